"""The compare stage's ``metrics.json`` and ``diagnostics.json``: the flat ``strategy.key`` numbers of a
:class:`lenbatch_study.analysis.report.CompareResult` (:func:`flat_metrics`) and the headline subset users
compare between experiments (:func:`user_metrics`, at most :data:`MAX_METRIC_NUMBERS` numbers).

Separate from :mod:`lenbatch_study.analysis.report` (which writes every output and re-exports these names):
what a diff of experiments shows is chosen here, apart from how report.md words the answer. Pure; cost
O(strategies + K sweep).
"""

from __future__ import annotations

import math
from typing import Any

from lenbatch_study.analysis import interleaved as il, quality_report as qr
from lenbatch_study.analysis import report_details
from lenbatch_study.analysis.verdict import USE

CompareResult = Any  # lenbatch_study.analysis.report.CompareResult (which imports this module)


METRIC_KEYS = (
    "padding_model_efficiency",
    "simulated_efficiency",
    "measured_efficiency",
    "predicted_tok_s",
    "measured_tok_s",
    "prediction_error",
    "ratio_to_sorted_padding",
    "ratio_to_sorted_predicted",
    "ratio_to_sorted_measured",
    "composition_repeat",
    "length_mixing",
    "steps",
    "target_step_ratio",
    "drafter_step_ratio",
    "pipeline_error",
    "predicted_epoch_ratio_to_sorted",
    "target_cpu_share",
    "drafter_cpu_share",
    "target_reference_drift",
    "drafter_reference_drift",
    "predicted_transport_s",
    "measured_transport_s",
)


def _num(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 6)


# What users compare between experiments (``metrics.json``, DVC's metrics, the columns of ``dvc exp show``):
# the headline only, at most 40 numbers for five strategies so a user's changed params stay on screen.
# * Per strategy, from its training: measured throughput, the measured padding efficiency and the held-out
#   loss (the quality stage's, at equal useful tokens); for every strategy but sorted also the run's measured
#   and predicted ratio to sorted (the whole plan, pipelined: what the strategy gives a training).
# * Per strategy but sorted, from the interleaved measurement (its steps timed in turns with sorted's, so a
#   drift cannot flip them; the test of the step model): the ratio to sorted, its 95% interval (low, high)
#   and the predicted ratio.
# * The recommendation.
# Sorted's own ratios (1 by definition) and the rest (the absolute prediction error, which a machine's drift
# between the profile and a training dominates, absolute predictions, calibrated errors, diversity, loss
# intervals, fit errors, CPU shares, the K sweep, the machine) are diagnostics in ``diagnostics.json``, which
# no tool declares as metrics.
USER_METRIC_KEYS = (
    "measured_tok_s",
    "ratio_to_sorted_measured",
    "ratio_to_sorted_predicted",
    "measured_efficiency",
    "heldout_loss.mean",
    *il.USER_METRIC_KEYS,
)
USER_SUMMARY_KEYS = ("verdict", "recommended.strategy", "recommended.tie", "recommended.num_buckets")
MAX_METRIC_NUMBERS = 40  # what `dvc exp show` can show beside the changed params


def user_metrics(flat: dict[str, Any]) -> dict[str, Any]:
    """The subset of :func:`flat_metrics` written to ``metrics.json`` (see ``USER_METRIC_KEYS``): 40 numbers
    and the recommended strategy's name for five strategies with the quality stage and the interleaved
    measurement."""
    keep = set(USER_SUMMARY_KEYS)
    constant = {f"{il.BASELINE}.ratio_to_sorted_measured", f"{il.BASELINE}.ratio_to_sorted_predicted"}
    return {
        k: v
        for k, v in flat.items()
        if k in keep
        or k.partition(".")[2] in USER_METRIC_KEYS
        and k.partition(".")[0] not in ("fit", "profile", "recommended", "machine")
        and k not in constant
    }


def flat_metrics(result: CompareResult) -> dict[str, Any]:
    """Flat ``strategy.key`` metrics and diagnostics (``diagnostics.json``; :func:`user_metrics` picks
    ``metrics.json`` from them)."""
    out: dict[str, Any] = {}
    for s, r in result.rows.items():
        for k in METRIC_KEYS:
            out[f"{s}.{k}"] = _num(getattr(r, k))
    for role, f in result.fits.items():
        out[f"fit.{role}.holdout_error"] = _num(f["best"].holdout_error)
        out[f"fit.{role}.train_error"] = _num(f["best"].train_error)
    out["fit.grid_points"] = result.grid_points
    for hop, f in ((h, (result.transport or {}).get(h)) for h in ("receive", "stage")):  # the features' transport
        if f:  # seconds = const + per byte x bytes, the rate as seconds per GB (per byte rounds to 0)
            out.update(
                {
                    f"fit.transport.{hop}.const_s": _num(f["const_s"]),
                    f"fit.transport.{hop}.s_per_gb": _num(f["per_byte_s"] * 1e9),
                    f"fit.transport.{hop}.error": _num(f["error"]),
                }
            )
    for role, v in result.profile_cpu_share.items():
        out[f"profile.{role}_cpu_share"] = _num(v)
    out["max_abs_prediction_error"] = _num(max(abs(r.prediction_error) for r in result.rows.values()))
    for role, v in (result.profile_reference_drift or {}).items():
        out[f"profile.{role}_reference_drift"] = _num(v)
    out["machine.id"] = (result.machine or {}).get("id")
    for e in result.sweep:
        out[f"bucketed_k{e['num_buckets']}.predicted_ratio_to_sorted"] = _num(e["predicted_ratio_to_sorted"])
    rec = result.recommendation
    v = rec.verdict
    out["verdict"] = v.kind
    if v.settled:  # only a settled answer is a recommendation a diff can show changing
        if v.kind == USE:
            out["recommended.strategy"] = v.strategy
        else:
            out["recommended.tie"] = ", ".join(v.top)
        out["recommended.num_buckets"] = rec.num_buckets
    out.update(qr.flat_metrics(result.quality, _tok_s(result)))
    out.update(il.flat_metrics(result.interleaved))
    return out


def _tok_s(result: CompareResult) -> dict[str, float]:
    return report_details.tok_s(result)
