"""``lenbatch boundaries``: optimal length-bucket edges for the lengths input, and the K sweep.

The optimizers are :mod:`lenbatch.batching.boundaries` (pure functions lengths -> edges); this
stage runs the ``boundaries`` section's method on the lengths input and writes
``boundaries.json`` (edges, predicted and simulated efficiency, per-bucket counts) and
``sweep.json`` (K = 1..``boundaries.sweep_max_buckets``) and ``by-strategy/`` (what DVC's training
stages depend on: :func:`by_strategy_files`), all byte-identical for the same lengths,
params and code; the optimizer's seconds go to ``timings.json``, which no stage reads and no tool
tracks (a timing measures the machine, not the data). Cost: one dp solve per K.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from lenbatch_study.core.batchspec import batch_spec
from lenbatch.batching.boundaries import optimize_boundaries, simulate_bucketed, sweep_num_buckets
from lenbatch.batching.lengths import bucket_counts
from lenbatch_study.corpus.seed_profile import SEED_COUNT
from lenbatch.batching.padding import predict_bucketed
from lenbatch.batching.strategy import STRATEGIES
from lenbatch_study.core.config import Params
from lenbatch_study.core.objective import objective_named
from lenbatch_study.core.log import get_logger
from lenbatch_study.pipeline.artifacts.tokenized import read_lengths_input
from lenbatch_study.pipeline.artifacts.bucket_edges import BOUNDARIES, SWEEP, TIMINGS, by_strategy_path
from lenbatch_study.pipeline.artifacts.writing import write_json, write_resolved


def by_strategy_files(boundaries_bytes: bytes, strategies: Iterable[str]) -> dict[str, bytes]:
    """``{strategy: bytes of by-strategy/<strategy>.json}``: ``boundaries_bytes`` for ``bucketed`` (the only
    strategy that plans with edges), a constant naming the strategy for the others, so DVC's training stage
    of a strategy (one foreach body for all) reruns on new edges only for bucketed. Cost: O(#strategies)."""
    return {
        s: boundaries_bytes
        if s == "bucketed"
        else f'{{"strategy": "{s}", "plans_with_bucket_edges": false}}\n'.encode()
        for s in strategies
    }


def run(
    *,
    params: Params,
    lengths: str | None,
    out: str | Path,
    seed_profile: bool = False,
    seed_profile_size: int = SEED_COUNT,
    sweep: bool = True,
) -> int:
    """``lenbatch boundaries``: boundaries.json (the ``boundaries`` section's edges for the lengths at
    ``lengths`` or the generated ``seed_profile``, predicted and simulated) and sweep.json (the K sweep;
    ``[]`` without ``sweep``)."""
    log = get_logger("lenbatch.boundaries")
    p, bt = params.boundaries, params.batching
    x, source = read_lengths_input(
        lengths=lengths, generate=seed_profile, seed_profile_size=seed_profile_size, seed=bt.seed
    )
    log.info(
        "%s: %d samples; %s boundaries, K=%d, budget %d tokens, at most %d per batch",
        source,
        x.size,
        p.method,
        p.num_buckets,
        bt.token_budget,
        bt.max_batch_size,
    )
    spec = batch_spec(params)
    objective = objective_named(p.objective)
    res = optimize_boundaries(
        x, p.num_buckets, method=p.method, objective=objective, num_candidates=p.num_candidates, spec=spec
    )
    sim = simulate_bucketed(x, res.edges, spec=spec)
    pred = predict_bucketed(
        x, res.edges, token_budget=spec.token_budget, max_batch_size=spec.max_batch_size, objective=objective
    )
    out = Path(out)
    doc = res.to_dict()
    seconds = doc.pop("seconds")
    doc.update(sim)
    doc["lengths"] = source
    doc["buckets"] = [
        dict(row, predicted_efficiency=pr["efficiency"])
        for row, pr in zip(bucket_counts(x, res.edges), pred["buckets"])
    ]
    write_json(out / BOUNDARIES, doc)
    # what DVC's training stages depend on (one foreach body for every strategy): only bucketed's changes
    for strategy, data in by_strategy_files((out / BOUNDARIES).read_bytes(), STRATEGIES).items():
        path = by_strategy_path(out, strategy)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    log.info(
        "%s edges %s: predicted %.4f, simulated %.4f padding efficiency (%.2f s)",
        p.method,
        list(res.edges),
        res.predicted_efficiency,
        sim["simulated_efficiency"],
        res.seconds,
    )
    swept = (
        []
        if not sweep
        else sweep_num_buckets(
            x, p.sweep_max_buckets, method=p.method, objective=objective, num_candidates=p.num_candidates, spec=spec
        )
    )
    write_json(out / SWEEP, swept)
    write_json(out / TIMINGS, {"seconds": {"optimize": seconds}})
    write_resolved(params, out, sections=("boundaries", "batching"))
    return 0
