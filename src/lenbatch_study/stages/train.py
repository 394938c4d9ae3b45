"""Train stage: the DFlash drafter behind the frozen target, one batching strategy, measured.

Roles (``torchrun --nproc_per_node N -m lenbatch_study train ...``, env RANK/WORLD_SIZE):

* ranks ``0 .. N-2`` are **target ranks**. Target rank ``r`` takes its steps of the schedule
  (:mod:`lenbatch_study.runtime.schedule`: the batches its ``LengthBatchSampler(rank=r, world_size=N-1)``
  would yield), collates the batch
  (:mod:`lenbatch.loading.collate`), runs the target forward and sends the batch and its features
  to the drafter rank (:mod:`lenbatch_study.runtime.transport`: header and credits on a gloo control group,
  tensors alone on the default group, deadlock-free under NCCL's rendezvous semantics). Credits
  bound the queue: target rank ``r`` sends its ``k``-th batch only after the drafter took its
  ``(k - queue_size)``-th, so at most ``train.queue_size`` batches per target rank are in flight.
  On CUDA, each rank's peak memory is computed from the config first (:mod:`lenbatch_study.models.memory`) and a
  setting that cannot fit is refused.
* rank ``N-1`` is the **drafter rank**: it takes batches round-robin over the target ranks
  (global step ``g`` comes from target rank ``g mod (N-1)``), trains the drafter
  (AdamW, gradient clipping), and writes ``steps.jsonl``, ``summary.json`` and
  ``checkpoint.pt`` (the drafter rank is the one that measures).
* ``N = 1`` (or no torchrun with ``train.nproc: 1``): one process does both in turn; its plan
  is the one of ``N = 2`` (one target rank), so its losses equal the 2-process run's.
  Without torchrun and ``train.nproc > 1``, ``lenbatch train`` starts ``python -m torch.distributed.run
  --standalone --nproc_per_node train.nproc`` (logged) and hands its workers the request it checked, as it
  is (:mod:`lenbatch_study.runtime.launch`): :func:`train` gets the same checked ``params`` in every process.

Across nodes (``train.nodes`` = N > 1; ``N x train.nproc`` processes, one torchrun per node or one for all):
roles come from the global rank (:class:`lenbatch_study.runtime.runner.Roles`); the schedule is sharded over
all ``N x (nproc - 1)`` target ranks, each node's drafter takes its own target ranks' steps in schedule order,
and the drafters train one model, cluster step by cluster step (:mod:`lenbatch_study.runtime.schedule`,
:class:`lenbatch_study.runtime.transport.DrafterGroup`). Node 0's drafter writes OUT: rows in global step
order with ``node``, ``cluster_step``, ``allreduce_s``, ``cluster_wait_s`` and ``t`` the cluster step's end;
checkpoints only where the steps trained are a prefix of the schedule (so a resume replays the batches and
losses; a run stopped inside a round and later extended pairs its remaining steps anew).

gloo on CPU, NCCL on GPU (``train.device``). The trained drafter keeps fp32 master weights (autocast
to ``model.dtype``); the frozen target runs in ``model.dtype``.

Stop rule (:mod:`lenbatch_study.runtime.schedule`): the global schedule (pure: lengths, batch spec, target ranks)
walks epochs 0, 1, ... and ends at the first step at which the useful tokens trained reach
``train.useful_tokens`` (or at ``--max-steps``). Every rank computes the same schedule, so no
rank ever waits for a batch that will not come.

Measured (``steps.jsonl``, one line per step; ``summary.json``): :mod:`lenbatch_study.runtime.ranks`, the
loops of the three roles, which this module sets up and hands the run's files.

Resume: ``checkpoint.pt`` (every ``train.checkpoint_every`` steps and at the end; see
:mod:`lenbatch_study.runtime.checkpoint`) holds the drafter, the optimizer, every target rank's sampler state
(the schedule's, :meth:`lenbatch_study.runtime.schedule.Schedule.sampler_states`; checked against it on resume), the step
counter, RNG states, a fingerprint of the params and the digest of the ``steps.jsonl`` lines it
covers. One run owns OUT: the writing rank holds OUT's writer lock (:mod:`lenbatch_study.pipeline.outputs`). A fresh
run trains in ``.<OUT>.partial`` beside OUT and swaps it in whole only when its summary is written, so a
failed or killed run leaves the previous complete output as it was; ``--resume`` continues the run in
``.<OUT>.partial`` when it holds a checkpoint (an interrupted run), else the one in OUT. A checkpoint that
cannot be resumed (other params or code, another format, a log that is not its own, or a run that
reached its last step but was killed before its summary) is set aside as ``<OUT>.set-aside-<time>.pt``
beside OUT (named in the log) and the run starts afresh: a workflow never gets stuck on it, and a resume
ends with a complete summary or a non-zero exit. A run that gets SIGUSR1, SIGTERM or SIGINT (a scheduler's
warning ahead of its time limit or of preemption; Ctrl-C) checkpoints at the next step boundary all ranks agree on, writes
no summary and exits with 75 (:mod:`lenbatch_study.runtime.stopping`). Anchors are drawn from
(seed, epoch, step, dataset index) and the target is deterministic, so ``--resume`` replays exactly
the remaining batches and losses.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from lenbatch_study.runtime.checkpoint import (
    fingerprint,
    save_checkpoint,
    summary_problem,
)
from lenbatch_study.pipeline.artifacts.bucket_edges import edges_for
from lenbatch_study.pipeline.artifacts.tokenized import read_dataset, read_lengths
from lenbatch.batching.strategy import STRATEGIES
from lenbatch_study.core.config import Params
from lenbatch_study.core.machine import fingerprint as fingerprint_machine
from lenbatch_study.runtime.lifetime import die_with_parent, remove_launcher_logs
from lenbatch_study.runtime.resume import partial_dir
from lenbatch_study.runtime.stopping import STOPPED_EXIT, StopRequest, read_marker
from lenbatch_study.core.log import get_logger
from lenbatch_study.core.files import write_atomic, write_error, write_failure
from lenbatch_study.pipeline.artifacts.reading import read_json
from lenbatch_study.pipeline.artifacts.train_runs import CHECKPOINT, RUN_FILES, STEPS, STOPPED, SUMMARY
from lenbatch_study.pipeline.artifacts.writing import write_resolved
from lenbatch_study.pipeline.outputs import commit_staged, lock_path, writer_lock
from lenbatch_study.runtime.records import Recorder, device_report, log_summary
from lenbatch_study.runtime.records import progress_line as progress_line  # public: the stage's progress line
from lenbatch_study.runtime.runner import (
    Roles,
    StepRunner,
    check_world,
    configure_process,
    init_process_group,
    ranks_per_device,
    resolve_device,
    torchrun_world,
)
from lenbatch_study.runtime.ranks import run_drafter_rank, run_single, run_target_rank
from lenbatch_study.runtime.schedule import Schedule, build_schedule
from lenbatch_study.runtime.transport import Channel, DrafterGroup

log = get_logger("train")


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
    channel: Any = None  # lenbatch_study.runtime.transport.Channel of a multi-process run
    reference_group: Any = None  # gloo group of every rank: the reference step's barriers (multi-process run)
    final: Optional[Path] = None  # the --out folder; ``out`` is where this run writes (see the module doc)
    roles: Optional[Roles] = None  # this process's role (multi-process run)
    drafters: Optional[DrafterGroup] = None  # the drafter ranks of a multi-node run (train.nodes > 1)
    stop: StopRequest = field(default_factory=StopRequest)  # a stop signal this process received or was told of
    stopped: bool = False  # the ranks stopped on a signal before the last planned step (no summary)
    run_files: tuple[str, ...] = RUN_FILES  # what a fresh run in ``out`` removes first

    # the run's files in ``out`` (their names: lenbatch_study.pipeline.artifacts.train_runs)
    @property
    def checkpoint(self) -> Path:
        return self.out / CHECKPOINT

    @property
    def summary(self) -> Path:
        return self.out / SUMMARY

    @property
    def steps_log(self) -> Path:
        return self.out / STEPS

    @property
    def stop_marker(self) -> Path:
        return self.out / STOPPED

    def read_data(self) -> Any:
        """The tokenized dataset the rank loops collate from (:mod:`lenbatch_study.runtime.ranks`)."""
        return read_dataset(self.data, self.lengths)

    def finish(self, runner: StepRunner, rec: Recorder, states: list[Any], **kw: Any) -> dict[str, Any]:
        """The last checkpoint, ``params.json`` and the summary (:func:`_finish`): the drafter's end of a run."""
        return _finish(self, runner, rec, states, **kw)


def _finish(
    setup: RunSetup,
    runner: StepRunner,
    rec: Recorder,
    states: list[Any],
    *,
    resumed_from: Optional[int],
    kernels: dict[str, Any],
    ref: Optional[dict[str, Any]] = None,
    target_peak: Optional[int] = None,
    checksums: Optional[list[int]] = None,
) -> dict[str, Any]:
    p = setup.params
    done = setup.schedule[-1].step + 1 if setup.schedule else 0
    if resumed_from == done and summary_problem(setup.summary) is None:
        # resumed a run that had already finished: nothing trained, nothing to rewrite (its summary keeps
        # the throughput its last session measured)
        rec.close()
        log.info(
            "%s: the checkpoint is at the last planned step (%d): the run is complete, %s left as it is",
            setup.strategy,
            done,
            setup.summary,
        )
        return read_json(setup.summary, rerun=f"lenbatch train --out {setup.final or setup.out}")
    save_checkpoint(
        setup.checkpoint, runner=runner, step=done, sampler_states=states, fp=setup.fp, log_sha256=rec.log_sha256()
    )
    summary = rec.summary(
        params=p,
        strategy=setup.strategy,
        warmup=p.train.warmup_steps,
        world_size=setup.world_size,
        target_ranks=setup.target_ranks,
        resumed_from=resumed_from,
        total_steps=len(setup.schedule),
        machine=fingerprint_machine(threads=p.train.threads),
        reference=ref,
        device=device_report(
            setup.params,
            lengths=setup.lengths,
            batches=[s.indices for s in setup.schedule],
            device=setup.device,
            world_size=setup.world_size,
            kernels=kernels,
            target_peak=target_peak,
        ),
        nodes=p.train.nodes,
        weights_checksums=checksums,
    )
    rec.close()
    write_resolved(p, setup.out)
    # last, whole or not at all: a summary marks a complete run (a failure before it leaves the checkpoint)
    write_atomic(setup.summary, json.dumps(summary, indent=2) + "\n")
    return summary


# --------------------------------------------------------------------------- the stage


def _commit(setup: RunSetup) -> None:
    """Swap the complete run in the partial folder into OUT (one rename; the previous output goes)."""
    if setup.final is not None and setup.out != setup.final:
        commit_staged(setup.out, setup.final, stage="train", then="after that rerun with --resume to move it in")
        setup.out = setup.final


def train(
    *,
    params: Params,
    strategy: str,
    data: str | Path,
    out: str | Path,
    boundaries: Optional[str] = None,
    max_steps: Optional[int] = None,
    resume: bool = False,
) -> int:
    """``lenbatch train`` in this process (one of torchrun's, or the only one with ``train.nproc: 1``):
    trains ``strategy`` until ``train.useful_tokens`` (or ``max_steps`` global steps), writing ``out``
    on the drafter rank, which holds ``out``'s writer lock until it returns. Returns the exit code."""
    with contextlib.ExitStack() as stack:
        try:
            return _train(
                stack,
                params=params,
                strategy=strategy,
                data=data,
                out=out,
                boundaries=boundaries,
                max_steps=max_steps,
                resume=resume,
            )
        except OSError as err:  # a full disk, a read-only folder: one line naming the file, never a traceback
            ck = partial_dir(Path(out)) / CHECKPOINT
            refused = write_failure(err, written=(out, ck.parent, lock_path(out)))
            if refused is None:
                raise
            way = (
                f"rerun with --resume to continue from {ck}"
                if ck.exists()
                else "rerun (this run saved no checkpoint to resume)"
            )
            raise write_error(
                refused, path=ck.parent if ck.parent.exists() else out, then=f"{out} is as it was; after that {way}"
            ) from None


def _train(
    stack: contextlib.ExitStack,
    *,
    params: Params,
    strategy: str,
    data: str | Path,
    out: str | Path,
    boundaries: Optional[str],
    max_steps: Optional[int],
    resume: bool,
) -> int:
    # checked at the edge (lenbatch train: cli/flags.py), which hands this process the request as it is
    assert strategy in STRATEGIES and (max_steps is None or max_steps >= 1), (strategy, max_steps)
    under_torchrun, world, rank = torchrun_world()
    nproc, nodes = params.train.nproc, params.train.nodes
    check_world(nproc=nproc, nodes=nodes, under_torchrun=under_torchrun, world=world)
    if under_torchrun:  # a killed launcher must not leave its workers training (SIGTERM only asks them to stop)
        die_with_parent(sig=signal.SIGKILL)
        stack.callback(remove_launcher_logs)  # torchrun's torchelastic_* folder in $TMPDIR, as the run ends
    stop = stack.enter_context(StopRequest().installed(restore=not under_torchrun))
    configure_process(params)
    data = Path(data)
    lengths = read_lengths(data)
    edges = edges_for(boundaries, [strategy])
    target_ranks = max(1, nproc - 1) * nodes  # the plan is sharded over every node's target ranks
    device = resolve_device(params.train.device, int(os.environ.get("LOCAL_RANK", "0")))
    # a sample longer than batching.token_budget is refused here, by the plan (BatchSpec.check_lengths)
    schedule = build_schedule(
        lengths,
        strategy=strategy,
        params=params,
        edges=edges,
        target_ranks=target_ranks,
        useful_tokens=params.train.useful_tokens,
        max_steps=max_steps,
    )
    if device.type == "cuda":  # refuse before loading anything a setting whose ranks cannot fit
        from lenbatch_study.models.memory import check_fits, plan_memory_shape

        check_fits(
            params,
            device_bytes=torch.cuda.get_device_properties(device).total_memory,
            ranks_per_device=ranks_per_device(world),
            single_process=world == 1,
            **plan_memory_shape(params, lengths, [s.indices for s in schedule]),
        )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    partial = partial_dir(out)
    # a fresh run, or the resume of an interrupted one, writes the partial folder; OUT changes only when a
    # run is complete (a resume of a finished run in OUT, to extend it, continues there)
    work = partial if not resume or (partial / CHECKPOINT).exists() else out
    roles = Roles(rank=rank, nproc=nproc, nodes=nodes)
    if world == 1 or roles.writes:  # node 0's drafter (or the single process) writes OUT: one such run at a time
        stack.enter_context(writer_lock(out, stage="train"))
        if not resume:
            if partial.exists():  # an interrupted run's, which this fresh run replaces
                shutil.rmtree(partial)
            partial.mkdir()
        elif work == out and partial.exists():  # a killed fresh run that saved no checkpoint: nothing to resume
            shutil.rmtree(partial)
        (work / STOPPED).unlink(missing_ok=True)  # a stopped run's: this one continues it
    fp = fingerprint(params, strategy=strategy, edges=edges, lengths=lengths, target_ranks=target_ranks)
    setup = RunSetup(
        params,
        strategy,
        data,
        work,
        edges,
        lengths,
        schedule,
        target_ranks,
        world,
        rank,
        device,
        resume,
        fp,
        final=out,
        roles=roles,
        stop=stop,
    )
    log.info(
        "%s: %d steps planned (%s useful tokens, %d target rank(s) + 1 drafter %s, %s)",
        strategy,
        len(schedule),
        f"{sum(s.useful for s in schedule):,}",
        target_ranks,
        "rank" if world > 1 else "in the same process",
        device,
    )
    if nodes > 1:
        log.info(
            "%d nodes: node %d of this process (rank %d: %s); the %d drafters train one model",
            nodes,
            roles.node,
            rank,
            "drafter" if roles.is_drafter else f"target rank {roles.target_index}",
            nodes,
        )
    if world == 1:
        summary = run_single(setup)
        if summary is None:
            return STOPPED_EXIT
        _commit(setup)
        log_summary(summary, out / SUMMARY)
        return 0
    import torch.distributed as dist

    comm_device = init_process_group(device, world)
    setup.channel = Channel()  # every rank, same order: creates the gloo control group
    setup.reference_group = dist.new_group(backend="gloo")  # the reference step's barriers, apart from the traffic
    if nodes > 1:  # every rank, same order: the drafters' groups
        setup.drafters = DrafterGroup(roles.drafter_ranks, rank=rank, comm_device=comm_device)
    try:
        if roles.is_drafter:
            summary = run_drafter_rank(setup, comm_device)
            if summary is not None:
                _commit(setup)
                log_summary(summary, out / SUMMARY, force=True)
        else:
            run_target_rank(setup, comm_device)
        setup.channel.close()
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return STOPPED_EXIT if setup.stopped else 0


def stopped_on_signal(out: str | Path) -> Optional[dict[str, Any]]:
    """The stop (``{"signal", "step"}``) a run of ``--out out`` recorded beside its checkpoint when it stopped on a
    signal (:mod:`lenbatch_study.runtime.stopping`), None otherwise."""
    out = Path(out)
    return read_marker(partial_dir(out) / STOPPED) or read_marker(out / STOPPED)


__all__ = ["STOPPED_EXIT", "progress_line", "stopped_on_signal", "train"]
