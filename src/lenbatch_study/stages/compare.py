"""Compare stage: predicted vs measured throughput, the gap explained, the efficiency-diversity frontier.

For every strategy the stage reports the padding model's efficiency, the simulated plan's efficiency, the
throughput predicted by the step-time model (fitted on the profile grid, never on the run it predicts) and the
measured one, the prediction error, the calibrated prediction and its error (the profile rescaled by the run's
own reference-step ratio, :mod:`lenbatch_study.analysis.calibration`), the ratio to ``sorted``, both diversity
measures and, from the quality stage, the drafter's held-out loss at equal useful tokens and per second (95%
intervals over seeds; rendered by :mod:`lenbatch_study.analysis.quality_report`). It also predicts ``bucketed``
for every K of the boundary sweep, recommends a strategy and K, and replays the study's own setting
(:mod:`lenbatch_study.analysis.study_replay`). The profile and every run must come from one machine
(:func:`lenbatch_study.analysis.provenance.check_one_machine`): results without a machine fingerprint, or from
two machines, are refused with the rerun that fixes them.

Outputs (``--out``): ``metrics.json`` (what users compare, flat keys for ``dvc metrics diff``), ``diagnostics.json``
(every flat key: fit errors, CPU shares, transport seconds predicted and measured per strategy), ``report.md``,
``frontier.png``, ``throughput.png``, ``histogram.png``, ``quality.png`` (the quality stage's plot, drawn here
beside its report section), and DVC plot data ``frontier.json``, ``throughput.json``. This module predicts and
builds a typed :class:`lenbatch_study.analysis.report.CompareResult`; :mod:`lenbatch_study.analysis.report`
renders every output from it. Its parts: the inputs read and checked
(:mod:`lenbatch_study.analysis.compare_inputs`), the runs' planned steps (:mod:`lenbatch_study.runtime.planned`),
a plan's steps predicted (:mod:`lenbatch_study.analysis.step_prediction`), the diagnosis and the answer
(:mod:`lenbatch_study.analysis.compare_judge`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from lenbatch_study.analysis import calibration, provenance, shapes
from lenbatch_study.analysis import interleaved as il, stepmodel as sm, study_replay as sr, transport_model as tm
from lenbatch_study.core import cpu
from lenbatch_study.core.config import Params
from lenbatch_study.core.log import get_logger
from lenbatch_study.analysis.report import (
    QUIET_RERUN,
    CompareResult,
    StrategyRow,
    busy_machine,
    unsteady_machine,
    write_outputs,
)
from lenbatch_study.analysis.compare_inputs import fit_profile, grid_columns, load_run, params_mismatch
from lenbatch_study.analysis.compare_judge import diagnose, recommend
from lenbatch_study.analysis.step_prediction import LossMasks, loss_curve, predict_steps, step_columns
from lenbatch_study.runtime.planned import _epoch_plan, planned_batches
from lenbatch.batching.strategy import layout_of
from lenbatch_study.pipeline.artifacts import (
    bucket_edges,
    interleave_timings,
    length_stats,
    plan_metrics,
    quality_result,
    tokenized,
    train_runs,
)

log = get_logger("compare")


# --------------------------------------------------------------------------- inputs


def _check_efficiency(where: str, value: object) -> None:
    """A padding efficiency is useful / computed tokens: in (0, 1]; anything else is a corrupt input."""
    v = float(value)  # type: ignore[arg-type]
    if not 0 < v <= 1:
        raise ValueError(f"{where} is {v}, but a padding efficiency lies in (0, 1]; rerun the stage that wrote it")


# --------------------------------------------------------------------------- prediction


def interleaved_table(
    interleave_dir: Path,
    *,
    params: Params,
    lengths: np.ndarray,
    masks: LossMasks,
    profile: dict,
    edges: Any,
    target_ranks: int,
) -> dict[str, dict[str, Any]]:
    """The interleaved measurement judged (:func:`lenbatch_study.analysis.interleaved.judge`): per strategy
    the measured ratio to sorted with its 95% interval, and the ratio predicted for the same steps, one
    process (target then drafter, each as timed alone on the profile grid, :func:`fit_profile`'s result
    ``profile``; fitted on its CPU seconds, :func:`lenbatch_study.analysis.stepmodel.cpu_fits`, for a
    measurement on the CPU clock).

    The timed steps are rebuilt from the training plan (:func:`planned_batches`) and must give the useful
    tokens recorded; the measurement must come from the current params and the profile's machine.
    ``ValueError`` naming the rerun otherwise. Rows carry ``profile_pass_factors`` (per role, each profile pass's
    seconds / the median pass's), ``beyond_grid`` (:func:`il.beyond_grid`) and ``role_factors``
    (:func:`il.role_factors`). Cost: a plan per strategy, O(steps)."""
    doc = interleave_timings.read_timings(interleave_dir)
    fix = interleave_timings.rerun(Path(interleave_dir))
    resolved = interleave_timings.read_params(interleave_dir)
    diff = params_mismatch(resolved or {}, params.to_dict(), il.RUN_KEYS)
    if diff:
        raise ValueError(f"the interleaved measurement was taken with other params ({'; '.join(diff)}); rerun: {fix}")
    here, there = (doc.get("machine") or {}).get("id"), (profile["machine"] or {}).get("id")
    if here != there:
        raise ValueError(
            f"the interleaved measurement ran on machine {here} but the profile on {there}: the step "
            f"times of one do not predict the other's; rerun both on one machine: {fix}; and "
            f"{provenance.profile_rerun()}"
        )
    grid = grid_columns(profile["rows"])
    fits = (
        profile["fits"]
        if doc.get("clock") != "cpu"
        else sm.cpu_fits(
            profile["rows"],
            grid,
            holdout_fraction=params.compare.holdout_fraction,
            seed=params.batching.seed,
            rerun=provenance.profile_rerun(),
        )
    )
    predicted, by_role, reach, st = {}, {}, {}, doc["strategies"]
    run_tok_s: dict[str, float] = {}  # the step model's useful tokens/s over each run's post-warm-up steps
    for s, rec in st.items():
        plan = planned_batches(
            lengths, params, s, edges, useful_tokens=params.train.useful_tokens, target_ranks=target_ranks
        )
        picked = [(int(e), int(i)) for e, i in zip(rec["epochs"], rec["steps"])]
        if any(
            i >= len(plan) or plan[i][0] != e or int(lengths[plan[i][1]].sum()) != u
            for (e, i), u in zip(picked, rec["step_useful_tokens"])
        ):
            raise ValueError(
                f"strategy {s}: the interleaved measurement's steps {rec['steps']} are not those of "
                f"the current plan (other data or params); rerun: {fix}"
            )
        cols = step_columns(
            lengths,
            [(e, plan[i][1]) for e, i in picked],
            layout=layout_of(s),
            params=params,
            masks=masks,
            numbers=[i for _, i in picked],
        )
        by_role[s] = {role: fits[role]["best"].predict(cols) for role in il.ROLES}
        predicted[s] = by_role[s]["target"] + by_role[s]["drafter"]
        after = range(params.train.warmup_steps if len(plan) > params.train.warmup_steps else 0, len(plan))
        run = step_columns(
            lengths, [plan[i] for i in after], layout=layout_of(s), params=params, masks=masks, numbers=list(after)
        )
        run_tok_s[s] = float(run["useful_tokens"].sum()) / float(
            sum(fits[role]["best"].predict(run).sum() for role in il.ROLES)
        )
        reach[s] = {
            f"{role} {f}": x
            for role in il.ROLES  # features the fits extrapolate
            for f, x in il.beyond_grid(grid, cols, fits[role]["best"].features).items()
        }
    table = il.judge(
        {s: st[s]["seconds"] for s in st},
        {s: st[s]["useful_tokens"] for s in st},
        predicted,
        {s: st[s]["step_useful_tokens"] for s in st},
        run_ratios={s: v / run_tok_s[il.BASELINE] for s, v in run_tok_s.items()},
    )
    passes = {role: fits[role]["pass_factors"] for role in il.ROLES}  # the report names them
    roles = il.role_factors({s: {role: st[s][f"{role}_seconds"] for role in il.ROLES} for s in st}, by_role)
    return {
        s: {
            **r,
            "clock": doc.get("clock", "wall"),
            "max_rounds": doc.get("max_rounds", doc["rounds"]),
            "stopped": doc.get("stopped", ""),
            "profile_pass_factors": passes,
            "beyond_grid": reach[s],
            "role_factors": roles[s],
        }
        for s, r in table.items()
    }


# --------------------------------------------------------------------------- the stage


def compare(
    *,
    params: Params,
    stats_dir: Path,
    boundaries_dir: Path,
    plans_dir: Path,
    profile_dir: Path,
    train_dir: Path,
    data_dir: Path,
    quality_dir: Path | None = None,
    interleave_dir: Path | None = None,
    study_replay: bool = False,
) -> CompareResult:
    """Everything the report, metrics and plots show (pure function of the stage inputs).

    ``quality_dir``: the quality stage's output (held-out loss intervals); None leaves it out.
    ``interleave_dir``: the interleave stage's output (ratios measured in turns, :func:`interleaved_table`);
    None leaves it out.
    ``study_replay``: also replay the study's setting (:mod:`lenbatch_study.analysis.study_replay`, ~8 s; the
    stage always does)."""
    strategies = list(params.train.strategies)
    if "sorted" not in strategies:
        raise ValueError(
            "train.strategies lacks 'sorted', the baseline every ratio is taken to; add it and rerun: "
            f"snakemake {train_runs.summary_path('sorted')}"
        )
    histogram = length_stats.read_histogram(stats_dir)
    stats = length_stats.read_stats(stats_dir)
    tokenize_stats = tokenized.read_stats(data_dir)
    bounds = bucket_edges.read_boundaries(Path(boundaries_dir) / bucket_edges.BOUNDARIES)
    sweep = bucket_edges.read_sweep(Path(boundaries_dir) / bucket_edges.SWEEP)
    plans = plan_metrics.read_plans(plans_dir, strategies)
    lengths = tokenized.read_lengths(data_dir)
    masks = LossMasks(data_dir, lengths)
    if not masks.available:
        log.info(
            "no dataset under %s: the drafter's positions are estimated (anchors x (block - 1) per sequence)", data_dir
        )
    profile = fit_profile(profile_dir, params)
    fits, transport = (
        profile["fits"],
        profile["transport"],
    )  # transport None: a grid without it (then predicted without)
    target_ranks = max(params.train.nproc - 1, 1) * params.train.nodes
    at = {"fits": fits, "params": params, "target_ranks": target_ranks, "transport": transport}
    edges = tuple(int(e) for e in bounds["edges"])
    runs = {s: load_run(train_dir, s, params) for s in strategies}
    # the drafters' all-reduce (train.nodes > 1): its cost is the drafter's size, the same for every plan
    allreduce = {s: float(r["summary"].get("allreduce_s_mean") or 0.0) for s, r in runs.items()}
    allreduce_s = float(np.mean(list(allreduce.values())))
    where = provenance.check_one_machine(profile["machine"], {s: r["summary"].get("machine") for s, r in runs.items()})

    rows: dict[str, StrategyRow] = {}
    comp: dict[str, dict[str, float]] = {}
    # the fits whose terms the gap ladder adds up: busy ones when the prediction uses busy times
    busy_terms = params.train.nproc > 1 and params.compare.contention == "busy" and "target_busy" in fits
    term_fits = {r: fits[f"{r}_busy" if busy_terms else r] for r in ("target", "drafter")}
    for s in strategies:
        run = runs[s]
        summary, steps = run["summary"], run["steps"]
        trained = _trained_useful_per_step(steps)
        steps_plan = planned_batches(lengths, params, s, edges, steps=len(trained), target_ranks=target_ranks)
        batches = [b for _, b in steps_plan]
        planned = np.array([int(lengths[b].sum()) for b in batches])
        if not np.array_equal(planned, trained):
            bad = int(np.argmax(planned != trained))
            raise ValueError(
                f"strategy {s}: step {bad} trained {trained[bad]} useful tokens but the current plan "
                f"gives {planned[bad]} (the run was planned with other data or params); rerun: "
                f"snakemake {train_runs.summary_path(s)}"
            )
        cols = step_columns(lengths, steps_plan, layout=layout_of(s), params=params, masks=masks)
        pred = predict_steps(cols, allreduce_s=allreduce[s], **at)
        ratio = provenance.reference_ratios(summary.get("reference"), profile["reference"], strategy=s)
        calibrated = predict_steps(cols, scale=ratio, allreduce_s=allreduce[s], **at)
        comp[s] = sm.components(pred, term_fits, warmup_steps=params.train.warmup_steps)
        measured = float(summary["useful_tokens_per_s"])
        pm = plans[s]
        for what, eff in (
            (f"plans {plan_metrics.METRICS} ({s}) padding_efficiency", pm["padding_efficiency"]),
            (f"{train_runs.summary_path(s)} padding_efficiency", summary.get("padding_efficiency", 1.0)),
            (
                f"{bucket_edges.BOUNDARIES} predicted_efficiency",
                bounds["predicted_efficiency"] if s == "bucketed" else 1.0,
            ),
        ):
            _check_efficiency(what, eff)
        rows[s] = StrategyRow(
            padding_model_efficiency=float(bounds["predicted_efficiency"])
            if s == "bucketed"
            else float(pm["padding_efficiency"]),
            simulated_efficiency=float(pm["padding_efficiency"]),
            measured_efficiency=float(summary.get("padding_efficiency", float("nan"))),
            budget_fill=float(pm.get("budget_fill", float("nan"))),
            predicted_tok_s=pred["tok_s"],
            measured_tok_s=measured,
            prediction_error=pred["tok_s"] / measured - 1.0,
            composition_repeat=float(pm["composition_repeat"]),
            length_mixing=float(pm["length_mixing"]),
            steps=len(batches),
            useful_tokens=float(planned[params.train.warmup_steps :].sum()),
            predicted_seconds=pred["seconds"],
            mean_target_s=float(pred["target_s"].mean()),
            mean_drafter_s=float(pred["drafter_s"].mean()),
            loss_curve=loss_curve(steps),
            **diagnose(steps, pred, params=params, target_ranks=target_ranks, measured=measured),
            calibrated_tok_s=calibrated["tok_s"],
            calibrated_prediction_error=calibrated["tok_s"] / measured - 1.0,
            target_reference_ratio=ratio["target"],
            drafter_reference_ratio=ratio["drafter"],
            target_reference_drift=calibration.drift(summary["reference"], "target"),
            drafter_reference_drift=calibration.drift(summary["reference"], "drafter"),
            reference_seconds=float(summary["reference"].get("seconds", float("nan"))),
        )
    ref = rows["sorted"]
    for s, r in rows.items():
        r.ratio_to_sorted_measured = r.measured_tok_s / ref.measured_tok_s
        r.ratio_to_sorted_predicted = r.predicted_tok_s / ref.predicted_tok_s
        r.ratio_to_sorted_padding = r.padding_model_efficiency / ref.padding_model_efficiency
    quality = quality_result.read_quality(quality_dir, strategies) if quality_dir is not None else None
    ladder = sm.ratio_ladder(
        comp,
        {s: r.useful_tokens for s, r in rows.items()},
        {s: r.predicted_tok_s for s, r in rows.items()},
        {s: r.measured_tok_s for s, r in rows.items()},
    )
    ksweep = predict_sweep(lengths, sweep, allreduce_s=allreduce_s, **at)
    for s, r in rows.items():  # steady state: a whole epoch, ratio to sorted's whole epoch
        r.predicted_epoch_ratio_to_sorted = epoch_tok_s(
            lengths, strategy=s, edges=edges, allreduce_s=allreduce_s, **at
        ) / epoch_tok_s(lengths, strategy="sorted", edges=None, allreduce_s=allreduce_s, **at)
    pref = profile["reference"]
    inter = (
        None
        if interleave_dir is None
        else interleaved_table(
            interleave_dir,
            params=params,
            lengths=lengths,
            masks=masks,
            profile=profile,
            edges=edges,
            target_ranks=target_ranks,
        )
    )
    return CompareResult(
        rows=rows,
        components=comp,
        ladder=ladder,
        sweep=ksweep,
        fits=fits,
        exact_drafter_work=masks.available,
        grid_points=len(profile["rows"]),
        edges=edges,
        profile_cpu_share=cpu.grid_cpu_share(profile["rows"], threads=params.train.threads),
        threads=params.train.threads,
        num_buckets=int(bounds["num_buckets"]),
        histogram=histogram,
        stats=stats,
        quality=quality,
        recommendation=recommend(rows, ksweep, inter, params=params),
        machine=where,
        reference_shape=pref["shape"],
        profile_reference_drift={r: calibration.drift(pref, r) for r in ("target", "drafter")},
        profile_reference_seconds=float(pref.get("seconds", float("nan"))),
        study_replay=sr.replay(log=log) if study_replay else None,
        interleaved=inter,
        transport=tm.describe(transport),
        tokenize_stats=tokenize_stats,
        data_dir=Path(data_dir).as_posix(),
    )


def _trained_useful_per_step(steps: list[dict]) -> np.ndarray:
    """Useful tokens of each trained step in step order (one row per step: the drafter rank's)."""
    by_step: dict[int, int] = {}
    for row in steps:
        by_step.setdefault(int(row["step"]), int(row["useful_tokens"]))
    order = sorted(by_step)
    return np.array([by_step[i] for i in order], dtype=np.int64)


def epoch_tok_s(
    lengths: np.ndarray, params: Params, strategy: str, edges: Any, *, fits: dict, target_ranks: int, **links: Any
) -> float:
    """Predicted useful tokens/s over a whole epoch (epoch 0), the steady state of a long run.

    A run of train.useful_tokens covers only its first batches, which vary a lot from one
    plan to the next; comparing K over a whole epoch does not. The drafter's work is
    estimated from lengths here (anchors x (block - 1) positions per sequence, context =
    sequences x longest), the same way for every plan, so ratios stay comparable.
    ``links``: :func:`predict_steps`' allreduce_s and transport. Cost: one plan and O(steps) prediction.
    """
    d = params.drafter
    steps = [(0, b) for b in _epoch_plan(lengths, params, strategy, edges, epoch=0, target_ranks=target_ranks)]
    cols = shapes.batch_columns(
        lengths,
        [b for _, b in steps],
        layout=layout_of(strategy),
        positions_per_seq=d.anchors_per_seq * (d.block_size - 1),
    )
    return predict_steps(cols, fits=fits, params=params, target_ranks=target_ranks, **links)["tok_s"]


def predict_sweep(
    lengths: np.ndarray, sweep: list[dict], *, params: Params, fits: dict, target_ranks: int, **links: Any
) -> list[dict]:
    """Predicted steady-state (whole-epoch) useful tokens/s of ``bucketed`` for every K of the sweep,
    and its ratio to sorted's, predicted the same way (``links``: :func:`epoch_tok_s`')."""
    ref = epoch_tok_s(lengths, params, "sorted", None, fits=fits, target_ranks=target_ranks, **links)
    out = []
    for entry in sweep:
        tok_s = epoch_tok_s(
            lengths,
            params,
            "bucketed",
            tuple(int(e) for e in entry["edges"]),
            fits=fits,
            target_ranks=target_ranks,
            **links,
        )
        out.append(
            {
                "num_buckets": int(entry["num_buckets"]),
                "simulated_efficiency": float(entry["simulated_efficiency"]),
                "predicted_efficiency": float(entry["predicted_efficiency"]),
                "composition_repeat": float(entry["composition_repeat"]),
                "length_mixing": float(entry["length_mixing"]),
                "predicted_tok_s": tok_s,
                "predicted_ratio_to_sorted": tok_s / ref,
            }
        )
    return out


# --------------------------------------------------------------------------- CLI


def run(
    *,
    params: Params,
    stats: Path,
    boundaries: Path,
    plans: Path,
    profile: Path,
    train: Path,
    data: Path,
    quality: Path | None,
    out: Path,
    interleave: Path | None = None,
) -> int:
    """``lenbatch compare``: predict from the stage outputs in the given folders and write every output
    into ``out`` (:func:`lenbatch_study.analysis.report.write_outputs`); ``quality`` None leaves the held-out
    loss out, ``interleave`` None the interleaved ratios. Returns the exit code."""
    result = compare(
        params=params,
        stats_dir=Path(stats),
        boundaries_dir=Path(boundaries),
        plans_dir=Path(plans),
        profile_dir=Path(profile),
        train_dir=Path(train),
        data_dir=Path(data),
        quality_dir=Path(quality) if quality is not None else None,
        interleave_dir=Path(interleave) if interleave is not None else None,
        study_replay=True,
    )
    metrics = write_outputs(result, Path(out), params=params)
    for flag, given, what in (("quality", quality, "held-out loss"), ("interleave", interleave, "ratios in turns")):
        if given is None:  # said, never silent: the workflow gives both, a by-hand run may not
            log.info("no --%s folder given: the report and metrics leave out the %s", flag, what)
    for s, r in result.rows.items():
        log.info(
            "%-9s training: predicted %8.0f tok/s  measured %8.0f tok/s  error %+5.1f%%",
            s,
            r.predicted_tok_s,
            r.measured_tok_s,
            100 * r.prediction_error,
        )
    for s, r in (result.interleaved or {}).items():
        log.info(
            "%-9s in turns: ratio to sorted %.3f [%.3f, %.3f], predicted %.3f (error %+.1f%%)",
            s,
            r["ratio_to_sorted"],
            *r["ci95"],
            r["predicted_ratio"],
            100 * r["prediction_error"],
        )
    v = result.recommendation.verdict
    log.info(
        "answer: %s%s, K = %s (decided on the ratios in turns); machine %s; wrote %s",
        v.kind,
        f" {', '.join(v.top)}" if v.top and v.kind != "not settled" else "",
        metrics.get("recommended.num_buckets"),
        metrics["machine.id"],
        out,
    )
    low = busy_machine(result)
    if low:
        log.warning(
            "busy machine: %s of its cores; the trainings' prediction errors mix other work with model error "
            "(the ratios in turns do not). Rerun on a quiet machine: %s",
            ", ".join(low),
            QUIET_RERUN,
        )
    moved = unsteady_machine(result)
    if moved:
        log.warning(
            "the machine's speed changed during the trainings: the reference step moved by %s between start "
            "and end; their errors and ratios mix that drift with model error (the ratios in turns, which the "
            "answer is decided on, do not)",
            ", ".join(moved),
        )
    return 0
