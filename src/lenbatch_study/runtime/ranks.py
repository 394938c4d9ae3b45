"""The loops of a training run's three roles (:mod:`lenbatch_study.stages.train` sets the run up and hands
them ``setup``, its ``RunSetup``: the run's files, schedule, roles, links, and ``read_data``/``finish``,
where the stage reads the dataset and writes the summary): :func:`run_single` (one process, both roles in
turn), :func:`run_target_rank` and :func:`run_drafter_rank` (a pipelined run).

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
"""

from __future__ import annotations

import time
from typing import Any, Optional

import numpy as np
import torch

from lenbatch.loading.collate import collate
from lenbatch_study.runtime import reference
from lenbatch_study.runtime.checkpoint import save_checkpoint
from lenbatch_study.runtime.records import Recorder, progress, step_row
from lenbatch_study.runtime.resume import resume_point, share_resume
from lenbatch_study.runtime.runner import StepRunner, peak_memory_bytes
from lenbatch_study.runtime.schedule import cluster_steps
from lenbatch_study.runtime.stopping import agree_stopped, stop_here
from lenbatch_study.runtime.transport import DrafterLink, TargetLink, weights_checksum


def reference_point(setup: Any, runner: StepRunner, *, role: str) -> tuple[dict[str, Any], float]:
    """One reference point (:mod:`lenbatch_study.runtime.reference`) of this rank and the seconds it added: the
    single process times both roles; in a pipelined run target rank 0 and the drafter rank time theirs in
    turn while every rank waits at the reference group's barriers (``{}`` on the other target ranks)."""
    if setup.world_size == 1:
        return reference.measure(runner, setup.params, roles=reference.ROLES)
    import torch.distributed as dist

    # node 0's drafter and target rank 0 time theirs (the other nodes' drafters only wait)
    mine = (role,) if (role == "drafter" and setup.rank == setup.params.train.nproc - 1) or setup.rank == 0 else ()
    return reference.measure(runner, setup.params, roles=mine, wait=lambda: dist.barrier(group=setup.reference_group))


def periodic_checkpoint(setup: Any, runner: StepRunner, rec: Recorder, *, done: int, before: int) -> float:
    """Write the periodic checkpoint at ``done`` trained global steps (the schedule's first ``done``, and no
    other) when a multiple of ``train.checkpoint_every`` lies in ``(before, done]``; returns the seconds it
    took (0.0 when none was due). The caller takes them off its step clock: a checkpoint is not part of a
    step's cost (~6 GB per write on the study's 8 GPUs: a 0.5-1% bias on the strategies that happen to
    cross one more)."""
    every = setup.params.train.checkpoint_every
    if not every or done // every == before // every:
        return 0.0
    c0 = time.perf_counter()
    save_checkpoint(
        setup.checkpoint,
        runner=runner,
        step=done,
        sampler_states=setup.schedule.sampler_states(done),
        fp=setup.fp,
        log_sha256=rec.log_sha256(),
    )
    return time.perf_counter() - c0


def run_single(setup: Any) -> Optional[dict[str, Any]]:
    """One process: target forward then drafter step, batch after batch; None when it stopped on a signal."""
    p = setup.params
    runner = StepRunner(p, device=setup.device)
    data = setup.read_data()
    start, resumed_from, kept = 0, None, None
    if setup.resume:
        start, _, kept, _ = resume_point(setup, runner)
        resumed_from = start if setup.resume else None
    rec = Recorder(setup.steps_log, kept=kept)
    useful_done = sum(r["useful_tokens"] for r in rec.rows)
    # outside the measured steps: before the first and after the last
    ref_start, ref_s = reference_point(setup, runner, role="both") if start < len(setup.schedule) else (None, 0.0)
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
        rec.add(
            step_row(
                step,
                batch,
                target_s=t_s,
                credit_s=0.0,
                wait_s=0.0,
                drafter_s=d_s,
                loss=loss,
                t=t,
                runner=runner,
                target_cpu_s=t_cpu,
                compile_s=runner.last_compile_s,
                checkpoint_s=ck_s,
            )
        )
        progress(step, len(setup.schedule), loss, useful_done, t)
        ck_s = periodic_checkpoint(setup, runner, rec, done=step.step + 1, before=step.step)
        paused += ck_s
        if setup.stop.signum and step.step + 1 < len(setup.schedule):
            stop_here(setup, runner, rec, done=step.step + 1, written=ck_s > 0)
            return None
    ref = None
    if ref_start is not None:
        ref_end, end_s = reference_point(setup, runner, role="both")
        ref = reference.record(p, ref_start, ref_end, seconds=ref_s + end_s)
    return setup.finish(
        runner,
        rec,
        setup.schedule.sampler_states(len(setup.schedule)),
        resumed_from=resumed_from,
        kernels=runner.kernel_report(),
        ref=ref,
        target_peak=peak_memory_bytes(setup.device),
    )


def run_target_rank(setup: Any, comm_device: torch.device) -> None:
    """Compute features of this rank's batches and stream them to the drafter rank under credits
    (:class:`lenbatch_study.runtime.transport.TargetLink`)."""
    p = setup.params
    q = p.train.queue_size
    assert setup.roles is not None
    runner = StepRunner(p, device=setup.device, role="target")
    data = setup.read_data()
    start, _, _ = share_resume(setup, None)
    mine = [s for s in setup.schedule[start:] if s.rank == setup.roles.target_index]
    link = TargetLink(setup.channel, dst=setup.roles.drafter_process, queue_size=q, comm_device=comm_device)
    timed = start < len(setup.schedule)  # every rank knows start: all skip the reference alike
    ref_start = reference_point(setup, runner, role="target")[0] if timed else {}
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
        meta = [
            step.epoch,
            step.step,
            int(t_s * 1e9),
            int(credit_s * 1e9),
            int(runner.last_cpu_s * 1e9),
            int(runner.last_compile_s * 1e9),
            peak_memory_bytes(setup.device) or 0,
        ]
        link.send(batch, feats, meta=meta, stop=setup.stop.signum)
        useful_done += batch.useful_tokens
        if setup.rank == 0:
            progress(
                step,
                len(setup.schedule),
                link.last_loss,
                useful_done,
                time.perf_counter() - t_start,
                target_ranks=setup.target_ranks,
            )
    link.end()
    link.drain()
    if agree_stopped(setup, False):
        return
    ref_points = None
    if timed:  # the drafter rank records target rank 0's reference times with its own
        ref_points = (ref_start, reference_point(setup, runner, role="target")[0])
    import torch.distributed as dist

    # and target rank 0's kernels: the drafter rank, which writes the summary, runs none of its own
    dist.broadcast_object_list([(ref_points, runner.kernel_report())], src=0, group=setup.reference_group)


def run_drafter_rank(setup: Any, comm_device: torch.device) -> Optional[dict[str, Any]]:
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
    ref_start, ref_s = reference_point(setup, runner, role="drafter") if timed else ({}, 0.0)
    target_peak = 0  # the largest peak device memory any target rank reported (bytes; 0 on CPU)
    t_start = time.perf_counter()
    paused = ck_s = 0.0  # checkpoint seconds: all so far (off the clock "t"), the last one (in the next row)
    pending: dict[int, dict[str, Any]] = {}  # rows waiting for an earlier global step's row (node 0)
    done = settled = start  # global steps written (the schedule's first ``done``); at the last prefix point
    # the cluster steps trained before ``start``: the most steps any node trained (a checkpoint's steps are a
    # prefix of the schedule, so the nodes' counts differ only in the last round, where some ran out)
    first_cluster = max(
        np.bincount([s.rank // roles.per_node for s in setup.schedule[:start]], minlength=roles.nodes), default=0
    )
    checksums: list[int] = []
    stopped = False
    for c, cluster in enumerate(
        cluster_steps(setup.schedule[start:], nodes=roles.nodes, ranks_per_node=roles.per_node), start=first_cluster
    ):
        step = cluster[roles.node]
        row = None
        reduce = group.reduce if group is not None else None
        peak = 0
        if step is not None:
            t0 = time.perf_counter()
            # gloo on a GPU run (ranks sharing a GPU): staged through the host, moved to the device in recv
            got = link.recv(roles.target_process(step.rank), step=step.step, last_loss=last_loss, device=setup.device)
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
            row = step_row(
                step,
                batch,
                target_s=t_ns / 1e9,
                credit_s=credit_ns / 1e9,
                wait_s=wait_s,
                drafter_s=d_s,
                loss=loss,
                t=t,
                runner=runner,
                target_cpu_s=t_cpu_ns / 1e9,
                compile_s=compile_ns / 1e9,
                stage_s=stage_ns / 1e9,
                checkpoint_s=ck_s,
                transport=(link.last_transfer_s, link.last_bytes),
            )
        else:
            assert reduce is not None, "one node: every step has its batch"
            runner.drafter_idle_step(reduce=reduce)
        rows = [row]
        if group is not None:
            if row is not None:
                row.update(
                    node=roles.node,
                    cluster_step=c,
                    allreduce_s=round(group.last_allreduce_s, 6),
                    cluster_wait_s=round(group.last_wait_s, 6),
                )
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
            ck_s = periodic_checkpoint(setup, runner, rec, done=done, before=settled)
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
        ref_end, end_s = reference_point(setup, runner, role="drafter")
    got: list[Any] = [None]
    dist.broadcast_object_list(got, src=0, group=setup.reference_group)  # every rank, timed or not
    target_points, kernels = got[0]
    summary = None
    if rec is not None:
        if timed:
            target_start, target_end = target_points
            ref = reference.record(p, {**target_start, **ref_start}, {**target_end, **ref_end}, seconds=ref_s + end_s)
        summary = setup.finish(
            runner,
            rec,
            setup.schedule.sampler_states(len(setup.schedule)),
            resumed_from=resumed_from,
            kernels=kernels,
            ref=ref,
            target_peak=target_peak or None,
            checksums=checksums or None,
        )
    link.close()
    return summary


__all__ = ["periodic_checkpoint", "reference_point", "run_drafter_rank", "run_single", "run_target_rank"]
