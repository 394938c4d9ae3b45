"""Step records of a training run: ``steps.jsonl`` (one line per step) and ``summary.json``.

:class:`Recorder` writes the lines (flushed per step, digested for the checkpoint) and the summary
(post-warm-up pipeline throughput, padding efficiency, loss curve) on the measuring rank;
:func:`resumed_log` keeps a resumed run's earlier lines; :func:`step_row` is one line's fields and
:func:`batch_hash` the hash that ties a line to the planned batch; :func:`progress_line` is a step's log line.
Used by :mod:`lenbatch_study.stages.train`, which names the files (:mod:`lenbatch_study.pipeline.artifacts.train_runs`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
import zlib
from pathlib import Path
from typing import Any, Optional, Protocol

import numpy as np

from lenbatch_study.runtime.checkpoint import check_log
from lenbatch.loading.collate import Batch
from lenbatch_study.core.config import Params
from lenbatch_study.core.log import get_logger
from lenbatch_study.runtime.runner import StepRunner, peak_memory_bytes, ranks_per_device
from lenbatch_study.core.cpu import steps_cpu_share

log = get_logger("train")
LOSS_CURVE_POINTS = 500  # loss curve in summary.json is downsampled to at most this many points


class StepLike(Protocol):
    """What a step record reads of a scheduled step (the schedule's own type lives with the schedule)."""

    step: int
    epoch: int
    rank: int
    indices: np.ndarray


def batch_hash(indices: np.ndarray) -> int:
    """CRC-32 of the batch's dataset indices (int64): the ``batch_hash`` of a ``steps.jsonl`` line. O(batch)."""
    return zlib.crc32(np.ascontiguousarray(indices, dtype=np.int64).tobytes())


def resumed_log(path: Path, state: dict[str, Any]) -> list[str]:
    """The lines of the step log at ``path`` a resume keeps: those of the steps the checkpoint covers (a killed
    run may have logged steps past it, and cut its last line short), checked to be the ones written beside
    that checkpoint (:func:`lenbatch_study.runtime.checkpoint.check_log`). Reads only; O(log size)."""
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
    """The step log at ``path``, one line per step (flushed per step), and the run's summary
    (:meth:`summary`) on the measuring rank.

    ``kept``: the lines of a resumed run's earlier steps (:func:`resumed_log`), rewritten first.
    ``log_sha256()``: the digest of every line written so far, which each checkpoint records. Each line
    carries its ``session`` (0 for the first run, +1 per resume): a line's clock ``t`` counts from its
    session's start, so the summary measures every session's post-warm-up steps on their own clock.
    """

    def __init__(self, path: Path, *, kept: Optional[list[str]]) -> None:
        self.path = path
        kept = kept or []
        self.rows: list[dict[str, Any]] = [json.loads(line) for line in kept]
        self.sha = hashlib.sha256()
        self.session_start = len(self.rows)
        self.session = 1 + max((int(r.get("session", 0)) for r in self.rows), default=-1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # the kept lines replace the log whole (temp file, then rename): a failed write (a full disk) leaves the
        # log the checkpoint was written beside, so the run stays resumable
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            with tmp.open("w") as fh:
                for line in kept:
                    fh.write(line + "\n")
                    self.sha.update((line + "\n").encode())
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self.fh = self.path.open("a")

    def add(self, row: dict[str, Any]) -> None:
        row = {**row, "session": self.session}
        self.rows.append(row)
        line = json.dumps(row) + "\n"
        self.fh.write(line)
        self.fh.flush()
        self.sha.update(line.encode())

    def log_sha256(self) -> str:
        return self.sha.hexdigest()

    def summary(
        self,
        *,
        params: Params,
        strategy: str,
        warmup: int,
        world_size: int,
        target_ranks: int,
        resumed_from: Optional[int],
        total_steps: int,
        machine: Optional[dict[str, Any]] = None,
        reference: Optional[dict[str, Any]] = None,
        device: Optional[dict[str, Any]] = None,
        nodes: int = 1,
        weights_checksums: Optional[list[int]] = None,
    ) -> dict[str, Any]:
        """Post-warm-up pipeline throughput + whole-run padding efficiency and loss curve.

        Throughput = useful tokens of the measured steps / their wall seconds, where the measured steps are
        every session's steps after that session's first ``warmup`` (each resume warms up again: its first
        steps pay the start-up) and a session's wall runs from the end of its last warm-up step to its last
        step. A run resumed one step before its end thus keeps the throughput its first session measured
        instead of ending with none. O(steps).

        ``machine``: the fingerprint of the measuring machine (:mod:`lenbatch_study.core.machine`); ``reference``:
        this session's reference step (:mod:`lenbatch_study.runtime.reference`), both recorded as given.
        ``device``: what ran (``kernel_backend``: the kernels, lenbatch_study.models.kernels) and what it held
        (peak memory per role against the estimate), merged in as given. Triton compile/autotune seconds
        of the target steps are summed apart for the warm-up and the measured steps: a compile inside a
        measured step slows the throughput of that strategy alone.

        ``nodes`` > 1 (rows with ``node``, ``cluster_step``; a cluster step's rows share its end ``t``): the
        warm-up is each session's first ``warmup`` cluster steps, and the summary adds ``nodes``,
        ``per_node`` (each node's measured useful tokens and their rate over the common wall time: the
        useful_tokens_per_s of the run is their sum), ``allreduce_s_mean`` / ``cluster_wait_s_mean`` and
        ``weights_checksums`` (each drafter's after the last step: equal, or the run would have stopped)."""
        rows, session = self.rows, self.rows[self.session_start :]
        measured, wall = [], 0.0
        for part in _sessions(rows):
            if nodes > 1:
                c0 = part[0]["cluster_step"]
                warm = [r for r in part if r["cluster_step"] < c0 + warmup]
                meas = [r for r in part if r["cluster_step"] >= c0 + warmup]
                if meas:
                    measured += meas
                    wall += max(r["t"] for r in part) - (max(r["t"] for r in warm) if warm else 0.0)
            elif len(part) > warmup:
                t0 = part[warmup - 1]["t"] if warmup > 0 else 0.0  # "t": seconds since the session's start
                measured += part[warmup:]
                wall += part[-1]["t"] - t0
        wall = wall if measured else None
        useful_m = sum(r["useful_tokens"] for r in measured)
        computed_m = sum(r["computed_tokens"] for r in measured)
        useful = sum(r["useful_tokens"] for r in rows)
        computed = sum(r["computed_tokens"] for r in rows)
        stride = max(1, -(-len(rows) // LOSS_CURVE_POINTS))
        tail = rows[-max(1, min(20, len(rows) // 10)) :] if rows else []

        def mean(key: str, src: list[dict[str, Any]]) -> Optional[float]:
            return float(np.mean([r[key] for r in src])) if src else None

        return {
            "strategy": strategy,
            "world_size": world_size,
            "target_ranks": target_ranks,
            "steps": len(rows),
            "planned_steps": total_steps,
            "epochs": (rows[-1]["epoch"] + 1) if rows else 0,
            "useful_tokens": useful,
            "computed_tokens": computed,
            "padding_efficiency": useful / computed if computed else None,
            "warmup_steps_excluded": len(rows) - len(measured),
            "measured_steps": len(measured),
            "sessions": len(_sessions(rows)),
            "measured_wall_s": wall,
            "measured_useful_tokens": useful_m,
            "measured_computed_tokens": computed_m,
            "useful_tokens_per_s": useful_m / wall if wall else None,
            "computed_tokens_per_s": computed_m / wall if wall else None,
            "measured_padding_efficiency": useful_m / computed_m if computed_m else None,
            "session_wall_s": max(r["t"] for r in session) if session else 0.0,  # "t": from the session start
            "target_s_mean": mean("target_s", measured),
            "drafter_s_mean": mean("drafter_s", measured),
            "queue_wait_s_mean": mean("queue_wait_s", measured),
            "credit_wait_s_mean": mean("credit_wait_s", measured),
            "target_s_total": float(sum(r["target_s"] for r in measured)),
            "drafter_s_total": float(sum(r["drafter_s"] for r in measured)),
            "threads": params.train.threads,
            **{
                f"{role}_cpu_share": _none_if_nan(steps_cpu_share(measured, role, threads=params.train.threads))
                for role in ("target", "drafter")
            },
            "loss_curve": [[r["step"], r["loss"]] for r in rows[::stride]],
            "loss_curve_stride": stride,
            "first_loss": rows[0]["loss"] if rows else None,
            "final_loss": float(np.mean([r["loss"] for r in tail])) if tail else None,
            "final_loss_steps": len(tail),
            "sequences_without_anchor": int(sum(r.get("sequences_without_anchor", 0) for r in rows)),
            "resumed_from_step": resumed_from,
            "machine": machine,
            "reference": reference,
            "compile_s_warmup": float(sum(r.get("compile_s", 0.0) for part in _sessions(rows) for r in part[:warmup])),
            "compile_s_measured": float(sum(r.get("compile_s", 0.0) for r in measured)),
            "measured_steps_with_compile": int(sum(r.get("compile_s", 0.0) > 0 for r in measured)),
            # periodic checkpoints written inside the measured window, kept off its wall time ("t")
            "checkpoint_s_measured": float(sum(r.get("checkpoint_s", 0.0) for r in measured)),
            "checkpoints_measured": int(sum(r.get("checkpoint_s", 0.0) > 0 for r in measured)),
            # pipelined steps only (a run resumed from a checkpoint written before the run's shape was recorded
            # may mix them with single-process ones, which have none)
            "stage_s_mean": mean("stage_s", measured) if measured and all("stage_s" in r for r in measured) else None,
            # the features' transport to the drafter rank (pipelined runs recorded since it was measured)
            **{
                f"{k}_mean": mean(k, measured) if measured and all(k in r for r in measured) else None
                for k in ("transport_s", "transport_bytes")
            },
            **(_nodes_summary(measured, wall, nodes, weights_checksums, mean) if nodes > 1 else {}),
            **(device or {}),
            "params": params.to_dict(),
        }

    def close(self) -> None:
        self.fh.close()


def _nodes_summary(
    measured: list[dict[str, Any]], wall: Optional[float], nodes: int, checksums: Optional[list[int]], mean: Any
) -> dict[str, Any]:
    """The multi-node part of the summary (:meth:`Recorder.summary`)."""
    per_node = []
    for k in range(nodes):
        mine = [r for r in measured if r["node"] == k]
        useful = sum(r["useful_tokens"] for r in mine)
        per_node.append(
            {
                "node": k,
                "measured_steps": len(mine),
                "measured_useful_tokens": useful,
                "useful_tokens_per_s": useful / wall if wall else None,
                "drafter_s_mean": mean("drafter_s", mine),
                "target_s_mean": mean("target_s", mine),
            }
        )
    return {
        "nodes": nodes,
        "per_node": per_node,
        "allreduce_s_mean": mean("allreduce_s", measured),
        "cluster_wait_s_mean": mean("cluster_wait_s", measured),
        "weights_checksums": checksums,
    }


def _sessions(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``rows`` split into runs of one session each (lines written before sessions were recorded: one session)."""
    parts: list[list[dict[str, Any]]] = []
    for r in rows:
        if not parts or r.get("session", 0) != parts[-1][-1].get("session", 0):
            parts.append([])
        parts[-1].append(r)
    return parts


def _none_if_nan(x: float) -> Optional[float]:
    return None if math.isnan(x) else x


def step_row(
    step: StepLike,
    batch: Batch,
    *,
    target_s: float,
    credit_s: float,
    wait_s: float,
    drafter_s: float,
    loss: float,
    t: float,
    runner: StepRunner,
    target_cpu_s: float,
    compile_s: float = 0.0,
    stage_s: Optional[float] = None,
    checkpoint_s: float = 0.0,
    transport: Optional[tuple[float, int]] = None,
) -> dict[str, Any]:
    """One ``steps.jsonl`` line. ``compile_s``: Triton compile/autotune seconds inside the target step;
    ``stage_s``: the target rank's copy of the batch onto the data group's device (pipelined runs);
    ``transport``: (seconds, bytes) of the batch's transport to the drafter rank, its wait for the target's
    forward excluded (pipelined runs: ``transport_s``, ``transport_bytes``;
    :class:`lenbatch_study.runtime.transport.DrafterLink`);
    ``checkpoint_s``: seconds of the periodic checkpoint written between the previous row and this one,
    kept off the clock ``t`` (so off every measured wall time)."""
    out = runner.last_output
    extra = {} if stage_s is None else {"stage_s": round(stage_s, 6)}
    if transport is not None:
        extra.update(transport_s=round(float(transport[0]), 6), transport_bytes=int(transport[1]))
    return {
        "rank": step.rank,
        "step": step.step,
        "epoch": step.epoch,
        "sequences": batch.num_sequences,
        "length": batch.shape_length,
        "useful_tokens": batch.useful_tokens,
        "computed_tokens": batch.computed_tokens,
        "target_s": round(target_s, 6),
        "credit_wait_s": round(credit_s, 6),
        "queue_wait_s": round(wait_s, 6),
        "drafter_s": round(drafter_s, 6),
        "loss": loss,
        "t": round(t, 6),
        "batch_hash": batch_hash(step.indices),
        "target_cpu_s": round(target_cpu_s, 6),
        "drafter_cpu_s": round(runner.last_cpu_s, 6),
        "positions": out.positions if out else 0,
        "blocks": out.blocks if out else 0,
        "sequences_without_anchor": out.sequences_without_anchor if out else 0,
        "compile_s": round(compile_s, 6),
        "checkpoint_s": round(checkpoint_s, 6),
        **extra,
    }


def progress_line(step: StepLike, total: int, loss: float, useful_done: int, t: float, *, target_ranks: int = 1) -> str:
    """The progress line of ``step`` (of ``total``), ``t`` seconds in. ``loss`` NaN: none known yet ("pending":
    in a pipelined run target rank 0 shows the drafter's last loss, which comes back a few steps late).
    ``target_ranks`` > 1: ``useful_done`` counts rank 0's own batches, and the rate scales them by the target
    ranks, an estimate marked ``~`` (``summary.json`` has the exact numbers)."""
    shown = "pending" if np.isnan(loss) else f"{loss:.4f}"
    where = "" if target_ranks == 1 else f" on target rank 0 of {target_ranks}"
    rate = f"{'~' if target_ranks > 1 else ''}{useful_done * target_ranks / max(t, 1e-9):.0f}"
    return (
        f"step {step.step + 1}/{total} (epoch {step.epoch}): loss {shown}, {useful_done:,} useful tokens{where}, "
        f"{t:.1f} s, {rate} useful tok/s"
    )


def progress(step: StepLike, total: int, loss: float, useful_done: int, t: float, *, target_ranks: int = 1) -> None:
    every = max(1, total // 20)
    if step.step % every == 0 or step.step == total - 1:
        log.info("%s", progress_line(step, total, loss, useful_done, t, target_ranks=target_ranks))


def device_report(
    params: Params,
    *,
    lengths: Any,
    batches: list[Any],
    device: Any,
    world_size: int,
    kernels: dict[str, Any],
    target_peak: Optional[int],
) -> dict[str, Any]:
    """What a run ran and held: the target's kernels and Triton compile seconds (``kernels``:
    :meth:`StepRunner.kernel_report`), peak device memory per role (bytes; None on CPU) against
    :mod:`lenbatch_study.models.memory`'s estimate for the plan's ``batches`` (index arrays into ``lengths``)."""
    from lenbatch_study.models.memory import plan_memory_shape, rank_memory

    est_t, est_d = rank_memory(
        params,
        **plan_memory_shape(params, lengths, batches),
        host_queue=device.type == "cuda" and ranks_per_device(world_size) > 1,
    )
    return {
        "kernel_backend": kernels,
        "peak_memory_bytes": {"target": target_peak, "drafter": peak_memory_bytes(device)},
        "memory_estimate_bytes": {"target": est_t.total, "drafter": est_d.total},
    }


def log_summary(summary: dict[str, Any], path: Path, *, force: bool = False) -> None:
    """One line of the run ``summary`` written at ``path``."""
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
    logger.info(
        "%s: %d steps, %s useful tokens, padding efficiency %.3f, %s useful tok/s (post-warm-up), "
        "final loss %.4f -> %s",
        summary["strategy"],
        summary["steps"],
        f"{summary['useful_tokens']:,}",
        summary["padding_efficiency"] or float("nan"),
        f"{tps:,.0f}" if tps else "n/a",
        summary["final_loss"] or float("nan"),
        path,
    )


__all__ = [
    "LOSS_CURVE_POINTS",
    "Recorder",
    "batch_hash",
    "device_report",
    "log_summary",
    "progress",
    "progress_line",
    "resumed_log",
    "step_row",
]
