"""Length arrays: checks, statistics, histogram, counts per bucket, and the study's seed profile.

A library module (numpy only): the ``stats`` stage (:mod:`lenbatch.stages.stats`) renders these numbers;
the planning stages read their lengths input through :func:`lenbatch.pipeline.artifacts.tokenized.read_lengths_input`.

The *seed profile* is a deterministic stand-in for the study's 902,087 tokenized chat
completions, drawn through its published percentiles (min 65, P10 637, P25 1035,
P50 1727, P75 2912, P90 4200, P95 4374, P99 4917, P100 8191; mean 2,068).

Interpolation between percentiles: within each percentile interval the quantile
function is linear in a Box-Cox (power) transform of the length,
``Q(u) = (a**lam + t * (b**lam - a**lam)) ** (1/lam)`` with ``t`` the position of ``u``
inside the interval.  ``lam = 1`` is linear, ``lam -> 0`` log-linear; every member
passes through all published percentiles, and the mean grows with ``lam``
(log-linear gives 2,044.6, linear 2,084.7).  We pick the ``lam`` whose discretised
mean equals the published 2,068 (bisection), so the profile hits the percentiles
*and* the mean.  Samples are a jittered quantile grid ``u_i = (i + U_i) / N`` (seeded),
rounded to integers, with the two ends pinned to the published min and max, then
shuffled with the same seed.  Cost: O(N log N).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

SEED_PERCENTILES = (0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 100.0)
SEED_VALUES = (65, 637, 1035, 1727, 2912, 4200, 4374, 4917, 8191)
SEED_COUNT = 902_087
SEED_MEAN = 2068.0
STAT_PERCENTILES = (10, 25, 50, 75, 90, 95, 99, 100)


def check_lengths(lengths: Any, *, name: str = "lengths") -> np.ndarray:
    """Validate a 1-D array of positive integer lengths and return it as int64.

    Raises ``ValueError`` naming the problem and the fix (empty, not 1-D, not integer,
    zero or negative entries).
    """
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of token counts, got shape {arr.shape}; flatten it")
    if arr.size == 0:
        raise ValueError(f"{name} is empty; give at least one sample length (tokens)")
    if not np.issubdtype(arr.dtype, np.integer):
        if np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"{name} must hold integer token counts, got dtype {arr.dtype}; round or cast them")
    arr = arr.astype(np.int64, copy=False)
    bad = int(np.count_nonzero(arr <= 0))
    if bad:
        raise ValueError(f"{name} has {bad} zero or negative length(s) (first at index "
                         f"{int(np.argmax(arr <= 0))}); drop empty samples before batching")
    return arr


def _quantile_fn(u: np.ndarray, lam: float) -> np.ndarray:
    p = np.asarray(SEED_PERCENTILES) / 100.0
    v = np.asarray(SEED_VALUES, dtype=np.float64)
    k = np.clip(np.searchsorted(p, u, side="right") - 1, 0, len(p) - 2)
    t = (u - p[k]) / (p[k + 1] - p[k])
    a, b = v[k], v[k + 1]
    if abs(lam) < 1e-9:
        return np.exp(np.log(a) + t * (np.log(b) - np.log(a)))
    return (a**lam + t * (b**lam - a**lam)) ** (1.0 / lam)


def _grid(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    u = (np.arange(n) + rng.random(n)) / n
    u[0], u[-1] = 0.0, 1.0  # pin the published min and max
    return u


@functools.lru_cache(maxsize=8)
def seed_profile_lambda(n: int = SEED_COUNT, seed: int = 0, target_mean: float = SEED_MEAN) -> float:
    """The Box-Cox exponent whose profile of ``n`` samples has mean ``target_mean`` (bisection, 24 steps)."""
    u = _grid(n, seed)
    lo, hi = 0.0, 1.0
    for _ in range(24):
        mid = (lo + hi) / 2
        if np.rint(_quantile_fn(u, mid)).mean() < target_mean:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def seed_profile(n: int = SEED_COUNT, *, seed: int = 0, lam: float | None = None) -> np.ndarray:
    """``n`` int32 lengths through the study's published percentiles (see module doc); deterministic in ``seed``.

    ``lam=None`` fits the interpolation exponent to the published mean (about 0.58).
    """
    if n < 2:
        raise ValueError(f"seed profile size must be >= 2, got {n}; use the default {SEED_COUNT}")
    if lam is None:
        lam = seed_profile_lambda(min(n, SEED_COUNT), seed)
    u = _grid(n, seed)
    x = np.rint(_quantile_fn(u, lam)).astype(np.int32)
    return np.random.default_rng(seed).permutation(x)


def length_stats(lengths: Any) -> dict[str, Any]:
    """count, total_tokens, mean, std, min, max and percentiles p10..p100 (numpy's linear method)."""
    x = check_lengths(lengths)
    pct = np.percentile(x, STAT_PERCENTILES)
    return {
        "count": int(x.size),
        "total_tokens": int(x.sum()),
        "mean": float(x.mean()),
        "std": float(x.std()),
        "min": int(x.min()),
        "max": int(x.max()),
        "percentiles": {f"p{p}": float(v) for p, v in zip(STAT_PERCENTILES, pct)},
    }


def histogram(lengths: Any, *, bins: int = 64) -> list[dict[str, int]]:
    """Equal-width histogram rows ``{"lo", "hi", "count"}`` (half-open ``[lo, hi)``, last bin closed)."""
    x = check_lengths(lengths)
    if bins < 1:
        raise ValueError(f"stats.histogram_bins must be >= 1, got {bins}")
    counts, edges = np.histogram(x, bins=bins, range=(0, int(x.max()) + 1))
    return [{"lo": int(np.floor(a)), "hi": int(np.floor(b)), "count": int(c)}
            for a, b, c in zip(edges[:-1], edges[1:], counts)]


def bucket_ids(lengths: Any, edges: Any) -> np.ndarray:
    """Bucket index of every sample: bucket k holds ``edges[k] <= length < edges[k+1]``.

    ``ValueError`` if the edges are not strictly increasing or do not cover the lengths.
    """
    x = check_lengths(lengths)
    e = check_edges(edges, x)
    return np.searchsorted(e, x, side="right") - 1


def check_edges(edges: Any, lengths: np.ndarray) -> np.ndarray:
    e = np.asarray(edges)
    if e.ndim != 1 or e.size < 2:
        raise ValueError(f"edges must be a list of at least 2 bucket edges, got {edges!r}; "
                         "pass K+1 increasing ints (Boundaries.edges)")
    if not np.issubdtype(e.dtype, np.integer):
        if np.all(e == np.round(e)):
            e = e.astype(np.int64)
        else:
            raise ValueError(f"edges must be integers (tokens), got {edges!r}")
    e = e.astype(np.int64)
    if np.any(np.diff(e) <= 0):
        raise ValueError(f"edges {e.tolist()} must be strictly increasing; sort them and remove duplicates")
    if e[0] > lengths.min() or e[-1] <= lengths.max():
        raise ValueError(f"edges {e.tolist()} do not cover the lengths {int(lengths.min())}..{int(lengths.max())}: "
                         "need edges[0] <= min and edges[-1] > max; recompute boundaries for these lengths")
    return e


def bucket_counts(lengths: Any, edges: Any) -> list[dict[str, Any]]:
    """Per bucket: lo, hi, count, tokens, mean length."""
    x = check_lengths(lengths)
    e = check_edges(edges, x)
    ids = np.searchsorted(e, x, side="right") - 1
    k = len(e) - 1
    counts = np.bincount(ids, minlength=k)
    tokens = np.bincount(ids, weights=x, minlength=k)
    return [{"lo": int(e[i]), "hi": int(e[i + 1]), "count": int(counts[i]), "tokens": int(tokens[i]),
             "mean": float(tokens[i] / counts[i]) if counts[i] else 0.0} for i in range(k)]
