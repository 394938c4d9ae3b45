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
  Without torchrun and ``train.nproc > 1``, ``lenbatch train`` re-executes itself under
  ``python -m torch.distributed.run --standalone --nproc_per_node train.nproc`` (logged).

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

Measured (``steps.jsonl``, one line per step): rank, step, epoch, sequences, length (longest or
packed row length), useful and computed tokens, target_s (forward on the target rank),
credit_wait_s (target rank waiting for queue room: the drafter is the bottleneck),
queue_wait_s (drafter waiting for the batch, transfer included -- on CUDA the device is synchronized
at that boundary, as NCCL's recv returns before the copy is done: the target is the bottleneck),
transport_s and transport_bytes (pipelined steps: the batch's transport alone, from its header's arrival to
its features on the drafter's device, and its bytes; :class:`lenbatch_study.runtime.transport.DrafterLink`),
drafter_s, loss; target_cpu_s and drafter_cpu_s (process CPU seconds of each step: on a CPU
device, cpu_s / (seconds x threads) below 1 means other work took the cores, see
:func:`lenbatch_study.core.cpu.cpu_share`); checkpoint_s (the periodic checkpoint written after the previous
step, kept off the clock ``t`` and so off the measured wall time). ``summary.json``: throughput = useful tokens of the post-warm-up steps / the
drafter-side wall time of those steps (pipeline throughput), padding efficiency, loss curve..., ``machine``
(the fingerprint of the machine, :mod:`lenbatch_study.core.machine`) and ``reference`` (the reference step, timed
before the first step and after the last, outside the measured window: target rank 0 and the drafter rank in
turn, :mod:`lenbatch_study.runtime.reference`; compare calibrates the prediction with it).

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
import time
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
from lenbatch.loading.collate import collate
from lenbatch.batching.strategy import STRATEGIES
from lenbatch_study.core.config import Params
from lenbatch_study.core.machine import fingerprint as fingerprint_machine
from lenbatch_study.runtime.lifetime import die_with_parent, remove_launcher_logs
from lenbatch_study.runtime.resume import partial_dir, resume_point, share_resume
from lenbatch_study.runtime.stopping import STOPPED_EXIT, StopRequest, agree_stopped, read_marker, stop_here
from lenbatch_study.core.log import get_logger
from lenbatch_study.pipeline.artifacts.reading import read_json
from lenbatch_study.pipeline.artifacts.train_runs import CHECKPOINT, RUN_FILES, STEPS, STOPPED, SUMMARY
from lenbatch_study.pipeline.artifacts.writing import write_resolved
from lenbatch_study.pipeline.outputs import (
    commit_staged,
    lock_path,
    write_atomic,
    write_error,
    write_failure,
    writer_lock,
)
from lenbatch_study.runtime import reference
from lenbatch_study.runtime.records import (Recorder, device_report, log_summary, progress, progress_line,  # noqa: F401 (public)
                                            step_row)
from lenbatch_study.runtime.runner import (
    Roles,
    StepRunner,
    check_world,
    configure_process,
    init_process_group,
    peak_memory_bytes,
    ranks_per_device,
    resolve_device,
    torchrun_world,
)
from lenbatch_study.runtime.schedule import Schedule, build_schedule, cluster_steps
from lenbatch_study.runtime.transport import Channel, DrafterGroup, DrafterLink, TargetLink, weights_checksum

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


def _reference_point(setup: RunSetup, runner: StepRunner, *, role: str) -> tuple[dict[str, Any], float]:
    """One reference point (:mod:`lenbatch_study.runtime.reference`) of this rank and the seconds it added: the
    single process times both roles; in a pipelined run target rank 0 and the drafter rank time theirs in
    turn while every rank waits at the reference group's barriers (``{}`` on the other target ranks)."""
    if setup.world_size == 1:
        return reference.measure(runner, setup.params, roles=reference.ROLES)
    import torch.distributed as dist

    # node 0's drafter and target rank 0 time theirs (the other nodes' drafters only wait)
    mine = (role,) if (role == "drafter" and setup.rank == setup.params.train.nproc - 1) or setup.rank == 0 else ()
    return reference.measure(runner, setup.params, roles=mine,
                             wait=lambda: dist.barrier(group=setup.reference_group))


def _finish(setup: RunSetup, runner: StepRunner, rec: Recorder, states: list[Any], *,
            resumed_from: Optional[int], kernels: dict[str, Any], ref: Optional[dict[str, Any]] = None,
            target_peak: Optional[int] = None, checksums: Optional[list[int]] = None) -> dict[str, Any]:
    p = setup.params
    done = setup.schedule[-1].step + 1 if setup.schedule else 0
    if resumed_from == done and summary_problem(setup.summary) is None:
        # resumed a run that had already finished: nothing trained, nothing to rewrite (its summary keeps
        # the throughput its last session measured)
        rec.close()
        log.info("%s: the checkpoint is at the last planned step (%d): the run is complete, %s left as it is",
                 setup.strategy, done, setup.summary)
        return read_json(setup.summary, rerun=f"lenbatch train --out {setup.final or setup.out}")
    save_checkpoint(setup.checkpoint, runner=runner, step=done, sampler_states=states, fp=setup.fp,
                    log_sha256=rec.log_sha256())
    summary = rec.summary(params=p, strategy=setup.strategy, warmup=p.train.warmup_steps,
                          world_size=setup.world_size, target_ranks=setup.target_ranks, resumed_from=resumed_from,
                          total_steps=len(setup.schedule), machine=fingerprint_machine(threads=p.train.threads),
                          reference=ref, device=device_report(setup.params, lengths=setup.lengths, batches=[s.indices for s in setup.schedule],
                                                 device=setup.device, world_size=setup.world_size, kernels=kernels,
                                                 target_peak=target_peak),
                          nodes=p.train.nodes, weights_checksums=checksums)
    rec.close()
    write_resolved(p, setup.out)
    # last, whole or not at all: a summary marks a complete run (a failure before it leaves the checkpoint)
    write_atomic(setup.summary, json.dumps(summary, indent=2) + "\n")
    return summary


def _periodic_checkpoint(setup: RunSetup, runner: StepRunner, rec: Recorder, *, done: int, before: int) -> float:
    """Write the periodic checkpoint at ``done`` trained global steps (the schedule's first ``done``, and no
    other) when a multiple of ``train.checkpoint_every`` lies in ``(before, done]``; returns the seconds it
    took (0.0 when none was due). The caller takes them off its step clock: a checkpoint is not part of a
    step's cost (~6 GB per write on the study's 8 GPUs: a 0.5-1% bias on the strategies that happen to
    cross one more)."""
    every = setup.params.train.checkpoint_every
    if not every or done // every == before // every:
        return 0.0
    c0 = time.perf_counter()
    save_checkpoint(setup.checkpoint, runner=runner, step=done,
                    sampler_states=setup.schedule.sampler_states(done), fp=setup.fp,
                    log_sha256=rec.log_sha256())
    return time.perf_counter() - c0


def run_single(setup: RunSetup) -> Optional[dict[str, Any]]:
    """One process: target forward then drafter step, batch after batch; None when it stopped on a signal."""
    p = setup.params
    runner = StepRunner(p, device=setup.device)
    data = read_dataset(setup.data, setup.lengths)
    start, resumed_from, kept = 0, None, None
    if setup.resume:
        start, _, kept, _ = resume_point(setup, runner)
        resumed_from = start if setup.resume else None
    rec = Recorder(setup.steps_log, kept=kept)
    useful_done = sum(r["useful_tokens"] for r in rec.rows)
    # outside the measured steps: before the first and after the last
    ref_start, ref_s = _reference_point(setup, runner, role="both") if start < len(setup.schedule) else (None, 0.0)
    t_start = time.perf_counter()
    paused = ck_s = 0.0  # checkpoint seconds: all so far (off the clock "t"), the last one (in the next row)
    for step in setup.schedule[start:]:
        idx = step.indices
        batch = collate(data.samples(idx), layout=setup.schedule.plan_strategy, spec=setup.schedule.spec, indices=idx)
        feats, t_s = runner.target_step(batch)
        t_cpu = runner.last_cpu_s
        loss, d_s = runner.drafter_step(batch, feats, step=step.step, epoch=step.epoch)
        useful_done += batch.useful_tokens
        t = time.perf_counter() - t_start - paused
        rec.add(step_row(step, batch, target_s=t_s, credit_s=0.0, wait_s=0.0, drafter_s=d_s, loss=loss, t=t,
                          runner=runner, target_cpu_s=t_cpu, compile_s=runner.last_compile_s, checkpoint_s=ck_s))
        progress(step, len(setup.schedule), loss, useful_done, t)
        ck_s = _periodic_checkpoint(setup, runner, rec, done=step.step + 1, before=step.step)
        paused += ck_s
        if setup.stop.signum and step.step + 1 < len(setup.schedule):
            stop_here(setup, runner, rec, done=step.step + 1, written=ck_s > 0)
            return None
    ref = None
    if ref_start is not None:
        ref_end, end_s = _reference_point(setup, runner, role="both")
        ref = reference.record(p, ref_start, ref_end, seconds=ref_s + end_s)
    return _finish(setup, runner, rec, setup.schedule.sampler_states(len(setup.schedule)), resumed_from=resumed_from,
                   kernels=runner.kernel_report(), ref=ref, target_peak=peak_memory_bytes(setup.device))


def run_target_rank(setup: RunSetup, comm_device: torch.device) -> None:
    """Compute features of this rank's batches and stream them to the drafter rank under credits
    (:class:`lenbatch_study.runtime.transport.TargetLink`)."""
    p = setup.params
    q = p.train.queue_size
    assert setup.roles is not None
    runner = StepRunner(p, device=setup.device, role="target")
    data = read_dataset(setup.data, setup.lengths)
    start, _, _ = share_resume(setup, None)
    mine = [s for s in setup.schedule[start:] if s.rank == setup.roles.target_index]
    link = TargetLink(setup.channel, dst=setup.roles.drafter_process, queue_size=q, comm_device=comm_device)
    timed = start < len(setup.schedule)  # every rank knows start: all skip the reference alike
    ref_start = _reference_point(setup, runner, role="target")[0] if timed else {}
    t_start = time.perf_counter()
    useful_done = 0
    for step in mine:
        if link.stopped:  # the drafter stopped on a signal (a credit said so): it trains no more batches
            break
        idx = step.indices
        batch = collate(data.samples(idx), layout=setup.schedule.plan_strategy, spec=setup.schedule.spec, indices=idx)
        feats, t_s = runner.target_step(batch)
        credit_s = link.wait_for_room()  # the drafter is the bottleneck when this grows
        if link.stopped:
            break
        meta = [step.epoch, step.step, int(t_s * 1e9), int(credit_s * 1e9), int(runner.last_cpu_s * 1e9),
                int(runner.last_compile_s * 1e9), peak_memory_bytes(setup.device) or 0]
        link.send(batch, feats, meta=meta, stop=setup.stop.signum)
        useful_done += batch.useful_tokens
        if setup.rank == 0:
            progress(step, len(setup.schedule), link.last_loss, useful_done, time.perf_counter() - t_start,
                      target_ranks=setup.target_ranks)
    link.end()
    link.drain()
    if agree_stopped(setup, False):
        return
    ref_points = None
    if timed:  # the drafter rank records target rank 0's reference times with its own
        ref_points = (ref_start, _reference_point(setup, runner, role="target")[0])
    import torch.distributed as dist

    # and target rank 0's kernels: the drafter rank, which writes the summary, runs none of its own
    dist.broadcast_object_list([(ref_points, runner.kernel_report())], src=0, group=setup.reference_group)


def run_drafter_rank(setup: RunSetup, comm_device: torch.device) -> Optional[dict[str, Any]]:
    """Receive this node's batches in schedule order, train, measure, checkpoint; credit each batch on receipt
    (:class:`lenbatch_study.runtime.transport.DrafterLink`). On several nodes each step is a cluster step
    (:func:`lenbatch_study.runtime.schedule.cluster_steps`): the drafters reduce their gradients
    (:class:`lenbatch_study.runtime.transport.DrafterGroup`), then share their rows and weight checksums;
    node 0's drafter writes the rows in global step order and returns the summary (the others None)."""
    p = setup.params
    roles, group = setup.roles, setup.drafters
    assert roles is not None
    runner = StepRunner(p, device=setup.device, role="drafter")
    if group is not None:
        group.module = runner.drafter
    start, _, kept = share_resume(setup, runner)
    resumed_from = start if setup.resume else None
    rec = Recorder(setup.steps_log, kept=kept) if roles.writes else None
    link = DrafterLink(setup.channel, comm_device=comm_device)
    last_loss = float("nan")
    timed = start < len(setup.schedule)
    if group is not None:  # built from one seed, or restored from node 0's checkpoint: the same weights
        group.share(None, weights_checksum(runner.drafter), step=-1)
    # outside the measured steps: before the first and after the last
    ref_start, ref_s = _reference_point(setup, runner, role="drafter") if timed else ({}, 0.0)
    target_peak = 0  # the largest peak device memory any target rank reported (bytes; 0 on CPU)
    t_start = time.perf_counter()
    paused = ck_s = 0.0  # checkpoint seconds: all so far (off the clock "t"), the last one (in the next row)
    pending: dict[int, dict[str, Any]] = {}  # rows waiting for an earlier global step's row (node 0)
    done = settled = start  # global steps written (the schedule's first ``done``); at the last prefix point
    # the cluster steps trained before ``start``: the most steps any node trained (a checkpoint's steps are a
    # prefix of the schedule, so the nodes' counts differ only in the last round, where some ran out)
    first_cluster = max(np.bincount([s.rank // roles.per_node for s in setup.schedule[:start]],
                                    minlength=roles.nodes), default=0)
    checksums: list[int] = []
    stopped = False
    for c, cluster in enumerate(cluster_steps(setup.schedule[start:], nodes=roles.nodes,
                                              ranks_per_node=roles.per_node), start=first_cluster):
        step = cluster[roles.node]
        row = None
        reduce = group.reduce if group is not None else None
        peak = 0
        if step is not None:
            t0 = time.perf_counter()
            # gloo on a GPU run (ranks sharing a GPU): staged through the host, moved to the device in recv
            got = link.recv(roles.target_process(step.rank), step=step.step, last_loss=last_loss,
                            device=setup.device)
            assert got is not None, f"target rank {step.rank} ended its stream before step {step.step}"
            batch, feats, meta = got
            setup.stop.note(link.last_stop)  # a target rank's signal reaches its drafter with its batch
            wait_s = time.perf_counter() - t0
            epoch, gstep, t_ns, credit_ns, t_cpu_ns, compile_ns, peak, stage_ns = meta
            assert (epoch, gstep) == (step.epoch, step.step), f"got step {gstep} of epoch {epoch}, expected {step}"
            if not np.array_equal(batch.indices.cpu().numpy(), step.indices):
                raise AssertionError(f"step {step.step}: received a batch other than the planned one")
            loss, d_s = runner.drafter_step(batch, feats, step=step.step, epoch=step.epoch, reduce=reduce)
            last_loss = loss
            t = time.perf_counter() - t_start - paused
            row = step_row(step, batch, target_s=t_ns / 1e9, credit_s=credit_ns / 1e9, wait_s=wait_s,
                           drafter_s=d_s, loss=loss, t=t, runner=runner, target_cpu_s=t_cpu_ns / 1e9,
                           compile_s=compile_ns / 1e9, stage_s=stage_ns / 1e9, checkpoint_s=ck_s,
                           transport=(link.last_transfer_s, link.last_bytes))
        else:
            assert reduce is not None, "one node: every step has its batch"
            runner.drafter_idle_step(reduce=reduce)
        rows = [row]
        if group is not None:
            if row is not None:
                row.update(node=roles.node, cluster_step=c, allreduce_s=round(group.last_allreduce_s, 6),
                           cluster_wait_s=round(group.last_wait_s, 6))
            # a stop signal of any drafter (or of its target ranks) travels with the rows: all stop alike
            shared = group.share(row, weights_checksum(runner.drafter), (peak, setup.stop.signum), step=c)
            t = time.perf_counter() - t_start - paused  # the cluster step ends for every node here
            rows = [None if r is None else dict(r, t=round(t, 6)) for r, _, _ in shared]
            peak = max(x[0] for _, _, x in shared)
            asked = max(x[1] for _, _, x in shared)
            setup.stop.note(asked)
            checksums = [x for _, x, _ in shared]
        else:
            asked = setup.stop.signum
        target_peak = max(target_peak, peak)
        ck_s = 0.0
        for r in rows:  # every drafter follows the prefix (the rows are shared), node 0's writes it
            if r is not None:
                pending[r["step"]] = r
        while done in pending:
            r = pending.pop(done)
            if rec is not None:
                rec.add(r)
            done += 1
        if pending:
            continue
        # the steps trained are exactly the schedule's first ``done``: a checkpoint may be written here
        if rec is not None:
            ck_s = _periodic_checkpoint(setup, runner, rec, done=done, before=settled)
            paused += ck_s
        settled = done
        if asked and done < len(setup.schedule):  # every drafter decides it on the same shared values
            stopped = True
            if rec is not None:
                stop_here(setup, runner, rec, done=done, written=ck_s > 0)
            break
    # what the target ranks still sent (none when the run ended at its last step), then their end of stream
    link.stopping = stopped
    for k in range(roles.per_node):
        left = link.drain(roles.target_process(roles.node * roles.per_node + k))
        assert stopped or left == 0, f"target rank {k} sent {left} batches past the last planned step"
    if agree_stopped(setup, stopped):
        link.close()
        return None
    assert not pending, f"steps {sorted(pending)} were trained but an earlier one was not"
    import torch.distributed as dist

    ref = None
    if timed:
        ref_end, end_s = _reference_point(setup, runner, role="drafter")
    got: list[Any] = [None]
    dist.broadcast_object_list(got, src=0, group=setup.reference_group)  # every rank, timed or not
    target_points, kernels = got[0]
    summary = None
    if rec is not None:
        if timed:
            target_start, target_end = target_points
            ref = reference.record(p, {**target_start, **ref_start}, {**target_end, **ref_end},
                                   seconds=ref_s + end_s)
        summary = _finish(setup, runner, rec, setup.schedule.sampler_states(len(setup.schedule)),
                          resumed_from=resumed_from, kernels=kernels, ref=ref, target_peak=target_peak or None,
                          checksums=checksums or None)
    link.close()
    return summary


# --------------------------------------------------------------------------- the stage


def _commit(setup: RunSetup) -> None:
    """Swap the complete run in the partial folder into OUT (one rename; the previous output goes)."""
    if setup.final is not None and setup.out != setup.final:
        commit_staged(setup.out, setup.final, stage="train", then="after that rerun with --resume to move it in")
        setup.out = setup.final


def check_request(*, strategy: str, max_steps: Optional[int]) -> None:
    """Refuse a strategy or step limit that cannot run (``ValueError`` naming the fix)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"--max-steps must be >= 1, got {max_steps}")


def train(*, params: Params, strategy: str, data: str | Path, out: str | Path, boundaries: Optional[str] = None,
          max_steps: Optional[int] = None, resume: bool = False) -> int:
    """``lenbatch train`` in this process (one of torchrun's, or the only one with ``train.nproc: 1``):
    trains ``strategy`` until ``train.useful_tokens`` (or ``max_steps`` global steps), writing ``out``
    on the drafter rank, which holds ``out``'s writer lock until it returns. Returns the exit code."""
    with contextlib.ExitStack() as stack:
        try:
            return _train(stack, params=params, strategy=strategy, data=data, out=out, boundaries=boundaries,
                          max_steps=max_steps, resume=resume)
        except OSError as err:  # a full disk, a read-only folder: one line naming the file, never a traceback
            ck = partial_dir(Path(out)) / CHECKPOINT
            refused = write_failure(err, written=(out, ck.parent, lock_path(out)))
            if refused is None:
                raise
            way = (f"rerun with --resume to continue from {ck}" if ck.exists() else
                   "rerun (this run saved no checkpoint to resume)")
            raise write_error(refused, path=ck.parent if ck.parent.exists() else out,
                              then=f"{out} is as it was; after that {way}") from None


def _train(stack: contextlib.ExitStack, *, params: Params, strategy: str, data: str | Path, out: str | Path,
           boundaries: Optional[str], max_steps: Optional[int], resume: bool) -> int:
    check_request(strategy=strategy, max_steps=max_steps)
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
    too_long = int((lengths > params.batching.token_budget).sum())
    if too_long:
        raise ValueError(f"{too_long} samples are longer than batching.token_budget={params.batching.token_budget}; "
                         "raise the budget or lower data.max_len and re-tokenize")
    target_ranks = max(1, nproc - 1) * nodes  # the plan is sharded over every node's target ranks
    device = resolve_device(params.train.device, int(os.environ.get("LOCAL_RANK", "0")))
    schedule = build_schedule(lengths, strategy=strategy, params=params, edges=edges, target_ranks=target_ranks,
                              useful_tokens=params.train.useful_tokens, max_steps=max_steps)
    if device.type == "cuda":  # refuse before loading anything a setting whose ranks cannot fit
        from lenbatch_study.models.memory import check_fits, plan_memory_shape

        check_fits(params, device_bytes=torch.cuda.get_device_properties(device).total_memory,
                   ranks_per_device=ranks_per_device(world), single_process=world == 1,
                   **plan_memory_shape(params, lengths, [s.indices for s in schedule]))
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
    setup = RunSetup(params, strategy, data, work, edges, lengths, schedule, target_ranks, world, rank, device,
                     resume, fp, final=out, roles=roles, stop=stop)
    log.info("%s: %d steps planned (%s useful tokens, %d target rank(s) + 1 drafter %s, %s)", strategy,
             len(schedule), f"{sum(s.useful for s in schedule):,}", target_ranks,
             "rank" if world > 1 else "in the same process", device)
    if nodes > 1:
        log.info("%d nodes: node %d of this process (rank %d: %s); the %d drafters train one model", nodes,
                 roles.node, rank, "drafter" if roles.is_drafter else f"target rank {roles.target_index}", nodes)
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


__all__ = ["STOPPED_EXIT", "check_request", "progress_line", "stopped_on_signal", "train"]
