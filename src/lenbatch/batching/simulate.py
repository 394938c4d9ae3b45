"""Simulated epochs of every strategy: what each plan costs and how it mixes (the ``plans`` stage's numbers).

Per strategy, over ``epochs`` epochs (world size ``world_size``, all ranks' batches together):
padding efficiency and budget fill (totals over the epochs), steps per rank per epoch, useful and
computed tokens per epoch, composition repeat (mean over consecutive epoch pairs), length mixing
(mean over epochs, each epoch against the ``random`` plan of the same epoch: random scores 1) and the seconds to plan one epoch (mean). ``bucketed`` also reports the
boundary objective's predicted efficiency for the edges used. Pure numpy (``sortish`` draws its
permutation with torch, as transformers does). Cost: ``epochs`` plans per strategy plus O(N log N)
metrics.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from lenbatch.batching.padding import batch_tokens, composition_repeat, length_mixing, predict_bucketed
from lenbatch.batching.spec import BatchSpec, spec_or_keywords
from lenbatch.batching.strategies import STRATEGIES, plan_epoch_all
from lenbatch.batching.strategy import WITH_EDGES, Strategy, edges_tuple


def simulate(
    lengths: np.ndarray,
    *,
    strategies: tuple[str, ...] = STRATEGIES,
    epochs: int = 3,
    seed: int = 0,
    token_budget: int | None = None,
    max_batch_size: int | None = None,
    edges: Any = None,
    packed_window: int = 8,
    world_size: int = 1,
    log: Any = None,
    spec: BatchSpec | None = None,
) -> dict[str, dict[str, Any]]:
    """Metrics of every strategy (see module doc); ``bucketed`` is skipped with a log line when edges is None.

    The batching comes as keyword arguments or whole as ``spec``; ``edges`` serve ``bucketed`` alone (each
    strategy plans as ``Strategy.sharing(name, edges)``)."""
    base = spec_or_keywords(
        spec, token_budget=token_budget, max_batch_size=max_batch_size, seed=seed, packed_window=packed_window
    )
    edges = edges_tuple(edges)
    if epochs < 2:
        raise ValueError(f"plans.epochs must be >= 2 to measure composition repeat, got {epochs}")
    out: dict[str, dict[str, Any]] = {}
    # length mixing's reference: the random order's plan of each epoch under the same spec and ranks
    reference = [
        [b for r in plan_epoch_all(lengths, strategy="random", epoch=e, world_size=world_size, spec=base) for b in r]
        for e in range(epochs)
    ]
    if "sortish" in strategies:  # import torch + transformers before timing, so plan_seconds is planning only
        from transformers.trainer_pt_utils import get_length_grouped_indices  # noqa: F401
    for strategy in strategies:
        if strategy in WITH_EDGES and edges is None:
            if log:
                log.info("bucketed skipped: no --boundaries given")
            continue
        plans, secs = [], []
        strategy_s = Strategy.sharing(strategy, edges)
        for e in range(epochs):
            t0 = time.perf_counter()
            ranks = plan_epoch_all(lengths, strategy=strategy_s, epoch=e, world_size=world_size, spec=base)
            secs.append(time.perf_counter() - t0)
            plans.append((ranks, [b for r in ranks for b in r]))
        useful = computed = 0
        steps = []
        for ranks, flat in plans:
            u, c = batch_tokens(lengths, flat, packed=strategy_s.packed)
            useful += int(u.sum())
            computed += int(c.sum())
            steps.append(len(ranks[0]))
        n_batches = sum(len(flat) for _, flat in plans)
        row = {
            "padding_efficiency": useful / computed,
            "budget_fill": computed / (n_batches * base.token_budget),
            "steps": float(np.mean(steps)),
            "useful_tokens": useful / epochs,
            "computed_tokens": computed / epochs,
            "composition_repeat": float(
                np.mean([composition_repeat(plans[e][1], plans[e + 1][1], lengths.size) for e in range(epochs - 1)])
            ),
            "length_mixing": float(
                np.mean([length_mixing(lengths, flat, reference=reference[e]) for e, (_, flat) in enumerate(plans)])
            ),
            "plan_seconds": float(np.mean(secs)),
            "world_size": world_size,
            "epochs": epochs,
        }
        if strategy == "bucketed":
            row["edges"] = [int(v) for v in edges]
            row["predicted_efficiency"] = predict_bucketed(
                lengths, edges, token_budget=base.token_budget, max_batch_size=base.max_batch_size
            )["efficiency"]
        out[strategy] = row
        if log:
            log.info(
                "%-8s padding efficiency %.4f, budget fill %.4f, %.0f steps/epoch, composition repeat %.5f, "
                "length mixing %.3f, %.2f s to plan an epoch",
                strategy,
                row["padding_efficiency"],
                row["budget_fill"],
                row["steps"],
                row["composition_repeat"],
                row["length_mixing"],
                row["plan_seconds"],
            )
    return out
