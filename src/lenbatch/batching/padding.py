"""The padding model: exact expected batch maxima, the greedy token-budget plan, plan metrics,
and the per-bucket predictor of computed tokens that the boundary optimizers minimise (``"greedy"``, a
renewal model of the real plan), or any other given as an :class:`Objective`.

Definitions (DESIGN.md): a padded batch of n samples with longest m computes n*m tokens;
greedy token-budget packing along an order grows a batch while
(n+1)*max(m, next) <= token_budget and n < max_batch_size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lenbatch.batching import scan
from lenbatch.batching.lengths import check_edges, check_lengths
from lenbatch.batching.strategy import layout_of

# --------------------------------------------------------------------------- exact order statistics


def log_factorials(n: int) -> np.ndarray:
    """``out[k] = log(k!)`` for k = 0..n (float64, the running sum of logs, left to right; O(n)).

    Computed in place a block at a time, the running total carried into each block's first term, so
    the sums are those of one ``np.cumsum`` over all n logs, bit for bit, without its two n-sized
    temporaries (320 MB at 20 M samples)."""
    out = np.empty(n + 1)
    out[0] = 0.0
    step = 1 << 20
    for a in range(1, n + 1, step):
        seg = out[a : min(n + 1, a + step)]
        np.log(np.arange(a, a + seg.size, dtype=np.float64), out=seg)
        seg[0] += out[a - 1]
        np.cumsum(seg, out=seg)
    return out


def value_counts(lengths: Any) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct lengths and their counts (int64; the histogram every model works on).

    Lengths are small non-negative ints (at most the token budget), so a counting pass gives what
    ``np.unique(lengths, return_counts=True)`` gives without its sort and int64 copy: O(n + max),
    ~20x faster at 20 M lengths. Negative, unsigned 64-bit or very spread values (a table over
    0..max that would dwarf the samples) take ``np.unique``, O(n log n)."""
    x = np.asarray(lengths)
    if x.ndim == 1 and x.size and x.dtype.kind in "iu" and x.dtype != np.uint64:
        if int(x.min()) >= 0 and not scan.histogram_too_wide(int(x.max()), x.size):
            counts = scan.value_counts(x)
            v = np.flatnonzero(counts).astype(np.int64, copy=False)
            return v, counts[v]
    v, c = np.unique(np.asarray(lengths, dtype=np.int64), return_counts=True)
    return v, c.astype(np.int64, copy=False)


def expected_max(values: Any, draws: int, counts: Any | None = None) -> float:
    """Exact E[max of ``draws`` samples drawn without replacement] from a bucket.

    ``values``: the bucket's lengths, or its sorted distinct values when ``counts`` is given.
    With F_k the number of samples <= v_k and n the bucket size, P(max <= v_k) = C(F_k, B)/C(n, B)
    (all B draws among the F_k smallest), so E[max] = v_max - sum_k (v_{k+1} - v_k) C(F_k, B)/C(n, B).
    The ratio is computed as exp of log-factorial differences (no overflow). Cost O(n + distinct).
    """
    if counts is None:
        v, c = value_counts(values)
    else:
        v, c = np.asarray(values, dtype=np.int64), np.asarray(counts, dtype=np.int64)
    n = int(c.sum())
    if not 1 <= draws <= n:
        raise ValueError(f"draws must be in 1..{n} (bucket size), got {draws}")
    lf = log_factorials(n)
    f = np.cumsum(c)[:-1]
    ok = f >= draws
    # log C(f, B) - log C(n, B) = lf[f] - lf[f-B] - lf[n] + lf[n-B]
    logr = np.where(ok, lf[f] - lf[np.where(ok, f - draws, 0)] - lf[n] + lf[n - draws], -np.inf)
    return float(v[-1] - np.sum(np.diff(v) * np.exp(logr)))


# --------------------------------------------------------------------------- greedy token-budget plan


def greedy_starts(ordered_lengths: Sequence[int] | np.ndarray, token_budget: int, max_batch_size: int) -> np.ndarray:
    """Start offsets of the greedy token-budget batches along ``ordered_lengths``.

    A batch grows while (n+1)*max(m, next) <= token_budget and n < max_batch_size. One sequential
    pass, O(n): compiled with numba when installed (~3 ns per length), else a Python loop over ints
    (~0.15 us per length) (:func:`lenbatch.batching.scan.greedy_start_mask`). Assumes every length
    <= token_budget (checked by the callers).
    """
    x = np.asarray(ordered_lengths)
    if x.size == 0:
        return np.zeros(0, dtype=np.int64)
    return scan.greedy_starts(x.astype(np.int64, copy=False), token_budget, max_batch_size)


def sorted_greedy_starts(
    counts: np.ndarray, token_budget: int, max_batch_size: int, values: np.ndarray | None = None
) -> np.ndarray:
    """:func:`greedy_starts` along the lengths sorted ascending, from their histogram alone
    (``counts[v]`` samples of length v; or, with ``values``, ``counts[d]`` samples of length
    ``values[d]``, ascending): O(distinct lengths), not O(n).

    Along an ascending order a batch's maximum is its newest length v, so it takes a sample of
    length v while it holds fewer than cap(v) = min(max_batch_size, token_budget // v). Per distinct
    v (count c, first position p): the open batch of n samples takes t = min(c, cap(v) - n) of them
    (none if n >= cap(v), or if no batch is open); the other c - t fill ceil((c - t) / cap(v))
    batches of cap(v) starting at p + t, p + t + cap(v), ...; the last one stays open.
    """
    if values is None:
        values = np.flatnonzero(counts)
        counts = counts[values]
    values = np.asarray(values, dtype=np.int64)
    c = np.asarray(counts, dtype=np.int64)
    first = np.cumsum(c) - c
    cap = np.minimum(max_batch_size, token_budget // np.maximum(values, 1))
    starts_at = np.zeros(values.size, dtype=np.int64)
    batches = np.zeros(values.size, dtype=np.int64)
    n = 0
    for d, (cd, capd, pd) in enumerate(zip(c.tolist(), cap.tolist(), first.tolist())):
        t = 0 if n == 0 else min(cd, max(0, capd - n))
        r = cd - t
        if r:
            k = -(-r // capd)
            starts_at[d], batches[d] = pd + t, k
            n = r - (k - 1) * capd
        else:
            n += t
    owner = np.repeat(np.arange(values.size), batches)
    within = np.arange(owner.size) - np.repeat(np.cumsum(batches) - batches, batches)
    return starts_at[owner] + within * cap[owner]


def greedy_batches(order: np.ndarray, lengths: np.ndarray, token_budget: int, max_batch_size: int) -> list[np.ndarray]:
    """Greedy token-budget batches of the sample indices ``order`` (int64 arrays, in order)."""
    order = np.asarray(order, dtype=np.int64)
    if order.size == 0:
        return []
    starts = greedy_starts(lengths[order], token_budget, max_batch_size)
    return np.split(order, starts[1:])


# --------------------------------------------------------------------------- plan metrics


def _flat(lengths: np.ndarray, batches: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(every batch's indices concatenated, sizes, start offsets); a :class:`lenbatch.Plan` already
    holds them (no per-batch work)."""
    offsets = getattr(batches, "offsets", None)
    if offsets is not None and hasattr(batches, "indices"):
        sizes = np.diff(offsets)
        if np.any(sizes == 0):
            raise ValueError("a batch is empty; plans never hold empty batches")
        return batches.indices, sizes, offsets[:-1]
    sizes = np.fromiter((len(b) for b in batches), dtype=np.int64, count=len(batches))
    if np.any(sizes == 0):
        raise ValueError("a batch is empty; plans never hold empty batches")
    idx = np.concatenate(batches) if batches else np.zeros(0, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return idx, sizes, starts


def batch_tokens(lengths: Any, batches: Sequence[np.ndarray], *, packed: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per batch: (useful tokens, computed tokens). Computed = n*max for padded batches, the row length if packed."""
    x = np.asarray(lengths, dtype=np.int64)
    idx, sizes, starts = _flat(x, batches)
    if idx.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    _check_indices(idx, x.size)
    lx = x[idx]
    useful = np.add.reduceat(lx, starts)
    computed = useful.copy() if packed else sizes * np.maximum.reduceat(lx, starts)
    return useful, computed


def _check_indices(idx: np.ndarray, n: int) -> None:
    """``ValueError`` naming ``batches`` for sample indices that are not integers in 0..n-1: numpy would
    wrap -1 to the last sample silently, or raise a bare IndexError. Cost: O(indices)."""
    idx = np.asarray(idx)
    if not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(
            f"batches must hold integer sample indices (rows of lengths), got dtype {idx.dtype}; "
            "pass the index arrays a plan holds (lb.plan_epoch)"
        )
    bad = (idx < 0) | (idx >= n)
    if np.any(bad):
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"batches holds sample index {int(idx[first])}, outside 0..{n - 1} (lengths has {n} "
            "samples); score a plan against the lengths it was made from"
        )


def plan_is_packed(batches: Sequence[np.ndarray], strategy: str | None) -> bool:
    """Whether ``batches`` are packed rows: the plan's own ``layout`` (plans from ``plan_epoch``
    carry it) or else ``strategy``. A ``strategy`` whose layout contradicts the plan's raises
    ``ValueError``: scoring packed rows as padded ones (or back) gives a wrong number silently."""
    layout = getattr(batches, "layout", None)
    if strategy is not None:
        want = layout_of(strategy)
        if layout is not None and layout != want:
            raise ValueError(
                f"strategy={strategy!r} scores {want} batches but this plan is {layout} (made by "
                f"strategy {getattr(batches, 'strategy', '?')!r}); drop strategy= (the plan knows "
                "its layout) or pass the strategy that made it"
            )
        return want == "packed"
    return layout == "packed"


def padding_efficiency(lengths: Any, batches: Sequence[np.ndarray], strategy: str | None = None) -> float:
    """Useful tokens / computed tokens over the batches (1.0 for packed rows: they carry no padding).

    The layout comes from the plan (``plan_epoch`` returns a list carrying ``.layout``); a plain
    list of index arrays is scored as padded unless ``strategy="packed"``.
    """
    useful, computed = batch_tokens(lengths, batches, packed=plan_is_packed(batches, strategy))
    return float(useful.sum() / computed.sum()) if computed.size else 1.0


def budget_fill(lengths: Any, batches: Sequence[np.ndarray], token_budget: int, strategy: str | None = None) -> float:
    """Computed tokens / (steps * token_budget): how full each step's budget is (layout as in padding_efficiency)."""
    _, computed = batch_tokens(lengths, batches, packed=plan_is_packed(batches, strategy))
    return float(computed.sum() / (len(batches) * token_budget)) if batches else 0.0


def composition_repeat(batches_a: Sequence[np.ndarray], batches_b: Sequence[np.ndarray], num_samples: int) -> float:
    """Share of sample pairs batched together in plan ``a`` that are batched together again in plan ``b``.

    Pairs together in a: sum_b C(n_b, 2). Pairs together in both: sum over (batch in a, batch in b)
    of C(overlap, 2), the overlaps counted by one ``np.unique`` over the (a-batch, b-batch) code of
    every sample. O(N log N). Sorted plans give 1, random ones about (mean batch size)/N.
    """
    ida = np.full(num_samples, -1, dtype=np.int64)
    idb = np.full(num_samples, -1, dtype=np.int64)
    for ids, batches in ((ida, batches_a), (idb, batches_b)):
        if not batches:
            continue
        idx, sizes, _ = _flat(np.zeros(0), batches)
        ids[idx] = np.repeat(np.arange(len(batches), dtype=np.int64), sizes)
    if np.any(ida < 0) or np.any(idb < 0):
        raise ValueError("composition_repeat needs two plans that each hold every sample")
    sizes_a = np.bincount(ida)
    pairs_a = float(np.sum(sizes_a * (sizes_a - 1) / 2))
    if pairs_a == 0:
        return 0.0
    _, overlap = np.unique(ida * (int(idb.max()) + 1) + idb, return_counts=True)
    return float(np.sum(overlap * (overlap - 1) / 2) / pairs_a)


def within_batch_variance(lengths: Any, batches: Sequence[np.ndarray]) -> float:
    """Pooled within-batch length variance: sum_b sum_{i in b} (x_i - mean_b)^2 / sum_b (n_b - 1).

    Per batch the sum of squared deviations is S2_b - S1_b^2 / n_b from the batch's sum S1_b and sum
    of squares S2_b (one ``np.add.reduceat`` each), so the cost is O(N). A batch of one sample adds 0
    to both sums. 0.0 when no batch holds two samples.
    """
    x = np.asarray(lengths, dtype=np.float64)
    idx, sizes, starts = _flat(x, batches)
    if idx.size == 0:
        return 0.0
    lx = x[idx]
    # centring on the dataset mean keeps S2 - S1^2/n free of cancellation for long lengths
    lx = lx - lx.mean()
    s1 = np.add.reduceat(lx, starts)
    s2 = np.add.reduceat(lx * lx, starts)
    dof = float(np.sum(sizes - 1))
    if dof == 0:
        return 0.0
    return float(np.sum(np.maximum(s2 - s1 * s1 / sizes, 0.0)) / dof)


def length_mixing(
    lengths: Any, batches: Sequence[np.ndarray], *, reference: Sequence[np.ndarray] | None = None
) -> float:
    """How much a plan mixes lengths within its batches: 0 when every batch holds one length, 1 for
    a random order.

    mixing = V(batches) / V(reference), with V the pooled within-batch variance of
    :func:`within_batch_variance`. ``reference`` is the plan a random order makes under the same
    batch spec, seed and epoch (``plan_epoch_all(lengths, strategy="random", ...)``, all ranks'
    batches): the ``random`` strategy then scores exactly 1, sorted plans about 0 (a sorted batch
    spans a narrow length range). Without ``reference`` the denominator is the dataset's variance
    s^2 (ddof=1), which is E[V] for any partition whose batch sizes do not depend on the lengths
    (a batch of n drawn without replacement has E[sum (x_i - mean_b)^2] = (n - 1) s^2). Greedy
    token-budget batches break that: a batch holding a long sample is small, so a random padded
    plan's V falls below s^2 (to 0.7 s^2 on heavy-tailed lengths with a budget twice the longest);
    hence the reference plan. Packed rows fill by tokens, not by the longest sample, so packed
    plans score about 1 (0.99-1.05 on uniform, lognormal and bimodal lengths with a budget 4x the
    longest, up to ~1.3 when the budget is only 2x the longest). Cost O(N) per plan.
    """
    x = np.asarray(lengths, dtype=np.float64)
    if reference is None:
        denom = float(x.var(ddof=1)) if x.size > 1 else 0.0
    else:
        denom = within_batch_variance(x, reference)
    if denom == 0:
        return 0.0
    return within_batch_variance(x, batches) / denom


# --------------------------------------------------------------------------- per-bucket predictors


def greedy_bucket_computed(values: np.ndarray, counts: np.ndarray, token_budget: int, max_batch_size: int) -> float:
    """Expected computed tokens of the greedy token-budget plan over one shuffled bucket (accurate model).

    Model: the shuffled bucket is an i.i.d. stream with the bucket's length distribution G. A batch
    reaches size n iff n*M_n <= budget (k*M_k never decreases), i.e. M_n <= T_n = budget // n, and
    n <= max_batch_size. The greedy plan never drops the sample that overflows a batch: it *starts*
    the next batch, so first elements are biased long. We track that exactly: a batch closed at size
    n with M_n <= T_{n+1} (so the next sample X > T_{n+1} overflowed) starts the next batch with X drawn
    from G conditioned on X > T_{n+1}; any other close (count limit, or M_n > T_{n+1}) starts it with a
    fresh draw. The stationary first-element law is the mixture
    Phi(v) = a0 G(v) + sum_t a_t (G(v) - theta_t)^+ / (1 - theta_t), theta_t = G(T_t), t = 2..B_max,
    with a_t = Phi(theta_t) theta_t^(t-2) (1 - theta_t): a triangular system solved by one backward
    recurrence (no iteration). Then P(M_n <= v) = Phi(v) G(v)^(n-1), and renewal-reward gives
    E[N] = sum_n P(M_n <= T_n), E[N M] = sum_n n (E[M_n; M_n <= T_n] - G(T_{n+1}) E[M_n; M_n <= T_{n+1}]).
    Finite bucket: the last batch is partial; its size is the renewal age (P(r = k) = P(N >= k)/E[N])
    and its maximum that of r draws, so computed = (n - E[r]) E[NM]/E[N] + sum_k k E[M_k; N >= k]/E[N].
    A bucket whose longest sample fits B = min(max_batch_size, budget // shortest) times in the budget
    (every batch holds exactly B samples) is computed exactly: each full batch of B is a uniform random
    B-subset, so computed = B*floor((n-1)/B) E[max of B] + r E[max of r] (r = the last batch's size),
    with the hypergeometric :func:`expected_max`.
    Checked against simulated greedy plans (tests/batching/test_padding.py; within 0.1 pp on the seed profile).
    Cost O(max_batch_size * distinct values).
    """
    v = np.asarray(values, dtype=np.int64)
    c = np.asarray(counts, dtype=np.float64)
    n_b = float(c.sum())
    # no batch holds more than budget // shortest samples; with that cap the model is unchanged (the
    # batch then closes with M_n > T_{n+1}: a fresh restart, like a count stop) and, when every batch
    # holds exactly that many, the count-limited branch below is exact
    mb = int(max(1, min(max_batch_size, token_budget // int(v[0]))))
    G = np.cumsum(c) / n_b
    G[-1] = 1.0
    gap = np.diff(v).astype(np.float64)
    nn = np.arange(1, mb + 1)
    # E[M_n; M_n <= v_q] = v_q Q_n(q) - sum_{p<q} gap_p Q_n(p) for any law Q_n (summation by parts).
    T = token_budget // np.arange(1, mb + 2)  # T[t-1] = T_t, t = 1..mb+1
    pos = np.searchsorted(v, T, side="right") - 1  # largest value <= T_t (-1: none)
    theta = np.where(pos >= 0, G[np.clip(pos, 0, None)], 0.0)
    if v[-1] <= T[mb - 1]:  # every batch count-limited
        full = (int(n_b) - 1) // mb
        r = int(n_b) - full * mb
        c_int = np.asarray(counts, dtype=np.int64)
        em_full = expected_max(v, mb, c_int) if full else 0.0
        return float(full * mb * em_full + r * expected_max(v, r, c_int))
    bw, phi_all, a0v = renewal_weights(theta[None, :])
    b = bw[0, 2 : mb + 1]
    th = theta[1:mb]  # theta_t for t = 2..mb
    a0 = float(a0v[0])
    # Phi at every distinct value: thresholds strictly below v_p contribute
    w = pos[1:mb] + 1  # first position above T_t
    add1 = np.zeros(len(v) + 1)
    add2 = np.zeros(len(v) + 1)
    np.add.at(add1, np.clip(w, 0, len(v)), b)
    np.add.at(add2, np.clip(w, 0, len(v)), b * th)
    Phi = a0 * (G * (1 + np.cumsum(add1)[:-1]) - np.cumsum(add2)[:-1])
    # Q_n(p) = Phi_p G_p^(n-1); prefix sums of gap * Q_n
    Gp = G[None, :] ** (nn[:, None] - 1)
    Q = Phi[None, :] * Gp  # (mb, m)
    S = np.zeros((mb, len(v)))
    np.cumsum(Q[:, :-1] * gap[None, :], axis=1, out=S[:, 1:])

    def H(q: np.ndarray) -> np.ndarray:  # E[M_n; M_n <= v_q] for n = 1..mb, q per n
        qq = np.clip(q, 0, len(v) - 1)
        h = v[qq] * Q[nn - 1, qq] - S[nn - 1, qq]
        return np.where(q >= 0, h, 0.0)

    qn = np.minimum(pos[:mb], len(v) - 1)
    qn1 = np.minimum(pos[1 : mb + 1], len(v) - 1)
    p_ge = np.where(qn >= 0, Q[nn - 1, np.clip(qn, 0, None)], 0.0)  # P(N >= n)
    h_n = H(qn)
    h_n1 = H(qn1) * theta[1 : mb + 1]
    h_n1[-1] = 0.0  # at n = max_batch_size the batch closes by count
    EN = p_ge.sum()
    ENM = np.sum(nn * (h_n - h_n1))
    last = np.sum(nn * h_n) / EN
    Er = np.sum(nn * p_ge) / EN
    return float((n_b - Er) * ENM / EN + last)


def renewal_weights(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """First-element law of the greedy plan's batches, for many buckets at once.

    ``theta[:, t-1] = G(T_t)`` for t = 1..B+1 (B the batch-size cap). Returns ``(b, phi, a0)`` with
    columns indexed by t (0 unused): b_t = a_t / (a0 (1 - theta_t)), phi_t = Phi(theta_t) / a0, and a0
    the share of batches that start with a fresh draw. Backward recurrence over t = B..2:
    phi_t = theta_t (1 + sum_{s>t} b_s) - sum_{s>t} b_s theta_s, b_t = phi_t theta_t^(t-2).
    Cost O(rows * B).
    """
    rows, width = theta.shape
    mb = width - 1
    b = np.zeros((rows, mb + 2))
    phi = np.zeros((rows, mb + 2))
    s1 = np.zeros(rows)
    s2 = np.zeros(rows)
    for t in range(mb, 1, -1):
        th = theta[:, t - 1]
        phi[:, t] = th * (1 + s1) - s2
        b[:, t] = phi[:, t] * th ** (t - 2)
        s1 += b[:, t]
        s2 += b[:, t] * th
    phi[:, 1] = theta[:, 0] * (1 + s1) - s2
    phi[:, mb + 1] = theta[:, mb]
    ts = np.arange(2, mb + 1)
    a0 = 1.0 / (1.0 + np.sum((1 - theta[:, ts - 1]) * b[:, ts], axis=1))
    return b, phi, a0


OBJECTIVES = ("greedy",)


@dataclasses.dataclass(frozen=True)
class Objective:
    """What the boundary optimizers minimise, summed over buckets: a bucket's expected computed tokens.

    ``bucket(values, counts, token_budget, max_batch_size) -> float`` prices one bucket from its histogram
    (sorted distinct lengths, their counts). ``matrix(v, c, P, token_budget, max_batch_size)``, optional,
    prices every candidate bucket at once: ``cost[a, b]`` for the bucket holding ``v[P[a]:P[b]]`` (inf where
    b <= a); without it the optimizers call ``bucket`` for every pair of grid positions (O(C^2) calls).
    ``name`` is what results record (``Boundaries.objective``). The library's own is ``"greedy"``
    (:func:`greedy_bucket_computed`); pass an ``Objective`` as ``objective=`` for another model.
    """

    name: str
    bucket: Callable[[np.ndarray, np.ndarray, int, int], float]
    matrix: Callable[[np.ndarray, np.ndarray, np.ndarray, int, int], np.ndarray] | None = None


GREEDY = Objective("greedy", greedy_bucket_computed)  # its matrix: bucket_cost.greedy_cost_matrix


def objective_of(objective: "str | Objective") -> Objective:
    """The :class:`Objective` named ``objective`` (``"greedy"``) or ``objective`` itself; ``ValueError``
    naming the choices otherwise."""
    if isinstance(objective, Objective):
        return objective
    if objective == "greedy":
        return GREEDY
    raise ValueError(
        f"objective {objective!r} unknown; choose one of {list(OBJECTIVES)} or pass a "
        "lenbatch.batching.padding.Objective"
    )


def bucket_computed(
    values: np.ndarray,
    counts: np.ndarray,
    token_budget: int,
    max_batch_size: int,
    objective: "str | Objective" = "greedy",
) -> float:
    return objective_of(objective).bucket(values, counts, token_budget, max_batch_size)


def predict_bucketed(
    lengths: Any, edges: Any, *, token_budget: int, max_batch_size: int, objective: "str | Objective" = "greedy"
) -> dict[str, Any]:
    """Predicted padding efficiency of the bucketed plan with ``edges`` (and per-bucket rows)."""
    x = check_lengths(lengths)
    v, c = value_counts(x)
    return predict_bucketed_counts(
        v, c, edges, token_budget=token_budget, max_batch_size=max_batch_size, objective=objective
    )


def predict_bucketed_counts(
    v: np.ndarray,
    c: np.ndarray,
    edges: Any,
    *,
    token_budget: int,
    max_batch_size: int,
    objective: "str | Objective" = "greedy",
) -> dict[str, Any]:
    """:func:`predict_bucketed` from the histogram (:func:`value_counts`: sorted distinct lengths ``v``,
    counts ``c``), for callers that hold it already. Cost O(K * max_batch_size * distinct)."""
    e = check_edges(edges, v)
    objective = objective_of(objective)
    rows = []
    tot_u = tot_c = 0.0
    for lo, hi in zip(e[:-1], e[1:]):
        sel = (v >= lo) & (v < hi)
        if not np.any(sel):
            rows.append({"lo": int(lo), "hi": int(hi), "count": 0, "useful": 0, "computed": 0.0, "efficiency": None})
            continue
        comp = objective.bucket(v[sel], c[sel], token_budget, max_batch_size)
        useful = float(np.dot(v[sel], c[sel]))
        rows.append(
            {
                "lo": int(lo),
                "hi": int(hi),
                "count": int(c[sel].sum()),
                "useful": int(useful),
                "computed": comp,
                "efficiency": useful / comp,
            }
        )
        tot_u += useful
        tot_c += comp
    return {"efficiency": tot_u / tot_c, "buckets": rows, "objective": objective.name}
