"""Ratios from an interleaved measurement (:mod:`lenbatch_study.runtime.interleave`): pure.

* :func:`lenbatch_study.core.intervals.ratio_intervals`: per strategy, the throughput ratio to sorted with
  its 95% interval, paired by round, so a drift common to a round cancels (the interleave stage's stop rule);
* :func:`predicted_ratios`: the same ratio from the step model's predicted seconds of the same steps;
* :func:`judge`: both side by side per strategy, with the prediction's error on the ratio and whether it
  meets the targets (:data:`INTERVAL_TARGET`, :data:`PREDICTION_TARGET`);
* :func:`role_factors`: per strategy and role, measured over predicted seconds, against sorted's in the same
  round: which role's prediction a missed ratio comes from;
* :func:`flat_metrics`: the flat keys compare writes (``<strategy>.interleaved.*``);
* :func:`section_lines`: the report's section (a table beside the other strategies' tables).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from lenbatch_study.analysis import provenance
from lenbatch_study.core.intervals import INTERVAL_TARGET, PREDICTION_TARGET, half_width, ratio_intervals

BASELINE = "sorted"
ROLES = ("target", "drafter")
# a profile pass this far off the median pass (either way) is named as drift when a prediction misses
PROFILE_DRIFT = 0.10
# a plan step's fitted feature this far above the grid's largest is named as extrapolated
GRID_MARGIN = 0.05
# The keys of compare's metrics.json (DVC's headline, at most 40 numbers) for every strategy but sorted: 16
# for five strategies, beside the trainings' 24. The interval is two numbers: DVC 3.67 leaves a list out of
# `metrics show`, `metrics diff` and `exp show`, so ``[low, high]`` as one list would be recorded but never seen.
USER_METRIC_KEYS = (
    "interleaved.ratio_to_sorted",
    "interleaved.ci95.low",
    "interleaved.ci95.high",
    "interleaved.predicted_ratio",
)
# Params the interleaved measurement must share with compare's (section -> keys; None: all): its plans,
# model and segments.
RUN_KEYS: dict[str, tuple[str, ...] | None] = {
    "batching": None,
    "model": None,
    "drafter": None,
    "interleave": None,
    "train": (
        "strategies",
        "nproc",
        "nodes",
        "useful_tokens",
        "warmup_steps",
        "threads",
        "kernels",
        "reuse_host_memory",
    ),
}


def predicted_ratios(
    predicted_seconds: Mapping[str, Sequence[float]],
    useful_tokens: Mapping[str, Sequence[float]],
    *,
    baseline: str = BASELINE,
) -> dict[str, float]:
    """Predicted throughput ratio to ``baseline`` over the same timed steps: (sum u / sum predicted t) of
    the strategy over that of the baseline (per-step predicted seconds, as the step model gives them)."""

    def thr(s: str) -> float:
        return float(np.sum(useful_tokens[s])) / float(np.sum(predicted_seconds[s]))

    b = thr(baseline)
    return {s: thr(s) / b for s in predicted_seconds}


def judge(
    seconds: Mapping[str, Sequence[float]],
    useful_tokens: Mapping[str, Sequence[float]],
    predicted_seconds: Mapping[str, Sequence[float]],
    step_useful_tokens: Mapping[str, Sequence[float]],
    *,
    baseline: str = BASELINE,
    run_ratios: Mapping[str, float] | None = None,
) -> dict[str, dict[str, object]]:
    """Per strategy: the measured ratio to ``baseline`` and its 95% interval (:func:`ratio_intervals`, from
    the per-round ``seconds`` and ``useful_tokens``), the predicted ratio of the same steps
    (:func:`predicted_ratios`, from each timed step's ``predicted_seconds`` and ``step_useful_tokens``),
    ``half_width`` = max(hi / ratio - 1, 1 - lo / ratio), ``prediction_error`` = predicted / measured - 1,
    and ``interval_ok`` / ``prediction_ok`` against :data:`INTERVAL_TARGET` / :data:`PREDICTION_TARGET`.
    ``run_ratios``: the step model's ratio over each strategy's whole run (its post-warm-up steps, the roles
    one after the other, as for the timed steps); with them, ``run_predicted_ratio`` and ``steps_gap`` =
    predicted ratio of the timed steps / that of the run - 1: how far the timed steps stand for the run, by
    the model the measurement just tested (:func:`lenbatch_study.analysis.verdict.decide` vetoes an answer
    whose strategies' steps miss by more than :data:`PREDICTION_TARGET`).
    Pure, O(S x (rounds + steps))."""
    meas = ratio_intervals(seconds, useful_tokens, baseline=baseline)
    pred = predicted_ratios(predicted_seconds, step_useful_tokens, baseline=baseline)
    out: dict[str, dict[str, object]] = {}
    for s, m in meas.items():
        r = float(m["ratio_to_sorted"])  # type: ignore[arg-type]
        lo, hi = m["ci95"]  # type: ignore[misc]
        half = half_width(r, (lo, hi))
        err = pred[s] / r - 1.0
        out[s] = {
            "ratio_to_sorted": r,
            "ci95": [float(lo), float(hi)],
            "predicted_ratio": float(pred[s]),
            "rounds": m["rounds"],
            "half_width": half,
            "prediction_error": err,
            "interval_ok": half <= INTERVAL_TARGET,
            "prediction_ok": abs(err) <= PREDICTION_TARGET,
        }
        if run_ratios is not None:
            out[s]["run_predicted_ratio"] = float(run_ratios[s])
            out[s]["steps_gap"] = float(pred[s] / run_ratios[s] - 1.0)
    return out


def role_factors(
    role_seconds: Mapping[str, Mapping[str, Sequence[float]]],
    predicted: Mapping[str, Mapping[str, Sequence[float]]],
    *,
    baseline: str = BASELINE,
) -> dict[str, dict[str, dict[str, float]]]:
    """Per strategy and role (:data:`ROLES`): ``measured_over_predicted`` (m), the role's measured seconds of
    the segment, mean over rounds, over its predicted seconds (the machine at the measurement against the
    profile's); ``vs_sorted``, m over the baseline's m (the same rounds: a drift common to them cancels; 1
    wherever the step model's dependence on shape held); ``share`` (w), the role's part of the strategy's
    predicted seconds. Then predicted / measured ratio = sum_r w_r m_r / (the baseline's sum_r w_r m_r), up
    to the measured ratio being a geometric mean over rounds (0.1 points on the CPU default): a ratio misses
    where a role's dependence on shape failed, or where the roles' speeds moved apart since the profile and
    the strategy's shares differ from the baseline's. ``role_seconds[s][role]``: per round;
    ``predicted[s][role]``: per timed step. Pure, O(S x rounds)."""
    pred = {s: {r: float(np.sum(predicted[s][r])) for r in ROLES} for s in role_seconds}
    assert all(p > 0 for per in pred.values() for p in per.values()), "a role without predicted seconds"
    assert len({len(role_seconds[s][r]) for s in role_seconds for r in ROLES}) == 1, "one segment per round"
    m = {s: {r: float(np.mean(role_seconds[s][r])) / pred[s][r] for r in ROLES} for s in role_seconds}
    return {
        s: {
            r: {
                "measured_over_predicted": m[s][r],
                "vs_sorted": m[s][r] / m[baseline][r],
                "share": pred[s][r] / sum(pred[s].values()),
            }
            for r in ROLES
        }
        for s in role_seconds
    }


def flat_metrics(table: Mapping[str, Mapping[str, object]] | None, *, baseline: str = BASELINE) -> dict[str, object]:
    """Flat ``<strategy>.interleaved.<key>`` entries of :func:`judge`'s table (none without one) for every
    strategy but the baseline (1, [1, 1] and 1 by definition): ``ratio_to_sorted``, ``ci95.low`` and
    ``ci95.high`` (the 95% interval), ``predicted_ratio`` and ``prediction_error`` (6 decimals), and per role of
    :func:`role_factors` ``<role>_measured_over_predicted`` (the baseline's too) and ``<role>_vs_sorted`` where
    rows have them. compare's ``metrics.json`` keeps ``USER_METRIC_KEYS``; ``diagnostics.json`` all of them."""
    out: dict[str, object] = {}
    for s, r in (table or {}).items():
        p = f"{s}.interleaved."
        for role, f in (r.get("role_factors") or {}).items():  # type: ignore[union-attr]
            out[f"{p}{role}_measured_over_predicted"] = round(float(f["measured_over_predicted"]), 6)
        if s == baseline:  # the rest is 1 (or [1, 1]) by definition
            continue
        for role, f in (r.get("role_factors") or {}).items():  # type: ignore[union-attr]
            out[f"{p}{role}_vs_sorted"] = round(float(f["vs_sorted"]), 6)
        out[p + "ratio_to_sorted"] = round(float(r["ratio_to_sorted"]), 6)  # type: ignore[arg-type]
        lo, hi = r["ci95"]  # type: ignore[misc]
        out[p + "ci95.low"], out[p + "ci95.high"] = round(float(lo), 6), round(float(hi), 6)
        out[p + "predicted_ratio"] = round(float(r["predicted_ratio"]), 6)  # type: ignore[arg-type]
        out[p + "prediction_error"] = round(float(r["prediction_error"]), 6)  # type: ignore[arg-type]
    return out


def beyond_grid(
    grid: Mapping[str, np.ndarray], steps: Mapping[str, np.ndarray], features: Sequence[str]
) -> dict[str, float]:
    """The fitted ``features`` on which ``steps`` (their shape columns) reach past the profile ``grid``'s largest
    value by more than ``GRID_MARGIN``: ``{feature: max over steps / max over the grid}``. A model is linear in
    its features, so beyond the grid it extrapolates a cost it never timed (the drafter's context tensor,
    sequences x the largest anchor, of a packed row with one long part is such a case). Pure, O(steps)."""
    out = {}
    for f in features:
        if f == "const" or not len(steps[f]):
            continue
        top, hi = float(np.max(grid[f])), float(np.max(steps[f]))
        if top > 0 and hi > top * (1 + GRID_MARGIN):
            out[f] = hi / top
    return out


def _beyond_grid_sentence(rows: Sequence[tuple[str, Mapping[str, object]]]) -> str:
    """The report's note on strategies whose steps the fitted models reach only by extrapolating."""
    far = [(s, r["beyond_grid"]) for s, r in rows if r.get("beyond_grid")]
    if not far:
        return ""
    said = "; ".join(
        f"`{s}`: " + ", ".join(f"{k} {x:.2f}x" for k, x in b.items())  # type: ignore[union-attr]
        for s, b in far
    )
    return (
        f" Beyond the profile grid ({said} the grid's largest value): those predictions extrapolate the step "
        "model past every shape the profile timed."
    )


def _profile_drift_sentence(factors: Mapping[str, Sequence[float]] | None) -> str:
    """What the report adds to a missed prediction: how far the profile's timed passes moved (per role, the
    range of each pass's seconds against the median pass, :func:`lenbatch_study.analysis.stepmodel.
    pass_corrected_seconds`), and the rerun that tells the profile's drift from the step model's error."""
    if not factors:
        return ""
    spans = {role: (min(f), max(f)) for role, f in factors.items() if f}
    said = " and ".join(f"{lo:.2f}-{hi:.2f}x ({role})" for role, (lo, hi) in spans.items())
    moved = [role for role, (lo, hi) in spans.items() if max(hi, 1 / lo) - 1 > PROFILE_DRIFT]
    why = (
        f"; a pass more than {100 * PROFILE_DRIFT:g}% off the median ({', '.join(moved)}) means the machine's "
        "speed moved while the grid was timed, which alone can move a predicted ratio by several percent "
        "(docs/prediction.md)"
        if moved
        else ""
    )
    return (
        f" The profile's timed passes took {said} the seconds of its median pass{why}. To tell the profile's "
        f"drift from the step model's error, time the grid again on a quiet machine and compare: "
        f"{provenance.profile_rerun()}."
    )


def _missed_role_sentence(missed: Sequence[tuple[str, Mapping[str, object]]]) -> str:
    """Per missed strategy, the role whose seconds moved most against ``sorted``'s (share-weighted)."""
    said = []
    for s, r in missed:
        f = r.get("role_factors")
        if f:
            role = max(ROLES, key=lambda x: abs(f[x]["vs_sorted"] - 1) * f[x]["share"])  # type: ignore[index]
            said.append(
                f"`{s}`'s {role} step took {f[role]['vs_sorted']:.2f}x"  # type: ignore[index]
                f" of its predicted seconds against `sorted`'s"
            )
    return " Where the misses come from: " + "; ".join(said) + " (per role, the table after this one)." if said else ""


def _role_lines(table: Mapping[str, Mapping[str, object]], *, baseline: str) -> list[str]:
    """The per-role table (:func:`role_factors`): none for a measurement without per-role seconds."""
    if not table[baseline].get("role_factors"):
        return []
    lines = [
        "",
        "Per role, each strategy's measured seconds over its predicted seconds (mean over rounds), and the "
        f"same against `{baseline}`'s (1.000 where the step model's dependence on shape held). A strategy's two "
        "measured / predicted, weighted by each role's share of its predicted step, over the same for "
        f"`{baseline}`, give its predicted / measured ratio (up to the measured ratio being a geometric mean "
        "over rounds): a ratio misses where a role's dependence on shape failed, or where the two roles' speeds "
        f"moved apart since the profile and the strategy's drafter share differs from `{baseline}`'s.",
        "",
        f"| strategy | target: measured / predicted | against {baseline} | drafter: measured / predicted | "
        f"against {baseline} | drafter's share of the predicted step |",
        "|---|---|---|---|---|---|",
    ]
    for s, r in table.items():
        f: Mapping[str, Mapping[str, float]] = r.get("role_factors") or {}  # type: ignore[assignment]
        if f:
            lines.append(
                f"| {s} | "
                + " | ".join(f"{f[x]['measured_over_predicted']:.3f} | {f[x]['vs_sorted']:.3f}" for x in ROLES)
                + f" | {f['drafter']['share']:.0%} |"
            )
    return lines


def section_lines(table: Mapping[str, Mapping[str, object]] | None, *, baseline: str = BASELINE) -> list[str]:
    """The report's lines for :func:`judge`'s ``table`` (none without one): a blank line, the heading, what
    was measured and the verdict on the targets, and one table row per strategy but the baseline."""
    if not table:
        return []
    rows = [(s, r) for s, r in table.items() if s != baseline]
    wide = [f"`{s}`" for s, r in rows if not r["interval_ok"]]
    off = [f"`{s}`" for s, r in rows if not r["prediction_ok"]]
    pct = f"{100 * INTERVAL_TARGET:g}%", f"{100 * PREDICTION_TARGET:g}%"
    first = next(iter(table.values()))
    resolved = str(first.get("stopped", "")).startswith("the ranking resolved")
    verdict = (
        f"The rounds stopped after {first['rounds']} once the ranking was resolved: no two intervals "
        f"overlap and every one is within ±{pct[1]}, where a predicted ratio more than {pct[1]} off lies "
        f"outside its interval as it would at ±{pct[0]} ({', '.join(wide)} wider than ±{pct[0]})."
        if wide and resolved
        else f"The intervals of {', '.join(wide)} are wider than ±{pct[0]} after {first['rounds']} rounds "
        f"(`interleave.max_rounds`: {first.get('max_rounds', first['rounds'])}): the machine's speed moved "
        f"within rounds too much to judge a {pct[1]} prediction there (a quieter machine, or more rounds, "
        "narrows them)."
        if wide
        else f"Every interval is within ±{pct[0]}."
    )
    verdict += f" The predicted ratio is within {pct[1]} of the measured one for " + (
        "every strategy." if not off else f"{len(rows) - len(off)} of {len(rows)} strategies (not {', '.join(off)})."
    )
    inside = [
        f"`{s}`" for s, r in rows if not r["prediction_ok"] and r["ci95"][0] <= r["predicted_ratio"] <= r["ci95"][1]
    ]  # type: ignore[index, operator]
    if inside:
        verdict += (
            f" Within the measured interval nonetheless: {', '.join(inside)} (a miss this measurement cannot show)."
        )
    if off:
        verdict += _missed_role_sentence([(s, r) for s, r in rows if not r["prediction_ok"]])
        verdict += _profile_drift_sentence(first.get("profile_pass_factors"))
    verdict += _beyond_grid_sentence(rows)
    if any("steps_gap" in r for _, r in rows):
        apart = [f"`{s}`" for s, r in rows if abs(float(r.get("steps_gap", 0.0))) > PREDICTION_TARGET]  # type: ignore[arg-type]
        verdict += (
            " The timed steps stand for each run: the step model's ratio over them is within "
            f"{pct[1]} of its ratio over the whole run (last column)."
            if not apart
            else f" The timed steps of {', '.join(apart)} do not stand for the run: the step model's ratio over "
            f"them is more than {pct[1]} from its ratio over the whole run (last column)."
        )
    clock = (
        "the process's CPU seconds (other processes' time slices left out), predicted from the grid's CPU seconds"
        if first.get("clock") == "cpu"
        else "wall seconds"
    )
    lines = [
        "",
        "## Ratios measured in turns",
        "",
        f"One process timed every strategy's steps in turns ({first['rounds']} rounds, each strategy after its "
        "own warm-up; `lenbatch interleave`), so the machine's drift fell on all alike, where the trainings "
        f"above ran one after another. A ratio is the strategy's useful tokens/s over `{baseline}`'s, paired "
        f"by round (95% interval over rounds), on {clock}; the prediction is the step model's for the same "
        "steps, target and drafter one after the other as the profile grid timed them alone. " + verdict,
        "",
        f"| strategy | measured ratio to {baseline} | 95% interval | predicted ratio | predicted / measured | "
        "predicted over its whole run | timed steps / whole run |",
        "|---|---|---|---|---|---|---|",
    ]
    for s, r in rows:
        lo, hi = r["ci95"]  # type: ignore[misc]
        run = (
            f"{r['run_predicted_ratio']:.3f} | {100 * float(r['steps_gap']):+.1f}%"  # type: ignore[arg-type]
            if "run_predicted_ratio" in r
            else "n/a | n/a"
        )
        lines.append(
            f"| {s} | {r['ratio_to_sorted']:.3f} | [{lo:.3f}, {hi:.3f}] | {r['predicted_ratio']:.3f} | "
            f"{100 * float(r['prediction_error']):+.1f}% | {run} |"
        )  # type: ignore[arg-type]
    return lines + _role_lines(table, baseline=baseline)


__all__ = [
    "BASELINE",
    "PREDICTION_TARGET",
    "ROLES",
    "RUN_KEYS",
    "USER_METRIC_KEYS",
    "beyond_grid",
    "flat_metrics",
    "judge",
    "predicted_ratios",
    "role_factors",
    "section_lines",
]
