"""Epoch planning at scale: seconds and peak RSS increase of one rank's epoch plan, per strategy and N.

    python benchmarks/bench_plans.py [--sizes 0.9,9,90] [--strategies sorted,random,...] [--tree SRC]
                                     [--world-size 7] [--json out.json]

Setting: the seed profile's 902,087 lengths tiled 1x, 10x, 100x (N = 0.9, 9, 90 M), token
budget 49,152, at most 64 per batch, 7 ranks, one epoch (epoch 0, seed 0); ``bucketed`` uses the
study's published edges. Each cell runs in a fresh subprocess (cells share no memory): it builds the
lengths (int32), loads the numba kernels when numba is installed (``scan.preload``) and plans once at
N = 50,000 (imports torch for ``sortish``, loads each kernel from numba's cache: the one-off cost, reported
as ``warm-up s``), then resets the peak RSS
(``/proc/self/clear_refs``) and times ``plan_epoch(..., rank=0, world_size=7)``: what one rank's
sampler computes each epoch. ``--tree`` runs the cells against another source tree (e.g. main's, for
the before-table). ``LENBATCH_NO_NUMBA=1`` in the environment times the pure numpy/Python path.
Times are wall seconds and, in brackets, this process's CPU seconds (a shared machine inflates the
wall time first); quote ``uptime``'s load with them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

STRATEGY_NAMES = ("sorted", "random", "bucketed", "sortish", "packed")
STUDY_EDGES = (0, 770, 1216, 1728, 2432, 3296, 8192)

CELL = r"""
import gc, json, sys, time
import numpy as np
sys.path.insert(0, {tree!r})
import lenbatch as lb
from lenbatch_study.corpus.seed_profile import seed_profile

def rss_kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])

strategy, reps, world = {strategy!r}, {reps}, {world}
edges = {edges!r} if strategy == "bucketed" else None
kw = dict(strategy=strategy, token_budget=49152, max_batch_size=64, seed=0, edges=edges, world_size=world, rank=0)
x = np.tile(seed_profile(902087).astype(np.int32), reps)
t0 = time.perf_counter()
from lenbatch.batching import scan
getattr(scan, "preload", lambda: None)()  # a 50 K pass alone does not load the kernels
lb.plan_epoch(x[:50000], epoch=0, **kw)  # imports (torch for sortish), loads the compiled kernels: the one-off cost
warm = time.perf_counter() - t0
gc.collect()
with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")  # reset VmHWM (peak RSS) to the current RSS
before = rss_kb("VmRSS:")
t0, c0 = time.perf_counter(), time.process_time()
plan = lb.plan_epoch(x, epoch=0, **kw)
secs, cpu = time.perf_counter() - t0, time.process_time() - c0
peak = rss_kb("VmHWM:")
n_idx = sum(len(b) for b in plan) if len(plan) < 2_000_000 else None
print(json.dumps({{"strategy": strategy, "n": int(x.size), "seconds": secs, "cpu_seconds": cpu, "peak_increase_mb": (peak - before) / 1024,
                  "warmup_seconds": warm, "batches": len(plan), "lengths_mb": x.nbytes / 2**20,
                  "rank_samples": n_idx, "planner": lb.__file__}}))
"""


def run_cell(strategy: str, reps: int, world: int, tree: str) -> dict:
    code = CELL.format(tree=tree, strategy=strategy, reps=reps, world=world, edges=STUDY_EDGES)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"cell {strategy} x{reps} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="0.9,9,90", help="N in millions: 0.9 (1x), 9 (10x), 90 (100x the profile)")
    ap.add_argument("--strategies", default=",".join(STRATEGY_NAMES))
    ap.add_argument("--world-size", type=int, default=7)
    ap.add_argument(
        "--tree",
        default=str(Path(__file__).resolve().parents[1] / "src"),
        help="the source tree to plan with (default: this checkout's src)",
    )
    ap.add_argument("--json", help="also write the cells as JSON here")
    args = ap.parse_args()
    reps_of = {"0.9": 1, "9": 10, "90": 100}
    sizes = args.sizes.split(",")
    strategies = args.strategies.split(",")
    cells = {}
    for size in sizes:
        for s in strategies:
            c = run_cell(s, reps_of[size], args.world_size, args.tree)
            cells[(size, s)] = c
            print(
                f"# {s:8s} N={c['n']:>11,}: {c['seconds']:7.2f} s ({c['cpu_seconds']:.2f} CPU s), peak +{c['peak_increase_mb']:7.0f} MB "
                f"(warm-up {c['warmup_seconds']:.2f} s, {c['batches']:,} batches on rank 0)",
                file=sys.stderr,
                flush=True,
            )
    load = os.getloadavg()
    print(
        f"\nOne rank's epoch plan (rank 0 of {args.world_size}), tree {args.tree}, numba "
        f"{'off' if os.environ.get('LENBATCH_NO_NUMBA') else 'if installed'}; load average before the last cell "
        f"{load[0]:.2f}\n"
    )
    print("| samples | " + " | ".join(strategies) + " |")
    print("|---|" + "---|" * len(strategies))
    for size in sizes:
        row = []
        for s in strategies:
            c = cells[(size, s)]
            row.append(f"{c['seconds']:.2f} s ({c['cpu_seconds']:.2f} CPU), {c['peak_increase_mb']:.0f} MB")
        print(f"| {cells[(size, strategies[0])]['n'] / 1e6:.1f} M | " + " | ".join(row) + " |")
    print("\nper sample (ns):")
    print("| samples | " + " | ".join(strategies) + " |")
    print("|---|" + "---|" * len(strategies))
    for size in sizes:
        row = [f"{cells[(size, s)]['seconds'] / cells[(size, s)]['n'] * 1e9:.0f}" for s in strategies]
        print(f"| {cells[(size, strategies[0])]['n'] / 1e6:.1f} M | " + " | ".join(row) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps([{"size": k[0], **v} for k, v in cells.items()], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
