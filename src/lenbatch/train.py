"""Train stage: the DFlash drafter behind the frozen target, one batching strategy, measured.

Roles (``torchrun --nproc_per_node N -m lenbatch train ...``, env RANK/WORLD_SIZE):

* ranks ``0 .. N-2`` are **target ranks**. Target rank ``r`` takes its steps of the schedule
  (:mod:`lenbatch.schedule`: the batches its ``LengthBatchSampler(rank=r, world_size=N-1)``
  would yield), collates the batch
  (:mod:`lenbatch.collate`), runs the target forward and sends the batch and its features
  to the drafter rank (:mod:`lenbatch.transport`: header and credits on a gloo control group,
  tensors alone on the default group, deadlock-free under NCCL's rendezvous semantics). Credits
  bound the queue: target rank ``r`` sends its ``k``-th batch only after the drafter took its
  ``(k - queue_size)``-th, so at most ``train.queue_size`` batches per target rank are in flight.
  On CUDA, each rank's peak memory is computed from the config first (:mod:`lenbatch.memory`) and a
  setting that cannot fit is refused.
* rank ``N-1`` is the **drafter rank**: it takes batches round-robin over the target ranks
  (global step ``g`` comes from target rank ``g mod (N-1)``), trains the drafter
  (AdamW, gradient clipping), and writes ``steps.jsonl``, ``summary.json`` and
  ``checkpoint.pt`` (the drafter rank is the one that measures).
* ``N = 1`` (or no torchrun with ``train.nproc: 1``): one process does both in turn; its plan
  is the one of ``N = 2`` (one target rank), so its losses equal the 2-process run's.
  Without torchrun and ``train.nproc > 1``, ``lenbatch train`` re-executes itself under
  ``python -m torch.distributed.run --standalone --nproc_per_node train.nproc`` (logged).

gloo on CPU, NCCL on GPU (``train.device``). The trained drafter keeps fp32 master weights (autocast
to ``model.dtype``); the frozen target runs in ``model.dtype``.

Stop rule (:mod:`lenbatch.schedule`): the global schedule (pure: lengths, batch spec, target ranks)
walks epochs 0, 1, ... and ends at the first step at which the useful tokens trained reach
``train.useful_tokens`` (or at ``--max-steps``). Every rank computes the same schedule, so no
rank ever waits for a batch that will not come.

Measured (``steps.jsonl``, one line per step): rank, step, epoch, sequences, length (longest or
packed row length), useful and computed tokens, target_s (forward on the target rank),
credit_wait_s (target rank waiting for queue room: the drafter is the bottleneck),
queue_wait_s (drafter waiting for the batch, transfer included -- on CUDA the device is synchronized
at that boundary, as NCCL's recv returns before the copy is done: the target is the bottleneck),
drafter_s, loss; target_cpu_s and drafter_cpu_s (process CPU seconds of each step: on a CPU
device, cpu_s / (seconds x threads) below 1 means other work took the cores, see
:func:`lenbatch.stepmodel.cpu_share`). ``summary.json``: throughput = useful tokens of the post-warm-up steps / the
drafter-side wall time of those steps (pipeline throughput), padding efficiency, loss curve...

Resume: ``checkpoint.pt`` (every ``train.checkpoint_every`` steps and at the end; see
:mod:`lenbatch.checkpoint`) holds the drafter, the optimizer, every target rank's sampler state
(the schedule's, :meth:`lenbatch.schedule.Schedule.sampler_states`; checked against it on resume), the step
counter, RNG states, a fingerprint of the params and the digest of the ``steps.jsonl`` lines it
covers. One run owns OUT: the writing rank holds OUT's writer lock (:mod:`lenbatch.outputs`), and a
fresh run first removes the previous run's checkpoint, summary and log. Anchors are drawn from
(seed, epoch, step, dataset index) and the target is deterministic, so ``--resume`` replays exactly
the remaining batches and losses.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import os
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from lenbatch.checkpoint import (
    check_log,
    fingerprint,
    load_checkpoint,
    restore,
    save_checkpoint,
    start_fresh,
)
from lenbatch.collate import Batch, batch_from_parts, collate, layout_for
from lenbatch.config import STRATEGY_NAMES, Params, add_params_argument, load_params, write_resolved
from lenbatch.hostmem import reuse_freed_memory
from lenbatch.lifetime import die_with_parent, parent_death_signal
from lenbatch.log import get_logger
from lenbatch.outputs import writer_lock
from lenbatch.schedule import Schedule, ScheduledStep, build_schedule
from lenbatch.stepmodel import steps_cpu_share
from lenbatch.transport import Channel, DrafterLink, TargetLink, settle

log = get_logger("train")
LOSS_CURVE_POINTS = 500  # loss curve in summary.json is downsampled to at most this many points


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
            raise ValueError(f"local rank {local_rank} has no GPU ({torch.cuda.device_count()} visible); start at "
                             "most as many processes per node as GPUs (train.nproc / --nproc_per_node)")
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def ranks_per_device(world: int) -> int:
    """Processes of this node per visible GPU (1 for the study's 8 ranks on 8 GPUs)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    return max(1, -(-local // max(torch.cuda.device_count(), 1)))


def configure_process(params: Params) -> None:
    """Per-process settings every stepping process shares (train ranks, both profile roles), so the
    profile times steps the way training runs them: torch's intra-op threads and, with
    ``train.reuse_host_memory``, an allocator that keeps freed memory (see :mod:`lenbatch.hostmem`)."""
    torch.set_num_threads(params.train.threads)
    if params.train.reuse_host_memory:
        reuse_freed_memory()


# --------------------------------------------------------------------------- one step, both halves


class StepRunner:
    """Target forward and drafter training step for one process (single-process mode, profile).

    ``StepRunner(params, *, device="cpu")`` builds the frozen target, the drafter and AdamW.
    ``target_step(batch) -> (features, seconds)``; ``drafter_step(batch, features) -> (loss, seconds)``
    (one optimizer step; anchors from (batching.seed, epoch, step, dataset index), ``step``
    defaults to the runner's own counter). ``last_cpu_s``: process CPU seconds of the last step. ``role="drafter"`` builds only the target's
    embedding and lm_head (the drafter rank), ``role="target"`` only the target.
    """

    def __init__(self, params: Params, *, device: str | torch.device = "cpu", role: str = "both") -> None:
        from lenbatch.drafter import build_drafter
        from lenbatch import model as target_model

        if role not in ("both", "target", "drafter"):
            raise ValueError(f"role must be both, target or drafter, got {role!r}")
        self.params = params
        self.device = torch.device(device)
        self.steps = 0
        self.threads = torch.get_num_threads()
        self.last_cpu_s = 0.0
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

    def target_step(self, batch: Batch) -> tuple[torch.Tensor, float]:
        """Features ``[B, T, F]`` of ``batch`` (padded or packed) and the seconds the forward took."""
        assert self.target is not None, "this StepRunner was built without the target (role='drafter')"
        batch = batch.to(self.device)
        _sync(self.device)
        t0, c0 = time.perf_counter(), time.process_time()
        if batch.kind == "packed":
            feats = self.target.features(batch.input_ids, cu_seqlens=batch.cu_seqlens)
        else:
            feats = self.target.features(batch.input_ids, attention_mask=batch.attention_mask)
        _sync(self.device)
        self.last_cpu_s = time.process_time() - c0
        return feats, time.perf_counter() - t0

    def drafter_step(self, batch: Batch, features: torch.Tensor, *, step: Optional[int] = None,
                     epoch: int = 0) -> tuple[float, float]:
        """One AdamW step of the drafter on ``batch``; returns (loss, seconds)."""
        assert self.drafter is not None and self.optimizer is not None, "built without the drafter"
        p = self.params
        step = self.steps if step is None else step
        batch = batch.to(self.device)
        if features.is_inference():  # produced under inference_mode: make it a normal tensor for autograd
            features = features.clone()
        _sync(self.device)
        t0, c0 = time.perf_counter(), time.process_time()
        anchors, valid = self.drafter.anchors_for(batch, anchors_per_seq=p.drafter.anchors_per_seq,
                                                  seed=p.batching.seed, epoch=epoch, step=step)
        with torch.autocast(self.device.type, dtype=self.compute_dtype,
                            enabled=self.compute_dtype != torch.float32):
            out = self.drafter(features, batch, anchors, valid, embed_tokens=self.embed_tokens,
                               lm_head=self.lm_head)
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), p.drafter.grad_clip)
        self.optimizer.step()
        loss = float(out.loss.detach())
        _sync(self.device)
        self.last_cpu_s = time.process_time() - c0
        self.steps = step + 1
        self.last_output = out
        return loss, time.perf_counter() - t0


# --------------------------------------------------------------------------- data, plan, schedule


def load_lengths(data: Path) -> np.ndarray:
    path = data / "lengths.npy"
    if not path.exists():
        raise ValueError(f"{path} does not exist; run 'lenbatch tokenize --out {data}' first (or pass --data)")
    return np.load(path).astype(np.int64)


def load_edges(boundaries: Optional[str], strategy: str) -> Optional[tuple[int, ...]]:
    """Bucket edges from boundaries.json (only the bucketed strategy reads them)."""
    if strategy != "bucketed":
        return None
    if not boundaries:
        raise ValueError("strategy 'bucketed' needs bucket edges; pass --boundaries "
                         "results/boundaries/boundaries.json (run 'lenbatch boundaries' first)")
    path = Path(boundaries)
    if not path.exists():
        raise ValueError(f"--boundaries {path} does not exist; run 'lenbatch boundaries' first")
    edges = json.loads(path.read_text()).get("edges")
    if not edges:
        raise ValueError(f"{path} has no 'edges'; regenerate it with 'lenbatch boundaries'")
    return tuple(int(e) for e in edges)


class TrainData:
    """The tokenized dataset (``datasets.load_from_disk``) read by target ranks, batch by batch."""

    def __init__(self, data: Path, lengths: np.ndarray) -> None:
        import datasets

        path = data / "dataset"
        if not path.exists():
            raise ValueError(f"{path} does not exist; run 'lenbatch tokenize --out {data}' first (or pass --data)")
        ds = datasets.load_from_disk(str(path))
        missing = {"input_ids", "loss_mask"} - set(ds.column_names)
        if missing:
            raise ValueError(f"{path} lacks columns {sorted(missing)}; re-run 'lenbatch tokenize'")
        if len(ds) != len(lengths):
            raise ValueError(f"{path} has {len(ds)} rows but lengths.npy has {len(lengths)}; re-run "
                             "'lenbatch tokenize' so both come from the same run")
        self.ds = ds.select_columns(["input_ids", "loss_mask"])
        self.lengths = lengths

    def samples(self, indices: np.ndarray) -> list[dict[str, Any]]:
        rows = self.ds[[int(i) for i in indices]]
        out = []
        for i, ids, mask in zip(indices, rows["input_ids"], rows["loss_mask"]):
            if len(ids) != self.lengths[i]:
                raise ValueError(f"dataset row {i} has {len(ids)} tokens but lengths.npy says {self.lengths[i]}; "
                                 "re-run 'lenbatch tokenize'")
            out.append({"input_ids": ids, "loss_mask": mask})
        return out


def batch_hash(indices: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(indices, dtype=np.int64).tobytes())


# --------------------------------------------------------------------------- recording


def resumed_log(out: Path, state: dict[str, Any]) -> list[str]:
    """The ``steps.jsonl`` lines a resume keeps: those of the steps the checkpoint covers (a killed run
    may have logged steps past it, and cut its last line short), checked to be the ones written beside
    that checkpoint (:func:`lenbatch.checkpoint.check_log`). Reads only; O(log size)."""
    path = out / "steps.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    kept, steps, sha = [], [], hashlib.sha256()
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # the line a kill cut short
            continue
        if row["step"] < int(state["step"]):
            kept.append(line)
            steps.append(row["step"])
            sha.update((line + "\n").encode())
    check_log(path, state, steps, sha.hexdigest())
    return kept


class Recorder:
    """``steps.jsonl`` lines (flushed per step) and ``summary.json`` on the measuring rank.

    ``kept``: the lines of a resumed run's earlier steps (:func:`resumed_log`), rewritten first.
    ``log_sha256()``: the digest of every line written so far, which each checkpoint records.
    """

    def __init__(self, out: Path, *, kept: Optional[list[str]]) -> None:
        self.path = out / "steps.jsonl"
        kept = kept or []
        self.rows: list[dict[str, Any]] = [json.loads(line) for line in kept]
        self.sha = hashlib.sha256()
        self.session_start = len(self.rows)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("w") as fh:
            for line in kept:
                fh.write(line + "\n")
                self.sha.update((line + "\n").encode())
        self.fh = self.path.open("a")

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        line = json.dumps(row) + "\n"
        self.fh.write(line)
        self.fh.flush()
        self.sha.update(line.encode())

    def log_sha256(self) -> str:
        return self.sha.hexdigest()

    def summary(self, *, params: Params, strategy: str, warmup: int, world_size: int,
                target_ranks: int, resumed_from: Optional[int], total_steps: int) -> dict[str, Any]:
        """Post-warm-up pipeline throughput of this session + whole-run padding efficiency and loss curve."""
        rows, session = self.rows, self.rows[self.session_start:]
        measured = session[warmup:]
        t0 = session[warmup - 1]["t"] if 0 < warmup <= len(session) else 0.0  # "t": seconds since session start
        wall = (measured[-1]["t"] - t0) if measured else None
        useful_m = sum(r["useful_tokens"] for r in measured)
        computed_m = sum(r["computed_tokens"] for r in measured)
        useful = sum(r["useful_tokens"] for r in rows)
        computed = sum(r["computed_tokens"] for r in rows)
        stride = max(1, -(-len(rows) // LOSS_CURVE_POINTS))
        tail = rows[-max(1, min(20, len(rows) // 10)):] if rows else []

        def mean(key: str, src: list[dict[str, Any]]) -> Optional[float]:
            return float(np.mean([r[key] for r in src])) if src else None

        return {
            "strategy": strategy, "world_size": world_size, "target_ranks": target_ranks,
            "steps": len(rows), "planned_steps": total_steps, "epochs": (rows[-1]["epoch"] + 1) if rows else 0,
            "useful_tokens": useful, "computed_tokens": computed,
            "padding_efficiency": useful / computed if computed else None,
            "warmup_steps_excluded": min(warmup, len(session)), "measured_steps": len(measured),
            "measured_wall_s": wall, "measured_useful_tokens": useful_m, "measured_computed_tokens": computed_m,
            "useful_tokens_per_s": useful_m / wall if wall else None,
            "computed_tokens_per_s": computed_m / wall if wall else None,
            "measured_padding_efficiency": useful_m / computed_m if computed_m else None,
            "session_wall_s": session[-1]["t"] if session else 0.0,  # "t" counts from the session start
            "target_s_mean": mean("target_s", measured), "drafter_s_mean": mean("drafter_s", measured),
            "queue_wait_s_mean": mean("queue_wait_s", measured), "credit_wait_s_mean": mean("credit_wait_s", measured),
            "target_s_total": float(sum(r["target_s"] for r in measured)),
            "drafter_s_total": float(sum(r["drafter_s"] for r in measured)),
            "threads": params.train.threads,
            **{f"{role}_cpu_share": _none_if_nan(steps_cpu_share(measured, role, threads=params.train.threads))
               for role in ("target", "drafter")},
            "loss_curve": [[r["step"], r["loss"]] for r in rows[::stride]],
            "loss_curve_stride": stride,
            "first_loss": rows[0]["loss"] if rows else None,
            "final_loss": float(np.mean([r["loss"] for r in tail])) if tail else None,
            "final_loss_steps": len(tail),
            "sequences_without_anchor": int(sum(r.get("sequences_without_anchor", 0) for r in rows)),
            "resumed_from_step": resumed_from,
            "params": params.to_dict(),
        }

    def close(self) -> None:
        self.fh.close()


# --------------------------------------------------------------------------- the run


@dataclass
class RunSetup:
    params: Params
    strategy: str
    data: Path
    out: Path
    edges: Optional[tuple[int, ...]]
    lengths: np.ndarray
    schedule: Schedule
    target_ranks: int
    world_size: int
    rank: int
    device: torch.device
    resume: bool
    fp: dict[str, Any]
    channel: Any = None  # lenbatch.transport.Channel of a multi-process run


def _none_if_nan(x: float) -> Optional[float]:
    return None if math.isnan(x) else x


def _row(step: ScheduledStep, batch: Batch, *, target_s: float, credit_s: float, wait_s: float, drafter_s: float,
         loss: float, t: float, runner: StepRunner, target_cpu_s: float) -> dict[str, Any]:
    out = runner.last_output
    return {"rank": step.rank, "step": step.step, "epoch": step.epoch, "sequences": batch.num_sequences,
            "length": batch.shape_length, "useful_tokens": batch.useful_tokens,
            "computed_tokens": batch.computed_tokens, "target_s": round(target_s, 6),
            "credit_wait_s": round(credit_s, 6), "queue_wait_s": round(wait_s, 6), "drafter_s": round(drafter_s, 6),
            "loss": loss, "t": round(t, 6), "batch_hash": batch_hash(step.indices),
            "target_cpu_s": round(target_cpu_s, 6), "drafter_cpu_s": round(runner.last_cpu_s, 6),
            "positions": out.positions if out else 0, "blocks": out.blocks if out else 0,
            "sequences_without_anchor": out.sequences_without_anchor if out else 0}


def _progress(step: ScheduledStep, total: int, loss: float, useful_done: int, t: float) -> None:
    every = max(1, total // 20)
    if step.step % every == 0 or step.step == total - 1:
        log.info("step %d/%d (epoch %d): loss %.4f, %s useful tokens, %.1f s, %.0f useful tok/s", step.step + 1,
                 total, step.epoch, loss, f"{useful_done:,}", t, useful_done / max(t, 1e-9))


def _finish(setup: RunSetup, runner: StepRunner, rec: Recorder, states: list[Any], *,
            resumed_from: Optional[int]) -> dict[str, Any]:
    p = setup.params
    done = setup.schedule[-1].step + 1 if setup.schedule else 0
    if resumed_from == done and (setup.out / "summary.json").exists():
        # resumed a run that had already finished: nothing trained, nothing to rewrite (its summary keeps
        # the throughput its last session measured)
        rec.close()
        log.info("%s: the checkpoint is at the last planned step (%d): the run is complete, %s left as it is",
                 setup.strategy, done, setup.out / "summary.json")
        return json.loads((setup.out / "summary.json").read_text())
    save_checkpoint(setup.out / "checkpoint.pt", runner=runner, step=done, sampler_states=states, fp=setup.fp,
                    log_sha256=rec.log_sha256())
    summary = rec.summary(params=p, strategy=setup.strategy, warmup=p.train.warmup_steps,
                          world_size=setup.world_size, target_ranks=setup.target_ranks, resumed_from=resumed_from,
                          total_steps=len(setup.schedule))
    rec.close()
    (setup.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_resolved(p, setup.out)
    return summary


def run_single(setup: RunSetup) -> dict[str, Any]:
    """One process: target forward then drafter step, batch after batch."""
    p = setup.params
    runner = StepRunner(p, device=setup.device)
    data = TrainData(setup.data, setup.lengths)
    start, resumed_from, kept = 0, None, None
    if setup.resume:
        ck = _load_checkpoint(setup)
        kept = resumed_log(setup.out, ck)
        restore(runner, ck)
        start = resumed_from = int(ck["step"])
        setup.schedule.check_sampler_states(ck["samplers"], start)
    rec = Recorder(setup.out, kept=kept)
    useful_done = sum(r["useful_tokens"] for r in rec.rows)
    t_start = time.perf_counter()
    for step in setup.schedule[start:]:
        idx = step.indices
        batch = collate(data.samples(idx), spec=setup.schedule.spec, indices=idx)
        feats, t_s = runner.target_step(batch)
        t_cpu = runner.last_cpu_s
        loss, d_s = runner.drafter_step(batch, feats, step=step.step, epoch=step.epoch)
        useful_done += batch.useful_tokens
        t = time.perf_counter() - t_start
        rec.add(_row(step, batch, target_s=t_s, credit_s=0.0, wait_s=0.0, drafter_s=d_s, loss=loss, t=t,
                     runner=runner, target_cpu_s=t_cpu))
        _progress(step, len(setup.schedule), loss, useful_done, t)
        if p.train.checkpoint_every and (step.step + 1) % p.train.checkpoint_every == 0:
            save_checkpoint(setup.out / "checkpoint.pt", runner=runner, step=step.step + 1,
                            sampler_states=setup.schedule.sampler_states(step.step + 1), fp=setup.fp,
                            log_sha256=rec.log_sha256())
    return _finish(setup, runner, rec, setup.schedule.sampler_states(len(setup.schedule)), resumed_from=resumed_from)


def _load_checkpoint(setup: RunSetup) -> dict[str, Any]:
    return load_checkpoint(setup.out / "checkpoint.pt", setup.fp, total_steps=len(setup.schedule),
                           checkpoint_every=setup.params.train.checkpoint_every)


def _share_resume(setup: RunSetup, runner: Optional[StepRunner]
                  ) -> tuple[int, Optional[list[Any]], Optional[list[str]]]:
    """The drafter rank loads and checks the checkpoint and the log it extends, and tells every rank the
    start step and sampler states; returns (start, sampler states, kept log lines on the drafter rank)."""
    import torch.distributed as dist

    drafter_rank = setup.world_size - 1
    if not setup.resume:
        return 0, None, None
    payload: list[Any] = [None]
    kept = None
    if setup.rank == drafter_rank:
        try:
            ck = _load_checkpoint(setup)
            kept = resumed_log(setup.out, ck)
            assert runner is not None
            restore(runner, ck)
            setup.schedule.check_sampler_states(ck["samplers"], int(ck["step"]))
            payload = [{"step": int(ck["step"]), "samplers": ck["samplers"]}]
        except ValueError as err:
            payload = [{"error": str(err)}]
    dist.broadcast_object_list(payload, src=drafter_rank)
    if "error" in payload[0]:
        raise ValueError(payload[0]["error"])
    return payload[0]["step"], payload[0]["samplers"], kept


def run_target_rank(setup: RunSetup, comm_device: torch.device) -> None:
    """Compute features of this rank's batches and stream them to the drafter rank under credits
    (:class:`lenbatch.transport.TargetLink`)."""
    p = setup.params
    q = p.train.queue_size
    drafter_rank = setup.world_size - 1
    runner = StepRunner(p, device=setup.device, role="target")
    data = TrainData(setup.data, setup.lengths)
    start, _, _ = _share_resume(setup, None)
    mine = [s for s in setup.schedule[start:] if s.rank == setup.rank]
    link = TargetLink(setup.channel, dst=drafter_rank, queue_size=q, comm_device=comm_device)
    t_start = time.perf_counter()
    useful_done = 0
    for step in mine:
        idx = step.indices
        batch = collate(data.samples(idx), spec=setup.schedule.spec, indices=idx)
        feats, t_s = runner.target_step(batch)
        credit_s = link.wait_for_room()  # the drafter is the bottleneck when this grows
        meta = [step.epoch, step.step, int(t_s * 1e9), int(credit_s * 1e9), int(runner.last_cpu_s * 1e9), 0]
        link.send(batch, feats, meta=meta)
        useful_done += batch.useful_tokens
        if setup.rank == 0:
            _progress(step, len(setup.schedule), link.last_loss, useful_done * setup.target_ranks,
                      time.perf_counter() - t_start)
    link.drain()


def run_drafter_rank(setup: RunSetup, comm_device: torch.device) -> dict[str, Any]:
    """Receive batches round-robin, train, measure, checkpoint; credit each batch on receipt
    (:class:`lenbatch.transport.DrafterLink`)."""
    p = setup.params
    runner = StepRunner(p, device=setup.device, role="drafter")
    start, _, kept = _share_resume(setup, runner)
    resumed_from = start if setup.resume else None
    rec = Recorder(setup.out, kept=kept)
    link = DrafterLink(setup.channel, comm_device=comm_device)
    last_loss = float("nan")
    t_start = time.perf_counter()
    for step in setup.schedule[start:]:
        t0 = time.perf_counter()
        batch, feats, meta = link.recv(step.rank, step=step.step, last_loss=last_loss)  # transfer included
        if feats.device != setup.device:  # gloo on a GPU run (ranks sharing a GPU): staged through the host
            feats = feats.to(setup.device)
            settle(setup.device)
        wait_s = time.perf_counter() - t0
        epoch, gstep, t_ns, credit_ns, t_cpu_ns = meta[:5]
        assert (epoch, gstep) == (step.epoch, step.step), f"got step {gstep} of epoch {epoch}, expected {step}"
        if not np.array_equal(batch.indices.cpu().numpy(), step.indices):
            raise AssertionError(f"step {step.step}: received a batch other than the planned one")
        loss, d_s = runner.drafter_step(batch, feats, step=step.step, epoch=step.epoch)
        last_loss = loss
        t = time.perf_counter() - t_start
        rec.add(_row(step, batch, target_s=t_ns / 1e9, credit_s=credit_ns / 1e9, wait_s=wait_s, drafter_s=d_s,
                     loss=loss, t=t, runner=runner, target_cpu_s=t_cpu_ns / 1e9))
        if p.train.checkpoint_every and (step.step + 1) % p.train.checkpoint_every == 0:
            save_checkpoint(setup.out / "checkpoint.pt", runner=runner, step=step.step + 1,
                            sampler_states=setup.schedule.sampler_states(step.step + 1), fp=setup.fp,
                            log_sha256=rec.log_sha256())
    summary = _finish(setup, runner, rec, setup.schedule.sampler_states(len(setup.schedule)), resumed_from=resumed_from)
    link.close()
    return summary


# --------------------------------------------------------------------------- CLI


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    train: dict[str, Any] = {}
    if args.useful_tokens is not None:
        train["useful_tokens"] = args.useful_tokens
    return {"train": train} if train else {}


def _load_params(args: argparse.Namespace) -> Params:
    from lenbatch import config

    fn = getattr(config, "params_from_args", None)
    if fn is not None:
        return fn(args, _overrides(args))
    return load_params(*args.params, overrides=_overrides(args) or None)


def register(parser: argparse.ArgumentParser) -> None:
    add_params_argument(parser)
    parser.add_argument("--strategy", required=True, help=f"batching strategy: one of {', '.join(STRATEGY_NAMES)}")
    parser.add_argument("--data", default="results/tokenize", help="tokenize stage output (dataset/, lengths.npy)")
    parser.add_argument("--boundaries", default=None, help="boundaries.json (needed by the bucketed strategy)")
    parser.add_argument("--out", required=True, help="output directory (steps.jsonl, summary.json, checkpoint.pt)")
    parser.add_argument("--useful-tokens", type=int, default=None, help="override train.useful_tokens (tokens)")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many global steps (total, "
                        "counting steps before a resume)")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    parser.set_defaults(func=run)


def _reexec_under_torchrun(args: argparse.Namespace, nproc: int) -> int:
    argv = ["train", "--params", *args.params, "--strategy", args.strategy, "--data", args.data, "--out", args.out]
    if args.boundaries:
        argv += ["--boundaries", args.boundaries]
    if args.useful_tokens is not None:
        argv += ["--useful-tokens", str(args.useful_tokens)]
    if args.max_steps is not None:
        argv += ["--max-steps", str(args.max_steps)]
    if args.resume:
        argv.append("--resume")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           "-m", "lenbatch", *argv]
    log.info("train.nproc=%d and no torchrun environment: running %s", nproc, " ".join(cmd))
    # the launcher dies with us, and its workers with it (lenbatch.lifetime)
    return subprocess.call(cmd, preexec_fn=parent_death_signal)


def run(args: argparse.Namespace) -> int:
    """``lenbatch train``; the process that writes ``--out`` holds its writer lock until it returns."""
    with contextlib.ExitStack() as stack:
        return _run(args, stack)


def _run(args: argparse.Namespace, stack: contextlib.ExitStack) -> int:
    params = _load_params(args)
    if args.strategy not in STRATEGY_NAMES:
        raise ValueError(f"unknown strategy {args.strategy!r}; choose one of {', '.join(STRATEGY_NAMES)}")
    if args.max_steps is not None and args.max_steps < 1:
        raise ValueError(f"--max-steps must be >= 1, got {args.max_steps}")
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world = int(os.environ.get("WORLD_SIZE", "1")) if under_torchrun else 1
    rank = int(os.environ.get("RANK", "0")) if under_torchrun else 0
    if not under_torchrun and params.train.nproc > 1:
        return _reexec_under_torchrun(args, params.train.nproc)
    if under_torchrun and world != params.train.nproc:
        raise ValueError(f"torchrun started {world} processes but train.nproc is {params.train.nproc}: the roles "
                         f"({params.train.nproc - 1} target ranks + 1 drafter rank) do not fit; launch with "
                         f"--nproc_per_node {params.train.nproc} or set train.nproc: {world}")
    if under_torchrun:  # a killed launcher must not leave its workers training
        die_with_parent()
    configure_process(params)
    data = Path(args.data)
    lengths = load_lengths(data)
    edges = load_edges(args.boundaries, args.strategy)
    if len(lengths) == 0:
        raise ValueError(f"{data}/lengths.npy is empty; tokenize some data first")
    too_long = int((lengths > params.batching.token_budget).sum())
    if too_long:
        raise ValueError(f"{too_long} samples are longer than batching.token_budget={params.batching.token_budget}; "
                         "raise the budget or lower data.max_len and re-tokenize")
    target_ranks = max(1, world - 1)
    device = resolve_device(params.train.device, int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":  # refuse before loading anything a setting whose ranks cannot fit
        from lenbatch.memory import check_fits

        check_fits(params, device_bytes=torch.cuda.get_device_properties(device).total_memory,
                   ranks_per_device=ranks_per_device(world), single_process=world == 1)
    schedule = build_schedule(lengths, strategy=args.strategy, params=params, edges=edges, target_ranks=target_ranks,
                              useful_tokens=params.train.useful_tokens, max_steps=args.max_steps)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if rank == world - 1:  # the drafter rank (or the single process) writes OUT: one such run at a time
        stack.enter_context(writer_lock(out, stage="train"))
        if not args.resume:  # a fresh run owns OUT from its first step (lenbatch.checkpoint)
            start_fresh(out)
    fp = fingerprint(params, strategy=args.strategy, edges=edges, lengths=lengths, target_ranks=target_ranks)
    setup = RunSetup(params, args.strategy, data, out, edges, lengths, schedule, target_ranks, world, rank, device,
                     args.resume, fp)
    log.info("%s: %d steps planned (%s useful tokens, %d target rank(s) + 1 drafter %s, %s)", args.strategy,
             len(schedule), f"{sum(s.useful for s in schedule):,}", target_ranks,
             "rank" if world > 1 else "in the same process", device)
    if world == 1:
        summary = run_single(setup)
        _log_summary(summary, out)
        return 0
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda" and ranks_per_device(world) > 1:
        # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): tensors go over gloo, through host memory
        backend = "gloo"
        log.info("%d ranks share each GPU (%s=1): gloo through host memory instead of NCCL", ranks_per_device(world),
                 SHARE_GPU_ENV)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend)
    comm_device = device if backend == "nccl" else torch.device("cpu")
    setup.channel = Channel()  # every rank, same order: creates the gloo control group
    try:
        if rank == world - 1:
            summary = run_drafter_rank(setup, comm_device)
            _log_summary(summary, out, force=True)
        else:
            run_target_rank(setup, comm_device)
        setup.channel.close()
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def _log_summary(summary: dict[str, Any], out: Path, *, force: bool = False) -> None:
    logger = log
    if force:  # the drafter rank measures; let it speak even though it is not rank 0
        logger = logging.getLogger("train.drafter")
        if not logger.handlers:
            h = logging.StreamHandler(sys.stderr)
            h.setFormatter(logging.Formatter("%(asctime)s train %(message)s", datefmt="%H:%M:%S"))
            logger.addHandler(h)
            logger.propagate = False
        logger.setLevel(logging.INFO)
    tps = summary["useful_tokens_per_s"]
    logger.info("%s: %d steps, %s useful tokens, padding efficiency %.3f, %s useful tok/s (post-warm-up), "
                "final loss %.4f -> %s", summary["strategy"], summary["steps"], f"{summary['useful_tokens']:,}",
                summary["padding_efficiency"] or float("nan"), f"{tps:,.0f}" if tps else "n/a",
                summary["final_loss"] or float("nan"), out / "summary.json")


__all__ = ["StepRunner", "build_schedule", "fingerprint", "register", "run"]
