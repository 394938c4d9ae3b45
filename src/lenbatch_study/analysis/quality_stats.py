"""The quality stage's numbers from its runs: intervals over seeds and flat metrics (no rendering).

Pure functions of the result dict that :mod:`lenbatch_study.stages.quality` builds (``quality.json``); the
report and the plot of that result are :mod:`lenbatch_study.analysis.quality_report`, the compare stage's
(editing how the result is rendered reruns compare, not the quality stage).

* **at equal useful tokens** (:func:`summarize`): each run's final held-out loss; per strategy the
  mean and the 95% Student-t interval over seeds; the difference from ``sorted`` with Welch's 95%
  interval (:func:`lenbatch_study.core.intervals.difference_interval`): "beyond seed noise" when it
  excludes 0; per eval point the curves' intervals; "learned" when every run's final loss is at least
  ``quality.min_drop_nats`` below uniform.
* **flat metrics** (:func:`strategy_metrics`, :func:`stage_metrics`): ``strategy.key`` numbers for
  ``dvc metrics diff``.

Cost: O(runs x eval points).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lenbatch_study.core import intervals


def by_strategy(result: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The runs of ``result`` grouped by strategy (in the order of ``result["strategies"]``)."""
    out: dict[str, list[dict[str, Any]]] = {s: [] for s in result["strategies"]}
    for r in result["runs"]:
        out[r["strategy"]].append(r)
    return out


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Intervals over seeds: final held-out loss, difference from sorted, curves, the learned criterion."""
    runs = by_strategy(result)
    final = {s: intervals.mean_interval([r["final_heldout_loss"] for r in rs]) for s, rs in runs.items()}
    ref = [r["final_heldout_loss"] for r in runs["sorted"]]
    vs = {
        s: intervals.difference_interval([r["final_heldout_loss"] for r in rs], ref)
        for s, rs in runs.items()
        if s != "sorted"
    }
    curves = {}
    for s, rs in runs.items():
        L = np.array([r["curve_loss"] for r in rs])
        T = np.array([r["curve_tokens"] for r in rs], dtype=float)
        iv = [intervals.mean_interval(L[:, k]) for k in range(L.shape[1])]
        curves[s] = {
            "useful_tokens": T.mean(0).tolist(),
            "mean": [i["mean"] for i in iv],
            "lo": [i["lo"] for i in iv],
            "hi": [i["hi"] for i in iv],
        }
    uniform, drop = result["setting"]["uniform_loss"], result["setting"]["min_drop_nats"]
    worst = max(r["final_heldout_loss"] for r in result["runs"])
    return {
        "final": final,
        "vs_sorted": vs,
        "curves": curves,
        "learned": bool(worst <= uniform - drop),
        "worst_final_loss": worst,
    }


def metric_number(x: Any) -> Any:
    """A metric value as JSON keeps it: bools and None as they are, floats rounded to 6 digits, NaN/inf None."""
    if isinstance(x, bool) or x is None:
        return x
    x = float(x)
    return None if math.isnan(x) or math.isinf(x) else round(x, 6)


def strategy_metrics(result: dict[str, Any]) -> dict[str, Any]:
    """Per strategy: held-out loss mean/lo/hi, difference from sorted and whether it exceeds seed noise,
    and the gradient measures per checkpoint (``<strategy>.<key>``)."""
    num = metric_number
    summ = result["summary"]
    out: dict[str, Any] = {}
    for s in result["strategies"]:
        f = summ["final"][s]
        for k in ("mean", "lo", "hi"):
            out[f"{s}.heldout_loss.{k}"] = num(f[k])
        if s != "sorted":
            d = summ["vs_sorted"][s]
            out[f"{s}.heldout_loss_vs_sorted.diff"] = num(d["diff"])
            out[f"{s}.heldout_loss_vs_sorted.lo"] = num(d["lo"])
            out[f"{s}.heldout_loss_vs_sorted.hi"] = num(d["hi"])
            out[f"{s}.heldout_loss_vs_sorted.beyond_noise"] = bool(d["distinguishable"])
        for ck in ("init", "trained"):
            g = result["gradients"].get(f"{ck}.{s}")
            if g:
                for k in ("cosine_mean", "variance_per_token", "noise_scale", "length_loss_r"):
                    out[f"{s}.grad_{ck}.{k}"] = num(g[k])
    return out


def stage_metrics(result: dict[str, Any]) -> dict[str, Any]:
    """The stage's own: learned criterion, uniform and unigram losses, tokens per run, time (``quality.<key>``)."""
    num = metric_number
    return {
        "quality.learned": bool(result["summary"]["learned"]),
        "quality.uniform_loss": num(result["setting"]["uniform_loss"]),
        "quality.unigram_loss": num(result["setting"].get("unigram_loss")),
        "quality.useful_tokens_per_run": result["setting"]["useful_tokens_per_run"],
        "quality.seconds": num(result["timing"]["total_s"]),
        "quality.cpu_seconds": num(result["timing"]["total_cpu_s"]),
    }


__all__ = ["by_strategy", "metric_number", "stage_metrics", "strategy_metrics", "summarize"]
