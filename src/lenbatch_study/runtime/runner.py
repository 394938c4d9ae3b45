"""The step runner and the process it runs in: device choice, per-process settings, process group.

Shared by ``lenbatch train`` (every rank) and ``lenbatch profile`` (both roles), so the profile
times exactly the steps training runs: :class:`StepRunner` (target forward, drafter AdamW step),
:func:`resolve_device` (``train.device`` -> a torch device), :func:`configure_process` (threads,
host allocator) and :func:`init_process_group` (NCCL on GPUs, gloo otherwise or when ranks share a
GPU), and :class:`Roles`: what a process of a (multi-node) training is, from its global rank. Neither stage
imports the other; both import this module.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from lenbatch.loading.collate import Batch
from lenbatch_study.core.config import Params
from lenbatch_study.runtime.hostmem import reuse_freed_memory
from lenbatch_study.core.log import get_logger

log = get_logger("train")


def _sync(device: torch.device) -> None:
    """Wait for the work queued on this process's *compute* stream (a step's timer boundary).

    Never ``torch.cuda.synchronize``: that waits for every stream of the device, NCCL's too, and an
    NCCL send of a batch's features cannot finish before the drafter posts its receive, so a target
    rank timing its next forward that way would wait for the drafter (the queue collapses to
    lockstep, and the wait lands before the timer, in neither target_s nor credit_wait_s)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def peak_memory_bytes(device: torch.device) -> Optional[int]:
    """Peak bytes torch's allocator handed out on ``device`` in this process (None on CPU)."""
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None


ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"
# every batch has another shape: segments that grow in place instead of one cached block per size
ALLOC_CONF = "expandable_segments:True"


SHARE_GPU_ENV = "LENBATCH_SHARE_GPU"  # check only (make gpu-check): several ranks on one GPU


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``train.device`` -> a torch device (auto: cuda when available). With ``LENBATCH_SHARE_GPU=1``
    local ranks beyond the visible GPUs share them round-robin (a one-GPU check of the pipeline)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("train.device is 'cuda' but no GPU is visible; set train.device: cpu (or auto)")
        if os.environ.get(SHARE_GPU_ENV) == "1":
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        if local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"local rank {local_rank} has no GPU ({torch.cuda.device_count()} visible); start at "
                "most as many processes per node as GPUs (train.nproc / --nproc_per_node)"
            )
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def ranks_per_device(world: int) -> int:
    """Processes of this node per visible GPU (1 for the study's 8 ranks on 8 GPUs)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    return max(1, -(-local // max(torch.cuda.device_count(), 1)))


def configure_process(params: Params) -> None:
    """Per-process settings every stepping process shares (train ranks, both profile roles), so the
    profile times steps the way training runs them: torch's intra-op threads and, with
    ``train.reuse_host_memory``, an allocator that keeps freed memory (see :mod:`lenbatch_study.runtime.hostmem`)."""
    torch.set_num_threads(params.train.threads)
    # read when CUDA initialises (this runs before): a user's own setting wins
    os.environ.setdefault(ALLOC_CONF_ENV, ALLOC_CONF)
    if params.train.reuse_host_memory:
        reuse_freed_memory()


@dataclass(frozen=True)
class Roles:
    """Who a process of a training is (``nodes`` x ``nproc`` processes, :mod:`lenbatch_study.stages.train`), from
    its global rank: node ``rank // nproc``; local index ``nproc - 1`` is that node's drafter, the others its
    target ranks, whose global target rank (the schedule's ``step.rank``) is ``node x (nproc - 1) + local``."""

    rank: int
    nproc: int
    nodes: int

    @property
    def node(self) -> int:
        return self.rank // self.nproc

    @property
    def per_node(self) -> int:  # target ranks per node
        return max(1, self.nproc - 1)

    @property
    def is_drafter(self) -> bool:
        return self.rank % self.nproc == self.nproc - 1

    @property
    def writes(self) -> bool:  # node 0's drafter (or the single process) measures and writes OUT
        return self.rank == self.nproc - 1

    @property
    def target_index(self) -> int:
        return self.node * self.per_node + self.rank % self.nproc

    @property
    def drafter_process(self) -> int:  # the global rank of this node's drafter
        return self.node * self.nproc + self.nproc - 1

    def target_process(self, target_rank: int) -> int:
        """The global rank of the process of global target rank ``target_rank``."""
        return (target_rank // self.per_node) * self.nproc + target_rank % self.per_node

    @property
    def drafter_ranks(self) -> list[int]:
        return [k * self.nproc + self.nproc - 1 for k in range(self.nodes)]


def check_world(*, nproc: int, nodes: int, under_torchrun: bool, world: int) -> None:
    """Refuse a process count the roles of ``nproc`` x ``nodes`` (``train.nproc``, ``train.nodes``) do not fit
    (``ValueError`` naming the launch that does): ``world`` is torchrun's WORLD_SIZE, LOCAL_WORLD_SIZE this
    node's processes. Handed the two numbers, not the params: the profile, which imports this module, reads
    neither."""
    if not under_torchrun and nproc * nodes > 1:
        raise ValueError(
            f"train.nproc is {nproc} and train.nodes {nodes}: start this under torchrun "
            f"(--nproc_per_node {nproc} --nnodes {nodes}); 'lenbatch train' does that for you"
        )
    if under_torchrun and world != nproc * nodes:
        raise ValueError(
            f"torchrun started {world} processes but train.nproc is {nproc} and train.nodes {nodes}: "
            f"the roles ({nproc - 1} target ranks + 1 drafter rank per node) do not fit; launch with "
            f"--nproc_per_node {nproc} --nnodes {nodes} or set train.nproc x train.nodes to {world}"
        )
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if under_torchrun and nodes > 1 and local_world not in (nproc, world):
        raise ValueError(
            f"torchrun started {local_world} processes on this node but train.nproc is {nproc}: a node "
            f"of train.nodes={nodes} runs --nproc_per_node {nproc}"
        )


class StepRunner:
    """Target forward and drafter training step for one process (single-process mode, profile).

    ``StepRunner(params, *, device="cpu")`` builds the frozen target, the drafter and AdamW.
    ``target_step(batch) -> (features, seconds)``; ``drafter_step(batch, features) -> (loss, seconds)``
    (one optimizer step; anchors from (batching.seed, epoch, step, dataset index), ``step``
    defaults to the runner's own counter). ``last_cpu_s``: process CPU seconds of the last step. ``role="drafter"`` builds only the target's
    embedding and lm_head (the drafter rank), ``role="target"`` only the target.
    """

    def __init__(self, params: Params, *, device: str | torch.device = "cpu", role: str = "both") -> None:
        from lenbatch_study.models import target as target_model
        from lenbatch_study.models.drafter import build_drafter
        from lenbatch_study.models.kernels import compile_meter, select_kernels

        if role not in ("both", "target", "drafter"):
            raise ValueError(f"role must be both, target or drafter, got {role!r}")
        self.params = params
        self.device = torch.device(device)
        self.steps = 0
        self.threads = torch.get_num_threads()
        self.last_cpu_s = 0.0
        self.last_compile_s = 0.0  # Triton compile/autotune seconds inside the last target step
        # which Gated DeltaNet kernels run (train.kernels; a CUDA run on the torch fallback is refused).
        # The drafter alone runs none, so it takes no decision and never imports fla (~7 CPU-s per
        # process, measured: fla's kernels with transformers' Qwen3.5 model, which imports them too);
        # a pipelined run reports the target ranks' decision (kernel_report on target rank 0, sent to
        # the drafter rank).
        self.kernels: Optional[dict] = None
        self.meter = None
        if role != "drafter":
            self.kernels = select_kernels(
                params.train.kernels, device=self.device, dtype=target_model.DTYPES[params.model.dtype]
            )
            self.meter = compile_meter()
        self.warmup_compile_s = 0.0
        self.warmup_tokens: Optional[tuple[int, int]] = None  # set where the kernels are warmed
        self.autotune_choices: Optional[dict] = None
        self.target = None
        if role in ("both", "target"):
            self.target = target_model.build_target(params.model, device=self.device)
            self.embed_tokens, self.lm_head = self.target.embed_tokens, self.target.lm_head
        elif role == "drafter":
            self.embed_tokens, self.lm_head = target_model.build_heads(params.model, device=self.device)
        self.drafter = None
        self.optimizer = None
        # the trained drafter keeps fp32 master weights and runs its forward under autocast to
        # model.dtype (bf16: AdamW on bf16 weights drops updates below 2^-8 of a weight); the frozen
        # target stays in model.dtype
        self.compute_dtype = target_model.DTYPES[params.model.dtype]
        if role in ("both", "drafter"):
            self.drafter = build_drafter(params, device=self.device).float()
            d = params.drafter
            self.optimizer = torch.optim.AdamW(self.drafter.parameters(), lr=d.lr, weight_decay=d.weight_decay)
        self.last_output = None
        if self.target is not None:
            self.warm_kernels()

    def warm_kernels(self) -> None:
        """Compile fla's kernels before any timed step (CUDA + fla only): :func:`warm_target` at the
        budget's token counts (:func:`warmup_tokens`). Their compile/autotune seconds are
        ``warmup_compile_s``; the configs fla's autotuner chose there, ``autotune_choices``."""
        if self.device.type != "cuda" or self.kernels["gated_delta_rule"] != "fla":
            return
        from lenbatch_study.models.kernels import autotune_choices

        c0 = self.meter.seconds
        self.warmup_tokens = warmup_tokens(self.params.batching.token_budget)
        warm_target(self.target, self.device, self.warmup_tokens)
        _sync(self.device)
        self.warmup_compile_s = self.meter.seconds - c0
        self.autotune_choices = autotune_choices()

    def kernel_report(self) -> dict:
        """The kernels this target ran (:func:`lenbatch_study.models.kernels.select_kernels`' record), the
        Triton compile seconds of :meth:`warm_kernels` and whether the compile meter was on: the run
        summary's ``device.kernel_backend``."""
        assert self.kernels is not None, "built as the drafter alone (role='drafter'): no kernels of its own"
        return dict(
            self.kernels,
            warmup_compile_s=self.warmup_compile_s,
            compile_meter=self.meter.active,
            warmup_tokens=list(self.warmup_tokens) if self.warmup_tokens else None,
            autotune_choices=self.autotune_choices,
        )

    def target_step(self, batch: Batch) -> tuple[torch.Tensor, float]:
        """Features ``[B, T, F]`` of ``batch`` (padded or packed) and the seconds the forward took."""
        assert self.target is not None, "this StepRunner was built without the target (role='drafter')"
        batch = batch.to(self.device)
        _sync(self.device)
        t0, c0, k0 = time.perf_counter(), time.process_time(), self.meter.seconds
        if batch.layout == "packed":
            feats = self.target.features(batch.input_ids, cu_seqlens=batch.cu_seqlens)
        else:
            feats = self.target.features(batch.input_ids, attention_mask=batch.attention_mask)
        _sync(self.device)
        self.last_cpu_s = time.process_time() - c0
        self.last_compile_s = self.meter.seconds - k0
        return feats, time.perf_counter() - t0

    def drafter_step(
        self,
        batch: Batch,
        features: torch.Tensor,
        *,
        step: Optional[int] = None,
        epoch: int = 0,
        reduce: Optional[Callable[[float], Any]] = None,
    ) -> tuple[float, float]:
        """One AdamW step of the drafter on ``batch``; returns (loss, seconds).

        ``reduce`` (several drafters training one model): called after the backward with the loss's weight
        sum (:class:`lenbatch_study.models.drafter.DrafterOutput`), it replaces every gradient by the
        cluster's (:meth:`lenbatch_study.runtime.transport.DrafterGroup.reduce`); clipping and the update
        follow. Its seconds are not in the returned ones (they are the group's ``last_*_s``)."""
        assert self.drafter is not None and self.optimizer is not None, "built without the drafter"
        p = self.params
        step = self.steps if step is None else step
        batch = batch.to(self.device)
        features = features.to(self.device)  # every tensor this role is handed runs on its device
        if features.is_inference():  # produced under inference_mode: make it a normal tensor for autograd
            features = features.clone()
        _sync(self.device)
        t0, c0 = time.perf_counter(), time.process_time()
        anchors, valid = self.drafter.anchors_for(
            batch, anchors_per_seq=p.drafter.anchors_per_seq, seed=p.batching.seed, epoch=epoch, step=step
        )
        with torch.autocast(self.device.type, dtype=self.compute_dtype, enabled=self.compute_dtype != torch.float32):
            out = self.drafter(features, batch, anchors, valid, embed_tokens=self.embed_tokens, lm_head=self.lm_head)
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        reduce_s = self._reduce(reduce, out.weight_sum)
        torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), p.drafter.grad_clip)
        self.optimizer.step()
        loss = float(out.loss.detach())
        _sync(self.device)
        self.last_cpu_s = time.process_time() - c0
        self.steps = step + 1
        self.last_output = out
        return loss, time.perf_counter() - t0 - reduce_s

    def drafter_idle_step(self, *, reduce: Callable[[float], Any]) -> float:
        """The update of a drafter without a batch in this step (its node's steps ran out while another
        node's did not): no gradient of its own (weight 0), the cluster's through ``reduce``, then clipping
        and the update, so its weights stay those of every other drafter. Returns the seconds (reduce
        excluded)."""
        assert self.drafter is not None and self.optimizer is not None, "built without the drafter"
        t0 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        reduce_s = self._reduce(reduce, 0.0)
        torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), self.params.drafter.grad_clip)
        self.optimizer.step()
        _sync(self.device)
        self.last_output = None
        return time.perf_counter() - t0 - reduce_s

    @staticmethod
    def _reduce(reduce: Optional[Callable[[float], Any]], weight: float) -> float:
        if reduce is None:
            return 0.0
        t0 = time.perf_counter()
        reduce(weight)
        return time.perf_counter() - t0


# Token counts of the warm-up forwards: one a multiple of 16 and one not, Triton's two integer
# specialisations of a token count. No other shape enters a compile key once every layout goes in as
# one row and q/k are normalised outside fla (lenbatch_study.models.kernels: its l2norm kernel keys its
# autotune on a token bucket); tests/models/_fla_checks.py records every launch's keys to hold this.
WARMUP_TOKENS = (128, 129)


def warmup_tokens(token_budget: int) -> tuple[int, int]:
    """The token counts the runner warms fla's kernels at: the budget's, as the two integer
    specialisations Triton compiles a token count under (a multiple of 16, ``m``, and ``m - 1``),
    ``m`` = the budget rounded down to a multiple of 16 (16 at least). fla's autotuner benchmarks its
    configs on a key's first call and serves that choice at every later token count (its keys hold
    none), so the choice is made at the shapes the plan's largest batches have, not at a toy size. O(1)."""
    m = max(16, token_budget - token_budget % 16)
    return m, m - 1


def warm_target(target: torch.nn.Module, device: torch.device, tokens: tuple[int, ...] = WARMUP_TOKENS) -> None:
    """One forward of each of ``tokens`` tokens (:func:`warmup_tokens` in the runner), as one row of two
    sequences (a packed row, so the varlen paths compile too). Cost: a forward per count plus whatever
    compiles and autotunes."""
    for n in tokens:
        ids = torch.zeros(1, n, dtype=torch.long, device=device)
        target.features(ids, cu_seqlens=torch.tensor([0, n // 2, n], dtype=torch.int64))


def init_process_group(device: torch.device, world: int) -> torch.device:
    """Start torch.distributed for a ``world``-process run on ``device``; returns the device tensors
    travel on (the GPU under NCCL; the host under gloo). NCCL refuses two ranks on one GPU
    ("Duplicate GPU detected"), so ranks sharing a GPU use gloo through host memory."""
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda" and ranks_per_device(world) > 1:
        backend = "gloo"
        log.info(
            "%d ranks share each GPU (%s=1): gloo through host memory instead of NCCL",
            ranks_per_device(world),
            SHARE_GPU_ENV,
        )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend)
    return device if backend == "nccl" else torch.device("cpu")


def torchrun_world() -> tuple[bool, int, int]:
    """(started by torchrun, world size, rank) from the environment torchrun sets (RANK, WORLD_SIZE)."""
    under = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    return (
        under,
        (int(os.environ.get("WORLD_SIZE", "1")) if under else 1),
        (int(os.environ.get("RANK", "0")) if under else 0),
    )


__all__ = [
    "ALLOC_CONF",
    "WARMUP_TOKENS",
    "SHARE_GPU_ENV",
    "Roles",
    "StepRunner",
    "check_world",
    "configure_process",
    "init_process_group",
    "peak_memory_bytes",
    "ranks_per_device",
    "resolve_device",
    "torchrun_world",
    "warm_target",
    "warmup_tokens",
]
