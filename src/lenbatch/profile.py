"""Profile stage: time the target step and the drafter step on a grid of batch shapes.

The step-time model (:mod:`lenbatch.stepmodel`) is fitted on these timings, never on
the run it predicts. Shapes:

- padded: ``sequences`` samples padded to ``length`` tokens (sequences x length
  computed tokens), for every batch size and length of the ``profile`` section that
  fits the token budget and max_batch_size, plus the largest batch that fills the
  budget at each length (the shape greedy packing produces most);
- packed: one row of ``length`` tokens holding ``sequences`` sequences, for every
  row length of the grid that fits the budget, plus the budget itself.

Each point runs ``profile.warmup`` untimed steps, then ``profile.repeats`` timed
ones; the median is kept. Target and drafter are timed separately, on the same
model, threads and device as training (``StepRunner``). Cost: grid points x
(warmup + repeats) x (target + drafter step).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from lenbatch.config import Params, add_params_argument, params_from_args, write_resolved
from lenbatch.log import get_logger
from lenbatch.stepmodel import batch_columns, drafter_work, grid_shape

log = get_logger("profile")


def grid_points(params: Params, *, quiet: bool = False) -> list[tuple[str, int, int]]:
    """(kind, sequences, length) of every grid point, smallest shapes first.

    Points above the token budget, above max_batch_size or longer than data.max_len are
    skipped (they can never occur in a plan); the number skipped is logged.
    """
    pr, b = params.profile, params.batching
    budget, max_bs, max_len = b.token_budget, b.max_batch_size, params.data.max_len
    lengths = sorted({int(m) for m in pr.lengths})
    pts: set[tuple[str, int, int]] = set()
    skipped = 0
    for m in lengths:
        if m > max_len:
            skipped += len(pr.batch_sizes)
            continue
        for n in pr.batch_sizes:
            if n * m <= budget and n <= max_bs:
                pts.add(("padded", int(n), m))
            else:
                skipped += 1
        fill = min(max_bs, budget // m)  # the batch that fills the budget at this length
        if fill >= 1:
            pts.add(("padded", fill, m))
    for L in sorted({int(x) for x in pr.packed_lengths} | {budget}):
        if L > budget:
            continue
        for k in pr.packed_seqs:
            if k <= L and k * max_len >= L:  # k parts of at most max_len tokens fill the row
                pts.add(("packed", int(k), L))
            else:
                skipped += 1
    if skipped and not quiet:
        log.info("grid: skipped %d shapes outside token_budget=%d, max_batch_size=%d, max_len=%d",
                 skipped, budget, max_bs, max_len)
    return sorted(pts, key=lambda p: (p[1] * p[2], p[0], p[1]))


def make_batch(kind: str, lengths: list[int], params: Params, *, seed: int):
    """A collated batch of synthetic token ids with these sequence lengths (what training feeds)."""
    from lenbatch import collate

    seqs = collate.synthetic_sequences(np.asarray(lengths), vocab_size=params.model.vocab_size, seed=seed)
    return collate.collate(seqs, kind=kind, token_budget=params.batching.token_budget,
                           max_batch_size=params.batching.max_batch_size)


def time_point(runner, batch, *, warmup: int, repeats: int, max_seconds: float) -> tuple[list[float], list[float]]:
    """Target and drafter seconds of ``repeats`` timed steps after ``warmup`` untimed ones.

    Stops early once this point has taken ``max_seconds`` (a 10 s step is timed once:
    its run-to-run noise is small next to its length, and the grid must stay short).
    At least one step is always kept: if the budget ran out during warm-up, the last
    warm-up step is the timing.
    """
    runs: list[tuple[float, float]] = []
    spent = 0.0
    for _ in range(warmup + repeats):
        feats, t_s = runner.target_step(batch)
        _, d_s = runner.drafter_step(batch, feats)
        runs.append((float(t_s), float(d_s)))
        spent += float(t_s) + float(d_s)
        if spent >= max_seconds:
            break
    timed = runs[warmup:] if len(runs) > warmup else runs[-1:]
    return [t for t, _ in timed], [d for _, d in timed]


def _drafter_work(batch, params: Params, *, steps: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Mean (positions, context tokens) the drafter worked on over the timed steps of a grid point."""
    lengths = batch.lengths.numpy()
    rows, starts = (t.numpy() for t in batch.seq_rows_starts())
    lm = batch.loss_mask.numpy()
    masks = [lm[r, s:s + n] for r, s, n in zip(rows, starts, lengths)]
    work = [drafter_work(lengths, masks, batch.indices.numpy(), anchors_per_seq=params.drafter.anchors_per_seq,
                         block_size=params.drafter.block_size, seed=params.batching.seed, epoch=0, step=st)
            for st in steps]
    return np.array([np.mean([w[0] for w in work])]), np.array([np.mean([w[1] for w in work])])


def _time_role(runner, role: str, batch, feats, *, warmup: int, repeats: int, max_seconds: float) -> list[float]:
    """Seconds of ``repeats`` timed steps of one role after ``warmup`` untimed ones (cap as in :func:`time_point`)."""
    runs: list[float] = []
    for _ in range(warmup + repeats):
        if role == "target":
            _, secs = runner.target_step(batch)
        else:
            _, secs = runner.drafter_step(batch, feats)
        runs.append(float(secs))
        if sum(runs) >= max_seconds:
            break
    return runs[warmup:] if len(runs) > warmup else runs[-1:]


def _role_worker(role: str, params: Params, device: str, queue, done, other_done) -> None:
    """One role's timings over the whole grid, in its own process (spawned by :func:`profile`).

    When done it keeps stepping (untimed, cycling through the grid) until the other role
    is done too, so every timing is taken with both processes busy, as in a pipelined run.
    """
    import torch

    from lenbatch.train import StepRunner

    torch.set_num_threads(params.train.threads)
    runner = StepRunner(params, device=device, role=role)
    pr = params.profile
    pts = grid_points(params, quiet=True)
    fdim = len(params.model.target_layers) * params.model.hidden_size
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[params.model.dtype]
    gen = torch.Generator().manual_seed(params.batching.seed)
    batches, out = [], []
    t0 = time.perf_counter()
    for i, (kind, n, m) in enumerate(pts):
        batch = make_batch(kind, grid_shape(kind, n, m, max_len=params.data.max_len), params,
                           seed=params.batching.seed + i)
        feats = None
        if role == "drafter":  # the drafter's cost does not depend on the feature values
            feats = torch.randn(*batch.input_ids.shape, fdim, generator=gen).to(dtype)
        batches.append((batch, feats))
        secs = _time_role(runner, role, batch, feats, warmup=pr.warmup, repeats=pr.repeats,
                          max_seconds=pr.max_point_seconds)
        steps = list(range(runner.steps - len(secs), runner.steps)) if role == "drafter" else []
        out.append({"seconds": secs, "steps": steps})
        if role == "drafter" and ((i + 1) % 5 == 0 or i + 1 == len(pts)):
            log.info("grid %d/%d points, %.1f s elapsed; last %s %dx%d: drafter %.1f ms", i + 1, len(pts),
                     time.perf_counter() - t0, kind, n, m, 1e3 * float(np.median(secs)))
    done.set()
    j = 0
    while not other_done.is_set():
        batch, feats = batches[j % len(batches)]
        _time_role(runner, role, batch, feats, warmup=0, repeats=1, max_seconds=0.0)
        j += 1
    queue.put((role, out, j))


def profile(params: Params, *, device: str = "cpu") -> list[dict]:
    """Time every grid point; one dict per point (see module docstring). Cost: see module docstring.

    With ``profile.concurrent`` and ``train.nproc > 1`` the target and the drafter are timed
    in two processes at once (each with ``train.threads`` threads), both busy all the time,
    as in the pipelined run: they compete for cores, caches and memory bandwidth. Timed one
    after the other in one process instead, the CPU default's run steps came out 1.3-2x
    slower than profiled (throughput over-predicted by 27-44%); timed together, the
    prediction errors were -6..-12% (benchmarks/bench_prediction.py).
    """
    pts = grid_points(params)
    t_start = time.perf_counter()
    if params.profile.concurrent and params.train.nproc > 1:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        done = {r: ctx.Event() for r in ("target", "drafter")}
        procs = [ctx.Process(target=_role_worker, args=(r, params, device, queue, done[r],
                                                        done["drafter" if r == "target" else "target"]))
                 for r in ("target", "drafter")]
        for proc in procs:
            proc.start()
        got = {}
        for _ in procs:
            role, out, filler = queue.get()
            got[role] = out
            log.info("%s process done (%d untimed steps kept it busy until the other finished)", role, filler)
        for proc in procs:
            proc.join()
            if proc.exitcode:
                raise RuntimeError(f"profile worker exited with code {proc.exitcode}")
        timings = [(t["seconds"], d["seconds"], d["steps"]) for t, d in zip(got["target"], got["drafter"])]
    else:
        import torch

        from lenbatch.train import StepRunner

        torch.set_num_threads(params.train.threads)
        runner = StepRunner(params, device=device)
        timings = []
        for i, (kind, n, m) in enumerate(pts):
            batch = make_batch(kind, grid_shape(kind, n, m, max_len=params.data.max_len), params,
                               seed=params.batching.seed + i)
            t_all, d_all = time_point(runner, batch, warmup=params.profile.warmup, repeats=params.profile.repeats,
                                      max_seconds=params.profile.max_point_seconds)
            timings.append((t_all, d_all, list(range(runner.steps - len(d_all), runner.steps))))
            if (i + 1) % 5 == 0 or i + 1 == len(pts):
                log.info("grid %d/%d points, %.1f s elapsed", i + 1, len(pts), time.perf_counter() - t_start)
    rows = []
    for i, ((kind, n, m), (t_all, d_all, steps)) in enumerate(zip(pts, timings)):
        lengths = grid_shape(kind, n, m, max_len=params.data.max_len)
        batch = make_batch(kind, lengths, params, seed=params.batching.seed + i)
        cols = batch_columns(np.asarray(lengths), [np.arange(len(lengths))], kind=kind,
                             drafter=_drafter_work(batch, params, steps=steps))
        k = min(len(t_all), len(d_all))
        tot = [a + b for a, b in zip(t_all[:k], d_all[:k])]
        rows.append({"kind": kind, "sequences": n, "length": m, "sequence_lengths": lengths,
                     "computed_tokens": float(cols["computed_tokens"][0]), "sum_len_sq": float(cols["sum_len_sq"][0]),
                     "ctx_tokens": float(cols["ctx_tokens"][0]), "positions": float(cols["positions"][0]),
                     "target_seconds_median": float(np.median(t_all)), "target_seconds_all": t_all,
                     "drafter_seconds_median": float(np.median(d_all)), "drafter_seconds_all": d_all,
                     "seconds_median": float(np.median(tot)), "seconds_all": tot})
    return rows


def register(parser: argparse.ArgumentParser) -> None:
    add_params_argument(parser)
    parser.add_argument("--repeats", type=int, default=None, help="override profile.repeats")
    parser.add_argument("--out", default="results/profile", help="output folder")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    overrides = {"profile": {"repeats": args.repeats}} if args.repeats is not None else None
    params = params_from_args(args, overrides)
    t0 = time.perf_counter()
    rows = profile(params, device="cpu" if params.train.device == "auto" else params.train.device)
    seconds = time.perf_counter() - t0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "grid.json").write_text(json.dumps(rows, indent=1) + "\n")
    write_resolved(params, out)
    log.info("profiled %d grid points in %.1f s; wrote %s", len(rows), seconds, out / "grid.json")
    return 0
