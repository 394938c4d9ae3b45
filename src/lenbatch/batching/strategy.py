"""A batching strategy as an object: its name, its layout and, for ``bucketed``, its own edges.

The five strategies (DESIGN.md) and the rules that bind them are stated here, once:

* each makes batches of one **layout**: ``"padded"`` (n samples padded to the longest) for
  ``sorted``, ``random``, ``bucketed`` and ``sortish``; ``"packed"`` rows for ``packed``;
* ``bucketed`` needs its bucket **edges** (K+1 strictly increasing token counts) and no other
  strategy takes any.

A strategy owns its name, layout and edges; a :class:`lenbatch.BatchSpec` owns only the limits and the
plan's randomness, and the two travel side by side. ``Strategy("bucketed", edges=b.edges)`` is what the planner, the sampler and the Trainer integration
accept wherever they take ``strategy=`` (a name alone still works for the four strategies without
edges, and with ``edges=`` beside it). Each strategy's planner is in :mod:`lenbatch.batching.strategies`
(an import-time assertion there checks that every strategy has one). Numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

LAYOUTS = ("padded", "packed")
# The one list of strategies, each with the layout of its batches.
STRATEGY_LAYOUTS: dict[str, str] = {
    "sorted": "padded",
    "random": "padded",
    "bucketed": "padded",
    "sortish": "padded",
    "packed": "packed",
}
STRATEGIES: tuple[str, ...] = tuple(STRATEGY_LAYOUTS)
WITH_EDGES = ("bucketed",)  # the strategies that plan with bucket edges


def check_strategy(strategy: Any) -> str:
    """``strategy`` if it is one of :data:`STRATEGIES`; ``ValueError`` naming the choices otherwise."""
    if not isinstance(strategy, str) or strategy not in STRATEGY_LAYOUTS:
        raise ValueError(f"strategy {strategy!r} unknown; choose one of {list(STRATEGIES)}")
    return strategy


def layout_of(strategy: str) -> str:
    """The layout a strategy's batches have: ``"packed"`` rows for ``packed``, ``"padded"`` batches for
    the others; ``ValueError`` for an unknown strategy."""
    return STRATEGY_LAYOUTS[check_strategy(strategy)]


def edges_tuple(edges: Any) -> tuple[int, ...] | None:
    """``edges`` as a tuple of ints (None stays None); ``ValueError`` unless K+1 >= 2 strictly increasing
    non-negative integers. Whether they cover the lengths is checked where the lengths are known."""
    if edges is None:
        return None
    e = np.asarray(edges)
    if e.ndim != 1 or e.size < 2:
        raise ValueError(
            f"edges must be a list of at least 2 bucket edges, got {edges!r}; "
            "pass K+1 increasing ints (Boundaries.edges)"
        )
    if not np.issubdtype(e.dtype, np.integer):
        if not (np.issubdtype(e.dtype, np.number) and np.all(np.isfinite(e)) and np.all(e == np.round(e))):
            raise ValueError(f"edges must be integers (tokens), got {edges!r}")
    e = e.astype(np.int64)
    if np.any(np.diff(e) <= 0):
        raise ValueError(f"edges {e.tolist()} must be strictly increasing; sort them and remove duplicates")
    if e[0] < 0:
        raise ValueError(
            f"edges {e.tolist()} start below 0 tokens; bucket edges are lengths (tokens >= 0), so start at 0"
        )
    return tuple(int(v) for v in e)


def kept_edges(strategy: str, edges: Any) -> Any:
    """``edges`` if ``strategy`` plans with edges, else None: what a strategy keeps of the edges every
    strategy of a run is handed (one boundaries file for all). Whether it has the edges it needs is
    checked where it plans (:class:`Strategy`)."""
    return edges if check_strategy(strategy) in WITH_EDGES else None


@dataclass(frozen=True)
class Strategy:
    """One batching strategy: ``name`` (one of :data:`STRATEGIES`) and, for ``bucketed`` only, its ``edges``.

    ``ValueError`` naming the fix for an unknown name, ``bucketed`` without edges, edges given to a
    strategy that takes none, and edges that are not K+1 strictly increasing non-negative ints.
    """

    name: str
    edges: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        check_strategy(self.name)
        object.__setattr__(self, "edges", edges_tuple(self.edges))  # frozen: normalised once, here
        if self.name in WITH_EDGES and self.edges is None:
            raise ValueError(
                f"strategy {self.name!r} needs edges (bucket boundaries in tokens); pass "
                "edges=lenbatch.optimize_boundaries(lengths, ...).edges"
            )
        if self.name not in WITH_EDGES and self.edges is not None:
            raise ValueError(
                f"edges are only used by strategy 'bucketed', not {self.name!r}; drop edges= or use strategy='bucketed'"
            )

    @property
    def layout(self) -> str:
        """``"padded"`` or ``"packed"``: the layout of this strategy's batches."""
        return STRATEGY_LAYOUTS[self.name]

    @property
    def packed(self) -> bool:
        """Whether this strategy's batches are packed rows."""
        return self.layout == "packed"

    def check_lengths(self, x: np.ndarray) -> None:
        """``ValueError`` when this strategy's edges do not cover the lengths ``x`` (``edges[0] <= min`` and
        ``edges[-1] > max``); nothing to check without edges. O(n)."""
        if self.edges is None:
            return
        lo, hi = int(x.min()), int(x.max())
        if self.edges[0] > lo or self.edges[-1] <= hi:
            raise ValueError(
                f"edges {list(self.edges)} do not cover the lengths {lo}..{hi}: need edges[0] <= min "
                "and edges[-1] > max; recompute boundaries for these lengths"
            )

    @classmethod
    def of(cls, strategy: "str | Strategy", edges: Any = None) -> "Strategy":
        """``strategy`` as a :class:`Strategy`: a name with ``edges`` beside it, or a Strategy (then
        ``edges`` must be None: a strategy carries its own; ``ValueError`` naming the fix otherwise)."""
        if isinstance(strategy, Strategy):
            if edges is not None:
                raise ValueError(
                    f"{strategy!r} carries its own edges and edges= was given too; pass the edges "
                    "once: drop edges=, or pass strategy=Strategy.name with edges="
                )
            return strategy
        return cls(strategy, edges)

    @classmethod
    def sharing(cls, name: str, edges: Any) -> "Strategy":
        """``name`` given the edges every strategy of a run is handed (one boundaries file for all):
        kept by the strategies that plan with edges, left out by the others."""
        return cls(name, kept_edges(name, edges))


__all__ = [
    "LAYOUTS",
    "STRATEGIES",
    "STRATEGY_LAYOUTS",
    "Strategy",
    "WITH_EDGES",
    "check_strategy",
    "edges_tuple",
    "kept_edges",
    "layout_of",
]
