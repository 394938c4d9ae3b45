"""The library at 20 M lengths, as ratios to numpy's ``argsort`` of the same lengths in the same process.

    python benchmarks/bench_scale.py [--n 20000000] [--repeats 3] [--strategy bucketed] [--dtype int64]
                                     [--small 20000] [--tree SRC] [--json out.json]

Why ratios: the machine is shared and loaded, so absolute seconds drift by 2x between runs; every
quantity is timed in turns with ``np.argsort(lengths, kind="stable")`` (round robin, ``--repeats``
rounds, medians), and what is reported is each median over argsort's median (the goal of issue 45,
item 4: a sampler's first batch and ``optimize_boundaries`` each at most 1.0).

Setting: ``--n`` chat-like lengths (a log-normal mixture: short single turns, multi-turn threads, a
thin tail of long documents, clipped to 48..8191; seeded) as ``--dtype`` (int64: what
``np.array(list_of_lengths)`` gives), token budget 49,152, at most 64 per batch, rank 0 of 8, epoch 0.
Timed, after a warm-up on 50 K lengths (imports, the numba kernels):

* ``optimize_boundaries(lengths, 6, ...)`` (the default method, ``dp``);
* ``LengthBatchSampler(lengths, strategy=--strategy, rank=0, world_size=8, ...)``: construction, and
  construction plus its first batch (``next(iter(sampler))``); the sampler's peak RSS increase over the
  lengths already held (``/proc/self/status`` VmHWM after a reset, construction to first batch) and
  what it keeps (VmRSS after the first batch);
* ``plan_epoch(..., rank=0, world_size=8)`` for every strategy.

Then the first call in a fresh process at ``--small`` lengths (one subprocess per call and path,
``import lenbatch`` and the lengths made before the clock starts; the sampler's row imports torch
first, which any sampler user has paid): with numba as installed, and with ``LENBATCH_NO_NUMBA=1``
(the pure path). Goal: each at most 0.3 s, and numba never slower than pure.

``--tree`` runs everything against another source tree (e.g. main's ``src``: the before-table).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

STRATEGIES = ("sorted", "random", "bucketed", "sortish", "packed")
BUDGET, MAX_BATCH, WORLD = 49152, 64, 8


def chat_lengths(n: int, seed: int = 0, dtype: str = "int64"):
    """Chat-like token lengths (the mixture of tests/batching/_chat_lengths.py, made here so the benchmark
    imports nothing from the tests)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    share, median, sigma = np.array([0.45, 0.40, 0.15]), np.array([650.0, 1900.0, 4300.0]), np.array([0.65, 0.55, 0.5])
    out = np.empty(n, dtype=dtype)
    step = 1 << 22  # in chunks: the float temporaries stay small
    for a in range(0, n, step):
        m = min(step, n - a)
        part = rng.choice(3, size=m, p=share)
        out[a : a + m] = np.clip(np.rint(median[part] * np.exp(sigma[part] * rng.standard_normal(m))), 48, 8191)
    return out


def rss_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # VmHWM := VmRSS


def edges_for(lb, x):
    return lb.optimize_boundaries(x[:200_000], 6, token_budget=BUDGET, max_batch_size=MAX_BATCH).edges


def large(args) -> dict:
    import numpy as np

    import lenbatch as lb

    x = chat_lengths(args.n, dtype=args.dtype)
    edges = edges_for(lb, x)

    def kw(strategy):
        return dict(
            strategy=strategy,
            token_budget=BUDGET,
            max_batch_size=MAX_BATCH,
            seed=0,
            edges=edges if strategy == "bucketed" else None,
            rank=0,
            world_size=WORLD,
        )

    # warm-up: imports (torch: sortish, the sampler), the numba kernels (loaded up front: a 50 K pass alone
    # would not load them)
    from lenbatch.batching import scan

    getattr(scan, "preload", lambda: None)()
    w = x[:50_000]
    for s in STRATEGIES:
        lb.plan_epoch(w, epoch=0, **kw(s))
    lb.optimize_boundaries(w, 6, token_budget=BUDGET, max_batch_size=MAX_BATCH)
    next(iter(lb.LengthBatchSampler(w, **{k: v for k, v in kw(args.strategy).items()})))

    times: dict[str, list[float]] = {}
    mem: dict[str, list[float]] = {"sampler_peak_mb": [], "sampler_kept_mb": []}

    def timed(name, fn):
        gc.collect()
        t0 = time.perf_counter()
        out = fn()
        times.setdefault(name, []).append(time.perf_counter() - t0)
        return out

    def sampler_round():
        gc.collect()
        reset_peak()
        before = rss_kb("VmRSS:")
        t0 = time.perf_counter()
        sampler = lb.LengthBatchSampler(x, **kw(args.strategy))
        t1 = time.perf_counter()
        first = next(iter(sampler))
        t2 = time.perf_counter()
        times.setdefault("sampler_build", []).append(t1 - t0)
        times.setdefault("sampler_first_batch", []).append(t2 - t0)
        mem["sampler_peak_mb"].append((rss_kb("VmHWM:") - before) / 1024)
        mem["sampler_kept_mb"].append((rss_kb("VmRSS:") - before) / 1024)
        assert len(first) > 0
        del sampler

    order = ["argsort", "optimize_boundaries", "sampler"] + [f"plan_epoch[{s}]" for s in STRATEGIES]
    for r in range(args.repeats):
        for item in order:
            if item == "argsort":
                timed("argsort", lambda: np.argsort(x, kind="stable"))
            elif item == "optimize_boundaries":
                timed(item, lambda: lb.optimize_boundaries(x, 6, token_budget=BUDGET, max_batch_size=MAX_BATCH))
            elif item == "sampler":
                sampler_round()
            else:
                s = item[len("plan_epoch[") : -1]
                timed(item, lambda s=s: lb.plan_epoch(x, epoch=0, **kw(s)))
        print(
            f"  round {r + 1}/{args.repeats}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()),
            file=sys.stderr,
            flush=True,
        )
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["argsort"]
    return {
        "n": args.n,
        "dtype": args.dtype,
        "repeats": args.repeats,
        "strategy": args.strategy,
        "argsort_seconds": base,
        "seconds": med,
        "ratio_to_argsort": {k: v / base for k, v in med.items()},
        "sampler_peak_mb": statistics.median(mem["sampler_peak_mb"]),
        "sampler_kept_mb": statistics.median(mem["sampler_kept_mb"]),
        "lengths_mb": x.nbytes / 2**20,
        "numba": "numba" in sys.modules,
        "planner": lb.__file__,
    }


SMALL_CELL = r"""
import sys, time
sys.path.insert(0, {tree!r})
sys.path.insert(0, {bench!r})
from bench_scale import chat_lengths, BUDGET, MAX_BATCH, WORLD
import lenbatch as lb
call = {call!r}
x = chat_lengths({n})
edges = (0, 1000, 2000, 3000, 4500, 6000, 8192)
if call == "sampler":
    import torch  # noqa: F401  (the sampler's module imports it: paid by every sampler user, not by lenbatch)
t0 = time.perf_counter()
if call == "optimize_boundaries":
    lb.optimize_boundaries(x, 6, token_budget=BUDGET, max_batch_size=MAX_BATCH)
elif call == "sampler":
    next(iter(lb.LengthBatchSampler(x, strategy="bucketed", edges=edges, token_budget=BUDGET,
                                    max_batch_size=MAX_BATCH, rank=0, world_size=WORLD)))
else:
    lb.plan_epoch(x, strategy=call, edges=edges if call == "bucketed" else None, token_budget=BUDGET,
                  max_batch_size=MAX_BATCH, rank=0, world_size=WORLD)
print(time.perf_counter() - t0, "numba" in sys.modules)
"""


def small(args) -> list[dict]:
    rows = []
    bench = str(Path(__file__).resolve().parent)
    for call in STRATEGIES + ("optimize_boundaries", "sampler"):
        row: dict = {"call": call}
        for path, env in (("numba", {"LENBATCH_NO_NUMBA": ""}), ("pure", {"LENBATCH_NO_NUMBA": "1"})):
            code = SMALL_CELL.format(tree=args.tree, bench=bench, call=call, n=args.small)
            res = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}
            )
            if res.returncode != 0:
                raise SystemExit(f"small call {call} ({path}) failed:\n{res.stderr[-3000:]}")
            secs, loaded = res.stdout.split()
            row[f"{path}_s"] = float(secs)
            if path == "numba":
                row["numba_loaded"] = loaded == "True"
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--strategy", default="bucketed", choices=STRATEGIES, help="the sampler's strategy")
    ap.add_argument("--dtype", default="int64", choices=("int64", "int32", "uint16"))
    ap.add_argument("--small", type=int, default=20_000, help="lengths of the fresh-process first calls")
    ap.add_argument("--skip-large", action="store_true")
    ap.add_argument("--skip-small", action="store_true")
    ap.add_argument("--tree", default=str(Path(__file__).resolve().parents[1] / "src"))
    ap.add_argument("--json", help="also write the results as JSON here")
    args = ap.parse_args()
    sys.path.insert(0, args.tree)
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[0]
    out: dict = {"tree": args.tree, "load_before": load}
    if not args.skip_large:
        big = large(args)
        out["large"] = big
        print(
            f"{big['n']:,} {big['dtype']} lengths, budget {BUDGET}, <= {MAX_BATCH} per batch, rank 0 of {WORLD}; "
            f"medians of {big['repeats']} rounds in turns; numba {'loaded' if big['numba'] else 'not loaded'}; "
            f"load {load}"
        )
        print(f"{'quantity':<28} {'seconds':>8} {'/ argsort':>10}")
        for k, v in big["seconds"].items():
            print(f"{k:<28} {v:8.2f} {big['ratio_to_argsort'][k]:10.2f}")
        print(
            f"sampler ({big['strategy']}): peak +{big['sampler_peak_mb']:.0f} MB, keeps +{big['sampler_kept_mb']:.0f} MB "
            f"(the lengths: {big['lengths_mb']:.0f} MB)"
        )
    if not args.skip_small:
        rows = small(args)
        out["small"] = rows
        print(f"\nfirst call in a fresh process, {args.small:,} lengths (goal <= 0.3 s, numba <= pure)")
        print(f"{'call':<22} {'numba s':>8} {'pure s':>8}  numba loaded")
        for r in rows:
            print(f"{r['call']:<22} {r['numba_s']:8.3f} {r['pure_s']:8.3f}  {r['numba_loaded']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
