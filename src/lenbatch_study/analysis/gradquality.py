"""Gradient quality and seed statistics: pure functions on arrays (numpy only).

Gradient quality at fixed weights (DESIGN.md "gradient quality"). For a strategy's batches
``b = 1..n`` with flattened gradients ``g_b`` (rows of ``grads [n, P]``), ``B_b`` useful tokens
each, and the full-data gradient ``G``:

* **cosine**: ``mean_b cos(g_b, G)``: how representative one batch is of the data;
* **variance per useful token**: ``tr(Sigma) ~= mean_b B_b * ||g_b - G||^2``. For batches of
  ``B`` tokens drawn independently, ``E ||g_b - G||^2 = tr(Sigma) / B`` with ``Sigma`` the
  per-token gradient covariance, so the estimate is the per-token covariance trace and does not
  depend on the batch size. A batch whose composition is biased (all long samples, all short)
  adds its bias ``||E g_b - G||^2`` undivided by ``B``, so composition bias shows as a larger value;
* **gradient noise scale** ``B_simple = tr(Sigma) / |G|^2`` (McCandlish et al. 2018, in useful
  tokens): the batch size at which the batch gradient's noise equals the signal;
* **length-loss correlation**: Pearson r between a batch's mean sample length and its loss
  (the "sawtooth" of length-grouped sampling: +-1 when the loss follows the length).

Seeds: ``mean_interval`` (Student t, 95%) and ``difference_interval`` (Welch's t for two means):
a difference counts only when its interval excludes 0. The t quantile is computed here (the
regularized incomplete beta function by continued fraction; no scipy).

Cost: ``O(n * P)`` for the gradient measures, ``O(1)`` per quantile (about 60 bisection steps).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np


# --------------------------------------------------------------------------- gradient measures


def full_gradient(grads: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``G = sum_b W_b g_b / sum_b W_b``: the gradient of the whole epoch's loss when batch ``b``'s loss is
    a mean over its own loss weight ``W_b`` (an epoch holds every sample once, so this is the
    full-data gradient whatever the strategy). ``grads [n, P]``, ``weights [n]``."""
    g = np.asarray(grads, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if g.ndim != 2 or w.shape != (g.shape[0],) or g.shape[0] == 0:
        raise ValueError(f"grads must be [n, P] and weights [n] with n >= 1, got {g.shape} and {w.shape}")
    if not (w > 0).all():
        raise ValueError("every batch weight must be > 0 (a batch without a trained position has no gradient)")
    return (w[:, None] * g).sum(0) / w.sum()


def gradient_quality(grads: np.ndarray, sizes: np.ndarray, full: np.ndarray) -> dict[str, float]:
    """Cosine to ``full``, variance per useful token and noise scale of batch gradients (module doc).

    ``grads [n, P]`` batch gradients, ``sizes [n]`` useful tokens per batch, ``full [P]`` = G.
    Returns cosine_mean, cosine_min, variance_per_token (tr Sigma), noise_scale (B_simple,
    tokens), full_norm_sq (|G|^2), mean_batch_tokens, batches.
    """
    g = np.asarray(grads, dtype=np.float64)
    B = np.asarray(sizes, dtype=np.float64)
    G = np.asarray(full, dtype=np.float64)
    if g.ndim != 2 or B.shape != (g.shape[0],) or G.shape != (g.shape[1],) or g.shape[0] == 0:
        raise ValueError(f"grads [n, P], sizes [n], full [P] expected, got {g.shape}, {B.shape}, {G.shape}")
    gn = np.linalg.norm(g, axis=1)
    Gn = float(np.linalg.norm(G))
    cos = (g @ G) / np.maximum(gn * Gn, 1e-300)
    dev = ((g - G) ** 2).sum(1)
    tr = float((B * dev).mean())
    return {"cosine_mean": float(cos.mean()), "cosine_min": float(cos.min()), "variance_per_token": tr,
            "noise_scale": tr / Gn ** 2 if Gn > 0 else float("inf"), "full_norm_sq": Gn ** 2,
            "mean_batch_tokens": float(B.mean()), "batches": int(g.shape[0])}


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation; nan when either side is constant or there are fewer than 3 points."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"pearson needs two 1-D arrays of one length, got {x.shape} and {y.shape}")
    if x.size < 3:
        return float("nan")
    dx, dy = x - x.mean(), y - y.mean()
    den = math.sqrt(float((dx * dx).sum() * (dy * dy).sum()))
    return float((dx * dy).sum() / den) if den > 0 else float("nan")


# --------------------------------------------------------------------------- Student t


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz), |error| < 1e-14."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 5000):  # converges in O(sqrt(max(a, b))) terms
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta ``I_x(a, b)``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(lbeta + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student t distribution function with ``df`` (> 0, real) degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


@functools.lru_cache(maxsize=256)  # the same (p, n - 1) for every strategy's seeds
def t_quantile(p: float, df: float) -> float:
    """Quantile of Student's t (``t_cdf(t_quantile(p, df), df) == p``), by bisection."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def mean_interval(values: Any, *, confidence: float = 0.95) -> dict[str, float]:
    """Mean and its two-sided Student-t interval over seeds: ``mean +- t_{(1+c)/2, n-1} * sd / sqrt(n)``.

    Returns mean, lo, hi, half (half width), sd (n - 1 denominator), n. One value: the interval is
    undefined (nan half width).
    """
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0 or not np.isfinite(x).all():
        raise ValueError(f"mean_interval needs finite values, got {x.tolist()}")
    n = int(x.size)
    mean = float(x.mean())
    if n < 2:
        return {"mean": mean, "lo": float("nan"), "hi": float("nan"), "half": float("nan"), "sd": float("nan"),
                "n": n}
    sd = float(x.std(ddof=1))
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * sd / math.sqrt(n)
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "half": half, "sd": sd, "n": n}


def difference_interval(a: Any, b: Any, *, confidence: float = 0.95) -> dict[str, Any]:
    """Welch's interval of ``mean(a) - mean(b)`` (unequal variances, Welch-Satterthwaite df).

    ``distinguishable`` is True when the interval excludes 0: the difference exceeds seed noise.
    Both sides constant: the difference is exact (interval of width 0).
    """
    x = np.asarray(a, dtype=np.float64).ravel()
    y = np.asarray(b, dtype=np.float64).ravel()
    if x.size < 2 or y.size < 2:
        raise ValueError(f"a difference interval needs >= 2 seeds per side, got {x.size} and {y.size}; "
                         "raise quality.seeds")
    d = float(x.mean() - y.mean())
    va, vb = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    se = math.sqrt(va + vb)
    if se == 0.0:
        return {"diff": d, "lo": d, "hi": d, "half": 0.0, "df": float("inf"), "distinguishable": d != 0.0}
    df = (va + vb) ** 2 / ((va ** 2 / (x.size - 1) if va else 0.0) + (vb ** 2 / (y.size - 1) if vb else 0.0))
    half = t_quantile(0.5 + confidence / 2.0, df) * se
    return {"diff": d, "lo": d - half, "hi": d + half, "half": half, "df": float(df),
            "distinguishable": bool(d - half > 0 or d + half < 0)}


__all__ = ["betainc", "difference_interval", "full_gradient", "gradient_quality", "mean_interval", "pearson",
           "t_cdf", "t_quantile"]
