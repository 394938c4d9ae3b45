"""The library's :class:`lenbatch.BatchSpec` and :class:`lenbatch.Strategy` from the study's params
(``params.batching``) and boundaries: the one place the study's params shape meets the library's batching."""

from __future__ import annotations

from typing import Any

from lenbatch.batching.spec import BatchSpec
from lenbatch.batching.strategy import Strategy


def batch_spec(params: Any, *, min_batches: int = 0) -> BatchSpec:
    """The limits and plan randomness of ``params.batching`` (the same for every strategy of a run)."""
    b = params.batching
    return BatchSpec(
        token_budget=b.token_budget,
        max_batch_size=b.max_batch_size,
        seed=b.seed,
        packed_window=b.packed_window,
        min_batches=min_batches,
    )


def batch_strategy(strategy: "str | Strategy", edges: Any = None) -> Strategy:
    """``strategy`` as a :class:`lenbatch.Strategy`, given the edges every strategy of the run is handed (the
    workflow hands them one boundaries file): kept by ``bucketed``, left out by the others. A Strategy is
    returned as it is (then ``edges`` must be None)."""
    if isinstance(strategy, Strategy):
        return Strategy.of(strategy, edges)
    return Strategy.sharing(strategy, edges)
