"""Drift calibration: rescale the profile's step times by the run's own reference ratio.

The profile and every training run time one fixed reference step at their start and end
(:mod:`lenbatch_study.runtime.reference`; recorded as ``reference`` in grid.json and summary.json). For a
role r (target, drafter) with reference times ``t_r`` (the mean of the start and end medians: the
midpoint of a drift that is linear in time)::

    ratio_r = t_r(run) / t_r(profile)
    calibrated step seconds_r = ratio_r x the step-time model's seconds_r (alone and busy alike)

and the calibrated throughput is the pipeline replay of those steps. ``drift_r`` = end median /
start median - 1 says how much the machine moved within one profile or run (the calibration
assumes the run's average speed is its reference midpoint's). Pure numpy; cost O(repeats).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

ROLES = ("target", "drafter")


def _median(xs: Any) -> float:
    arr = np.asarray(xs, dtype=np.float64)
    return float(np.median(arr)) if arr.size else math.nan


def reference_seconds(ref: Optional[dict], role: str) -> float:
    """Mean of the start and end medians of ``role``'s reference step (NaN when not timed)."""
    if not ref or role not in ref:
        return math.nan
    return 0.5 * (_median(ref[role]["start"]) + _median(ref[role]["end"]))


def drift(ref: Optional[dict], role: str) -> float:
    """End median / start median - 1 of ``role``'s reference step (NaN when not timed)."""
    if not ref or role not in ref:
        return math.nan
    return _median(ref[role]["end"]) / _median(ref[role]["start"]) - 1.0


def ratios(run_ref: dict, profile_ref: dict) -> dict[str, float]:
    """``ratio_r`` of every role both timed (module doc). ``ValueError`` when the two references are of
    different shapes (their ratio would measure the shapes, not the machine)."""
    if run_ref.get("shape") != profile_ref.get("shape"):
        raise ValueError(
            f"the run's reference step {run_ref.get('shape')} differs from the profile's "
            f"{profile_ref.get('shape')} (other batching or data.max_len)"
        )
    out = {}
    for role in ROLES:
        r, p = reference_seconds(run_ref, role), reference_seconds(profile_ref, role)
        if not (math.isnan(r) or math.isnan(p)) and p > 0:
            out[role] = r / p
    return out


__all__ = ["drift", "ratios", "reference_seconds"]
