"""Ratios from an interleaved measurement (:mod:`lenbatch_study.runtime.interleave`): pure.

* :func:`ratio_intervals`: per strategy, the throughput ratio to sorted with its 95% interval, paired by
  round, so a drift common to a round cancels;
* :func:`predicted_ratios`: the same ratio from the step model's predicted seconds of the same steps.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from lenbatch_study.analysis.gradquality import t_quantile

BASELINE = "sorted"


def ratio_intervals(seconds: Mapping[str, Sequence[float]], useful_tokens: Mapping[str, Sequence[float]], *,
                    baseline: str = BASELINE, level: float = 0.95) -> dict[str, dict[str, object]]:
    """Per strategy: throughput ratio to ``baseline`` and its ``level`` interval, paired by round.

    Round k's throughput of strategy s is u_sk / t_sk; d_k = log(thr_sk / thr_bk). The ratio is
    exp(mean d) and the interval exp(mean d +- t_{level, K-1} sd(d) / sqrt(K)) (Student t over the K
    rounds). A drift that scales every strategy's seconds of a round by the same factor leaves every
    d_k unchanged. The baseline itself is 1 with [1, 1]. Cost O(S x K).
    ``ValueError`` when the baseline is missing or the strategies' round counts differ or are < 2."""
    if baseline not in seconds:
        raise ValueError(f"the interleaved measurement lacks the baseline strategy {baseline!r}; add it to "
                         "train.strategies")
    k = len(seconds[baseline])
    if k < 2 or any(len(seconds[s]) != k or len(useful_tokens[s]) != k for s in seconds):
        raise ValueError(f"every strategy needs the same number (>= 2) of rounds, got "
                         f"{ {s: len(v) for s, v in seconds.items()} }")
    base = np.asarray(useful_tokens[baseline], float) / np.asarray(seconds[baseline], float)
    q = t_quantile(0.5 + level / 2, k - 1)
    out: dict[str, dict[str, object]] = {}
    for s in seconds:
        thr = np.asarray(useful_tokens[s], float) / np.asarray(seconds[s], float)
        d = np.log(thr / base)
        mean, half = float(d.mean()), q * float(d.std(ddof=1)) / math.sqrt(k)
        out[s] = {"ratio_to_sorted": math.exp(mean), "ci95": [math.exp(mean - half), math.exp(mean + half)],
                  "rounds": k}
    return out


def predicted_ratios(predicted_seconds: Mapping[str, Sequence[float]], useful_tokens: Mapping[str, Sequence[float]],
                     *, baseline: str = BASELINE) -> dict[str, float]:
    """Predicted throughput ratio to ``baseline`` over the same timed steps: (sum u / sum predicted t) of
    the strategy over that of the baseline (per-step predicted seconds, as the step model gives them)."""
    def thr(s: str) -> float:
        return float(np.sum(useful_tokens[s])) / float(np.sum(predicted_seconds[s]))

    b = thr(baseline)
    return {s: thr(s) / b for s in predicted_seconds}


__all__ = ["BASELINE", "predicted_ratios", "ratio_intervals"]
