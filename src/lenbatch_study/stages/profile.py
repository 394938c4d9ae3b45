"""Profile stage: time the target step and the drafter step on a grid of batch shapes.

The step-time model (:mod:`lenbatch_study.analysis.stepmodel`) is fitted on these timings, never on
the run it predicts. Shapes:

- padded: ``sequences`` samples padded to ``length`` tokens (sequences x length
  computed tokens), for every batch size and length of the ``profile`` section that
  fits the token budget and max_batch_size, plus the largest batch that fills the
  budget at each length (the shape greedy packing produces most);
- packed: one row of ``length`` tokens holding ``sequences`` sequences, for every
  row length of the grid that fits the budget, plus the budget itself.

Timing goes in passes over the whole grid: ``profile.warmup`` untimed passes, then
``profile.repeats`` timed ones, and the median per point is kept. Passes (rather than
all repeats of one point in a row) spread a slow drift of the machine's speed over every
shape alike. A point whose steps have taken ``profile.max_point_seconds`` is not repeated.
Target and drafter are timed on the same model, threads and device as training
(``StepRunner``):

- alone (``<role>_seconds_*``): the step with nothing else running;
- busy (``<role>_busy_seconds_*``, pipelined runs with ``profile.concurrent``): the
  step while the other role steps at the same time in its own process, as happens in a
  pipelined run whenever both are working. They share cores, caches and memory
  bandwidth, so busy is slower on a CPU; the prediction blends the two by the run's
  overlap (:func:`lenbatch_study.analysis.step_timeline.blended_pipeline`).

The features' transport (lockstep profile of a pipelined run): after the timed passes the two role processes
join a two-rank process group as a training's target and drafter ranks do (gloo, through the host where the
roles share a device or run on CPU; NCCL where each has its own GPU) and the target sends each grid point's
batch and features ``profile.repeats`` times through the training's own links
(:mod:`lenbatch_study.runtime.transport`): ``transport_bytes`` (on the data group), ``transport_seconds_all``
(the drafter rank's receive, from the header's arrival to the features on its device) and
``transport_stage_s_all`` (the target rank's copy onto the data group's device, ~0 on CPU) per row, and
``transport_backend``. Compare fits seconds per byte on them (:func:`lenbatch_study.analysis.stepmodel.fit_transport`)
and adds the receive to the drafter's critical path of the separate trainings.

Each row also keeps the process CPU seconds of every timed step: a step that got much less
than its cores (:func:`lenbatch_study.core.cpu.cpu_share`) was slowed by other work on the machine.

``grid.json`` is ``{"machine": the fingerprint of the machine that timed it
(:mod:`lenbatch_study.core.machine`), "reference": the reference step timed before the first pass and after
the last, each role alone (:mod:`lenbatch_study.runtime.reference`; compare rescales the grid by it), "points":
one row per grid point}``.

Cost: (warmup + repeats) passes x grid points x (target + drafter + max of the two);
about 90 s for the CPU default's 20 points, plus the reference step's few seconds; the transport
repeats x points sends plus one, ~1 s on the CPU default (~17 MB per 16,384-token step over loopback gloo).
"""

from __future__ import annotations

import json
import os
import queue as _queue
import time
from pathlib import Path

import numpy as np

from lenbatch_study.runtime.grid_batches import grid_points, make_batch
from lenbatch_study.runtime.profile_transport import (
    BARRIER_TIMEOUT_S,
    free_port,
    measure_transport,
    role_devices,
    transport_backend,
)
from lenbatch_study.core.config import Params
from lenbatch_study.pipeline.artifacts.profile_grid import GRID
from lenbatch_study.pipeline.artifacts.writing import write_resolved
from lenbatch_study.core.log import get_logger
from lenbatch_study.analysis.shapes import batch_columns, drafter_work, grid_shape
from lenbatch_study.models.anchors import CE_CHUNK_ROWS
from lenbatch_study.core.cpu import CPU_SHARE_WARN, grid_cpu_share
from lenbatch_study.core.machine import fingerprint

log = get_logger("profile")


class _Progress:
    """The log's progress lines: ``point k/N`` over all passes' grid points (at most one line per 10 s) and one
    line per pass (what ``tail -f`` of the job's log shows). Logging between points, never inside a timed
    step."""

    def __init__(self, passes: int, points: int, t0: float) -> None:
        self.passes, self.points, self.t0, self.last = passes, points, t0, t0

    def point(self, p: int, i: int) -> None:
        now = time.perf_counter()
        if now - self.last >= 10:
            self.last = now
            log.info(
                "pass %d/%d, point %d/%d, %.1f s elapsed",
                p + 1,
                self.passes,
                p * self.points + i + 1,
                self.passes * self.points,
                now - self.t0,
            )

    def pass_done(self, p: int, timed: bool) -> None:
        log.info(
            "pass %d/%d (%s) over %d grid points done, point %d/%d, %.1f s elapsed",
            p + 1,
            self.passes,
            "timed" if timed else "warm-up",
            self.points,
            (p + 1) * self.points,
            self.passes * self.points,
            time.perf_counter() - self.t0,
        )


def time_point(
    runner, batch, *, warmup: int, repeats: int, max_seconds: float
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Target and drafter seconds, then their process CPU seconds, of ``repeats`` timed steps
    after ``warmup`` untimed ones.

    Stops early once this point has taken ``max_seconds`` (a 10 s step is timed once:
    its run-to-run noise is small next to its length, and the grid must stay short).
    At least one step is always kept: if the budget ran out during warm-up, the last
    warm-up step is the timing.
    """
    runs: list[tuple[float, float, float, float]] = []
    spent = 0.0
    for _ in range(warmup + repeats):
        feats, t_s = runner.target_step(batch)
        t_cpu = runner.last_cpu_s
        _, d_s = runner.drafter_step(batch, feats)
        runs.append((float(t_s), float(d_s), float(t_cpu), float(runner.last_cpu_s)))
        spent += float(t_s) + float(d_s)
        if spent >= max_seconds:
            break
    timed = runs[warmup:] if len(runs) > warmup else runs[-1:]
    return [r[0] for r in timed], [r[1] for r in timed], [r[2] for r in timed], [r[3] for r in timed]


def _drafter_work(batch, params: Params, *, steps: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean (positions, context tokens, lm_head chunks) the drafter worked on over the timed steps of a grid
    point."""
    lengths = batch.lengths.numpy()
    rows, starts = (t.numpy() for t in batch.seq_rows_starts())
    lm = batch.loss_mask.numpy()
    masks = [lm[r, s : s + n] for r, s, n in zip(rows, starts, lengths)]
    work = [
        drafter_work(
            lengths,
            masks,
            batch.indices.numpy(),
            anchors_per_seq=params.drafter.anchors_per_seq,
            block_size=params.drafter.block_size,
            seed=params.batching.seed,
            epoch=0,
            step=st,
        )
        for st in steps
    ]
    positions = np.array([w[0] for w in work], dtype=np.float64)
    return (
        np.array([positions.mean()]),
        np.array([np.mean([w[1] for w in work])]),
        np.array([np.ceil(positions / CE_CHUNK_ROWS).mean()]),
    )


def _passes(params: Params) -> list[bool]:
    """Pass schedule over the whole grid: False = an untimed warm-up pass, True = a timed one.

    Passes go over every point before any point is repeated, so a slow drift of the
    machine's speed (other tenants, clocks) spreads over all shapes alike instead of
    biasing the shapes timed last; the median over passes is kept.
    """
    return [False] * params.profile.warmup + [True] * params.profile.repeats


def role_batches(role: str, params: Params, device) -> list[tuple]:
    """(batch, features) of every grid point for ``role``: the batch as collated on the host (the
    runner moves it, as training does); the drafter's stand-in features made on ``device`` itself --
    its cost does not depend on their values, and a runner must never be handed host features
    against device weights."""
    import torch

    fdim = len(params.model.target_layers) * params.model.hidden_size
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[params.model.dtype]
    gen = torch.Generator().manual_seed(params.batching.seed)
    out = []
    for i, (layout, n, m) in enumerate(grid_points(params, quiet=True)):
        batch = make_batch(
            layout, grid_shape(layout, n, m, max_len=params.data.max_len), params, seed=params.batching.seed + i
        )
        feats = None
        if role == "drafter":
            feats = torch.randn(*batch.input_ids.shape, fdim, generator=gen).to(device=device, dtype=dtype)
        out.append((batch, feats))
    return out


def _role_worker(
    role: str,
    params: Params,
    device: str,
    queue,
    barrier,
    timed_points,
    spent,
    parent: int | None = None,
    transport: tuple[int, str] | None = None,
) -> None:
    """One role's timings over the whole grid, in its own process (spawned by :func:`profile`).

    Lockstep with the other role, pass by pass (:func:`_passes`), point by point: (1) the
    target steps alone while the drafter waits, (2) the drafter alone while the target
    waits, (3) both step at once on the same shape, the one that finishes first stepping
    on, untimed, until the other is done too, so every "busy" timing is taken with the
    other role working, as in the pipelined run. ``timed_points[r]`` counts the (pass,
    point) pairs role r has finished phase (3) of; ``spent[r * points + i]`` is the seconds
    role r has stepped on point i, warm-up included (both roles read both, so they skip
    points alike). ``transport`` (port, backend): then the features' transport is measured
    (:func:`measure_transport`) after the timed passes.
    """
    from lenbatch_study.runtime import reference
    from lenbatch_study.runtime.lifetime import die_with_parent
    from lenbatch_study.runtime.runner import StepRunner, configure_process

    die_with_parent(parent)  # a profile killed by a timeout must not leave this worker holding the GPU
    configure_process(params)
    runner = StepRunner(params, device=device, role=role)
    me, other = (0, 1) if role == "target" else (1, 0)
    pts = grid_points(params, quiet=True)
    batches = role_batches(role, params, runner.device)
    out = [{"alone": [], "alone_cpu": [], "busy": [], "busy_cpu": [], "steps": [], "compile": []} for _ in pts]
    passes = _passes(params)
    # the reference step, each role alone in turn (lenbatch_study.runtime.reference)
    ref_start, ref_s = reference.measure(runner, params, roles=(role,), wait=barrier.wait)
    t0, pair = time.perf_counter(), 0
    note = _Progress(len(passes), len(pts), t0)
    for p, timed in enumerate(passes):
        for i, (batch, feats) in enumerate(batches):
            row = out[i]
            # a point whose steps have taken max_point_seconds (both roles) is not repeated once timed
            skip = bool(timed and row["alone"] and spent[i] + spent[len(pts) + i] >= params.profile.max_point_seconds)
            # a warm-up pass only needs each role to have run the shape once: both at once
            for phase in ("target", "drafter", "busy") if timed else ("busy",):
                barrier.wait()
                if skip or (phase != "busy" and phase != role):
                    continue
                _, secs = runner.target_step(batch) if role == "target" else runner.drafter_step(batch, feats)
                spent[me * len(pts) + i] += float(secs)
                if timed:
                    key = "alone" if phase == role else "busy"
                    row[key].append(float(secs))
                    row[key + "_cpu"].append(float(runner.last_cpu_s))
                    row["steps"].append(runner.steps - 1)
                    if role == "target":
                        row["compile"].append(float(runner.last_compile_s))
            pair += 1
            if not skip:
                with timed_points.get_lock():
                    timed_points[me] = pair
                while timed_points[other] < pair:  # keep the other role's busy step company
                    runner.target_step(batch) if role == "target" else runner.drafter_step(batch, feats)
            if role == "drafter":
                note.point(p, i)
        if role == "drafter":
            note.pass_done(p, timed)
    moved = (
        measure_transport(role, params, runner, batches, port=transport[0], backend=transport[1])
        if transport
        else [{} for _ in pts]
    )
    for row, m in zip(out, moved):
        row["transport"] = m
    ref_end, end_s = reference.measure(runner, params, roles=(role,), wait=barrier.wait)
    ref = (ref_start, ref_end, ref_s + end_s)
    queue.put(
        (
            role,
            out if role == "drafter" else [{k: v for k, v in r.items() if k != "steps"} for r in out],
            ref,
            runner.kernels,
        )
    )


def profile(params: Params, *, device: str = "cpu") -> dict:
    """Time every grid point: ``{"machine": fingerprint, "reference": the reference step's record
    (:mod:`lenbatch_study.runtime.reference`), "points": one dict per point (see module docstring)}``.
    Cost: see module docstring.

    ``device`` is a ``train.device`` name (auto, cpu, cuda), resolved as the run resolves it:
    the target on the first local device, the drafter on the last (``train.nproc - 1``).

    With ``profile.concurrent`` and ``train.nproc > 1`` the target and the drafter run in two
    processes (each with ``train.threads`` threads) in lockstep (:func:`_role_worker`): each
    role is timed alone and busy. Otherwise one process times both, alone, one after the other.
    """
    from lenbatch_study.runtime import reference
    from lenbatch_study.runtime.runner import resolve_device

    pts = grid_points(params)
    on_cpu = resolve_device(device, 0).type == "cpu"
    kernels: dict = {}
    t_start = time.perf_counter()
    if params.profile.concurrent and params.train.nproc > 1:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        barrier = ctx.Barrier(2, timeout=BARRIER_TIMEOUT_S)
        timed_points = ctx.Array("i", 2)
        spent = ctx.Array("d", 2 * len(pts))
        where = role_devices(params, device)
        backend = transport_backend(where)
        link = (free_port(), backend)
        procs = {
            r: ctx.Process(
                target=_role_worker, args=(r, params, where[r], queue, barrier, timed_points, spent, os.getpid(), link)
            )
            for r in ("target", "drafter")
        }
        for proc in procs.values():
            proc.start()
        got: dict = {}
        refs: dict = {}
        while len(got) < 2:
            try:
                role, out, refs[role], kernels[role] = queue.get(timeout=1.0)
                got[role] = out
            except _queue.Empty:
                dead = [r for r, proc in procs.items() if r not in got and proc.exitcode not in (None, 0)]
                if dead:
                    for proc in procs.values():
                        proc.kill()
                    raise RuntimeError(
                        f"profile {dead[0]} worker exited with code {procs[dead[0]].exitcode}; "
                        "its error is printed above"
                    )
        for proc in procs.values():
            proc.join()
        t, d = got["target"], got["drafter"]
        timings = [
            (
                a["alone"],
                b["alone"],
                a["alone_cpu"],
                b["alone_cpu"],
                b["steps"],
                (a["busy"], b["busy"], a["busy_cpu"], b["busy_cpu"]),
            )
            for a, b in zip(t, d)
        ]
        moved = [
            {
                "transport_bytes": int(b["transport"]["bytes"]),
                "transport_seconds_all": b["transport"]["seconds"],
                "transport_stage_s_all": a["transport"]["stage"],
                "transport_backend": backend,
            }
            for a, b in zip(t, d)
        ]
        ref = reference.record(
            params,
            {**refs["target"][0], **refs["drafter"][0]},
            {**refs["target"][1], **refs["drafter"][1]},
            seconds=max(refs["target"][2], refs["drafter"][2]),
        )
        compiles = [sum(a["compile"]) for a in t]
        kernels = kernels["target"]
    else:
        from lenbatch_study.runtime.runner import StepRunner, configure_process

        if params.train.nproc > 1:
            log.info(
                "profile.concurrent is off: the features' transport between the ranks is not measured, and "
                "compare predicts the trainings without it"
            )
        moved = [{} for _ in pts]
        configure_process(params)
        runner = StepRunner(params, device=resolve_device(device, 0))
        kernels = runner.kernels
        compiles = [0.0] * len(pts)
        batches = [
            make_batch(
                layout, grid_shape(layout, n, m, max_len=params.data.max_len), params, seed=params.batching.seed + i
            )
            for i, (layout, n, m) in enumerate(pts)
        ]
        acc = [([], [], [], [], []) for _ in pts]  # target s, drafter s, their CPU s, drafter steps
        spent = [0.0] * len(pts)
        passes = _passes(params)
        note = _Progress(len(passes), len(pts), t_start)
        # the reference step (lenbatch_study.runtime.reference), both roles in turn
        ref_start, ref_s = reference.measure(runner, params, roles=reference.ROLES)
        for p, timed in enumerate(passes):
            for i, batch in enumerate(batches):
                if timed and acc[i][0] and spent[i] >= params.profile.max_point_seconds:
                    continue  # long enough: not repeated once timed
                t_s, d_s, t_c, d_c = time_point(runner, batch, warmup=0, repeats=1, max_seconds=float("inf"))
                spent[i] += t_s[0] + d_s[0]
                if timed:
                    compiles[i] += runner.last_compile_s
                    for lst, x in zip(acc[i], (t_s[0], d_s[0], t_c[0], d_c[0], runner.steps - 1)):
                        lst.append(x)
                note.point(p, i)
            note.pass_done(p, timed)
        timings = [(t_all, d_all, t_cpu, d_cpu, steps, None) for t_all, d_all, t_cpu, d_cpu, steps in acc]
        ref_end, end_s = reference.measure(runner, params, roles=reference.ROLES)
        ref = reference.record(params, ref_start, ref_end, seconds=ref_s + end_s)
    rows = []
    for i, ((layout, n, m), (t_all, d_all, t_cpu, d_cpu, steps, busy)) in enumerate(zip(pts, timings)):
        lengths = grid_shape(layout, n, m, max_len=params.data.max_len)
        batch = make_batch(layout, lengths, params, seed=params.batching.seed + i)
        positions, ctx, chunks = _drafter_work(batch, params, steps=steps)
        cols = batch_columns(
            np.asarray(lengths), [np.arange(len(lengths))], layout=layout, drafter=(positions, ctx), lm_chunks=chunks
        )
        k = min(len(t_all), len(d_all))
        tot = [a + b for a, b in zip(t_all[:k], d_all[:k])]
        row = {
            "layout": layout,
            "sequences": n,
            "length": m,
            "sequence_lengths": lengths,
            "computed_tokens": float(cols["computed_tokens"][0]),
            "sum_len_sq": float(cols["sum_len_sq"][0]),
            "ctx_tokens": float(cols["ctx_tokens"][0]),
            "positions": float(cols["positions"][0]),
            "lm_chunks": float(cols["lm_chunks"][0]),
            "target_seconds_median": float(np.median(t_all)),
            "target_seconds_all": t_all,
            "drafter_seconds_median": float(np.median(d_all)),
            "drafter_seconds_all": d_all,
            "seconds_median": float(np.median(tot)),
            "seconds_all": tot,
            # process CPU seconds: cpu / (seconds x threads) well below 1 = a busy machine
            "target_cpu_seconds_all": t_cpu,
            "drafter_cpu_seconds_all": d_cpu,
            # which kernels ran, and Triton compile/autotune seconds that fell inside timed target steps
            "kernel_backend": kernels["gated_delta_rule"],
            "conv_backend": kernels["conv"],
            "target_compile_seconds_timed": compiles[i],
        }
        row.update(moved[i])  # the features' transport (a lockstep profile)
        if busy is not None:  # the same step with the other role working at the same time
            tb, db, tbc, dbc = busy
            row.update(
                {
                    "target_busy_seconds_median": float(np.median(tb)),
                    "target_busy_seconds_all": tb,
                    "drafter_busy_seconds_median": float(np.median(db)),
                    "drafter_busy_seconds_all": db,
                    "target_busy_cpu_seconds_all": tbc,
                    "drafter_busy_cpu_seconds_all": dbc,
                }
            )
        rows.append(row)
    share = grid_cpu_share(rows, threads=params.train.threads)
    # with more threads a step need not keep them all busy: a low share alone proves nothing then
    if on_cpu and params.train.threads == 1 and rows and min(share.values()) < CPU_SHARE_WARN:
        log.warning(
            "the profile's steps got %s of their cores: other work was running, so the step-time "
            "model will over-predict step times. Rerun on a quiet machine: snakemake --forcerun profile",
            ", ".join(f"{role} {100 * v:.0f}%" for role, v in share.items()),
        )
    # where the grid was timed (lenbatch_study.core.machine) and the reference step compare calibrates with
    return {"machine": fingerprint(threads=params.train.threads), "reference": ref, "points": rows}


def run(*, params: Params, out: str | Path) -> int:
    """``lenbatch profile``: time the grid on ``train.device`` and write ``out/grid.json`` (and the
    resolved params). Returns the exit code."""
    t0 = time.perf_counter()
    grid = profile(params, device=params.train.device)
    rows = grid["points"]
    seconds = time.perf_counter() - t0
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / GRID).write_text(json.dumps(grid, indent=1) + "\n")
    write_resolved(params, out)
    share = grid_cpu_share(rows, threads=params.train.threads)
    ref = grid["reference"]
    log.info(
        "profiled %d grid points in %.1f s (share of their cores: target %.0f%%, drafter %.0f%%; the "
        "reference step %s took %.1f s of it) on machine %s; wrote %s",
        len(rows),
        seconds,
        100 * share["target"],
        100 * share["drafter"],
        ref["shape"],
        ref["seconds"],
        grid["machine"]["id"],
        out / GRID,
    )
    moved = [
        (r["transport_bytes"], float(np.median(r["transport_seconds_all"]))) for r in rows if "transport_bytes" in r
    ]
    if moved:
        b, s = max(moved)
        log.info(
            "the features' transport (%s): %d points, the largest batch's %.1f MB in %.2f ms (median receive)",
            rows[0]["transport_backend"],
            len(moved),
            b / 1e6,
            1e3 * s,
        )
    return 0
