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
``recommended.*`` reaches ``metrics.json`` only when the answer is settled (the metrics are chosen in
:mod:`lenbatch_study.analysis.report_metrics`, the plots drawn in :mod:`lenbatch_study.analysis.report_plots`).
Cost: O(strategies + K sweep) plus three matplotlib figures.
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

# metrics.json / diagnostics.json and the plots (each its own module), re-exported
from lenbatch_study.analysis.report_metrics import (
    MAX_METRIC_NUMBERS as MAX_METRIC_NUMBERS,
    METRIC_KEYS as METRIC_KEYS,
    USER_METRIC_KEYS as USER_METRIC_KEYS,
    USER_SUMMARY_KEYS as USER_SUMMARY_KEYS,
    flat_metrics as flat_metrics,
    user_metrics as user_metrics,
)
from lenbatch_study.analysis.report_plots import (
    frontier_points as frontier_points,
    histogram_points as histogram_points,
    pareto_front as pareto_front,
    write_plots as write_plots,
)
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
    simulated_efficiency: float  # useful / computed tokens of the simulated epoch plan
    measured_efficiency: float  # useful / computed tokens of the run
    budget_fill: float
    predicted_tok_s: float
    measured_tok_s: float
    prediction_error: float  # predicted / measured - 1
    composition_repeat: float
    length_mixing: float
    steps: int
    useful_tokens: float  # useful tokens of the post-warm-up steps
    predicted_seconds: float  # modelled wall seconds of the post-warm-up steps
    mean_target_s: float
    mean_drafter_s: float
    loss_curve: tuple[np.ndarray, np.ndarray]
    target_step_ratio: float  # measured / predicted target step seconds (post-warm-up)
    drafter_step_ratio: float
    pipeline_error: float  # measured step times replayed through the pipeline model vs measured
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
    target_reference_drift: float = math.nan  # end / start of the run's reference - 1
    drafter_reference_drift: float = math.nan
    reference_seconds: float = math.nan  # wall seconds the run spent on its reference step
    # the features' transport to the drafter rank, mean seconds per post-warm-up step (separate trainings):
    # predicted from the profile's measurement (NaN: none measured) and measured by the run (NaN: none recorded)
    predicted_transport_s: float = math.nan
    measured_transport_s: float = math.nan


@dataclass(frozen=True)
class Recommendation:
    verdict: Verdict  # decided on the ratios measured in turns (analysis.verdict)
    num_buckets: Optional[int]  # smallest K within compare.k_tolerance of the best predicted K
    k_best_throughput: Optional[int]  # the best predicted K

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
    machine: Optional[dict[str, Any]] = None  # the fingerprint profile and runs share (lenbatch_study.core.machine)
    reference_shape: Optional[dict[str, Any]] = None
    profile_reference_drift: Optional[dict[str, float]] = None
    profile_reference_seconds: float = math.nan
    study_replay: Optional[dict[str, Any]] = None  # lenbatch_study.analysis.study_replay.replay(), when computed
    interleaved: Optional[dict[str, Any]] = None  # lenbatch_study.analysis.interleaved.judge(), when measured
    tokenize_stats: Optional[dict[str, Any]] = None  # the run's own tokenize stats.json (records, drops, source)
    data_dir: str = "results/tokenize"  # the tokenize folder the run read (its parent: the run's results folder)
    # the transport fits (lenbatch_study.analysis.transport_model.describe): backend, receive, stage; None: unmeasured
    transport: Optional[dict[str, Any]] = None


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
        counts.append(
            f"{sum(int(v) for v in dropped.values()):,} dropped ("
            + (", ".join(f"{k.replace('_', ' ')} {int(v):,}" for k, v in dropped.items() if int(v)) or "none")
            + ")"
        )
        counts.append(
            f"{int(tk.get('truncated', 0)):,} truncated to {tk.get('max_len', params.data.max_len):,} "
            f"tokens ({tk.get('overflow', 'truncate')})"
        )
        text += " Tokenize: " + ", ".join(counts) + "."
    p = st.get("percentiles") or {}
    if p:
        text += (
            f" Lengths {int(st['min']):,}..{int(st['max']):,} tokens, mean {float(st['mean']):,.0f}; "
            + ", ".join(f"{k.upper()} {float(v):,.0f}" for k, v in p.items() if k in ("p10", "p50", "p90", "p99"))
            + "."
        )
    where = (Path(result.data_dir) / tokenized.STATS).as_posix()
    return text + f" Counts by reason: `{where}`; the rest of the evidence: [{files.DETAILS}]({files.DETAILS})."


def _k_sentence(result: CompareResult, *, params: Params, bold: bool) -> str:
    rec = result.recommendation
    sweep = {e["num_buckets"]: e for e in result.sweep}
    k = rec.num_buckets
    if k is None or k not in sweep:
        return ""
    e, kb = sweep[k], sweep[rec.k_best_throughput]
    lead = (
        "Use it"
        if rec.strategy == "bucketed"
        else "Where a padded layout with length buckets is wanted, use `bucketed`"
    )
    kk = f"**K = {k}**" if bold else f"K = {k}"
    return (
        f" {lead} with {kk} buckets: predicted over a whole epoch at {pct(e['predicted_ratio_to_sorted'])} of "
        f"sorted at simulated efficiency {pct(e['simulated_efficiency'])} and length mixing "
        f"{e['length_mixing']:.3f}, the smallest K within {pct(params.compare.k_tolerance)} of the best predicted "
        f"K (K = {kb['num_buckets']}, {pct(kb['predicted_ratio_to_sorted'])})."
    )


def _missed_sentence(result: CompareResult, missed: tuple[str, ...]) -> str:
    """The step model's misses on strategies out of contention, said beside a settled answer."""
    table = result.interleaved or {}
    if not missed:
        return ""
    return (
        " The step model missed "
        + ", ".join(
            f"`{s}`'s ratio (predicted {table[s]['predicted_ratio']:.3f}, measured {_iv(table[s])}, "
            f"{100 * float(table[s]['prediction_error']):+.1f}%)"
            for s in missed
        )
        + f" beyond its interval and by more than {100 * PREDICTION_TARGET:g}%; the measurement separates "
        + ("it" if len(missed) == 1 else "them")
        + f" from the answer all the same (where the miss comes from: "
        f'[{files.DETAILS}]({files.DETAILS}), "Ratios measured in turns").'
    )


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
        return (
            ": the profile does not describe what was measured (the machine changed between them, or a shape "
            f"the grid never timed). Remeasure the profile: `{rerun}` (DVC: `dvc repro --force --single-item "
            "profile`, then `dvc repro`)"
        )
    return (
        f": the profile's timed passes agree within {100 * drift:.0f}% and every timed step lies inside its "
        "grid, so remeasuring it would give the same fits: the step model itself misses these steps (which "
        'role: details.md, "Ratios measured in turns"). The ratios are measured and stand, but the model '
        "cannot confirm them for this data, so no strategy is recommended on them"
    )


def answer_paragraph(result: CompareResult, *, params: Params) -> str:
    """The answer (:mod:`lenbatch_study.analysis.verdict`): "Use X", a named tie, or "Not settled" with why and the
    rerun; the trainings' drift is reported in details.md, never a veto."""
    v: Verdict = result.recommendation.verdict
    rows, table = result.rows, result.interleaved or {}
    others = ", ".join(f"`{s}` {_iv(table[s])}" for s in v.candidates if s not in v.top and s in table)
    if v.kind == USE:
        s = v.strategy
        r, m = rows[s], table[s]
        text = (
            f"**Use `{s}`** for this data and model. Measured in turns, its useful tokens/s are {_iv(m)} of "
            f"`sorted`'s (95% interval over {v.rounds} rounds), wholly above every other shuffling strategy's"
            + (f" ({others})" if others else "")
            + f"; the step model predicted {m['predicted_ratio']:.3f}. "
            f"Its batches change every epoch (composition repeat {r.composition_repeat:.3f}, sorted "
            f"{rows['sorted'].composition_repeat:.3f}; length mixing {r.length_mixing:.3f}, random 1). "
            + qr.answer_sentence(result.quality, s)
        )
        return text + _k_sentence(result, params=params, bold=True) + _missed_sentence(result, v.missed)
    if v.kind == TIE:
        names = " and ".join(f"`{s}`" for s in v.top)
        text = (
            f"**Tie: {names}** for this data and model. Measured in turns, their useful tokens/s are "
            + ", ".join(f"`{s}` {_iv(table[s])}" for s in v.top)
            + f" of `sorted`'s (95% intervals over "
            f"{v.rounds} rounds, each within ±{100 * INTERVAL_TARGET:g}%): the intervals overlap, so their "
            "throughput is the same within what this measurement resolves"
            + (f"; below them: {others}" if others else "")
            + ". What else separates them: composition repeat "
            + ", ".join(f"`{s}` {rows[s].composition_repeat:.3f}" for s in v.top)
            + " (lower: batch-mates change more between epochs), length mixing "
            + ", ".join(f"`{s}` {rows[s].length_mixing:.3f}" for s in v.top)
            + "; "
            + qr.tie_sentence(result.quality, v.top)
        )
        return text + _k_sentence(result, params=params, bold=True) + _missed_sentence(result, v.missed)
    if not v.measured:
        return (
            "**Not settled: no ratios were measured in turns** (compare ran without the interleave stage's "
            "results), and the trainings, run one after another, cannot separate strategies on a machine whose "
            f"speed moves. Run `{rerun_command(result, 'interleave')}` (DVC: `dvc repro interleave`), then "
            "compare."
        )
    why = []
    if v.wide:
        why.append(
            ", ".join(f"`{s}` {_iv(table[s])}" for s in v.top)
            + " overlap, and the intervals of "
            + ", ".join(f"`{s}`" for s in v.wide)
            + f" are still wider than ±{100 * INTERVAL_TARGET:g}% after "
            f"{v.rounds} rounds (`interleave.max_rounds`): the machine's speed moved within rounds too much to "
            "separate them. Rerun the measurement in turns on a quieter machine or with more rounds: "
            f"`dvc exp run -S interleave.max_rounds={2 * v.rounds}` (Snakemake: set it in your config, then "
            f"`{rerun_command(result, 'interleave')}`)"
        )
    vetoed = [s for s in v.missed if s in v.top]
    if vetoed:
        why.append(
            "the step model's predicted ratio missed the measured one beyond its 95% interval and by more "
            f"than {100 * PREDICTION_TARGET:g}% for "
            + ", ".join(
                f"`{s}` (predicted {table[s]['predicted_ratio']:.3f}, measured {_iv(table[s])})" for s in vetoed
            )
            + miss_cause(table, vetoed, rerun=rerun_command(result, "profile"))
        )
    apart = [s for s in v.unrepresentative if s in v.top]
    if apart:
        why.append(
            "the timed steps do not stand for the run for "
            + ", ".join(
                f"`{s}` (the step model's ratio over its timed steps {table[s]['predicted_ratio']:.3f}, over its whole "
                f"run {table[s]['run_predicted_ratio']:.3f})"
                for s in apart
            )
            + ": the ratio measured in turns describes "
            "a few batches, not the training. Time more steps per strategy: "
            f"`dvc exp run -S interleave.segment_steps={2 * params.interleave.segment_steps}` (Snakemake: set it in your "
            f"config, then `{rerun_command(result, 'interleave')}`)"
        )
    best = v.candidates[0]
    return (
        f"**Not settled**: {'; and '.join(why)}. On these numbers `{best}` measured highest, {_iv(table[best])} "
        "of `sorted`'s."
    )


MAIN_COLUMNS = (
    "strategy",
    "padding eff.",
    "ratio to sorted, in turns [95%]",
    "predicted ratio",
    "composition repeat",
    "length mixing",
    "held-out loss [95%]",
)


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
        lines.append(
            f"| {s} | {pct(r.simulated_efficiency)} | {measured} | {predicted} | "
            f"{r.composition_repeat:.3f} | {r.length_mixing:.3f} | {qr.loss_cell(result.quality, s)} |"
        )
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
    return (
        "The padding model (throughput in proportion to padding efficiency) gives " + ", ".join(parts) + ". It "
        "misses what a step costs besides its padded tokens: a fixed cost per step (more, smaller batches cost "
        "more), attention's quadratic term (long rows cost more per token), and the drafter's work, which "
        "follows sequences and positions rather than padded tokens; the step model fitted on the profile grid "
        f"adds them (term by term: [{files.DETAILS}]({files.DETAILS}))."
    )


def write_report(result: CompareResult, out: Path, *, params: Params) -> Path:
    """``report.md`` (at most 10 KB): the data, the answer, one table per strategy, why the padding model misses
    and the quality sentence; ``details.md`` holds the rest (:mod:`lenbatch_study.analysis.report_details`)."""
    lines = [
        "# Batching strategies: which to use",
        "",
        data_sentence(result, params=params),
        "",
        "## Answer",
        "",
        answer_paragraph(result, params=params),
        "",
        "## Every strategy",
        "",
        *main_table(result),
        "",
        "Ratios are useful tokens/s over `sorted`'s, every strategy's steps timed in turns in one process "
        "(`lenbatch interleave`), so the machine's drift falls on all alike; the predicted ratio is the step "
        "model's for the same steps. Padding efficiency: the simulated plan's useful / computed tokens. "
        "Composition repeat: the share of batch-mate pairs batched together again the next epoch (sorted 1). "
        "Length mixing: within-batch length variance over a random plan's (sorted 0, random 1).",
    ]
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
    tp = [
        {
            "strategy": s,
            "predicted_tok_s": r.predicted_tok_s,
            "measured_tok_s": r.measured_tok_s,
            "padding_model_tok_s": r.ratio_to_sorted_padding * result.rows["sorted"].measured_tok_s,
        }
        for s, r in result.rows.items()
    ]
    (out / files.THROUGHPUT).write_text(json.dumps(tp, indent=2) + "\n")
    (out / files.HISTOGRAM).write_text(json.dumps(histogram_points(result), indent=2) + "\n")
    fit = {
        role: {"chosen": f["best"].to_dict(), "candidates": [c.to_dict() for c in f["candidates"]]}
        for role, f in result.fits.items()
    }
    (out / files.STEPMODEL).write_text(json.dumps(fit, indent=2) + "\n")
    write_report(result, out, params=params)
    write_plots(result, out)
    if result.quality:  # the quality stage writes data only; its plot is drawn here, beside the report
        qr.write_plot(result.quality, out / files.QUALITY_PLOT)
    write_resolved(params, out)
    return metrics


__all__ = [
    "MAIN_COLUMNS",
    "QUIET_RERUN",
    "REPLAY_PART",
    "REPORT_MAX_BYTES",
    "CompareResult",
    "Recommendation",
    "StrategyRow",
    "answer_paragraph",
    "busy_machine",
    "data_sentence",
    "flat_metrics",
    "frontier_points",
    "histogram_points",
    "main_table",
    "rerun_command",
    "unsteady_machine",
    "write_outputs",
]
