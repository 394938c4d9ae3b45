"""The compare stage's ``details.md``: everything behind the report's answer, rendered from a
:class:`lenbatch_study.analysis.report.CompareResult`.

``report.md`` holds the answer and one table (:mod:`lenbatch_study.analysis.report`); this page holds the
evidence a reader checks it by: the separate trainings (absolute tokens/s, their ratios to ``sorted``, the
prediction's error and where it comes from, the machine and how far its speed moved while they ran), the
ratios measured in turns per role, the quality stage's tables, the step-time model's candidates, the K
sweep and, last, the study's own setting replayed. Pure rendering; cost O(strategies + K sweep).
"""

from __future__ import annotations

import math
from typing import Any

from lenbatch_study.analysis import interleaved as il, quality_report as qr
from lenbatch_study.analysis import stepmodel as sm
from lenbatch_study.analysis import study_replay
from lenbatch_study.analysis.settled import machine_sentence, quiet_paragraph
from lenbatch_study.core.config import Params
from lenbatch_study.pipeline.artifacts import compare_report as files

CompareResult = Any  # lenbatch_study.analysis.report.CompareResult (which imports this module)

# The study this project re-examines used K = 6 length buckets (one definition, with the replay's)
STUDY_NUM_BUCKETS = study_replay.STUDY_NUM_BUCKETS
REPLAY_PART = "The study's setting, replayed (not your data)"


def pct(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def signed(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:+.1f}%"


def _share_words(x: float) -> str:
    """0.1 -> 'a tenth' (the report's wording), else a percentage of it."""
    return {0.1: "a tenth", 0.5: "half", 0.25: "a quarter"}.get(x, f"{100 * x:g}% of it")


def tok_s(result: CompareResult) -> dict[str, float]:
    """Each strategy's useful tokens/s for the held-out loss per second: ``sorted``'s training's times the ratio
    measured in turns where there is one (drift-proof), else the strategy's own training's."""
    table = result.interleaved or {}
    ref = result.rows["sorted"].measured_tok_s
    return {
        s: ref * float(table[s]["ratio_to_sorted"]) if s in table else r.measured_tok_s for s, r in result.rows.items()
    }


def gap_paragraph(result: CompareResult) -> str:
    """Why the padding-only prediction misses, term by term of the step-time model (over the trainings' steps)."""
    rows, lad, comp = result.rows, result.ladder, result.components
    s = "bucketed" if "bucketed" in rows else next(k for k in rows if k != "sorted")
    L = lad[s]
    steps_s, steps_ref = rows[s].steps, rows["sorted"].steps
    const = {k: sum(v for n, v in comp[k].items() if n.endswith(".const")) for k in (s, "sorted")}
    attn = {k: sum(v for n, v in comp[k].items() if n.endswith(".sum_len_sq")) for k in (s, "sorted")}
    total = {k: sum(comp[k].values()) for k in (s, "sorted")}
    return (
        f"The padding model predicts `{s}` at {pct(L['padding'])} of sorted. Adding the step-time model's terms "
        f"one at a time over the training's steps: the fixed cost per step gives {pct(L['+step'])} (`{s}` takes "
        f"{steps_s} steps to sorted's {steps_ref}; the fixed terms are {const[s]:.1f} s of {total[s]:.1f} s "
        f"modelled, sorted {const['sorted']:.1f} s of {total['sorted']:.1f} s), the quadratic attention term "
        f"gives {pct(L['+attention'])} ({attn[s]:.1f} s vs sorted {attn['sorted']:.1f} s), the per-sequence term "
        f"{pct(L['+sequences'])}, and overlapping target and drafter through the queue (the full prediction) "
        f"{pct(L['pipelined'])}; the training measured {pct(L['measured'])}."
    )


def ladder_lines(result: CompareResult) -> list[str]:
    lines = [
        "| strategy | padding only | +step cost | +attention | +sequences | pipelined (prediction) | "
        "training (measured) |",
        "|---|---|---|---|---|---|---|",
    ]
    for s, L in result.ladder.items():
        lines.append(
            f"| {s} | "
            + " | ".join(pct(L[k]) for k in ("padding", "+step", "+attention", "+sequences", "pipelined", "measured"))
            + " |"
        )
    return lines


def study_k_paragraph(result: CompareResult, pts: list[dict]) -> str:
    """Where K = 6, the K of the study this project replays, sits on this data's K sweep and frontier (``pts``:
    :func:`lenbatch_study.analysis.report_plots.frontier_points`); '' when the sweep does not reach it."""
    sweep = {e["num_buckets"]: e for e in result.sweep}
    study = STUDY_NUM_BUCKETS
    if study not in sweep:
        return ""
    e = sweep[study]
    on = next(p for p in pts if p["kind"] == "sweep" and p["num_buckets"] == study)
    dominated_by = [
        p["name"]
        for p in pts
        if p["length_mixing"] >= on["length_mixing"]
        and p["efficiency"] >= on["efficiency"]
        and p is not on
        and (p["length_mixing"] > on["length_mixing"] or p["efficiency"] > on["efficiency"])
    ]
    where = (
        "on the Pareto front of efficiency vs length mixing"
        if on["pareto_mixing"]
        else f"behind the Pareto front (dominated by {', '.join(dominated_by[:3])})"
    )
    text = (
        f"On this data, K = {study} (the K of the study this project replays, not a choice for your data) sits "
        f"{where}: simulated efficiency {pct(e['simulated_efficiency'])}, length mixing "
        f"{e['length_mixing']:.3f}, predicted {pct(e['predicted_ratio_to_sorted'])} of sorted"
    )
    if on.get("pareto_padded") is not None:
        text += (
            ", and "
            + ("on" if on["pareto_padded"] else "behind")
            + " the front of the padded strategies (packing left out)"
        )
    steps = [f"K = {kk}: {pct(sweep[kk]['simulated_efficiency'])}" for kk in (study - 1, study + 1) if kk in sweep]
    return text + (f"; its neighbours give {', '.join(steps)}." if steps else ".")


def trainings_lines(result: CompareResult) -> list[str]:
    """The separate trainings: absolute throughput, its prediction and where the error comes from."""
    rows = result.rows
    lines = [
        "## The trainings, one after another",
        "",
        "Each strategy trained under `torchrun` in its own run (`train.useful_tokens`), one after another: "
        "they give the loss, the composition effects and absolute useful tokens/s. A machine whose speed moves "
        "between runs moves their ratios to `sorted` too, so the answer is decided on the ratios measured in "
        "turns (report.md), not on these.",
        "",
        "| strategy | steps | measured eff. | predicted tok/s | measured tok/s | error | ratio to sorted "
        "(trainings) | predicted ratio (trainings) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s, r in rows.items():
        lines.append(
            f"| {s} | {r.steps} | {pct(r.measured_efficiency)} | {r.predicted_tok_s:,.0f} | "
            f"{r.measured_tok_s:,.0f} | {signed(r.prediction_error)} | {pct(r.ratio_to_sorted_measured)} | "
            f"{pct(r.ratio_to_sorted_predicted)} |"
        )
    lines += [
        "",
        "Where the prediction error comes from: measured / predicted step seconds of each role "
        "(1.00 = the profile timed the run's steps right), and the measured step times replayed through "
        "the pipeline model against the measured throughput (0% = the pipeline model is right).",
        "",
        "| strategy | target step ratio | drafter step ratio | pipeline replay error | "
        "target CPU share | drafter CPU share | reference drift in the run (target, drafter) |",
        "|---|---|---|---|---|---|---|",
    ]
    for s, r in rows.items():
        lines.append(
            f"| {s} | {r.target_step_ratio:.2f} | {r.drafter_step_ratio:.2f} | "
            f"{signed(r.pipeline_error)} | {pct(r.target_cpu_share)} | {pct(r.drafter_cpu_share)} | "
            f"{signed(r.target_reference_drift)}, {signed(r.drafter_reference_drift)} |"
        )
    return lines + ["", machine_sentence(result) + " " + quiet_paragraph(result)]


def model_lines(result: CompareResult, *, params: Params) -> list[str]:
    lines = [
        "## Step-time model",
        "",
        f"Fitted by non-negative least squares on relative error over {result.grid_points} profile grid "
        f"points (never on the runs it predicts); each candidate feature set scored on "
        f"{pct(params.compare.holdout_fraction)} held-out points over {sm.HOLDOUT_SPLITS} random splits. A "
        f"larger set must lower the best held-out error by {_share_words(sm.MIN_GAIN_RELATIVE)} (and at least "
        f"{100 * sm.MIN_GAIN_ABSOLUTE:g} points) to be chosen.",
        "",
        "| role | features | held-out mean error | held-out worst | fit error | chosen |",
        "|---|---|---|---|---|---|",
    ]
    for role, f in result.fits.items():
        for c in f["candidates"]:
            lines.append(
                f"| {role} | {c.name} | {pct(c.holdout_error)} | {pct(c.holdout_max_error)} | "
                f"{pct(c.train_error)} | {'yes' if c is f['best'] else ''} |"
            )
    lines += [""]
    for role, f in result.fits.items():
        b = f["best"]
        terms = " + ".join(f"{c:.3g}·{n}" for n, c in zip(b.features, b.coef))
        lines.append(f"- {role}: t = {terms} seconds")
    return lines + transport_lines(result, nproc=params.train.nproc)


def transport_lines(result: CompareResult, *, nproc: int) -> list[str]:
    """The features' transport of the separate trainings (``nproc`` > 1; one process moves none): the profile's
    fits and, per strategy, the mean seconds per step predicted and measured."""
    tr = result.transport
    if nproc == 1:
        return []
    if not tr:
        return [
            "- transport: not measured by the profile (rerun it with profile.concurrent): the trainings are "
            "predicted without the features' move to the drafter rank"
        ]

    def ms(x: float) -> str:
        return "-" if x != x else f"{1e3 * x:.2f} ms"  # NaN: none

    rec, st = tr["receive"], tr["stage"]
    return [
        f"- transport ({tr['backend']}; on the drafter's critical path): receive = {rec['const_s'] * 1e3:.3g} ms + "
        f"{rec['per_byte_s'] * 1e9:.3g} s/GB (fit error {pct(rec['error'])}), staging on the target rank = "
        f"{st['const_s'] * 1e3:.3g} ms + {st['per_byte_s'] * 1e9:.3g} s/GB; per step, predicted / measured: "
        + ", ".join(f"{s} {ms(r.predicted_transport_s)} / {ms(r.measured_transport_s)}" for s, r in result.rows.items())
    ]


def sweep_lines(result: CompareResult, pts: list[dict]) -> list[str]:
    lines = [
        f"## bucketed for K = 1..{len(result.sweep)}",
        "",
        "Predicted over a whole epoch (the steady state; a run's first batches vary too much to rank K), "
        "relative to sorted predicted the same way. Every strategy the same way: "
        + ", ".join(f"{s} {pct(r.predicted_epoch_ratio_to_sorted)}" for s, r in result.rows.items())
        + ".",
        "",
        "| K | simulated eff. | predicted ratio to sorted | composition repeat | length mixing |",
        "|---|---|---|---|---|",
    ]
    for e in result.sweep:
        lines.append(
            f"| {e['num_buckets']} | {pct(e['simulated_efficiency'])} | "
            f"{pct(e['predicted_ratio_to_sorted'])} | {e['composition_repeat']:.3f} | "
            f"{e['length_mixing']:.3f} |"
        )
    lines += [
        "",
        "Length mixing: the pooled within-batch length variance over that of the `random` plan under the "
        "same batch spec, seed and epoch (0: every batch one length; 1: a random order; "
        "`lenbatch.length_mixing`).",
    ]
    study_k = study_k_paragraph(result, pts)
    return lines + (["", study_k] if study_k else [])


def details_text(result: CompareResult, *, params: Params, frontier: list[dict]) -> str:
    """The whole of ``details.md`` (``frontier``: :func:`lenbatch_study.analysis.report_plots.frontier_points`)."""
    lines = [
        "# Batching strategies: the details behind the answer",
        "",
        f"The answer and its table are in [{files.REPORT}]({files.REPORT}); this page holds the evidence.",
        "",
        *trainings_lines(result),
        "",
        "## Why the padding-only prediction misses",
        "",
        gap_paragraph(result),
        "",
        *ladder_lines(result),
        "",
        "(throughput relative to sorted as each term of the step-time model is added)",
        *il.section_lines(result.interleaved),
    ]
    if result.quality:
        lines += ["", qr.section(result.quality, tok_s=tok_s(result))]
    lines += [
        "",
        *model_lines(result, params=params),
        "",
        *sweep_lines(result, frontier),
        "",
        "## Plots",
        "",
        f"![length histogram]({files.HISTOGRAM_PLOT})",
        "",
        f"![predicted vs measured]({files.THROUGHPUT_PLOT})",
        "",
        f"![frontier]({files.FRONTIER_PLOT})",
        "",
    ]
    if result.study_replay is not None:
        # the study's setting, on a stand-in of its lengths: its own part, after everything about this data
        lines += [
            "---",
            "",
            f"# {REPLAY_PART}",
            "",
            "Everything above is about the data this run read. This part replays the study this project "
            "re-examines (902,087 chats on 8 GPUs) on a stand-in of its lengths, for comparison only; its "
            "numbers are not your data's.",
            "",
            study_replay.section(result.study_replay),
        ]
    return "\n".join(lines)


__all__ = ["REPLAY_PART", "STUDY_NUM_BUCKETS", "details_text", "gap_paragraph", "pct", "signed", "study_k_paragraph"]
