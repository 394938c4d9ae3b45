"""The cost of a batch beyond its tokens: :class:`Cost` (``per_token`` a, ``per_token_squared`` b) and
the limits a ``cost_budget`` puts on the planner's batches.

A padded batch of n samples padded to m tokens costs n·(a·m + b·m²) (every row computes m positions,
attention over m); a packed row of sequences n_1..n_k costs Σ(a·n_i + b·n_i²) (attention never crosses
a sequence). ``Cost()`` (a = 1, b = 0) is the computed tokens of DESIGN.md. With ``cost_budget`` C no
batch costs more than C (besides ``token_budget`` and ``max_batch_size``); with a cost and no budget the
batches are the token-only ones and only the ranks' balance uses the cost.

Padded greedy packing under both budgets: a batch whose longest has m tokens may hold
cap(m) = min(max_batch_size, token_budget // m, floor(C / g(m))) samples, g(m) = a·m + b·m², and g
grows with m, so "grow while n + 1 <= cap(max(m, next))" is the token rule with one more bound. The
compiled greedy scans take it unchanged through *effective lengths* e(m) = K // cap(m), K = (B+1)²
(B = max_batch_size): for 1 <= c <= B, t·(K // c) <= K exactly when t <= c (K >= c(c+1)), and e grows
with m, so the scan's ``(n+1)·max(e) <= K`` is ``n + 1 <= cap(max m)``. Numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Cost:
    """The cost of a batch: ``per_token`` a and ``per_token_squared`` b (module doc). ``ValueError`` for a
    negative or non-finite coefficient, or both zero."""

    per_token: float = 1.0
    per_token_squared: float = 0.0

    def __post_init__(self) -> None:
        for name in ("per_token", "per_token_squared"):
            v = getattr(self, name)
            if (
                isinstance(v, bool)
                or not isinstance(v, (int, float, np.integer, np.floating))
                or not np.isfinite(v)
                or v < 0
            ):
                raise ValueError(
                    f"Cost({name}={v!r}): a coefficient must be a finite number >= 0 (a step's "
                    "seconds per token, per token squared)"
                )
            object.__setattr__(self, name, float(v))
        if self.per_token == 0 and self.per_token_squared == 0:
            raise ValueError(
                "Cost(per_token=0, per_token_squared=0) prices every batch at 0; give at least one coefficient > 0"
            )

    def per_row(self, m: Any) -> Any:
        """g(m) = a·m + b·m²: one sequence (or one padded row) of m tokens (float64)."""
        m = np.asarray(m, dtype=np.float64)
        return self.per_token * m + self.per_token_squared * m * m

    def of_batches(self, lengths: Any, batches: Any, *, packed: bool) -> np.ndarray:
        """float64 cost of each batch (a :class:`lenbatch.Plan` or a list of index arrays into ``lengths``),
        in order. O(N)."""
        if not len(batches):
            return np.zeros(0)
        offsets = getattr(batches, "offsets", None)
        if offsets is not None and hasattr(batches, "indices"):
            idx, sizes, starts = batches.indices, np.diff(offsets), offsets[:-1]
        else:
            sizes = np.fromiter((len(b) for b in batches), dtype=np.int64, count=len(batches))
            idx = np.concatenate(batches)
            starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        if np.any(sizes == 0):
            raise ValueError("a batch is empty; plans never hold empty batches")
        return self.of_segments(np.asarray(lengths)[idx], starts, sizes, packed=packed)

    def of_segments(self, xs: np.ndarray, starts: np.ndarray, sizes: np.ndarray, *, packed: bool) -> np.ndarray:
        """Cost of the batches ``xs[starts[i]:starts[i]+sizes[i]]`` (lengths; starts ascending, covering)."""
        if packed:
            return np.add.reduceat(self.per_row(xs), starts)
        m = np.maximum.reduceat(np.asarray(xs, dtype=np.float64), starts)
        return sizes * self.per_row(m)


@dataclass(frozen=True)
class CostLimit:
    """What the planner needs of (cost, cost_budget) for lengths up to ``top``: ``effective[v]`` (padded
    greedy scans with budget ``k``; None without a cost budget) and the cost itself."""

    cost: Cost
    cost_budget: float | None
    effective: np.ndarray | None
    k: int


def cost_limit(
    x: np.ndarray, *, token_budget: int, max_batch_size: int, cost: Cost | None, cost_budget: Any
) -> CostLimit | None:
    """The :class:`CostLimit` of these lengths, or None without a cost (the token-only planner, unchanged).
    ``ValueError`` naming the fix for a budget without a cost, a budget that is not a positive number, or
    samples that alone cost more than the budget. Cost O(longest length)."""
    if cost is None:
        if cost_budget is not None:
            raise ValueError(
                "cost_budget needs cost=lenbatch.Cost(per_token=..., per_token_squared=...) to price "
                "the batches; pass both"
            )
        return None
    if not isinstance(cost, Cost):
        raise ValueError(
            f"cost must be a lenbatch.Cost(per_token=..., per_token_squared=...), got {type(cost).__name__}"
        )
    if cost_budget is None:
        return CostLimit(cost, None, None, 0)
    if (
        isinstance(cost_budget, bool)
        or not isinstance(cost_budget, (int, float, np.integer, np.floating))
        or not np.isfinite(cost_budget)
        or cost_budget <= 0
    ):
        raise ValueError(f"cost_budget must be a number > 0 (the most one batch may cost), got {cost_budget!r}")
    c = float(cost_budget)
    top = int(x.max())
    g = cost.per_row(np.arange(top + 1))
    over = int(np.count_nonzero(cost.per_row(x) > c))
    if over:
        raise ValueError(
            f"{over} sample(s) alone cost more than cost_budget={c:g} (the longest, {top} tokens, costs "
            f"{float(g[top]):g}); raise cost_budget or truncate those samples"
        )
    caps = np.minimum(max_batch_size, token_budget // np.maximum(np.arange(top + 1), 1)).astype(np.int64)
    with np.errstate(divide="ignore"):
        by_cost = np.floor(np.where(g > 0, c / np.where(g > 0, g, 1), max_batch_size)).astype(np.int64)
    # the floor of a float quotient can land one off: settle it on the rule itself, n·g(m) <= C
    by_cost -= (by_cost * g > c).astype(np.int64)
    by_cost += ((by_cost + 1) * g <= c).astype(np.int64)
    caps = np.maximum(np.minimum(caps, by_cost), 1)
    k = (max_batch_size + 1) ** 2
    return CostLimit(cost, c, (k // caps).astype(np.int64), k)


def cost_fingerprint(fingerprint: str, cost: Cost | None, cost_budget: Any) -> str:
    """A plan's fingerprint (16 hex digits) with the cost folded in; unchanged without a cost, so states
    saved by token-only samplers still load."""
    if cost is None:
        return fingerprint
    import hashlib

    key = f"{fingerprint}|{cost.per_token!r}|{cost.per_token_squared!r}|{cost_budget!r}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def first_fit_costed(
    order: np.ndarray,
    x: np.ndarray,
    *,
    token_budget: int,
    max_batch_size: int,
    window: int,
    shortest: int,
    limit: CostLimit,
) -> tuple[list[list[int]], list[list[int]]]:
    """First-fit rows along ``order`` under the token and the cost budget (the rules of
    :func:`lenbatch.batching.scan.first_fit_rows`, a row's cost Σ g(n_i) <= cost_budget as one more bound;
    a row also closes when it could not take even the shortest sequence's cost): (closed rows in closing
    order, the open rows re-packed first-fit decreasing under both budgets). Pure Python, O(n · window)."""
    c = limit.cost_budget
    g_short = float(limit.cost.per_row(shortest))
    ids = order.tolist()
    xs = x[order].tolist()
    gs = limit.cost.per_row(x[order]).tolist()
    rows: list[list[int]] = []
    members: list[list[int]] = []
    rem: list[int] = []
    remc: list[float] = []
    for i, L, gi in zip(ids, xs, gs):
        for k in range(len(rem)):
            if rem[k] >= L and remc[k] >= gi:
                members[k].append(i)
                rem[k] -= L
                remc[k] -= gi
                if rem[k] < shortest or remc[k] < g_short or len(members[k]) >= max_batch_size:
                    rows.append(members.pop(k))
                    rem.pop(k)
                    remc.pop(k)
                break
        else:
            if len(rem) >= window:
                k = rem.index(min(rem))  # close the fullest row (by tokens)
                rows.append(members.pop(k))
                rem.pop(k)
                remc.pop(k)
            if token_budget - L < shortest or c - gi < g_short or max_batch_size == 1:
                rows.append([i])
            else:
                members.append([i])
                rem.append(token_budget - L)
                remc.append(c - gi)
    rest = sorted((i for m in members for i in m), key=lambda i: (-int(x[i]), i))
    tail: list[list[int]] = []
    free: list[int] = []
    freec: list[float] = []
    for i in rest:
        L = int(x[i])
        gi = float(limit.cost.per_row(L))
        for k in range(len(free)):
            if free[k] >= L and freec[k] >= gi and len(tail[k]) < max_batch_size:
                tail[k].append(i)
                free[k] -= L
                freec[k] -= gi
                break
        else:
            tail.append([i])
            free.append(token_budget - L)
            freec.append(c - gi)
    return rows, tail


__all__ = ["Cost", "CostLimit", "cost_fingerprint", "cost_limit", "first_fit_costed"]
