"""Student-t intervals: pure functions (math and numpy; no scipy).

* :func:`t_cdf`, :func:`t_quantile`: Student's t (the regularized incomplete beta function by continued
  fraction); ``O(1)`` per quantile (about 60 bisection steps);
* seeds: :func:`mean_interval` (Student t) and :func:`difference_interval` (Welch's t for two means): a
  difference counts only when its interval excludes 0 (the quality stage);
* rounds: :func:`ratio_intervals`, throughput ratios to a baseline paired by round, and
  :func:`half_width`; the interleave stage times rounds until :func:`stop_reason` gives one (every
  interval within :data:`INTERVAL_TARGET`, or the ranking resolved within :data:`PREDICTION_TARGET`).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping, Sequence

import numpy as np

# The width the interleaved measurement aims at and compare judges by: every 95% interval within +-2% of
# its ratio.
INTERVAL_TARGET = 0.02
# A predicted ratio misses when it lies outside its 95% interval and more than this off the measured ratio.
# Once every interval is within it, "outside the interval" follows from "more than this off", so the miss
# reads the same at +-3% as at +-2%: what more rounds would still change is only whether overlapping
# intervals are a tie.
PREDICTION_TARGET = 0.03


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
        return {"mean": mean, "lo": float("nan"), "hi": float("nan"), "half": float("nan"), "sd": float("nan"), "n": n}
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
        raise ValueError(
            f"a difference interval needs >= 2 seeds per side, got {x.size} and {y.size}; raise quality.seeds"
        )
    d = float(x.mean() - y.mean())
    va, vb = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    se = math.sqrt(va + vb)
    if se == 0.0:
        return {"diff": d, "lo": d, "hi": d, "half": 0.0, "df": float("inf"), "distinguishable": d != 0.0}
    df = (va + vb) ** 2 / ((va**2 / (x.size - 1) if va else 0.0) + (vb**2 / (y.size - 1) if vb else 0.0))
    half = t_quantile(0.5 + confidence / 2.0, df) * se
    return {
        "diff": d,
        "lo": d - half,
        "hi": d + half,
        "half": half,
        "df": float(df),
        "distinguishable": bool(d - half > 0 or d + half < 0),
    }


def ratio_intervals(
    seconds: Mapping[str, Sequence[float]],
    useful_tokens: Mapping[str, Sequence[float]],
    *,
    baseline: str = "sorted",
    level: float = 0.95,
) -> dict[str, dict[str, object]]:
    """Per strategy: throughput ratio to ``baseline`` and its ``level`` interval, paired by round.

    Round k's throughput of strategy s is u_sk / t_sk; d_k = log(thr_sk / thr_bk). The ratio is
    exp(mean d) and the interval exp(mean d +- t_{level, K-1} sd(d) / sqrt(K)) (Student t over the K
    rounds). A drift that scales every strategy's seconds of a round by the same factor leaves every
    d_k unchanged. The baseline itself is 1 with [1, 1]. Cost O(S x K).
    ``ValueError`` when the baseline is missing or the strategies' round counts differ or are < 2."""
    if baseline not in seconds:
        raise ValueError(
            f"the interleaved measurement lacks the baseline strategy {baseline!r}; add it to train.strategies"
        )
    k = len(seconds[baseline])
    if k < 2 or any(len(seconds[s]) != k or len(useful_tokens[s]) != k for s in seconds):
        raise ValueError(
            f"every strategy needs the same number (>= 2) of rounds, got { {s: len(v) for s, v in seconds.items()} }"
        )
    base = np.asarray(useful_tokens[baseline], float) / np.asarray(seconds[baseline], float)
    q = t_quantile(0.5 + level / 2, k - 1)
    out: dict[str, dict[str, object]] = {}
    for s in seconds:
        thr = np.asarray(useful_tokens[s], float) / np.asarray(seconds[s], float)
        d = np.log(thr / base)
        mean, half = float(d.mean()), q * float(d.std(ddof=1)) / math.sqrt(k)
        out[s] = {
            "ratio_to_sorted": math.exp(mean),
            "ci95": [math.exp(mean - half), math.exp(mean + half)],
            "rounds": k,
        }
    return out


def half_width(ratio: float, ci95: Sequence[float]) -> float:
    """The interval's larger side relative to its ratio: max(hi / ratio - 1, 1 - lo / ratio)."""
    return max(ci95[1] / ratio - 1.0, 1.0 - ci95[0] / ratio)


def ranking_resolved(intervals: Mapping[str, Mapping[str, Any]], *, baseline: str = "sorted") -> bool:
    """No two intervals overlap (the baseline's [1, 1] left out): every strategy is above or below every other
    beyond the noise, so the answer, whichever strategies it may choose between, is decided. O(S log S)."""
    spans = sorted((float(v["ci95"][0]), float(v["ci95"][1])) for s, v in intervals.items() if s != baseline)
    return all(hi < lo for (_, hi), (lo, _) in zip(spans, spans[1:]))


def stop_reason(intervals: Mapping[str, Mapping[str, Any]], *, baseline: str = "sorted") -> str | None:
    """Why the rounds may stop, or None while they must go on (:func:`ratio_intervals`' ``intervals``):

    * every interval within :data:`INTERVAL_TARGET` (+-2%): ties are resolvable to that width;
    * or every interval within :data:`PREDICTION_TARGET` (+-3%) and :func:`ranking_resolved`: more rounds
      can change neither the order nor a prediction miss (:data:`PREDICTION_TARGET`'s note), only narrow
      intervals that already answer. On the CPU default this stopped after 20 rounds where +-2% took 32.

    Pure, O(S log S)."""
    widest = max(
        (half_width(float(v["ratio_to_sorted"]), v["ci95"]) for s, v in intervals.items() if s != baseline), default=0.0
    )
    if widest <= INTERVAL_TARGET:
        return f"every interval within +-{100 * INTERVAL_TARGET:g}%"
    if widest <= PREDICTION_TARGET and ranking_resolved(intervals, baseline=baseline):
        return f"the ranking resolved: no two intervals overlap, every one within +-{100 * PREDICTION_TARGET:g}%"
    return None


def width_to_reach(intervals: Mapping[str, Mapping[str, Any]], *, baseline: str = "sorted") -> float:
    """The widest interval at which the rounds would stop, as they stand (for a projection): +-3% where the
    ranking is already resolved, else +-2% (:func:`stop_reason`)."""
    return PREDICTION_TARGET if ranking_resolved(intervals, baseline=baseline) else INTERVAL_TARGET


__all__ = [
    "INTERVAL_TARGET",
    "PREDICTION_TARGET",
    "betainc",
    "difference_interval",
    "half_width",
    "mean_interval",
    "ranking_resolved",
    "ratio_intervals",
    "stop_reason",
    "t_cdf",
    "t_quantile",
    "width_to_reach",
]
