"""Streaming batches against the in-memory plan and lhotse's ``DynamicBucketingSampler`` on the same stream.

    python benchmarks/bench_streaming.py [--lengths results/tokenize/lengths.npy] [--synthetic 50000]
                                         [--buffer 4096] [--world-size 8] [--skip-lhotse]

Two streams of lengths: the study's tokenized data (``results/tokenize/lengths.npy``) and ``--synthetic``
chat-like lengths (tests/batching/_chat_lengths.py: 48..8191 tokens). Budget 16,384 padded tokens, at most
64 samples per batch (params.yaml's). Per (stream, method, strategy), over one pass:

* ``steps``: batches of rank 0 at ``--world-size`` ranks (and whether every rank got the same number and
  every sample came exactly once over all ranks: ``exact``);
* ``pad eff`` = useful / computed tokens, ``fill`` = computed / (batches x budget), over all ranks' batches;
* ``held``: the most samples held at once (in memory: all of them; lenbatch's stream: ``peak_held``;
  lhotse: its two buffers, ``buffer_size`` + ``shuffle_buffer_size``, by construction);
* ``s``: seconds for the pass of rank 0 (the stream only: lengths as the samples, no I/O).

lhotse's cuts carry the length as their ``duration``; its ``TimeConstraint`` with ``max_duration`` = the
budget and ``max_cuts`` = 64 is lenbatch's padded rule (n x longest <= budget). lhotse is not a dependency
of lenbatch: ``pip install lhotse`` to include it. Quote the printed table.
"""

from __future__ import annotations

import argparse
import sys
import warnings
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "batching"))

import lenbatch as lb  # noqa: E402
from _chat_lengths import chat_lengths  # noqa: E402
from lenbatch.batching.spec import BatchSpec  # noqa: E402
from lenbatch.batching.stream import StreamPlanner  # noqa: E402

BUDGET, MBS = 16384, 64


def score(x: np.ndarray, ranks: list[list[np.ndarray]], strategy: str) -> dict:
    flat = [b for r in ranks for b in r]
    every = np.concatenate(flat)
    exact = (
        len({len(r) for r in ranks}) == 1 and every.size == x.size and np.array_equal(np.sort(every), np.arange(x.size))
    )
    return {
        "steps": len(ranks[0]),
        "exact": exact,
        "eff": lb.padding_efficiency(x, flat, strategy=strategy),
        "fill": lb.budget_fill(x, flat, BUDGET, strategy=strategy),
    }


def in_memory(x, strategy, world_size):
    edges = (
        lb.optimize_boundaries(x, 6, token_budget=BUDGET, max_batch_size=MBS).edges if strategy == "bucketed" else None
    )
    t = time.perf_counter()
    ranks = lb.plan_epoch_all(
        x, strategy=strategy, token_budget=BUDGET, max_batch_size=MBS, edges=edges, world_size=world_size
    )
    return dict(score(x, ranks, strategy), held=x.size, s=time.perf_counter() - t)


def streamed(x, strategy, world_size, buffer):
    spec = BatchSpec(token_budget=BUDGET, max_batch_size=MBS)
    t = time.perf_counter()
    p = StreamPlanner(strategy=strategy, spec=spec, buffer_size=buffer, world_size=world_size)
    steps = []
    for L in x.tolist():
        p.push(L)
        steps += p.take_steps()
    p.finish()
    steps += p.take_steps()
    seconds = time.perf_counter() - t
    ranks = [[np.asarray(s[r], dtype=np.int64) for s in steps] for r in range(world_size)]
    return dict(score(x, ranks, strategy), held=p.peak_held, s=seconds)


def lhotse_run(x, world_size, buffer):
    warnings.filterwarnings("ignore", message=".*eagerly read CutSet")  # a list stands in for the stream
    from lhotse import CutSet, MonoCut
    from lhotse.dataset.sampling import DynamicBucketingSampler

    cuts = CutSet.from_cuts(
        MonoCut(id=str(i), start=0.0, duration=float(L), channel=0) for i, L in enumerate(x.tolist())
    )
    ranks, seconds = [], 0.0
    for r in range(world_size):
        t = time.perf_counter()
        sampler = DynamicBucketingSampler(
            cuts,
            max_duration=float(BUDGET),
            max_cuts=MBS,
            num_buckets=6,
            shuffle=True,
            buffer_size=buffer,
            shuffle_buffer_size=buffer,
            seed=0,
            num_cuts_for_bins_estimate=buffer,
            world_size=world_size,
            rank=r,
        )
        ranks.append([np.asarray([int(c.id) for c in batch], dtype=np.int64) for batch in sampler])
        if r == 0:
            seconds = time.perf_counter() - t
    flat = [b for rk in ranks for b in rk]
    every = np.concatenate(flat)
    out = {
        "steps": len(ranks[0]),
        "eff": lb.padding_efficiency(x, flat),
        "fill": lb.budget_fill(x, flat, BUDGET),
        "held": 2 * buffer,
        "s": seconds,
    }
    counts = sorted({len(r) for r in ranks})
    once = every.size == x.size and np.array_equal(np.sort(every), np.arange(x.size))
    out["exact"] = (
        "yes"
        if len(counts) == 1 and once
        else (
            f"no: {len(set(every.tolist()))}/{x.size} samples, {every.size - len(set(every.tolist()))} repeated, "
            f"batches per rank {counts[0]}..{counts[-1]}"
        )
    )
    computed = np.asarray([len(b) * int(x[b].max()) for b in flat])
    over = int(np.count_nonzero(computed > BUDGET))
    if over:
        out["exact"] += f"; {over} batches over budget (up to +{computed.max() / BUDGET - 1:.1%})"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default=str(ROOT / "results/tokenize/lengths.npy"))
    ap.add_argument("--synthetic", type=int, default=50_000)  # lhotse at 8 ranks: ~2 s per 1,000 samples
    ap.add_argument("--buffer", type=int, default=4096)
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--skip-lhotse", action="store_true")
    a = ap.parse_args()
    streams = [("study", np.load(a.lengths).astype(np.int64)), (f"chat {a.synthetic:,}", chat_lengths(a.synthetic))]
    print(f"budget {BUDGET}, max batch {MBS}, buffer {a.buffer}, {a.world_size} ranks (steps: rank 0's)\n")
    print("| stream | method | strategy | steps | exact | pad eff | fill | held | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, x in streams:
        for strategy in ("bucketed", "sortish", "random", "packed"):
            for method, fn in (
                ("in memory", lambda: in_memory(x, strategy, a.world_size)),
                ("lenbatch stream", lambda: streamed(x, strategy, a.world_size, a.buffer)),
            ):
                r = fn()
                print(
                    f"| {name} | {method} | {strategy} | {r['steps']:,} | {'yes' if r['exact'] else 'no'} | "
                    f"{r['eff']:.1%} | {r['fill']:.1%} | {r['held']:,} | {r['s']:.2f} |",
                    flush=True,
                )
        if not a.skip_lhotse:
            try:
                import lhotse  # noqa: F401
            except ImportError:
                print(f"| {name} | lhotse: not installed (pip install lhotse) | | | | | | | |")
                continue
            r = lhotse_run(x, a.world_size, a.buffer)
            print(
                f"| {name} | lhotse DynamicBucketing | bucketed (6) | {r['steps']:,} | {r['exact']} | {r['eff']:.1%} | "
                f"{r['fill']:.1%} | {r['held']:,} | {r['s']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
