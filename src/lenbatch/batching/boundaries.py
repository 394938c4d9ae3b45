"""Length-bucket boundaries: ``geometric``, ``coordinate`` (the study's search) and ``dp`` (exact).

Every optimizer is a pure function lengths -> edges + predicted efficiency. Bucket k holds
``edges[k] <= length < edges[k+1]``; edges[0] = 0 and edges[-1] = max + 1 (as in the study:
[0, ..., 8192] for lengths up to 8191). Interior edges come from a *candidate grid*: every
distinct length above the minimum when there are at most ``num_candidates`` of them (then the
search covers every partition), else ``num_candidates`` length quantiles (distinct sample values).

Objective (``objective=``): minimise the expected computed tokens, summed over buckets.
- ``"greedy"`` (default): :func:`lenbatch.batching.padding.greedy_bucket_computed`, a renewal model of the
  real greedy bucketed plan (budget-limited batch sizes, the overflowing sample starting the next
  batch, the partial last batch). It predicts simulated plans within 0.1 pp on the seed profile
  and on ShareGPT lengths (tests/batching/test_boundaries.py, benchmarks/bench_core.py).
- an :class:`~lenbatch.batching.padding.Objective`: any other model of a bucket's computed tokens (the
  study's lives in ``lenbatch_study.core.objective``).

``dp`` computes the cost of every candidate bucket once (a (C+2)^2 matrix: vectorised per bucket
start, prefix sums over distinct values, one small matrix product per start; see
:func:`greedy_cost_matrix`) and then solves min over K-partitions exactly by dynamic programming,
O(K C^2): the global optimum of the objective on the grid. ``coordinate`` runs the study's
coordinate descent on the same matrix, ``geometric`` snaps min..max+1 in K equal ratios to the grid.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from lenbatch.batching.padding import (GREEDY, Objective, log_factorials, objective_of, predict_bucketed_counts,
                                      renewal_weights, value_counts)
from lenbatch.batching.lengths import check_lengths
from lenbatch.batching.spec import BatchSpec, spec_or_keywords
from lenbatch.batching.strategy import Strategy


METHODS = ("dp", "coordinate", "geometric")


@dataclasses.dataclass(frozen=True)
class Boundaries:
    """Result of a boundary optimizer."""

    method: str
    num_buckets: int
    edges: tuple[int, ...]  # K+1 ints, edges[0] <= min, edges[-1] > max
    predicted_efficiency: float  # useful / predicted computed tokens under ``objective``
    objective: str
    token_budget: int
    max_batch_size: int
    num_candidates: int  # distinct candidate edge values searched
    seconds: float
    history: tuple[dict[str, Any], ...] = ()  # coordinate: one row per iteration

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["edges"] = list(self.edges)
        d["history"] = list(self.history)
        return d


# --------------------------------------------------------------------------- candidate grid


def candidate_values(lengths: np.ndarray, num_candidates: int) -> np.ndarray:
    """Interior edge candidates: distinct sample values > min (all of them, or ``num_candidates`` quantiles)."""
    return candidates_of_counts(*value_counts(lengths), num_candidates)


def candidates_of_counts(v: np.ndarray, c: np.ndarray, num_candidates: int) -> np.ndarray:
    """:func:`candidate_values` from the histogram (sorted distinct values ``v``, counts ``c``): the
    quantiles ``np.quantile(lengths, q, method="inverted_cdf")`` would give, read off the cumulative
    counts instead of partitioning every sample. O(distinct + num_candidates)."""
    inner = v[1:]
    if inner.size <= num_candidates:
        return inner
    # numpy's inverted_cdf rule: the order statistic at index n*q - 1, rounded up unless whole, at least 0
    n = int(c.sum())
    index = n * (np.arange(1, num_candidates + 1) / (num_candidates + 1)) - 1
    below = np.floor(index)
    at = np.where(index - below == 0, below, below + 1).astype(np.intp)
    at[at < 0] = 0
    cand = np.unique(v[np.searchsorted(np.cumsum(c), at, side="right")].astype(np.int64))
    return cand[cand > v[0]]


def _validate(lengths: Any, num_buckets: int, token_budget: int, max_batch_size: int, method: str,
              objective: "str | Objective", num_candidates: int) -> tuple[np.ndarray, np.ndarray]:
    """The histogram (sorted distinct lengths, counts) of the checked lengths; ``ValueError`` naming the
    setting. Integer lengths are counted as they are (no int64 copy). O(n)."""
    x = np.asarray(lengths)
    if not (x.ndim == 1 and x.size and x.dtype.kind in "iu" and x.min() > 0):
        x = check_lengths(lengths)  # raises, or converts integral floats
    v, c = value_counts(x)
    if method not in METHODS:
        raise ValueError(f"boundaries.method {method!r} unknown; choose one of {list(METHODS)}")
    objective_of(objective)  # ValueError naming the choices
    if token_budget <= 0 or max_batch_size <= 0:
        raise ValueError(f"batching.token_budget ({token_budget}) and batching.max_batch_size ({max_batch_size}) "
                         "must be > 0")
    if v[-1] > token_budget:
        raise ValueError(f"a sample of {int(v[-1])} tokens exceeds batching.token_budget={token_budget}; "
                         "raise the budget or truncate samples (data.max_len)")
    if num_candidates < 1:
        raise ValueError(f"boundaries.num_candidates must be >= 1, got {num_candidates}")
    distinct = int(v.size)
    if not 1 <= num_buckets <= distinct:
        raise ValueError(f"boundaries.num_buckets={num_buckets} but the lengths have {distinct} distinct values; "
                         f"choose K in 1..{distinct}")
    if num_buckets - 1 > num_candidates:
        raise ValueError(f"boundaries.num_buckets={num_buckets} needs >= {num_buckets - 1} candidates; "
                         f"raise boundaries.num_candidates (now {num_candidates})")
    return v, c


# --------------------------------------------------------------------------- cost matrices


def greedy_cost_matrix(v: np.ndarray, c: np.ndarray, P: np.ndarray, token_budget: int,
                       max_batch_size: int) -> np.ndarray:
    """cost[a, b] = :func:`~lenbatch.batching.padding.greedy_bucket_computed` of the bucket holding distinct
    values ``v[P[a]:P[b]]`` (inf where b <= a), for every pair of grid positions at once.

    First the threshold CDFs theta_t = G(T_t) and the first-element law (a backward recurrence) of
    every candidate bucket, all buckets in one vectorised pass. Then, per bucket start a, every
    remaining quantity is a prefix sum over the distinct values above P[a] of gap_p * g_p^n (g_p =
    samples <= v_p from P[a] over a reference count R; n = 0..B_a with B_a = min(max_batch_size,
    budget // v[P[a]])), read at the threshold positions and at each bucket's top; the bucket-dependent
    mixture weights enter through small matrix products. Bucket ends are processed in groups whose
    counts lie within a factor 10^(250/B) of the group's R, so (R/N)^n neither overflows nor loses
    the terms that matter. Cost O(C * B * distinct) flops: ~0.7 s CPU for 902,087 lengths, C = 290.
    """
    mb = int(max_batch_size)
    L2 = len(P)
    F = np.concatenate([[0], np.cumsum(c)]).astype(np.float64)
    T = token_budget // np.arange(1, mb + 2)
    posT = np.searchsorted(v, T, side="right") - 1
    # phase 1: theta and the first-element law of every bucket (a, b), a < b
    A, Bq = np.triu_indices(L2, k=1)
    p0 = P[A]
    top = P[Bq] - 1
    N = F[top + 1] - F[p0]
    q = np.minimum(posT[None, :], top[:, None])
    theta = np.where(q >= p0[:, None], np.minimum((F[q + 1] - F[p0][:, None]) / N[:, None], 1.0), 0.0)
    bw, phi, a0 = renewal_weights(theta)
    cost = np.full((L2, L2), np.inf)
    ratio = min(1e3, 10 ** (250 / mb))
    lf = log_factorials(int(F[-1]))
    first = 0
    for a in range(L2 - 1):
        cnt = L2 - 1 - a
        rows = np.arange(first, first + cnt)
        first += cnt
        pa = int(P[a])
        mb_a = int(max(1, min(mb, token_budget // int(v[pa]))))
        hi = cnt
        while hi > 0:
            R = N[rows[hi - 1]]
            lo = hi - 1
            while lo > 0 and N[rows[lo - 1]] * ratio >= R:
                lo -= 1
            r = rows[lo:hi]
            cost[a, Bq[r]] = _greedy_group(v, F, pa, top[r], N[r], R, posT[:mb_a + 1], T[:mb_a + 1], mb_a,
                                           theta[r, :mb_a + 1], bw[r, :mb_a + 2], phi[r, :mb_a + 2], a0[r])
            hi = lo
        # buckets whose batches all hold exactly mb_a samples: exact hypergeometric full/partial split
        rows_a = rows[v[top[rows]] <= T[mb_a - 1]]
        if rows_a.size:
            cost[a, Bq[rows_a]] = _count_limited(v, F, pa, top[rows_a], N[rows_a], mb_a, lf)
    return cost


def _greedy_group(v, F, p0, pt, N, R, posT, T, mb, theta, b, phi, a0):
    top = int(pt.max())
    ml = top - p0 + 1
    g = (F[p0 + 1:top + 2] - F[p0]) / R
    vloc = v[p0:top + 1].astype(np.float64)
    # E[n, q] = sum_{p<q} gap_p g_p^n, n = 0..mb
    E = np.zeros((mb + 1, ml))
    E[0, 1:] = np.diff(vloc)
    gg = g[:-1]
    for n in range(1, mb + 1):
        np.multiply(E[n - 1, 1:], gg, out=E[n, 1:])
    np.cumsum(E[:, 1:], axis=1, out=E[:, 1:])
    lt = pt - p0
    logs = np.log(R / N)[:, None]
    lT = posT - p0  # local threshold positions for T_1..T_{mb+1}
    qT = np.minimum(lT[None, :], lt[:, None])  # (J, mb+1)
    ts = np.arange(2, mb + 1)
    w = lT[ts - 1] + 1  # local first position above T_s
    maskJ = w[None, :] < lt[:, None]
    bJ = b[:, ts] * maskJ
    bthJ = bJ * theta[:, ts - 1]
    Ew = E[:, np.clip(w, 0, ml - 1)]  # (mb+1, S)
    nn = np.arange(1, mb + 1)
    rn = np.exp(nn[None, :] * logs)
    rn1 = np.exp((nn[None, :] - 1) * logs)
    # Threshold sums for both query kinds (A: q at T_n, B: q at T_{n+1}). w_s never increases with s,
    # so {s: w_s < L} is a suffix of s: plain sums of b over it are reverse cumulative sums; the sums
    # weighted by E_n[w_s] are one matrix product over the thresholds inside this group's range.
    act = np.flatnonzero((w > 0) & (w < lt.max()))
    lo_s, hi_s = (int(act[0]), int(act[-1]) + 1) if act.size else (0, 0)
    bJa, bthJa, wa = bJ[:, lo_s:hi_s], bthJ[:, lo_s:hi_s], w[lo_s:hi_s]
    rcb = np.concatenate([np.cumsum(bJa[:, ::-1], axis=1)[:, ::-1], np.zeros((len(lt), 1))], axis=1)
    rct = np.concatenate([np.cumsum(bthJa[:, ::-1], axis=1)[:, ::-1], np.zeros((len(lt), 1))], axis=1)
    cut = [np.searchsorted(-wa, -lT[nn + shift - 1], side="right") for shift in (0, 1)]  # suffix starts
    masks = [(wa[None, :] < lT[nn + shift - 1][:, None]).astype(np.float64) for shift in (0, 1)]  # (mb, S)
    Ewa = Ew[:, lo_s:hi_s]
    # einsum's own loop, not BLAS: these products are small and many, and a threaded BLAS spends
    # more time synchronising than multiplying (10x slower on a shared 2-core machine)
    prodb = np.einsum("js,ns->jn", bJa, np.concatenate([masks[0] * Ewa[1:mb + 1], masks[1] * Ewa[1:mb + 1]]))
    prodt = np.einsum("js,ns->jn", bthJa, np.concatenate([masks[0] * Ewa[0:mb], masks[1] * Ewa[0:mb]]))
    out_H = []
    for shift in (0, 1):
        tq = nn + shift  # threshold index t for each n
        B1 = rcb[:, cut[shift]]
        B2 = rct[:, cut[shift]]
        BE = prodb[:, shift * mb:(shift + 1) * mb]
        BE2 = prodt[:, shift * mb:(shift + 1) * mb]
        q = qT[:, tq - 1]
        qcl = np.clip(q, 0, ml - 1)
        ssum = rn * (E[nn[None, :], qcl] * (1 + B1) - BE) - rn1 * (E[nn[None, :] - 1, qcl] * B2 - BE2)
        Qq = a0[:, None] * phi[:, tq] * theta[:, tq - 1] ** (nn[None, :] - 1)
        H = np.where(q >= 0, vloc[qcl] * Qq - a0[:, None] * ssum, 0.0)
        out_H.append((H, Qq))
    (HA, QA), (HB, _) = out_H
    HB = HB * theta[:, nn]  # E[M_n; N >= n+1] = H_n(T_{n+1}) G(T_{n+1})
    HB[:, mb - 1] = 0.0
    EN = QA.sum(axis=1)
    ENM = np.sum(nn * (HA - HB), axis=1)
    last = np.sum(nn * HA, axis=1) / EN
    Er = np.sum(nn * QA, axis=1) / EN
    cost = (N - Er) * ENM / EN + last
    return cost


def _count_limited(v, F, p0, pt, N, mb, lf):
    """full * mb * E[max of mb] + r * E[max of r] (hypergeometric) for buckets [p0, pt], r the last batch."""
    top = int(pt.max())
    f = (F[p0 + 1:top + 1] - F[p0]).astype(np.int64)  # samples <= v_p, p = p0..top-1
    gap = np.diff(v[p0:top + 1]).astype(np.float64)
    lt = pt - p0
    Ni = N.astype(np.int64)
    full = (Ni - 1) // mb
    r = Ni - full * mb
    out = np.zeros(len(pt))
    for draws, weight in ((np.full(len(pt), mb), full * mb), (r, r)):
        ok = (f[None, :] >= draws[:, None]) & (np.arange(len(f))[None, :] < lt[:, None])
        hi_i = np.where(ok, f[None, :], 0)
        lo_i = np.where(ok, f[None, :] - draws[:, None], 0)
        logr = lf[hi_i] - lf[lo_i] - (lf[Ni] - lf[Ni - np.minimum(draws, Ni)])[:, None]
        emax = v[pt] - np.sum(np.where(ok, gap[None, :] * np.exp(np.minimum(logr, 0.0)), 0.0), axis=1)
        out += weight * emax
    return out


def pairwise_cost_matrix(bucket: Any, v: np.ndarray, c: np.ndarray, P: np.ndarray, token_budget: int,
                         max_batch_size: int) -> np.ndarray:
    """cost[a, b] = ``bucket(v[P[a]:P[b]], c[P[a]:P[b]], token_budget, max_batch_size)`` (inf where b <= a;
    0 for a bucket holding no value): an :class:`Objective` without its own matrix. O(C^2) bucket calls."""
    L2 = len(P)
    cost = np.full((L2, L2), np.inf)
    for a in range(L2 - 1):
        for b in range(a + 1, L2):
            lo, hi = int(P[a]), int(P[b])
            cost[a, b] = float(bucket(v[lo:hi], c[lo:hi], token_budget, max_batch_size)) if hi > lo else 0.0
    return cost


def cost_matrix(lengths: np.ndarray | None, cand: np.ndarray, token_budget: int, max_batch_size: int,
                objective: "str | Objective", counts: tuple[np.ndarray, np.ndarray] | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cost matrix over grid positions, grid positions P, distinct values); ``counts``: the lengths'
    histogram (:func:`~lenbatch.batching.padding.value_counts`) when the caller holds it."""
    v, c = value_counts(lengths) if counts is None else counts
    P = np.concatenate([[0], np.searchsorted(v, cand, side="left"), [len(v)]])
    obj = objective_of(objective)
    if obj.matrix is not None:
        cost = obj.matrix(v, c, P, token_budget, max_batch_size)
    elif obj is GREEDY:
        cost = greedy_cost_matrix(v, c, P, token_budget, max_batch_size)
    else:
        cost = pairwise_cost_matrix(obj.bucket, v, c, P, token_budget, max_batch_size)
    return cost, P, v


# --------------------------------------------------------------------------- optimizers on a cost matrix


def dp_partition(cost: np.ndarray, k: int) -> tuple[float, list[int]]:
    """Exact min over increasing grid index paths 0 = i_0 < ... < i_k = last of sum cost[i_j, i_j+1]."""
    best, arg = _dp_tables(cost, k)
    last = cost.shape[0] - 1
    return float(best[k][last]), _backtrack(arg, k, last)


def _dp_tables(cost: np.ndarray, kmax: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    L2 = cost.shape[0]
    best = [np.full(L2, np.inf)]
    best[0][0] = 0.0
    arg = [np.zeros(L2, dtype=np.int64)]
    for _ in range(kmax):
        tot = best[-1][:, None] + cost  # (from a, to b)
        a = np.argmin(tot, axis=0)
        best.append(tot[a, np.arange(L2)])
        arg.append(a)
    return best, arg


def _backtrack(arg: list[np.ndarray], k: int, last: int) -> list[int]:
    path = [last]
    for j in range(k, 0, -1):
        path.append(int(arg[j][path[-1]]))
    return path[::-1]


def _path_cost(cost: np.ndarray, path: list[int]) -> float:
    return float(sum(cost[a, b] for a, b in zip(path[:-1], path[1:])))


def geometric_path(v: np.ndarray, cand: np.ndarray, P: np.ndarray, k: int) -> list[int]:
    """Grid path of the geometric edges min * r^i, r = ((max+1)/min)^(1/K), each snapped to the nearest
    candidate value (kept strictly increasing)."""
    lo, hi = float(v[0]), float(v[-1] + 1)
    targets = lo * (hi / lo) ** (np.arange(1, k) / k)
    path = [0]
    L = len(cand)
    for i, t in enumerate(targets):
        j = int(np.argmin(np.abs(cand - t))) + 1  # grid index (1..L)
        j = max(j, path[-1] + 1)
        j = min(j, L - (k - 1 - i) + 1)  # leave room for the remaining edges
        path.append(j)
    path.append(len(P) - 1)
    return path


def coordinate_path(cost: np.ndarray, start: list[int], *, max_iter: int = 100) -> tuple[list[int], list[dict]]:
    """The study's search: Gauss-Seidel coordinate descent, each interior edge in turn moved to the best
    grid position strictly between its neighbours, until an iteration changes nothing."""
    path = list(start)
    history = [{"iteration": 0, "path": list(path), "cost": _path_cost(cost, path)}]
    for it in range(1, max_iter + 1):
        changed = False
        for i in range(1, len(path) - 1):
            lo, hi = path[i - 1], path[i + 1]
            cands = np.arange(lo + 1, hi)
            if cands.size == 0:
                continue
            tot = cost[lo, cands] + cost[cands, hi]
            j = int(cands[np.argmin(tot)])
            if tot.min() < cost[lo, path[i]] + cost[path[i], hi] - 1e-9 and j != path[i]:
                path[i] = j
                changed = True
        history.append({"iteration": it, "path": list(path), "cost": _path_cost(cost, path)})
        if not changed:
            break
    return path, history


def _edges_from_path(path: list[int], cand: np.ndarray, vmax: int) -> tuple[int, ...]:
    return tuple([0] + [int(cand[j - 1]) for j in path[1:-1]] + [int(vmax) + 1])


def optimize_boundaries(lengths: Any, num_buckets: int = 6, *, token_budget: int | None = None,
                        max_batch_size: int | None = None, method: str = "dp", objective: "str | Objective" = "greedy",
                        num_candidates: int = 290, spec: BatchSpec | None = None) -> Boundaries:
    """Bucket edges for ``lengths`` (see module doc). ``ValueError`` on bad input (naming the setting).
    The objective reads the budget and max batch size from ``spec`` or the keywords.

    Cost: one counting pass over the lengths (O(n), no sort and no int64 copy: every step after it
    works on the histogram), then O(C * max_batch_size * distinct) for the cost matrix and O(K C^2)
    for ``dp`` (benchmarks/bench_scale.py: below numpy's argsort of the same lengths at 20 M)."""
    t0 = time.perf_counter()
    spec = spec_or_keywords(spec, token_budget=token_budget, max_batch_size=max_batch_size)
    token_budget, max_batch_size = spec.token_budget, spec.max_batch_size
    v, c = _validate(lengths, num_buckets, token_budget, max_batch_size, method, objective, num_candidates)
    top = int(v[-1])
    cand = candidates_of_counts(v, c, num_candidates)
    useful = float(np.dot(v, c))
    history: list[dict] = []
    if num_buckets == 1:
        edges: tuple[int, ...] = (0, top + 1)
    elif num_buckets - 1 > cand.size:
        raise ValueError(f"boundaries.num_buckets={num_buckets} but only {cand.size} candidate edges exist; "
                         "raise boundaries.num_candidates or lower num_buckets")
    elif method == "geometric":
        P = np.concatenate([[0], np.searchsorted(v, cand), [len(v)]])
        edges = _edges_from_path(geometric_path(v, cand, P, num_buckets), cand, top)
    else:
        cost, P, _ = cost_matrix(None, cand, token_budget, max_batch_size, objective, counts=(v, c))
        if method == "dp":
            _, path = dp_partition(cost, num_buckets)
        else:
            path, hist = coordinate_path(cost, geometric_path(v, cand, P, num_buckets))
            history = [{"iteration": h["iteration"], "edges": list(_edges_from_path(h["path"], cand, top)),
                        "predicted_efficiency": useful / h["cost"]} for h in hist]
        edges = _edges_from_path(path, cand, top)
    pred = predict_bucketed_counts(v, c, edges, token_budget=token_budget, max_batch_size=max_batch_size,
                                   objective=objective)["efficiency"]
    return Boundaries(method=method, num_buckets=num_buckets, edges=edges, predicted_efficiency=float(pred),
                      objective=objective_of(objective).name, token_budget=token_budget, max_batch_size=max_batch_size,
                      num_candidates=int(cand.size), seconds=time.perf_counter() - t0, history=tuple(history))


def _solve_all(v: np.ndarray, c: np.ndarray, ks: list[int], *, token_budget: int, max_batch_size: int, method: str,
               objective: "str | Objective", num_candidates: int) -> dict[int, tuple[tuple[int, ...], list[dict]]]:
    """Edges (and coordinate history) for every K in ``ks`` from one cost matrix, on the histogram
    (sorted distinct lengths ``v``, counts ``c``)."""
    cand = candidates_of_counts(v, c, num_candidates)
    top = int(v[-1])
    out: dict[int, tuple[tuple[int, ...], list[dict]]] = {}
    need = [k for k in ks if k > 1]
    if 1 in ks:
        out[1] = ((0, top + 1), [])
    if not need:
        return out
    P = np.concatenate([[0], np.searchsorted(v, cand), [len(v)]])
    if method == "geometric":
        for k in need:
            out[k] = (_edges_from_path(geometric_path(v, cand, P, k), cand, top), [])
        return out
    cost, P, _ = cost_matrix(None, cand, token_budget, max_batch_size, objective, counts=(v, c))
    useful = float(np.dot(v, c))
    if method == "dp":
        _, arg = _dp_tables(cost, max(need))
        for k in need:
            out[k] = (_edges_from_path(_backtrack(arg, k, len(P) - 1), cand, top), [])
    else:
        for k in need:
            path, hist = coordinate_path(cost, geometric_path(v, cand, P, k))
            history = [{"iteration": h["iteration"], "edges": list(_edges_from_path(h["path"], cand, top)),
                        "predicted_efficiency": useful / h["cost"]} for h in hist]
            out[k] = (_edges_from_path(path, cand, top), history)
    return out


def simulate_bucketed(x: np.ndarray, edges: Any, *, token_budget: int | None = None,
                      max_batch_size: int | None = None, seed: int = 0,
                      spec: BatchSpec | None = None,
                      reference: Sequence[np.ndarray] | None = None) -> dict[str, float]:
    """Simulated epoch 0 of the bucketed plan: padding efficiency; diversity from epochs 0 and 1.
    ``spec`` or the keywords give the batching limits, ``edges`` the buckets. Length mixing is
    against ``reference``, the ``random`` plan of epoch 0 under the same spec (made here when None;
    :func:`sweep_num_buckets` makes it once for every K)."""
    from lenbatch.batching.padding import composition_repeat, length_mixing, padding_efficiency
    from lenbatch.batching.strategies import plan_epoch_all

    spec = spec_or_keywords(spec, token_budget=token_budget, max_batch_size=max_batch_size, seed=seed)
    plans = [plan_epoch_all(x, strategy=Strategy("bucketed", edges), epoch=e, spec=spec)[0] for e in (0, 1)]
    if reference is None:
        reference = plan_epoch_all(x, strategy="random", epoch=0, spec=spec)[0]
    return {"simulated_efficiency": padding_efficiency(x, plans[0]),
            "composition_repeat": composition_repeat(plans[0], plans[1], x.size),
            "length_mixing": length_mixing(x, plans[0], reference=reference)}


def sweep_num_buckets(lengths: Any, max_buckets: int = 16, *, token_budget: int | None = None,
                      max_batch_size: int | None = None, method: str = "dp", objective: "str | Objective" = "greedy",
                      num_candidates: int = 290, seed: int = 0, simulate: bool = True,
                      spec: BatchSpec | None = None) -> list[dict[str, Any]]:
    """The efficiency-diversity frontier: for K = 1..max_buckets (capped at the distinct lengths), the
    edges, predicted efficiency and, with ``simulate``, the simulated efficiency, composition repeat and
    length mixing of the bucketed plan (epochs 0 and 1). dp solves every K from one cost matrix."""
    log = logging.getLogger("lenbatch.boundaries")
    spec = spec_or_keywords(spec, token_budget=token_budget, max_batch_size=max_batch_size, seed=seed)
    seed, token_budget, max_batch_size = spec.seed, spec.token_budget, spec.max_batch_size
    v, c = _validate(lengths, 1, token_budget, max_batch_size, method, objective, num_candidates)
    x = check_lengths(lengths)
    if max_buckets < 1:
        raise ValueError(f"boundaries.sweep_max_buckets must be >= 1, got {max_buckets}")
    kmax = min(max_buckets, int(v.size), candidates_of_counts(v, c, num_candidates).size + 1)
    t0 = time.perf_counter()
    solved = _solve_all(v, c, list(range(1, kmax + 1)), token_budget=token_budget, max_batch_size=max_batch_size,
                        method=method, objective=objective, num_candidates=num_candidates)
    log.info("sweep: edges for K = 1..%d by %s in %.2f s", kmax, method, time.perf_counter() - t0)
    rows = []
    from lenbatch.batching.strategies import plan_epoch_all

    reference = plan_epoch_all(x, strategy="random", epoch=0, spec=spec)[0] if simulate else None
    for k in range(1, kmax + 1):
        edges = solved[k][0]
        pred = predict_bucketed_counts(v, c, edges, token_budget=token_budget, max_batch_size=max_batch_size,
                                       objective=objective)["efficiency"]
        row: dict[str, Any] = {"num_buckets": k, "edges": list(edges), "predicted_efficiency": pred}
        if simulate:
            row.update(simulate_bucketed(x, edges, token_budget=token_budget, max_batch_size=max_batch_size,
                                         seed=seed, reference=reference))
            log.info("sweep K=%d: predicted %.4f, simulated %.4f, composition repeat %.5f, length mixing %.4f",
                     k, pred, row["simulated_efficiency"], row["composition_repeat"], row["length_mixing"])
        rows.append(row)
    return rows
