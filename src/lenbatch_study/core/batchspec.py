"""The library's :class:`lenbatch.BatchSpec` from the study's params (``params.batching``): the one place
the study's params shape meets the library's batch specification."""

from __future__ import annotations

from typing import Any

from lenbatch.batching.spec import BatchSpec
from lenbatch.batching.strategy import kept_edges, layout_of


def batch_spec(params: Any, *, strategy: str, edges: Any = None, min_batches: int = 0) -> BatchSpec:
    """The spec of ``params.batching`` for ``strategy``. ``edges`` are kept for ``bucketed`` only
    (the workflow hands every strategy the same boundaries file)."""
    b = params.batching
    return BatchSpec(token_budget=b.token_budget, max_batch_size=b.max_batch_size, layout=layout_of(strategy),
                     seed=b.seed, packed_window=b.packed_window, edges=kept_edges(strategy, edges),
                     min_batches=min_batches)
