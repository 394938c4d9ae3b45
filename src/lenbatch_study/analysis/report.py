"""The compare stage's outputs: ``report.md`` and ``details.md``, the plots, ``metrics.json`` /
``diagnostics.json``, ``frontier.json``, ``throughput.json`` and ``stepmodel.json``, rendered from a
:class:`CompareResult`.

:mod:`lenbatch_study.stages.compare` predicts (pure function of the stage inputs) and builds the result; this
module only renders it, so a report change never touches a prediction. ``report.md`` (at most
:data:`REPORT_MAX_BYTES`) is about the data the run read: its counts and percentiles, the answer decided on the
ratios measured in turns (:mod:`lenbatch_study.analysis.verdict`: "Use X", a named tie, or "Not settled" with
why and the rerun), one table per strategy, why the padding model misses, and the quality stage's finding in a
sentence with its direction and interval. ``details.md`` (:mod:`lenbatch_study.analysis.report_details`) holds
the evidence: the separate trainings and the machine's drift under them (reported, never a veto), the
per-role ratios, the quality tables, the step-time model, the K sweep and the study's own setting replayed.
``recommended.*`` reaches ``metrics.json`` only when the answer is settled. Cost: O(strategies + K sweep)
plus three matplotlib figures.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from lenbatch_study.analysis import interleaved as il, quality_report as qr
from lenbatch_study.analysis.interleaved import PREDICTION_TARGET
from lenbatch_study.analysis import report_details
from lenbatch_study.analysis.report_details import REPLAY_PART, STUDY_NUM_BUCKETS, details_text, pct  # noqa: F401
from lenbatch_study.analysis.settled import QUIET_RERUN, busy_machine, unsteady_machine  # noqa: F401
from lenbatch_study.analysis.verdict import TIE, USE, Verdict
from lenbatch_study.core.config import Params
from lenbatch_study.core.intervals import INTERVAL_TARGET
from lenbatch_study.pipeline.artifacts import compare_report as files, tokenized
from lenbatch_study.pipeline.artifacts.writing import write_resolved

# report.md's bound: the answer and one table; everything else is details.md's
REPORT_MAX_BYTES = 10_000


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
    # how far the run's reference step moved (reported in details.md); the start/end calibration (the prediction
    # with each role's step times x its reference ratio, lenbatch_study.analysis.calibration) is no longer
    # reported: a drift within minutes is not linear in time. benchmarks/bench_prediction.py still scores it.
    calibrated_tok_s: float = math.nan
    calibrated_prediction_error: float = math.nan  # calibrated / measured - 1
    target_reference_ratio: float = math.nan
    drafter_reference_ratio: float = math.nan
    target_reference_drift: float = math.nan     # end / start of the run's reference - 1
    drafter_reference_drift: float = math.nan
    reference_seconds: float = math.nan          # wall seconds the run spent on its reference step
    # the features' transport to the drafter rank, mean seconds per post-warm-up step (separate trainings):
    # predicted from the profile's measurement (NaN: none measured) and measured by the run (NaN: none recorded)
    predicted_transport_s: float = math.nan
    measured_transport_s: float = math.nan


@dataclass(frozen=True)
class Recommendation:
    verdict: Verdict                    # decided on the ratios measured in turns (analysis.verdict)
    num_buckets: Optional[int]          # smallest K within compare.k_tolerance of the best predicted K
    k_best_throughput: Optional[int]    # the best predicted K

    @property
    def strategy(self) -> Optional[str]:
        """The strategy to use; None for a tie or when not settled."""
        return self.verdict.strategy


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
    tokenize_stats: Optional[dict[str, Any]] = None  # the run's own tokenize stats.json (records, drops, source)
    data_dir: str = "results/tokenize"  # the tokenize folder the run read (its parent: the run's results folder)
    # the transport fits (lenbatch_study.analysis.transport_model.describe): backend, receive, stage; None: unmeasured
    transport: Optional[dict[str, Any]] = None


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
               "target_cpu_share", "drafter_cpu_share", "target_reference_drift", "drafter_reference_drift",
               "predicted_transport_s", "measured_transport_s")


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
USER_SUMMARY_KEYS = ("verdict", "recommended.strategy", "recommended.tie", "recommended.num_buckets")
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
    for hop, f in ((h, (result.transport or {}).get(h)) for h in ("receive", "stage")):  # the features' transport
        if f:  # seconds = const + per byte x bytes, the rate as seconds per GB (per byte rounds to 0)
            out.update({f"fit.transport.{hop}.const_s": _num(f["const_s"]),
                        f"fit.transport.{hop}.s_per_gb": _num(f["per_byte_s"] * 1e9),
                        f"fit.transport.{hop}.error": _num(f["error"])})
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


def _iv(r: Mapping[str, Any]) -> str:
    lo, hi = r["ci95"]
    return f"{r['ratio_to_sorted']:.3f} [{lo:.3f}, {hi:.3f}]"


DEFAULT_RESULTS = "results"


def rerun_command(result: CompareResult, what: str) -> str:
    """``snakemake ... --forcerun <what>`` for this run: as it is where the run's results are the default folder,
    else naming the ``--configfile`` that put them elsewhere (without it, Snakemake would remeasure the embedded
    default)."""
    where = Path(result.data_dir).parent.as_posix()
    config = "" if where == DEFAULT_RESULTS else f" --configfile <your config, results_dir: {where}>"
    return f"snakemake --cores all{config} --forcerun {what}"


def data_sentence(result: CompareResult, *, params: Params) -> str:
    """What the report is about: the run's own data (its tokenize stage's counts, read from the run's own folder),
    and its length percentiles."""
    st, tk = result.stats or {}, result.tokenize_stats or {}
    n, tokens = st.get("count"), st.get("total_tokens")
    what = f"{int(n):,} samples, {int(tokens):,} tokens" if n is not None and tokens is not None else "its samples"
    source = (tk.get("source") or {}).get("path") if isinstance(tk.get("source"), dict) else tk.get("source")
    text = f"About the data this run read ({what}" + (f" from `{source}`" if source else "") + ")."
    counts = []
    skipped = sum(int(v) for v in (tk.get("skipped") or {}).values())
    dropped = tk.get("dropped") or {}
    if tk:
        counts.append(f"{int(tk.get('records_read', 0)):,} records read, {skipped:,} skipped as malformed")
        counts.append(f"{sum(int(v) for v in dropped.values()):,} dropped (" + (", ".join(
            f"{k.replace('_', ' ')} {int(v):,}" for k, v in dropped.items() if int(v)) or "none") + ")")
        counts.append(f"{int(tk.get('truncated', 0)):,} truncated to {tk.get('max_len', params.data.max_len):,} "
                      f"tokens ({tk.get('overflow', 'truncate')})")
        text += " Tokenize: " + ", ".join(counts) + "."
    p = st.get("percentiles") or {}
    if p:
        text += (f" Lengths {int(st['min']):,}..{int(st['max']):,} tokens, mean {float(st['mean']):,.0f}; " + ", ".join(
            f"{k.upper()} {float(v):,.0f}" for k, v in p.items() if k in ("p10", "p50", "p90", "p99")) + ".")
    where = (Path(result.data_dir) / tokenized.STATS).as_posix()
    return text + f" Counts by reason: `{where}`; the rest of the evidence: [{files.DETAILS}]({files.DETAILS})."


def _k_sentence(result: CompareResult, *, params: Params, bold: bool) -> str:
    rec = result.recommendation
    sweep = {e["num_buckets"]: e for e in result.sweep}
    k = rec.num_buckets
    if k is None or k not in sweep:
        return ""
    e, kb = sweep[k], sweep[rec.k_best_throughput]
    lead = "Use it" if rec.strategy == "bucketed" else "Where a padded layout with length buckets is wanted, use `bucketed`"
    kk = f"**K = {k}**" if bold else f"K = {k}"
    return (f" {lead} with {kk} buckets: predicted over a whole epoch at {pct(e['predicted_ratio_to_sorted'])} of "
            f"sorted at simulated efficiency {pct(e['simulated_efficiency'])} and length mixing "
            f"{e['length_mixing']:.3f}, the smallest K within {pct(params.compare.k_tolerance)} of the best predicted "
            f"K (K = {kb['num_buckets']}, {pct(kb['predicted_ratio_to_sorted'])}).")


def _missed_sentence(result: CompareResult, missed: tuple[str, ...]) -> str:
    """The step model's misses on strategies out of contention, said beside a settled answer."""
    table = result.interleaved or {}
    if not missed:
        return ""
    return (" The step model missed " + ", ".join(
        f"`{s}`'s ratio (predicted {table[s]['predicted_ratio']:.3f}, measured {_iv(table[s])}, "
        f"{100 * float(table[s]['prediction_error']):+.1f}%)" for s in missed)
        + f" beyond its interval and by more than {100 * PREDICTION_TARGET:g}%; the measurement separates "
        + ("it" if len(missed) == 1 else "them") + f" from the answer all the same (where the miss comes from: "
        f"[{files.DETAILS}]({files.DETAILS}), \"Ratios measured in turns\").")


def miss_cause(table: Mapping[str, Mapping[str, object]], vetoed: Sequence[str], *, rerun: str) -> str:
    """Why the vetoing predictions missed, and what helps. Where the profile's timed passes moved by more than
    :data:`lenbatch_study.analysis.interleaved.PROFILE_DRIFT` or a timed step lies beyond its grid, the profile
    does not describe what was measured: remeasure it. Where neither, a remeasured profile gives the same fits
    (3,002 own chats on the tiny model: +6.3%, then +6.8% after ``--forcerun profile``), so the miss is the step
    model's on these steps, and the advice says that instead of a rerun that cannot help."""
    spans = [f for s in vetoed for f in (table[s].get("profile_pass_factors") or {}).values() if f]
    drift = max((max(max(f), 1 / min(f)) - 1 for f in spans), default=float("inf"))  # type: ignore[type-var]
    beyond = [s for s in vetoed if table[s].get("beyond_grid")]
    if drift > il.PROFILE_DRIFT or beyond:
        return (": the profile does not describe what was measured (the machine changed between them, or a shape "
                f"the grid never timed). Remeasure the profile: `{rerun}` (DVC: `dvc repro --force --single-item "
                "profile`, then `dvc repro`)")
    return (f": the profile's timed passes agree within {100 * drift:.0f}% and every timed step lies inside its "
            "grid, so remeasuring it would give the same fits: the step model itself misses these steps (which "
            "role: details.md, \"Ratios measured in turns\"). The ratios are measured and stand, but the model "
            "cannot confirm them for this data, so no strategy is recommended on them")


def answer_paragraph(result: CompareResult, *, params: Params) -> str:
    """The answer (:mod:`lenbatch_study.analysis.verdict`): "Use X", a named tie, or "Not settled" with why and the
    rerun; the trainings' drift is reported in details.md, never a veto."""
    v: Verdict = result.recommendation.verdict
    rows, table = result.rows, result.interleaved or {}
    others = ", ".join(f"`{s}` {_iv(table[s])}" for s in v.candidates if s not in v.top and s in table)
    if v.kind == USE:
        s = v.strategy
        r, m = rows[s], table[s]
        text = (f"**Use `{s}`** for this data and model. Measured in turns, its useful tokens/s are {_iv(m)} of "
                f"`sorted`'s (95% interval over {v.rounds} rounds), wholly above every other shuffling strategy's"
                + (f" ({others})" if others else "") + f"; the step model predicted {m['predicted_ratio']:.3f}. "
                f"Its batches change every epoch (composition repeat {r.composition_repeat:.3f}, sorted "
                f"{rows['sorted'].composition_repeat:.3f}; length mixing {r.length_mixing:.3f}, random 1). "
                + qr.answer_sentence(result.quality, s))
        return text + _k_sentence(result, params=params, bold=True) + _missed_sentence(result, v.missed)
    if v.kind == TIE:
        names = " and ".join(f"`{s}`" for s in v.top)
        text = (f"**Tie: {names}** for this data and model. Measured in turns, their useful tokens/s are "
                + ", ".join(f"`{s}` {_iv(table[s])}" for s in v.top) + f" of `sorted`'s (95% intervals over "
                f"{v.rounds} rounds, each within ±{100 * INTERVAL_TARGET:g}%): the intervals overlap, so their "
                "throughput is the same within what this measurement resolves"
                + (f"; below them: {others}" if others else "") + ". What else separates them: composition repeat "
                + ", ".join(f"`{s}` {rows[s].composition_repeat:.3f}" for s in v.top)
                + " (lower: batch-mates change more between epochs), length mixing "
                + ", ".join(f"`{s}` {rows[s].length_mixing:.3f}" for s in v.top) + "; "
                + qr.tie_sentence(result.quality, v.top))
        return text + _k_sentence(result, params=params, bold=True) + _missed_sentence(result, v.missed)
    if not v.measured:
        return ("**Not settled: no ratios were measured in turns** (compare ran without the interleave stage's "
                "results), and the trainings, run one after another, cannot separate strategies on a machine whose "
                f"speed moves. Run `{rerun_command(result, 'interleave')}` (DVC: `dvc repro interleave`), then "
                "compare.")
    why = []
    if v.wide:
        why.append(", ".join(f"`{s}` {_iv(table[s])}" for s in v.top) + " overlap, and the intervals of "
                   + ", ".join(f"`{s}`" for s in v.wide) + f" are still wider than ±{100 * INTERVAL_TARGET:g}% after "
                   f"{v.rounds} rounds (`interleave.max_rounds`): the machine's speed moved within rounds too much to "
                   "separate them. Rerun the measurement in turns on a quieter machine or with more rounds: "
                   f"`dvc exp run -S interleave.max_rounds={2 * v.rounds}` (Snakemake: set it in your config, then "
                   f"`{rerun_command(result, 'interleave')}`)")
    vetoed = [s for s in v.missed if s in v.top]
    if vetoed:
        why.append("the step model's predicted ratio missed the measured one beyond its 95% interval and by more "
                   f"than {100 * PREDICTION_TARGET:g}% for " + ", ".join(
                       f"`{s}` (predicted {table[s]['predicted_ratio']:.3f}, measured {_iv(table[s])})"
                       for s in vetoed) + miss_cause(table, vetoed, rerun=rerun_command(result, 'profile')))
    apart = [s for s in v.unrepresentative if s in v.top]
    if apart:
        why.append("the timed steps do not stand for the run for " + ", ".join(
            f"`{s}` (the step model's ratio over its timed steps {table[s]['predicted_ratio']:.3f}, over its whole "
            f"run {table[s]['run_predicted_ratio']:.3f})" for s in apart) + ": the ratio measured in turns describes "
            "a few batches, not the training. Time more steps per strategy: "
            f"`dvc exp run -S interleave.segment_steps={2 * params.interleave.segment_steps}` (Snakemake: set it in your "
            f"config, then `{rerun_command(result, 'interleave')}`)")
    best = v.candidates[0]
    return (f"**Not settled**: {'; and '.join(why)}. On these numbers `{best}` measured highest, {_iv(table[best])} "
            "of `sorted`'s.")


MAIN_COLUMNS = ("strategy", "padding eff.", "ratio to sorted, in turns [95%]", "predicted ratio",
                "composition repeat", "length mixing", "held-out loss [95%]")


def main_table(result: CompareResult) -> list[str]:
    """The report's one table (``lenbatch readme`` copies it): per strategy the simulated padding efficiency, the
    ratio to sorted measured in turns with its interval, the predicted ratio, both diversity measures and the
    held-out loss at equal useful tokens."""
    table = result.interleaved or {}
    lines = ["| " + " | ".join(MAIN_COLUMNS) + " |", "|" + "---|" * len(MAIN_COLUMNS)]
    for s, r in result.rows.items():
        m = table.get(s)
        measured = "1 (baseline)" if s == il.BASELINE else (_iv(m) if m else "n/a")
        predicted = "1" if s == il.BASELINE else (f"{m['predicted_ratio']:.3f}" if m else "n/a")
        lines.append(f"| {s} | {pct(r.simulated_efficiency)} | {measured} | {predicted} | "
                     f"{r.composition_repeat:.3f} | {r.length_mixing:.3f} | {qr.loss_cell(result.quality, s)} |")
    return lines


def padding_miss_sentence(result: CompareResult) -> str:
    """Why the padding model (throughput proportional to padding efficiency) misses, in a sentence: its ratio
    against the measured one, and the step model's terms that close the gap (details.md's table)."""
    table = result.interleaved or {}
    parts = []
    for s, r in result.rows.items():
        if s != il.BASELINE and s in table:
            parts.append(f"`{s}` {r.ratio_to_sorted_padding:.3f} against {table[s]['ratio_to_sorted']:.3f} measured")
    if not parts:
        return ""
    return ("The padding model (throughput in proportion to padding efficiency) gives " + ", ".join(parts) + ". It "
            "misses what a step costs besides its padded tokens: a fixed cost per step (more, smaller batches cost "
            "more), attention's quadratic term (long rows cost more per token), and the drafter's work, which "
            "follows sequences and positions rather than padded tokens; the step model fitted on the profile grid "
            f"adds them (term by term: [{files.DETAILS}]({files.DETAILS})).")


def write_report(result: CompareResult, out: Path, *, params: Params) -> Path:
    """``report.md`` (at most 10 KB): the data, the answer, one table per strategy, why the padding model misses
    and the quality sentence; ``details.md`` holds the rest (:mod:`lenbatch_study.analysis.report_details`)."""
    lines = ["# Batching strategies: which to use", "", data_sentence(result, params=params), "", "## Answer", "",
             answer_paragraph(result, params=params), "", "## Every strategy", "", *main_table(result), "",
             "Ratios are useful tokens/s over `sorted`'s, every strategy's steps timed in turns in one process "
             "(`lenbatch interleave`), so the machine's drift falls on all alike; the predicted ratio is the step "
             "model's for the same steps. Padding efficiency: the simulated plan's useful / computed tokens. "
             "Composition repeat: the share of batch-mate pairs batched together again the next epoch (sorted 1). "
             "Length mixing: within-batch length variance over a random plan's (sorted 0, random 1)."]
    miss = padding_miss_sentence(result)
    if miss:
        lines += ["", "## Why the padding model misses", "", miss]
    lines += ["", "## Does composition change what is learned?", "", qr.summary_sentence(result.quality), ""]
    path = out / files.REPORT
    path.write_text("\n".join(lines))
    (out / files.DETAILS).write_text(details_text(result, params=params, frontier=frontier_points(result)))
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


__all__ = ["MAIN_COLUMNS", "QUIET_RERUN", "REPLAY_PART", "REPORT_MAX_BYTES", "CompareResult", "Recommendation",
           "StrategyRow", "answer_paragraph", "busy_machine", "data_sentence", "flat_metrics", "frontier_points",
           "histogram_points", "main_table", "rerun_command", "unsteady_machine", "write_outputs"]
