"""``lenbatch plans``: simulate epochs of every strategy (:func:`lenbatch.batching.simulate.simulate`)
and write what each plan costs and mixes to ``metrics.json``: byte-identical for the same lengths,
edges, params and code. The seconds to plan an epoch go to ``timings.json`` (``plan_seconds`` per
strategy), which no stage reads and no tool tracks: a timing measures the machine, not the plan."""

from __future__ import annotations

from pathlib import Path

from lenbatch_study.core.batchspec import batch_spec
from lenbatch_study.corpus.seed_profile import SEED_COUNT
from lenbatch.batching.simulate import simulate
from lenbatch.batching.strategies import STRATEGIES
from lenbatch_study.core.config import Params
from lenbatch_study.core.log import get_logger
from lenbatch_study.pipeline.artifacts.bucket_edges import NEEDS_EDGES, read_edges
from lenbatch_study.pipeline.artifacts.tokenized import read_lengths_input
from lenbatch_study.pipeline.artifacts.plan_metrics import METRICS, TIMINGS
from lenbatch_study.pipeline.artifacts.writing import write_json, write_resolved


def run(
    *,
    params: Params,
    lengths: str | None,
    out: str | Path,
    seed_profile: bool = False,
    seed_profile_size: int = SEED_COUNT,
    boundaries: str | None = None,
    strategies: list[str] | None = None,
    world_size: int = 1,
) -> int:
    """``lenbatch plans``: metrics.json, :func:`simulate` of ``strategies`` (default: all) over the lengths
    at ``lengths`` (or the generated ``seed_profile``), bucketed with the edges of ``boundaries``.
    (``lenbatch plans --study-replay`` runs :mod:`lenbatch_study.tools.study_replay` instead.)"""
    log = get_logger("lenbatch.plans")
    bt = params.batching
    x, source = read_lengths_input(
        lengths=lengths, generate=seed_profile, seed_profile_size=seed_profile_size, seed=bt.seed
    )
    edges = read_edges(boundaries)
    if strategies is not None and "bucketed" in strategies and edges is None:
        raise ValueError(NEEDS_EDGES)
    chosen = tuple(strategies) if strategies is not None else tuple(STRATEGIES)
    log.info(
        "%s: %d samples, %d epochs per strategy, budget %d tokens, at most %d per batch, world size %d",
        source,
        x.size,
        params.plans.epochs,
        bt.token_budget,
        bt.max_batch_size,
        world_size,
    )
    metrics = simulate(
        x,
        strategies=chosen,
        epochs=params.plans.epochs,
        world_size=world_size,
        log=log,
        spec=batch_spec(params),
        edges=edges,
    )  # edges serve bucketed alone
    out = Path(out)
    timings = {s: row.pop("plan_seconds") for s, row in metrics.items()}
    write_json(out / METRICS, metrics)
    write_json(out / TIMINGS, {"plan_seconds": timings})
    write_resolved(params, out, sections=("batching", "plans"))
    return 0
