"""The bucket-boundary search's inputs: the candidate grid of interior edges and the cost matrix over it.

``cost[a, b]`` is the objective's expected computed tokens of one bucket holding the distinct lengths
between grid positions ``a`` and ``b``; every optimizer in :mod:`lenbatch.batching.boundaries` walks
this matrix. Apart from the optimizers because it is the costly, vectorised part (the greedy
objective's renewal model per bucket start) while the searches are a few lines of dynamic programming
or descent over its entries. Numpy only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lenbatch.batching.padding import GREEDY, Objective, log_factorials, objective_of, renewal_weights, value_counts

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


# --------------------------------------------------------------------------- cost matrices


def greedy_cost_matrix(
    v: np.ndarray, c: np.ndarray, P: np.ndarray, token_budget: int, max_batch_size: int
) -> np.ndarray:
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
            cost[a, Bq[r]] = _greedy_group(
                v,
                F,
                pa,
                top[r],
                N[r],
                R,
                posT[: mb_a + 1],
                T[: mb_a + 1],
                mb_a,
                theta[r, : mb_a + 1],
                bw[r, : mb_a + 2],
                phi[r, : mb_a + 2],
                a0[r],
            )
            hi = lo
        # buckets whose batches all hold exactly mb_a samples: exact hypergeometric full/partial split
        rows_a = rows[v[top[rows]] <= T[mb_a - 1]]
        if rows_a.size:
            cost[a, Bq[rows_a]] = _count_limited(v, F, pa, top[rows_a], N[rows_a], mb_a, lf)
    return cost


def _greedy_group(v, F, p0, pt, N, R, posT, T, mb, theta, b, phi, a0):
    top = int(pt.max())
    ml = top - p0 + 1
    g = (F[p0 + 1 : top + 2] - F[p0]) / R
    vloc = v[p0 : top + 1].astype(np.float64)
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
    prodb = np.einsum("js,ns->jn", bJa, np.concatenate([masks[0] * Ewa[1 : mb + 1], masks[1] * Ewa[1 : mb + 1]]))
    prodt = np.einsum("js,ns->jn", bthJa, np.concatenate([masks[0] * Ewa[0:mb], masks[1] * Ewa[0:mb]]))
    out_H = []
    for shift in (0, 1):
        tq = nn + shift  # threshold index t for each n
        B1 = rcb[:, cut[shift]]
        B2 = rct[:, cut[shift]]
        BE = prodb[:, shift * mb : (shift + 1) * mb]
        BE2 = prodt[:, shift * mb : (shift + 1) * mb]
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
    f = (F[p0 + 1 : top + 1] - F[p0]).astype(np.int64)  # samples <= v_p, p = p0..top-1
    gap = np.diff(v[p0 : top + 1]).astype(np.float64)
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


def pairwise_cost_matrix(
    bucket: Any, v: np.ndarray, c: np.ndarray, P: np.ndarray, token_budget: int, max_batch_size: int
) -> np.ndarray:
    """cost[a, b] = ``bucket(v[P[a]:P[b]], c[P[a]:P[b]], token_budget, max_batch_size)`` (inf where b <= a;
    0 for a bucket holding no value): an :class:`Objective` without its own matrix. O(C^2) bucket calls."""
    L2 = len(P)
    cost = np.full((L2, L2), np.inf)
    for a in range(L2 - 1):
        for b in range(a + 1, L2):
            lo, hi = int(P[a]), int(P[b])
            cost[a, b] = float(bucket(v[lo:hi], c[lo:hi], token_budget, max_batch_size)) if hi > lo else 0.0
    return cost


def cost_matrix(
    lengths: np.ndarray | None,
    cand: np.ndarray,
    token_budget: int,
    max_batch_size: int,
    objective: "str | Objective",
    counts: tuple[np.ndarray, np.ndarray] | None = None,
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
