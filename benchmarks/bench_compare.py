"""Seconds of ``lenbatch.compare_strategies`` (every strategy, two epochs, all metrics) on chat-like lengths.

    python benchmarks/bench_compare.py [--samples 1000000] [--world-size 8] [--repeats 2]

Lengths from tests/batching/_chat_lengths.py (48..8191 tokens), budget 16,384, at most 64 per batch, with a
Cost (per token 1, per token squared 1/4096). The first call in the process includes loading numba's
kernels when ``lenbatch[fast]`` is installed; the table reports each repeat. Quote the printed table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "batching"))

import lenbatch as lb  # noqa: E402
from _chat_lengths import chat_lengths  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    x = chat_lengths(a.samples)
    print(
        f"{a.samples:,} samples, {a.world_size} ranks\n\n| repeat | seconds | of which optimize_boundaries |\n|---|---|---|"
    )
    for r in range(a.repeats):
        t = time.perf_counter()
        edges = lb.optimize_boundaries(x, 6, token_budget=16384, max_batch_size=64).edges
        tb = time.perf_counter() - t
        rows = lb.compare_strategies(
            x,
            token_budget=16384,
            max_batch_size=64,
            world_size=a.world_size,
            edges=edges,
            cost=lb.Cost(per_token=1.0, per_token_squared=1 / 4096),
        )
        print(f"| {r} | {time.perf_counter() - t:.2f} | {tb:.2f} |", flush=True)
    print()
    print(lb.batching.compare.format_table(rows))


if __name__ == "__main__":
    main()
