"""The study's boundary objective (``boundaries.objective: study``): the published study priced a bucket as
n * E[max of B draws], B = min(max_batch_size, token_budget // mean), and chose its edges by it. The library
minimises its own ``"greedy"`` renewal model of the real plan; this one is the study's, given to the library's
optimizers as a :class:`lenbatch.batching.padding.Objective` so that the study's 86.8% can be replayed."""

from __future__ import annotations

from typing import Any

import numpy as np

from lenbatch.batching.padding import Objective, expected_max, log_factorials

OBJECTIVES = ("greedy", "study")  # boundaries.objective's choices (params, flags)


def study_bucket_computed(
    values: np.ndarray, counts: np.ndarray, token_budget: int, max_batch_size: int, lf: np.ndarray | None = None
) -> float:
    """The study's model: B = min(max_batch_size, token_budget // mean), computed = n * E[max of B draws].

    E[max] is exact (without replacement, :func:`lenbatch.batching.padding.expected_max`). It ignores that the greedy plan
    adapts the batch size to each batch's maximum and the partial last batch.
    """
    n = int(counts.sum())
    useful = int(np.dot(np.asarray(values, dtype=np.int64), np.asarray(counts, dtype=np.int64)))
    b = int(min(max_batch_size, max(1, token_budget * n // useful), n))  # budget // mean, in integers
    return n * expected_max(values, b, counts)


def study_cost_matrix(
    v: np.ndarray, c: np.ndarray, P: np.ndarray, token_budget: int, max_batch_size: int
) -> np.ndarray:
    """cost[a, b] = n * E[max of B draws without replacement], B = min(max_batch_size, budget // mean, n).

    Per start a and each distinct B: a cumulative log-sum-exp over the values of
    log(gap_p) + log(F_p! / (F_p - B)!), read at every bucket top with that B. Cost O(C * #B * distinct).
    """
    L2 = len(P)
    Fc = np.concatenate([[0], np.cumsum(c)])
    S = np.concatenate([[0], np.cumsum(v.astype(np.int64) * c)])
    lf = log_factorials(int(Fc[-1]))
    cost = np.full((L2, L2), np.inf)
    logv_gap = np.log(np.maximum(np.diff(v), 1).astype(np.float64))
    for a in range(L2 - 1):
        p0 = int(P[a])
        js = np.arange(a + 1, L2)
        pt = P[js] - 1
        N = Fc[pt + 1] - Fc[p0]
        useful = S[pt + 1] - S[p0]
        B = np.minimum(np.minimum(max_batch_size, np.maximum(1, token_budget * N // useful)), N).astype(np.int64)
        f = Fc[p0 + 1 :] - Fc[p0]  # samples <= v_p from p0
        for bval in np.unique(B):
            sel = B == bval
            top = int(pt[sel].max())
            ff = f[: top - p0]  # positions p0..top-1 (those below some top)
            ok = ff >= bval
            terms = np.where(ok, logv_gap[p0:top] + lf[ff] - lf[np.where(ok, ff - bval, 0)], -np.inf)
            acc = np.concatenate([[-np.inf], np.logaddexp.accumulate(terms)]) if terms.size else np.array([-np.inf])
            ltop = pt[sel] - p0
            Ns = N[sel].astype(np.int64)
            emax = v[pt[sel]] - np.exp(acc[ltop] - (lf[Ns] - lf[Ns - bval]))
            cost[a, js[sel]] = N[sel] * emax
    return cost


STUDY = Objective("study", study_bucket_computed, study_cost_matrix)


def objective_named(name: str) -> Any:
    """What the library's optimizers take for ``boundaries.objective``: ``"greedy"`` (the library's own) or
    :data:`STUDY`; ``ValueError`` naming the setting otherwise."""
    if name == "study":
        return STUDY
    if name == "greedy":
        return "greedy"
    raise ValueError(f"boundaries.objective {name!r} unknown; choose one of {list(OBJECTIVES)}")
