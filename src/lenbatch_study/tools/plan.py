"""``lenbatch plan``: one epoch of one strategy, one rank's batches written as JSON (``plan.json``).

The planner is :func:`lenbatch.batching.strategies.plan_epoch`. Cost: one epoch plan.
"""

from __future__ import annotations

import time
from pathlib import Path

from lenbatch_study.corpus.seed_profile import SEED_COUNT
from lenbatch.batching.padding import budget_fill, padding_efficiency
from lenbatch.batching.strategies import plan_epoch
from lenbatch.batching.strategy import WITH_EDGES, Strategy
from lenbatch_study.core.config import Params
from lenbatch_study.pipeline.artifacts.writing import write_resolved
from lenbatch_study.core.log import get_logger
from lenbatch_study.pipeline.artifacts.bucket_edges import NEEDS_EDGES, read_edges
from lenbatch_study.pipeline.artifacts.tokenized import read_lengths_input
from lenbatch_study.pipeline.artifacts.writing import write_json


def run(
    *,
    params: Params,
    strategy: str,
    lengths: str | None,
    out: str | Path,
    seed_profile: bool = False,
    seed_profile_size: int = SEED_COUNT,
    boundaries: str | None = None,
    epoch: int = 0,
    rank: int = 0,
    world_size: int = 1,
) -> int:
    """``lenbatch plan``: plan.json, rank ``rank``'s batches of epoch ``epoch`` of ``strategy`` over the
    lengths at ``lengths`` (or the generated ``seed_profile``), with the edges of ``boundaries``."""
    log = get_logger("lenbatch.plan")
    bt = params.batching
    x, source = read_lengths_input(
        lengths=lengths, generate=seed_profile, seed_profile_size=seed_profile_size, seed=bt.seed
    )
    edges = read_edges(boundaries)
    if strategy in WITH_EDGES and edges is None:
        raise ValueError(NEEDS_EDGES)
    t0 = time.perf_counter()
    batches = plan_epoch(
        x,
        strategy=Strategy.sharing(strategy, edges),
        epoch=epoch,
        seed=bt.seed,
        token_budget=bt.token_budget,
        max_batch_size=bt.max_batch_size,
        rank=rank,
        world_size=world_size,
        packed_window=bt.packed_window,
    )
    secs = time.perf_counter() - t0
    out = Path(out)
    write_json(
        out / "plan.json",
        {
            "strategy": strategy,
            "epoch": epoch,
            "rank": rank,
            "world_size": world_size,
            "lengths": source,
            "edges": list(edges) if edges else edges,
            "steps": len(batches),
            "padding_efficiency": padding_efficiency(x, batches, strategy=strategy),
            "budget_fill": budget_fill(x, batches, bt.token_budget, strategy=strategy),
            "plan_seconds": secs,
            "batches": [b.tolist() for b in batches],
        },
    )
    write_resolved(params, out, sections=("batching",))
    log.info(
        "%s epoch %d rank %d/%d: %d batches in %.2f s -> %s",
        strategy,
        epoch,
        rank,
        world_size,
        len(batches),
        secs,
        out / "plan.json",
    )
    return 0
