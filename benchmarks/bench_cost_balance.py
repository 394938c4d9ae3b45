"""Per-step imbalance across ranks, token-only against cost-aware plans, under the study's fitted step cost.

    python benchmarks/bench_cost_balance.py [--world-size 8] [--stepmodel results/compare/stepmodel.json]

A DDP step lasts as long as its slowest rank. The study's step-time model (``results/compare/stepmodel.json``,
the target's chosen fit: seconds = const + a·computed tokens + b·Σ len²) prices a batch as
``lenbatch.Cost(per_token=a, per_token_squared=b)``. Two length sets: the study's seed profile (902,087
lengths 65..8191, budget 49,152, at most 64 per batch: its real setting) and the embedded data
(``results/tokenize/lengths.npy``, params.yaml's 16,384 / 64). Per strategy, epoch 0 at ``--world-size`` ranks:

* ``imbalance`` = Σ over steps of the costliest rank's batch / Σ of the ranks' mean − 1 (0: perfectly even);
* ``epoch s`` = Σ over steps of the costliest rank's predicted seconds (the model's const included);
* ``cost-aware`` = ``plan_epoch_all(..., cost=Cost(a, b))``: the same batches, each step's ranks given batches
  of about equal cost (no cost budget, so steps and padding are unchanged);
* the same for ``StreamingBatcher``'s planner on the embedded data (buffer 4,096; its cost-aware steps go out
  32 at a time sorted by cost, which can change the tail's split, hence both step counts).

Quote the printed table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import lenbatch as lb
from lenbatch.batching.spec import BatchSpec
from lenbatch.batching.stream import STREAM_STRATEGIES, plan_stream
from lenbatch_study.corpus.seed_profile import seed_profile

ROOT = Path(__file__).resolve().parents[1]


def measure(x, strategy, budget, mbs, world_size, cost, const, edges, with_cost, stream=False):
    t = time.perf_counter()
    if stream:
        spec = BatchSpec(token_budget=budget, max_batch_size=mbs)
        ranks = plan_stream(
            x, strategy=strategy, spec=spec, buffer_size=4096, world_size=world_size, cost=cost if with_cost else None
        )
    else:
        ranks = lb.plan_epoch_all(
            x,
            strategy=strategy,
            token_budget=budget,
            max_batch_size=mbs,
            world_size=world_size,
            edges=edges,
            cost=cost if with_cost else None,
        )
    seconds = time.perf_counter() - t
    per = np.stack([cost.of_batches(x, r, packed=strategy == "packed") for r in ranks])
    worst = per.max(axis=0)
    return {
        "steps": per.shape[1],
        "imbalance": worst.sum() / per.mean(axis=0).sum() - 1,
        "epoch": float((worst + const).sum()),
        "plan_s": seconds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--stepmodel", default=str(ROOT / "results/compare/stepmodel.json"))
    a = ap.parse_args()
    coef = json.loads(Path(a.stepmodel).read_text())["target"]["chosen"]["coef"]
    cost = lb.Cost(per_token=coef["computed_tokens"], per_token_squared=coef.get("sum_len_sq", 0.0))
    const = coef.get("const", 0.0)
    print(
        f"step model: const {const:.3g} s + {cost.per_token:.3g} s/token + {cost.per_token_squared:.3g} s/token^2; "
        f"{a.world_size} ranks\n"
    )
    print(
        "| lengths | strategy | steps | imbalance, token-only | imbalance, cost-aware | epoch s, token-only | "
        "epoch s, cost-aware | speed-up |"
    )
    print("|---|---|---|---|---|---|---|---|")
    sets = [
        ("seed profile 902,087 @ 49,152", seed_profile(), 49152, 64),
        ("embedded 17,483 @ 16,384", np.load(ROOT / "results/tokenize/lengths.npy").astype(np.int64), 16384, 64),
    ]
    for name, x, budget, mbs in sets:
        edges = lb.optimize_boundaries(x, 6, token_budget=budget, max_batch_size=mbs, num_candidates=64).edges
        for s in lb.STRATEGIES:
            e = edges if s == "bucketed" else None
            tok, cst = (measure(x, s, budget, mbs, a.world_size, cost, const, e, w) for w in (False, True))
            assert tok["steps"] == cst["steps"]
            print(
                f"| {name} | {s} | {tok['steps']:,} | {tok['imbalance']:.1%} | {cst['imbalance']:.1%} | "
                f"{tok['epoch']:.1f} | {cst['epoch']:.1f} | {tok['epoch'] / cst['epoch']:.3f}x |",
                flush=True,
            )
    name, x, budget, mbs = sets[1]
    for s in STREAM_STRATEGIES:  # streamed (buffer 4,096): steps are closing order unless a cost sorts them
        tok, cst = (measure(x, s, budget, mbs, a.world_size, cost, const, None, w, stream=True) for w in (False, True))
        print(
            f"| {name}, stream | {s} | {tok['steps']:,} / {cst['steps']:,} | {tok['imbalance']:.1%} | "
            f"{cst['imbalance']:.1%} | {tok['epoch']:.1f} | {cst['epoch']:.1f} | {tok['epoch'] / cst['epoch']:.3f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
