"""The one list of batching strategies, each with the layout of its batches.

Params (``train.strategies``), the planner, collate, the sampler and the report read
:data:`STRATEGIES` and :func:`layout_of` from here. A module of its own (not
:mod:`lenbatch.batching.spec`): the params loader validates strategy names with it, so every
stage imports it, and an edit of ``BatchSpec`` must not rerun the stages that never plan a batch
(tokenize, stats). To add a strategy: a row here and its planner in
:mod:`lenbatch.batching.strategies` (an import-time assertion there checks that every strategy has one).
"""

from __future__ import annotations

from typing import Any

LAYOUTS = ("padded", "packed")
# The one list of strategies, each with the layout of its batches (params, planner, collate and the
# report all read these).
STRATEGY_LAYOUTS: dict[str, str] = {"sorted": "padded", "random": "padded", "bucketed": "padded",
                                    "sortish": "padded", "packed": "packed"}
STRATEGIES: tuple[str, ...] = tuple(STRATEGY_LAYOUTS)


def check_strategy(strategy: Any) -> str:
    """``strategy`` if it is one of :data:`STRATEGIES`; ``ValueError`` naming the choices otherwise."""
    if not isinstance(strategy, str) or strategy not in STRATEGY_LAYOUTS:
        raise ValueError(f"strategy {strategy!r} unknown; choose one of {list(STRATEGIES)}")
    return strategy


def layout_of(strategy: str) -> str:
    """The layout a strategy's batches have (:data:`STRATEGY_LAYOUTS`): ``"packed"`` rows for ``packed``,
    ``"padded"`` batches for the others; ``ValueError`` for an unknown strategy."""
    return STRATEGY_LAYOUTS[check_strategy(strategy)]


__all__ = ["LAYOUTS", "STRATEGIES", "STRATEGY_LAYOUTS", "check_strategy", "layout_of"]
