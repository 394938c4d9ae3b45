"""``BatchSpec``: what one batch may be and how an epoch's plan is drawn, validated once and passed whole.

A spec holds the limits (``token_budget``, ``max_batch_size``) and the plan's randomness and knobs
(``seed``, ``packed_window``, ``min_batches``); the strategy (:class:`lenbatch.Strategy`: name, layout and,
for ``bucketed``, edges) is passed beside it, never inside it, so "bucketed with these edges" is said one
way. The public functions keep their keyword arguments and build a spec from them, or take it whole as
``spec=``, never both: one rule and one error for all of them (:func:`spec_or_keywords`,
:func:`refuse_both`).

Rules (DESIGN.md), for a batch of the strategy's ``layout``:

* padded: a batch of ``n`` sequences whose longest has ``m`` tokens computes ``n * m`` tokens;
  it fits when ``n <= max_batch_size`` and ``n * m <= token_budget``. The greedy packer grows a
  batch while ``fits(n + 1, max(m, next))``, i.e. ``(n+1) * max(m, next) <= token_budget`` and
  ``n < max_batch_size``.
* packed: a row of ``n`` sequences of ``T`` tokens in all computes ``T`` tokens; it fits when
  ``n <= max_batch_size`` and ``T <= token_budget``.

Numpy only (``import lenbatch`` stays light).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from lenbatch.batching.strategy import LAYOUTS, Strategy


def check_int(name: str, value: Any, *, minimum: int) -> int:
    """``value`` as an int >= ``minimum``; ``ValueError`` naming ``name`` for None, bools, floats
    (16384.5 and 16384.0 alike: a budget is a count of tokens), generators and the like."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        hint = (
            " (a seed is an int; a numpy Generator or None cannot be resumed or shared across ranks)"
            if name == "seed"
            else ""
        )
        raise ValueError(f"{name} must be an int, got {value!r} ({type(value).__name__}){hint}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_layout(layout: Any) -> str:
    if isinstance(layout, Strategy):
        return layout.layout
    if layout not in LAYOUTS:
        raise ValueError(
            f"layout {layout!r} unknown; pass one of {list(LAYOUTS)} or the lenbatch.Strategy "
            "whose batches these are (its .layout)"
        )
    return layout


@dataclass(frozen=True)
class BatchSpec:
    """One batch's limits and the plan's randomness; ``ValueError`` naming the argument and the fix.

    What belongs here is what stays the same when the strategy changes: a run compares strategies under one
    spec. ``token_budget`` and ``max_batch_size`` bound every batch. ``seed`` draws every strategy's epoch
    (``default_rng(seed + epoch)``), so it is the run's, not a strategy's: two strategies planned under one
    seed are the comparison the study makes. ``packed_window`` (the first-fit search window of ``packed``)
    and ``min_batches`` (0: off; an epoch of at least that many batches over all ranks, what trainers that fix
    the steps per epoch need) are knobs of the planning that every strategy accepts and the sampler's
    fingerprint covers; they say nothing about which batches a strategy forms, unlike a layout or edges,
    which are the strategy's (:class:`lenbatch.Strategy`) and are passed beside the spec.
    """

    token_budget: int
    max_batch_size: int
    seed: int = 0
    packed_window: int = 8
    min_batches: int = 0

    def __post_init__(self) -> None:
        fix = object.__setattr__  # frozen: normalise once, here
        fix(self, "token_budget", check_int("token_budget", self.token_budget, minimum=1))
        fix(self, "max_batch_size", check_int("max_batch_size", self.max_batch_size, minimum=1))
        fix(self, "seed", check_int("seed", self.seed, minimum=0))
        fix(self, "packed_window", check_int("packed_window", self.packed_window, minimum=1))
        fix(self, "min_batches", check_int("min_batches", self.min_batches, minimum=0))

    def fits(self, n: int, tokens: int, *, layout: "str | Strategy") -> bool:
        """Whether ``n`` sequences fit one batch of ``layout`` (``"padded"``/``"packed"`` or a Strategy):
        padded, ``tokens`` is the longest one's length (``n * tokens <= token_budget``); packed, ``tokens``
        is the row's total (``tokens <= token_budget``). Both: ``n <= max_batch_size``. O(1)."""
        packed = _check_layout(layout) == "packed"
        if n > self.max_batch_size:
            return False
        return (tokens if packed else n * tokens) <= self.token_budget

    def cost(self, lengths: Any, *, layout: "str | Strategy") -> int:
        """Computed tokens of one batch of these sequence lengths in ``layout``: ``n * max`` padded, ``sum``
        packed. O(n)."""
        packed = _check_layout(layout) == "packed"
        x = np.asarray(lengths, dtype=np.int64)
        if x.size == 0:
            return 0
        return int(x.sum()) if packed else int(x.size * x.max())

    def check_lengths(self, x: np.ndarray, strategy: "Strategy | None" = None) -> None:
        """``ValueError`` when a sample is longer than the budget or, given ``strategy``, its edges do not
        cover the lengths (:meth:`lenbatch.Strategy.check_lengths`). O(n)."""
        longest = int(x.max())
        if longest > self.token_budget:
            n_over = int(np.count_nonzero(x > self.token_budget))
            raise ValueError(
                f"{n_over} sample(s) are longer than token_budget={self.token_budget} (longest "
                f"{longest} tokens); raise token_budget or truncate those samples"
            )
        if strategy is not None:
            strategy.check_lengths(x)

    def fingerprint(self, x: np.ndarray, strategy: "str | Strategy") -> str:
        """16 hex digits identifying the plan of ``strategy`` (its name and edges) over lengths ``x`` under
        this spec: sha256 of the lengths as little-endian int64, then of the sorted JSON of the strategy's
        name and edges and this spec's values (the sampler's resume check; byte-identical to the earlier
        fingerprint, when the spec carried the edges, so saved states still load). ``min_batches`` enters
        only when set. O(n), in 1 Mi-sample blocks."""
        strategy = Strategy.of(strategy)
        h = hashlib.sha256()
        step = 1 << 20  # the int64 bytes a block at a time: the same digest, no n-sized int64 copy
        for a in range(0, x.size, step):
            h.update(np.ascontiguousarray(x[a : a + step], dtype="<i8"))
        fp: dict[str, Any] = {
            "strategy": strategy.name,
            "token_budget": self.token_budget,
            "max_batch_size": self.max_batch_size,
            "seed": self.seed,
            "edges": strategy.edges,
            "packed_window": self.packed_window,
        }
        if self.min_batches:
            fp["min_batches"] = self.min_batches
        h.update(json.dumps(fp, sort_keys=True).encode())
        return h.hexdigest()[:16]


# The public functions' defaults for the batching keywords: a keyword left at its default counts as not
# given beside ``spec=`` (seed=0 with a spec is the spec's seed, not a conflict).
KEYWORD_DEFAULTS: dict[str, Any] = {
    "token_budget": None,
    "max_batch_size": None,
    "seed": 0,
    "packed_window": 8,
    "min_batches": 0,
}


def refuse_both(spec: Any, **keywords: Any) -> None:
    """``ValueError`` when ``spec`` is given together with any of ``keywords`` set away from its default
    (:data:`KEYWORD_DEFAULTS`; others default to None), or is not a :class:`BatchSpec`: the one check of
    every public function that takes ``spec=`` or keyword arguments."""
    if spec is None:
        return
    if not isinstance(spec, BatchSpec):
        raise ValueError(f"spec must be a lenbatch.BatchSpec, got {type(spec).__name__}")
    given = sorted(
        k
        for k, v in keywords.items()
        if v is not None and (KEYWORD_DEFAULTS.get(k) is None or v != KEYWORD_DEFAULTS[k])
    )
    if given:
        raise ValueError(
            f"pass either spec= or the batching arguments, not both (got spec= and {given}); put them in the BatchSpec"
        )


def spec_or_keywords(spec: "BatchSpec | None", **keywords: Any) -> BatchSpec:
    """``spec`` (then ``keywords`` must be at their defaults: :func:`refuse_both`), else a
    :class:`BatchSpec` built from ``keywords`` (``token_budget``, ``max_batch_size`` and whichever of
    ``seed``, ``packed_window``, ``min_batches`` the function takes)."""
    refuse_both(spec, **keywords)
    if spec is not None:
        return spec
    if keywords.get("token_budget") is None or keywords.get("max_batch_size") is None:
        raise ValueError("pass token_budget= and max_batch_size= (or spec=lenbatch.BatchSpec(...))")
    return BatchSpec(**keywords)
