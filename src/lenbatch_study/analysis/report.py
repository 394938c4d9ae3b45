"""The compare stage's outputs: ``report.md``, the plots, ``metrics.json`` / ``diagnostics.json``,
``frontier.json``, ``throughput.json`` and ``stepmodel.json``, rendered from a :class:`CompareResult`.

:mod:`lenbatch_study.stages.compare` predicts (pure function of the stage inputs) and builds the result; this
module only renders it, so a report change never touches a prediction. The report is about the data the
run read; the study's own setting appears only in its last part, "The study's setting, replayed (not your
data)" (:func:`lenbatch_study.analysis.study_replay.section`), and as the study's K on this data's K sweep
(:data:`STUDY_NUM_BUCKETS`). The model-selection rule's numbers come from
:mod:`lenbatch_study.analysis.stepmodel`. The report states the machine profile and runs
were measured on (:mod:`lenbatch_study.core.machine`), the raw and the calibrated prediction side by side
(:func:`calibration_section`). The answer opens with "Not settled" and the rerun, and recommends nothing in bold,
when the machine was busy or unsteady or the predictions missed by more than the step-time model's own
held-out error (:func:`not_settled`); it draws no quality conclusion unless the quality runs met their
learned criterion (:mod:`lenbatch_study.analysis.quality_report`). Cost: O(strategies + K sweep) plus three matplotlib figures.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from lenbatch_study.analysis import interleaved as il, quality_report as qr
from lenbatch_study.analysis import stepmodel as sm
from lenbatch_study.analysis import study_replay
from lenbatch_study.analysis.settled import (DRIFT_WARN, QUIET_RERUN, busy_machine, calibration_section,  # noqa: F401
                                            errors_beyond_noise, machine_sentence, noise_paragraph, not_settled,
                                            prediction_noise, unsteady_machine, _signed)
from lenbatch_study.core.config import Params
from lenbatch_study.pipeline.artifacts import compare_report as files
from lenbatch_study.pipeline.artifacts.writing import write_resolved

# The study this project re-examines used K = 6 length buckets (one definition, with the replay's)
STUDY_NUM_BUCKETS = study_replay.STUDY_NUM_BUCKETS


@dataclass
class StrategyRow:
    """One trained strategy: plan, prediction and measurement (tokens/s are useful tokens per second)."""

    padding_model_efficiency: float  # boundaries' predicted efficiency (bucketed) or the simulated plan's
    simulated_efficiency: float      # useful / computed tokens of the simulated epoch plan
    measured_efficiency: float       # useful / computed tokens of the run
    budget_fill: float
    predicted_tok_s: float
    measured_tok_s: float
    prediction_error: float          # predicted / measured - 1
    composition_repeat: float
    length_mixing: float
    steps: int
    useful_tokens: float             # useful tokens of the post-warm-up steps
    predicted_seconds: float        # modelled wall seconds of the post-warm-up steps
    mean_target_s: float
    mean_drafter_s: float
    loss_curve: tuple[np.ndarray, np.ndarray]
    target_step_ratio: float         # measured / predicted target step seconds (post-warm-up)
    drafter_step_ratio: float
    pipeline_error: float            # measured step times replayed through the pipeline model vs measured
    target_cpu_share: float
    drafter_cpu_share: float
    ratio_to_sorted_measured: float = math.nan
    ratio_to_sorted_predicted: float = math.nan
    ratio_to_sorted_padding: float = math.nan
    predicted_epoch_ratio_to_sorted: float = math.nan  # whole epoch 0, the steady state
    # drift calibration (lenbatch_study.analysis.calibration): the prediction with each role's step times x its
    # reference ratio (run's reference step / profile's), its error, and how far the run's reference moved
    calibrated_tok_s: float = math.nan
    calibrated_prediction_error: float = math.nan  # calibrated / measured - 1
    target_reference_ratio: float = math.nan
    drafter_reference_ratio: float = math.nan
    target_reference_drift: float = math.nan     # end / start of the run's reference - 1
    drafter_reference_drift: float = math.nan
    reference_seconds: float = math.nan          # wall seconds the run spent on its reference step


@dataclass(frozen=True)
class Recommendation:
    strategy: str                       # highest measured tokens/s among the shuffling strategies
    num_buckets: Optional[int]          # smallest K within compare.k_tolerance of the best predicted K
    k_best_throughput: Optional[int]    # the best predicted K


@dataclass
class CompareResult:
    """Everything the report, metrics and plots show (built by :func:`lenbatch_study.stages.compare.compare`).

    ``fits``: role -> {"best": StepFit, "candidates": [StepFit]}; ``components``: strategy -> modelled
    seconds per fitted term; ``ladder``: strategy -> throughput ratio to sorted per added term;
    ``sweep``: one dict per K of bucketed (simulated, predicted efficiency, diversity, predicted tok/s
    and ratio to sorted); ``quality``: the quality stage's intervals (:mod:`lenbatch_study.analysis.quality_report`)."""

    rows: dict[str, StrategyRow]
    components: dict[str, dict[str, float]]
    ladder: dict[str, dict[str, float]]
    sweep: list[dict[str, Any]]
    fits: dict[str, dict[str, Any]]
    exact_drafter_work: bool
    grid_points: int
    edges: tuple[int, ...]
    profile_cpu_share: dict[str, float]
    threads: int
    num_buckets: int
    histogram: list[dict[str, Any]]
    stats: dict[str, Any]
    quality: Any
    recommendation: Recommendation
    machine: Optional[dict[str, Any]] = None     # the fingerprint profile and runs share (lenbatch_study.core.machine)
    reference_shape: Optional[dict[str, Any]] = None
    profile_reference_drift: Optional[dict[str, float]] = None
    profile_reference_seconds: float = math.nan
    study_replay: Optional[dict[str, Any]] = None  # lenbatch_study.analysis.study_replay.replay(), when computed
    interleaved: Optional[dict[str, Any]] = None  # lenbatch_study.analysis.interleaved.judge(), when measured


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Mask of points not dominated when both x and y are to be maximised. O(n^2), n is small."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.ones(x.size, dtype=bool)
    for i in range(x.size):
        dominated = (x >= x[i]) & (y >= y[i]) & ((x > x[i]) | (y > y[i]))
        keep[i] = not dominated.any()
    return keep


METRIC_KEYS = ("padding_model_efficiency", "simulated_efficiency", "measured_efficiency", "predicted_tok_s",
               "measured_tok_s", "prediction_error", "ratio_to_sorted_padding", "ratio_to_sorted_predicted",
               "ratio_to_sorted_measured", "composition_repeat", "length_mixing", "steps",
               "target_step_ratio", "drafter_step_ratio", "pipeline_error", "predicted_epoch_ratio_to_sorted",
               "target_cpu_share", "drafter_cpu_share", "calibrated_tok_s", "calibrated_prediction_error",
               "target_reference_ratio", "drafter_reference_ratio", "target_reference_drift",
               "drafter_reference_drift")


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
USER_METRIC_KEYS = ("measured_tok_s", "ratio_to_sorted_measured", "ratio_to_sorted_predicted", "measured_efficiency",
                    "heldout_loss.mean", *il.USER_METRIC_KEYS)
USER_SUMMARY_KEYS = ("recommended.strategy", "recommended.num_buckets")
MAX_METRIC_NUMBERS = 40  # what `dvc exp show` can show beside the changed params


def user_metrics(flat: dict[str, Any]) -> dict[str, Any]:
    """The subset of :func:`flat_metrics` written to ``metrics.json`` (see ``USER_METRIC_KEYS``): 40 numbers
    and the recommended strategy's name for five strategies with the quality stage and the interleaved
    measurement."""
    keep = set(USER_SUMMARY_KEYS)
    constant = {f"{il.BASELINE}.ratio_to_sorted_measured", f"{il.BASELINE}.ratio_to_sorted_predicted"}
    return {k: v for k, v in flat.items() if k in keep or k.partition(".")[2] in USER_METRIC_KEYS
            and k.partition(".")[0] not in ("fit", "profile", "recommended", "machine") and k not in constant}


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
    for role, v in result.profile_cpu_share.items():
        out[f"profile.{role}_cpu_share"] = _num(v)
    out["max_abs_prediction_error"] = _num(max(abs(r.prediction_error) for r in result.rows.values()))
    out["max_abs_calibrated_prediction_error"] = _num(max(abs(r.calibrated_prediction_error)
                                                          for r in result.rows.values()))
    for role, v in (result.profile_reference_drift or {}).items():
        out[f"profile.{role}_reference_drift"] = _num(v)
    out["machine.id"] = (result.machine or {}).get("id")
    for e in result.sweep:
        out[f"bucketed_k{e['num_buckets']}.predicted_ratio_to_sorted"] = _num(e["predicted_ratio_to_sorted"])
    rec = result.recommendation
    out["recommended.num_buckets"] = rec.num_buckets
    out["recommended.strategy"] = rec.strategy
    out.update(qr.flat_metrics(result.quality, _tok_s(result)))
    out.update(il.flat_metrics(result.interleaved))
    return out


def _tok_s(result: CompareResult) -> dict[str, float]:
    return {s: r.measured_tok_s for s, r in result.rows.items()}


def frontier_points(result: CompareResult) -> list[dict]:
    """Every strategy and bucketed K = 1..max: efficiency, diversity, Pareto membership (DVC plot data)."""
    pts = [{"name": s, "kind": "strategy", "num_buckets": result.num_buckets if s == "bucketed" else None,
            "efficiency": r.simulated_efficiency, "length_mixing": r.length_mixing,
            "composition_repeat": r.composition_repeat, "predicted_ratio_to_sorted": r.ratio_to_sorted_predicted}
           for s, r in result.rows.items()]
    pts += [{"name": f"bucketed K={e['num_buckets']}", "kind": "sweep", "num_buckets": e["num_buckets"],
             "efficiency": e["simulated_efficiency"], "length_mixing": e["length_mixing"],
             "composition_repeat": e["composition_repeat"], "predicted_ratio_to_sorted": e["predicted_ratio_to_sorted"]}
            for e in result.sweep]
    x = np.array([p["length_mixing"] for p in pts])
    y = np.array([p["efficiency"] for p in pts])
    front = pareto_front(x, y)
    front_repeat = pareto_front(1 - np.array([p["composition_repeat"] for p in pts]), y)
    padded = np.array([p["name"] != "packed" for p in pts])
    front_padded = np.zeros(len(pts), dtype=bool)
    front_padded[padded] = pareto_front(x[padded], y[padded])
    for p, f, g, h, isp in zip(pts, front, front_repeat, front_padded, padded):
        p["pareto_mixing"] = bool(f)
        p["pareto_repeat"] = bool(g)
        p["pareto_padded"] = bool(h) if isp else None
    return pts


def histogram_points(result: CompareResult) -> list[dict]:
    """DVC plot data of the length histogram with the bucket edges (``workflow/plots/histogram.json`` draws
    it): one row per bin (``lo``, ``hi``, ``count``, ``bucket``: 1-based index of the bucket holding the
    bin's midpoint), then one row per inner bucket edge (``edge``, and ``lo`` = ``hi`` = the edge). Every
    row has every key (null where it does not apply): DVC renders a plot blank when rows differ in keys.
    Cost: O(bins * log K)."""
    edges = np.asarray(result.edges, dtype=float)
    rows: list[dict] = []
    for r in result.histogram:
        mid = (float(r["lo"]) + float(r["hi"])) / 2
        bucket = int(np.clip(np.searchsorted(edges, mid, side="right"), 1, max(len(edges) - 1, 1)))
        rows.append({"lo": r["lo"], "hi": r["hi"], "count": r["count"], "bucket": bucket, "edge": None})
    rows += [{"lo": int(e), "hi": int(e), "count": None, "bucket": None, "edge": int(e)} for e in result.edges[1:-1]]
    return rows


def write_plots(result: CompareResult, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    # 1. length histogram with the bucket edges
    fig, ax = plt.subplots(figsize=(7, 4))
    h = result.histogram
    lo = np.array([r["lo"] for r in h], dtype=float)
    hi = np.array([r["hi"] for r in h], dtype=float)
    ax.bar(lo, [r["count"] for r in h], width=hi - lo, align="edge", color="#8aa", edgecolor="#577")
    for e in result.edges[1:-1]:
        ax.axvline(e, color="#c33", lw=1.2)
    ax.set_xlabel("length (tokens)")
    ax.set_ylabel("samples")
    ax.set_title(f"length histogram and the {result.num_buckets} bucket edges (red)")
    paths.append(_save(fig, out / files.HISTOGRAM_PLOT))
    # 2. predicted vs measured throughput
    fig, ax = plt.subplots(figsize=(5.5, 5))
    rows = result.rows
    meas = np.array([r.measured_tok_s for r in rows.values()])
    pred = np.array([r.predicted_tok_s for r in rows.values()])
    pad = np.array([r.ratio_to_sorted_padding * rows["sorted"].measured_tok_s for r in rows.values()])
    lim = [0, 1.1 * max(meas.max(), pred.max(), pad.max())]
    ax.plot(lim, lim, color="#999", lw=1, label="prediction = measurement")
    ax.scatter(meas, pred, color="#236", zorder=3, label="step-time model")
    ax.scatter(meas, pad, color="#c63", marker="x", zorder=3, label="padding model x sorted")
    for s, m, p in zip(rows, meas, pred):
        ax.annotate(s, (m, p), textcoords="offset points", xytext=(5, -10), fontsize=8)
    ax.set_xlim(lim)
    ax.set_ylim(lim)
    ax.set_xlabel("measured useful tokens/s")
    ax.set_ylabel("predicted useful tokens/s")
    ax.legend(fontsize=8, loc="upper left")
    paths.append(_save(fig, out / files.THROUGHPUT_PLOT))
    # 3. efficiency-diversity frontier
    pts = frontier_points(result)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, key, flip, label, front_key in (
            (axes[0], "length_mixing", False, "length mixing (0 sorted .. 1 random)", "pareto_mixing"),
            (axes[1], "composition_repeat", True, "1 - composition repeat (0 sorted .. 1 fresh batches)",
             "pareto_repeat")):
        sw = [p for p in pts if p["kind"] == "sweep"]
        xs = [(1 - p[key]) if flip else p[key] for p in sw]
        ax.plot(xs, [p["efficiency"] for p in sw], "-o", color="#9ab", ms=4, label="bucketed, K = 1..max")
        for p, xv in zip(sw, xs):
            ax.annotate(str(p["num_buckets"]), (xv, p["efficiency"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
        for p in pts:
            if p["kind"] == "strategy":
                xv = (1 - p[key]) if flip else p[key]
                ax.scatter([xv], [p["efficiency"]], s=50, zorder=3)
                ax.annotate(p["name"], (xv, p["efficiency"]), fontsize=8, xytext=(5, -10), textcoords="offset points")
        if not flip:
            fp = sorted((p[key], p["efficiency"]) for p in pts if p.get("pareto_padded"))
            ax.plot([f[0] for f in fp], [f[1] for f in fp], ":", color="#36c", lw=1.5,
                    label="Pareto front, padded strategies only")
        front = sorted(((1 - p[key]) if flip else p[key], p["efficiency"]) for p in pts if p[front_key])
        ax.plot([f[0] for f in front], [f[1] for f in front], "--", color="#c33", lw=1.5, label="Pareto front")
        ax.scatter([f[0] for f in front], [f[1] for f in front], facecolors="none", edgecolors="#c33", s=110,
                   zorder=4)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("padding efficiency (simulated plan)")
    axes[0].legend(fontsize=8, loc="lower left")
    fig.suptitle("efficiency vs diversity: every strategy, and bucketed for each K")
    paths.append(_save(fig, out / files.FRONTIER_PLOT))
    return paths


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _share_words(x: float) -> str:
    """0.1 -> 'a tenth' (the report's wording), else a percentage of it."""
    return {0.1: "a tenth", 0.5: "half", 0.25: "a quarter"}.get(x, f"{100 * x:g}% of it")


def _pct(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def answer_paragraph(result: CompareResult, *, params: Params) -> str:
    rows, rec = result.rows, result.recommendation
    s = rec.strategy
    r, ref = rows[s], rows["sorted"]
    sweep = {e["num_buckets"]: e for e in result.sweep}
    # A busy or unsteady machine mixes other work into every measurement: the answer says so first, names
    # the rerun, and gives no recommendation in bold (the numbers cannot pick a strategy)
    unsettled = not_settled(result)
    lead = (f"{unsettled} Rerun them on a quiet machine: `{QUIET_RERUN}` "
            f"(DVC: `dvc repro --force --single-item profile` and each `train@<strategy>`, then `dvc repro`). "
            f"On these numbers `{s}` came out ahead" if unsettled else f"**Use `{s}`** for this data and model")
    text = (f"{lead}: it measured {r.measured_tok_s:,.0f} useful tokens/s, "
            f"{_pct(r.ratio_to_sorted_measured)} of `sorted` ({ref.measured_tok_s:,.0f} tokens/s), "
            f"with padding efficiency {_pct(r.simulated_efficiency)}, composition repeat "
            f"{r.composition_repeat:.3f} (sorted: {ref.composition_repeat:.3f}) and length mixing "
            f"{r.length_mixing:.3f} (sorted: {ref.length_mixing:.3f}). "
            + qr.answer_sentence(result.quality, s, _tok_s(result)))
    k = rec.num_buckets
    if k is not None and k in sweep:
        e = sweep[k]
        kb = sweep[rec.k_best_throughput]
        lead = " Use it" if s == "bucketed" else " Where packing is not available, use `bucketed`"
        kk = f"K = {k}" if unsettled else f"**K = {k}**"
        text += (f"{lead} with {kk} buckets: predicted over a whole epoch at "
                 f"{_pct(e['predicted_ratio_to_sorted'])} of sorted at simulated efficiency "
                 f"{_pct(e['simulated_efficiency'])} and length mixing {e['length_mixing']:.3f}, the smallest K "
                 f"within {_pct(params.compare.k_tolerance)} of the best predicted K (K = {kb['num_buckets']}, "
                 f"{_pct(kb['predicted_ratio_to_sorted'])}).")
    return text


def study_k_paragraph(result: CompareResult) -> str:
    """Where the study's K sits on this data's K sweep and frontier ('' when the sweep does not reach it)."""
    sweep = {e["num_buckets"]: e for e in result.sweep}
    pts = frontier_points(result)
    text = ""
    study = STUDY_NUM_BUCKETS
    if study in sweep:
        e = sweep[study]
        on = next(p for p in pts if p["kind"] == "sweep" and p["num_buckets"] == study)
        dominated_by = [p["name"] for p in pts if p["length_mixing"] >= on["length_mixing"]
                        and p["efficiency"] >= on["efficiency"] and p is not on
                        and (p["length_mixing"] > on["length_mixing"] or p["efficiency"] > on["efficiency"])]
        where = ("on the Pareto front of efficiency vs length mixing" if on["pareto_mixing"]
                 else f"behind the Pareto front (dominated by {', '.join(dominated_by[:3])})")
        text += (f"The study's choice, K = {study}, sits {where}: simulated efficiency "
                 f"{_pct(e['simulated_efficiency'])}, "
                 f"length mixing {e['length_mixing']:.3f}, predicted {_pct(e['predicted_ratio_to_sorted'])} "
                 "of sorted")
        if on.get("pareto_padded") is not None:
            text += (", and " + ("on" if on["pareto_padded"] else "behind") +
                     " the front of the padded strategies (packing left out)")
        steps = [f"K = {kk}: {_pct(sweep[kk]['simulated_efficiency'])}" for kk in (study - 1, study + 1) if kk in sweep]
        text += (f"; its neighbours give {', '.join(steps)}." if steps else ".")
    return text


def gap_paragraph(result: CompareResult) -> str:
    rows, lad, comp = result.rows, result.ladder, result.components
    s = "bucketed" if "bucketed" in rows else next(k for k in rows if k != "sorted")
    L = lad[s]
    steps_s, steps_ref = rows[s].steps, rows["sorted"].steps
    const = {k: sum(v for n, v in comp[k].items() if n.endswith(".const")) for k in (s, "sorted")}
    attn = {k: sum(v for n, v in comp[k].items() if n.endswith(".sum_len_sq")) for k in (s, "sorted")}
    total = {k: sum(comp[k].values()) for k in (s, "sorted")}
    return (f"The padding model predicts `{s}` at {_pct(L['padding'])} of sorted and the run measured "
            f"{_pct(L['measured'])}. Adding the step-time model's terms one at a time: the fixed cost per step "
            f"gives {_pct(L['+step'])} (`{s}` takes {steps_s} steps to sorted's {steps_ref}; the fixed terms are "
            f"{const[s]:.1f} s of {total[s]:.1f} s modelled, sorted {const['sorted']:.1f} s of "
            f"{total['sorted']:.1f} s), the quadratic attention term gives {_pct(L['+attention'])} "
            f"({attn[s]:.1f} s vs sorted {attn['sorted']:.1f} s), the per-sequence term {_pct(L['+sequences'])}, "
            f"and overlapping target and drafter through the queue (the full prediction) {_pct(L['pipelined'])}.")


REPLAY_PART = "The study's setting, replayed (not your data)"


def data_sentence(result: CompareResult) -> str:
    """What the report is about: the run's own data, and where the study's replay is."""
    st = result.stats or {}
    n, tokens = st.get("count"), st.get("total_tokens")
    what = (f"{int(n):,} samples, {int(tokens):,} tokens" if n is not None and tokens is not None
            else "its samples")
    tail = (f"; the study's own setting, replayed for comparison, is the last part (\"{REPLAY_PART}\")"
            if result.study_replay is not None else "")
    return f"About the data this run read ({what}; results/tokenize/stats.json names the source){tail}."


def write_report(result: CompareResult, out: Path, *, params: Params) -> Path:
    rows = result.rows
    lines = ["# Batching strategies: predicted vs measured", "", data_sentence(result), "", "## Answer", "",
             answer_paragraph(result, params=params),
             "", "## Why the padding-only prediction misses", "", gap_paragraph(result), "",
             "| strategy | padding only | +step cost | +attention | +sequences | pipelined (prediction) | measured |",
             "|---|---|---|---|---|---|---|"]
    for s, L in result.ladder.items():
        lines.append(f"| {s} | " + " | ".join(_pct(L[k]) for k in
                                             ("padding", "+step", "+attention", "+sequences", "pipelined",
                                              "measured")) + " |")
    lines += ["", "(throughput relative to sorted as each term of the step-time model is added)", "",
              "## Every strategy", "",
              "| strategy | padding model eff. | simulated eff. | predicted tok/s | measured tok/s | error | "
              "calibrated error | ratio to sorted (meas.) | composition repeat | length mixing | "
              "held-out loss at equal tokens [95%] |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s, r in rows.items():
        lines.append(f"| {s} | {_pct(r.padding_model_efficiency)} | {_pct(r.simulated_efficiency)} | "
                     f"{r.predicted_tok_s:,.0f} | {r.measured_tok_s:,.0f} | "
                     f"{100 * r.prediction_error:+.1f}% | {_signed(r.calibrated_prediction_error)} | "
                     f"{_pct(r.ratio_to_sorted_measured)} | {r.composition_repeat:.3f} | "
                     f"{r.length_mixing:.3f} | {qr.loss_cell(result.quality, s)} |")
    lines += ["", "Where the prediction error comes from: measured / predicted step seconds of each role "
              "(1.00 = the profile timed the run's steps right), and the measured step times replayed through "
              "the pipeline model against the measured throughput (0% = the pipeline model is right).", "",
              "| strategy | target step ratio | drafter step ratio | pipeline replay error | "
              "target CPU share | drafter CPU share |", "|---|---|---|---|---|---|"]
    for s, r in rows.items():
        lines.append(f"| {s} | {r.target_step_ratio:.2f} | {r.drafter_step_ratio:.2f} | "
                     f"{100 * r.pipeline_error:+.1f}% | {_pct(r.target_cpu_share)} | "
                     f"{_pct(r.drafter_cpu_share)} |")
    lines += ["", noise_paragraph(result), "", calibration_section(result), *il.section_lines(result.interleaved)]
    if result.quality:
        lines += ["", qr.section(result.quality, tok_s=_tok_s(result))]
    lines += ["", "## Step-time model", "",
              f"Fitted by non-negative least squares on relative error over {result.grid_points} profile grid "
              f"points (never on the runs it predicts); each candidate feature set scored on "
              f"{_pct(params.compare.holdout_fraction)} held-out points over {sm.HOLDOUT_SPLITS} random splits. A "
              f"larger set must lower the best held-out error by {_share_words(sm.MIN_GAIN_RELATIVE)} (and at least "
              f"{100 * sm.MIN_GAIN_ABSOLUTE:g} points) to be chosen.", "",
              "| role | features | held-out mean error | held-out worst | fit error | chosen |",
              "|---|---|---|---|---|---|"]
    for role, f in result.fits.items():
        for c in f["candidates"]:
            lines.append(f"| {role} | {c.name} | {_pct(c.holdout_error)} | {_pct(c.holdout_max_error)} | "
                         f"{_pct(c.train_error)} | {'yes' if c is f['best'] else ''} |")
    lines += [""]
    for role, f in result.fits.items():
        b = f["best"]
        terms = " + ".join(f"{c:.3g}·{n}" for n, c in zip(b.features, b.coef))
        lines.append(f"- {role}: t = {terms} seconds")
    lines += ["", f"## bucketed for K = 1..{len(result.sweep)}", "",
              "Predicted over a whole epoch (the steady state; a run's first batches vary too much to rank K), "
              "relative to sorted predicted the same way. Every strategy the same way: " + ", ".join(
                  f"{s} {_pct(r.predicted_epoch_ratio_to_sorted)}" for s, r in rows.items()) + ".", "",
              "| K | simulated eff. | predicted ratio to sorted | composition repeat | length mixing |",
              "|---|---|---|---|---|"]
    for e in result.sweep:
        lines.append(f"| {e['num_buckets']} | {_pct(e['simulated_efficiency'])} | "
                     f"{_pct(e['predicted_ratio_to_sorted'])} | {e['composition_repeat']:.3f} | "
                     f"{e['length_mixing']:.3f} |")
    lines += ["", "Length mixing: the pooled within-batch length variance over that of the `random` plan under the "
              "same batch spec, seed and epoch (0: every batch one length; 1: a random order; "
              "`lenbatch.length_mixing`)."]
    study_k = study_k_paragraph(result)
    if study_k:
        lines += ["", study_k]
    lines += ["", "## Plots", "", f"![length histogram]({files.HISTOGRAM_PLOT})", "",
              f"![predicted vs measured]({files.THROUGHPUT_PLOT})", "", f"![frontier]({files.FRONTIER_PLOT})", ""]
    if result.study_replay is not None:
        # the study's setting, on a stand-in of its lengths: its own part, after everything about this data
        lines += ["---", "", f"# {REPLAY_PART}", "",
                  "Everything above is about the data this run read. This part replays the study this project "
                  "re-examines (902,087 chats on 8 GPUs) on a stand-in of its lengths, for comparison only; its "
                  "numbers are not your data's.", "", study_replay.section(result.study_replay)]
    path = out / files.REPORT
    path.write_text("\n".join(lines))
    return path


def write_outputs(result: CompareResult, out: Path, *, params: Params) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    metrics = flat_metrics(result)
    (out / files.METRICS).write_text(json.dumps(user_metrics(metrics), indent=2) + "\n")
    (out / files.DIAGNOSTICS).write_text(json.dumps(metrics, indent=2) + "\n")
    (out / files.FRONTIER).write_text(json.dumps(frontier_points(result), indent=2) + "\n")
    tp = [{"strategy": s, "predicted_tok_s": r.predicted_tok_s, "measured_tok_s": r.measured_tok_s,
           "padding_model_tok_s": r.ratio_to_sorted_padding * result.rows["sorted"].measured_tok_s}
          for s, r in result.rows.items()]
    (out / files.THROUGHPUT).write_text(json.dumps(tp, indent=2) + "\n")
    (out / files.HISTOGRAM).write_text(json.dumps(histogram_points(result), indent=2) + "\n")
    fit = {role: {"chosen": f["best"].to_dict(), "candidates": [c.to_dict() for c in f["candidates"]]}
           for role, f in result.fits.items()}
    (out / files.STEPMODEL).write_text(json.dumps(fit, indent=2) + "\n")
    write_report(result, out, params=params)
    write_plots(result, out)
    if result.quality:  # the quality stage writes data only; its plot is drawn here, beside the report
        qr.write_plot(result.quality, out / files.QUALITY_PLOT)
    write_resolved(params, out)
    return metrics


__all__ = ["QUIET_RERUN", "REPLAY_PART", "CompareResult", "Recommendation", "StrategyRow", "busy_machine",
           "data_sentence", "errors_beyond_noise", "flat_metrics", "frontier_points", "histogram_points", "not_settled",
           "prediction_noise", "unsteady_machine", "write_outputs"]
