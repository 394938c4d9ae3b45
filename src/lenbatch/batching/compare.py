"""Which strategy for these lengths: every strategy planned and scored in one call (with a
:class:`lenbatch.Cost`, also priced by attention: :mod:`lenbatch.batching.cost`).

:func:`compare_strategies` plans epochs 0 and 1 of every strategy with the in-memory planner and scores
them with the plan metrics of :mod:`lenbatch.batching.padding`. Numpy only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lenbatch.batching.lengths import check_lengths
from lenbatch.batching.cost import Cost
from lenbatch.batching.epoch import Plan, rank_plan
from lenbatch.batching.padding import budget_fill, composition_repeat, length_mixing, padding_efficiency
from lenbatch.batching.spec import BatchSpec, check_int
from lenbatch.batching.strategies import epoch_batches
from lenbatch.batching.strategy import STRATEGIES, Strategy, layout_of


def _epoch(x: np.ndarray, strategy: Strategy, spec: BatchSpec, epoch: int, world_size: int) -> tuple[int, Plan]:
    """(batches per rank, every rank's batches as one compact Plan, step by step and rank by rank)."""
    eb, ranks = epoch_batches(x, strategy=strategy, spec=spec, epoch=epoch, world_size=world_size)
    return len(ranks[0]), rank_plan(eb, np.stack(ranks, axis=1).reshape(-1), strategy.name)


def compare_strategies(
    lengths: Any,
    *,
    token_budget: int,
    max_batch_size: int,
    cost: Cost | None = None,
    seed: int = 0,
    world_size: int = 1,
    edges: Any = None,
    num_buckets: int = 6,
    packed_window: int = 8,
    strategies: tuple[str, ...] = STRATEGIES,
) -> list[dict[str, Any]]:
    """One row per strategy: ``steps`` (batches per rank, epoch 0), ``padding_efficiency``, ``budget_fill``,
    ``composition_repeat`` (epoch 0 vs 1), ``length_mixing`` (vs the random plan of epoch 0) and, with a
    :class:`Cost`, ``cost`` (Σ over steps of the costliest rank's batch, epoch 0) and ``relative_cost``
    (over the cheapest strategy's). ``bucketed`` uses ``edges``, else :func:`lenbatch.optimize_boundaries`
    with ``num_buckets`` (its edges in the row). Cost: two plans per strategy plus the metrics, O(N log N)
    (``benchmarks/bench_compare.py``: seconds at 10^6 samples).
    """
    x = check_lengths(lengths)
    world_size = check_int("world_size", world_size, minimum=1)
    if cost is not None and not isinstance(cost, Cost):
        raise ValueError(
            f"cost must be a lenbatch.Cost(per_token=..., per_token_squared=...), got {type(cost).__name__}"
        )
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        raise ValueError(f"strategies {list(strategies)}: choose among {list(STRATEGIES)}")
    spec = BatchSpec(token_budget=token_budget, max_batch_size=max_batch_size, seed=seed, packed_window=packed_window)
    spec.check_lengths(x)
    if "bucketed" in strategies and edges is None:
        from lenbatch.batching.boundaries import optimize_boundaries

        k = max(1, min(check_int("num_buckets", num_buckets, minimum=1), np.unique(x).size))
        edges = optimize_boundaries(x, k, spec=spec).edges
    reference = _epoch(x, Strategy("random"), spec, 0, world_size)[1]
    rows = []
    for s in strategies:
        strategy = Strategy.sharing(s, edges)  # the edges serve bucketed alone
        steps, e0 = _epoch(x, strategy, spec, 0, world_size)
        e1 = _epoch(x, strategy, spec, 1, world_size)[1]
        row: dict[str, Any] = {
            "strategy": s,
            "layout": layout_of(s),
            "steps": steps,
            "padding_efficiency": padding_efficiency(x, e0, strategy=s),
            "budget_fill": budget_fill(x, e0, token_budget, strategy=s),
            "composition_repeat": composition_repeat(e0, e1, x.size),
            "length_mixing": length_mixing(x, e0, reference=reference),
            "edges": None if strategy.edges is None else list(strategy.edges),
        }
        if cost is not None:
            per_batch = cost.of_batches(x, e0, packed=layout_of(s) == "packed")  # step by step, rank by rank
            row["cost"] = float(per_batch.reshape(-1, world_size).max(axis=1).sum())
        rows.append(row)
    if cost is not None:
        cheapest = min(r["cost"] for r in rows)
        for r in rows:
            r["relative_cost"] = r["cost"] / cheapest
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """``rows`` of :func:`compare_strategies` as a markdown table (one line per strategy)."""
    with_cost = "relative_cost" in rows[0]
    head = ["strategy", "steps", "padding eff.", "budget fill", "composition repeat", "length mixing"]
    head += ["relative cost"] if with_cost else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            f"`{r['strategy']}`",
            f"{r['steps']:,}",
            f"{r['padding_efficiency']:.1%}",
            f"{r['budget_fill']:.1%}",
            f"{r['composition_repeat']:.3f}",
            f"{r['length_mixing']:.3f}",
        ]
        cells += [f"{r['relative_cost']:.3f}"] if with_cost else []
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


__all__ = ["compare_strategies", "format_table"]
