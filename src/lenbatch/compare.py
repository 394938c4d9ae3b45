"""Compare stage: predicted vs measured throughput, the gap explained, the efficiency-diversity frontier.

For every strategy the stage reports the padding model's efficiency, the simulated
plan's efficiency, the throughput predicted by the step-time model (fitted on the
profile grid, never on the run it predicts) and the measured one, the prediction
error, the ratio to ``sorted``, both diversity measures and, from the quality stage, the
drafter's held-out loss at equal useful tokens and per second (95% intervals over seeds;
rendered by :mod:`lenbatch.quality_report`). It also predicts ``bucketed`` for every K of
the boundary sweep and recommends a strategy and K.

Outputs (``--out``): ``metrics.json`` (what users compare, flat keys for ``dvc metrics diff``),
``diagnostics.json`` (every flat key, fit errors and CPU shares included),
``report.md``, ``frontier.png``, ``throughput.png``, ``histogram.png``, and DVC plot
data ``frontier.json``, ``throughput.json``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from lenbatch import quality_report as qr
from lenbatch import stepmodel as sm
from lenbatch.config import Params, params_from_args, write_resolved
from lenbatch.log import get_logger
from lenbatch.profile import CPU_SHARE_WARN, grid_cpu_share
from lenbatch.schedule import build_schedule, epoch_steps
from lenbatch.spec import BatchSpec

log = get_logger("compare")

# The train stage's drafter rank used to wait for its outstanding acknowledgements once more
# than 4 x queue_size were pending (a stall worth up to 6% of a 20-step run, which
# stepmodel.pipeline_ends(ack_every=...) simulates); since train 987302c it never waits on
# them, and replaying measured step times without the stall matches the runs within 0.8%.
ACK_EVERY: int | None = None

# Params a training run must share with the current params to be compared (section -> keys; None: all).
RUN_KEYS: dict[str, tuple[str, ...] | None] = {
    "batching": None,
    "model": None,
    "drafter": None,
    "train": ("nproc", "useful_tokens", "warmup_steps", "queue_size", "threads"),
}
# Params the profile grid must share with the current params (the shapes are timed on this model).
PROFILE_KEYS: dict[str, tuple[str, ...] | None] = {
    "model": None,
    "drafter": None,
    "train": ("nproc", "threads", "reuse_host_memory"),
}


# --------------------------------------------------------------------------- inputs


def _read_json(path: Path, rerun: str) -> Any:
    if not path.exists():
        raise ValueError(f"{path} is missing; rerun: {rerun}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); rerun: {rerun}") from None


def params_mismatch(resolved: dict, current: dict, keys: dict[str, tuple[str, ...] | None]) -> list[str]:
    """``section.key: was -> now`` for every compared key whose value differs (lists == tuples)."""
    out = []
    for section, names in keys.items():
        was_sec, now_sec = resolved.get(section, {}), current.get(section, {})
        for key in names or sorted(set(was_sec) | set(now_sec)):
            was, now = was_sec.get(key), now_sec.get(key)
            if json.dumps(was) != json.dumps(now):
                out.append(f"{section}.{key}: {was!r} -> {now!r}")
    return out


def read_steps(path: Path, rerun: str) -> list[dict]:
    if not path.exists():
        raise ValueError(f"{path} is missing; rerun: {rerun}")
    rows = []
    for i, line in enumerate(path.read_text().splitlines()):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise ValueError(f"{path} line {i + 1} is not JSON (a partial run?); rerun: {rerun}") from None
    if not rows:
        raise ValueError(f"{path} holds no steps; rerun: {rerun}")
    return rows


def load_run(train_dir: Path, strategy: str, params: Params) -> dict:
    """summary.json + steps.jsonl of one strategy, checked against the current params."""
    rerun = f"snakemake results/train/{strategy}/summary.json"
    summary = _read_json(train_dir / strategy / "summary.json", rerun)
    for key in ("useful_tokens_per_s", "steps"):
        if summary.get(key) is None:
            raise ValueError(f"{train_dir / strategy / 'summary.json'} has no '{key}' (a partial run?); rerun: {rerun}")
    planned = summary.get("planned_steps")
    if planned is not None and int(planned) != int(summary["steps"]):
        raise ValueError(f"strategy {strategy} trained {summary['steps']} of {planned} planned steps (a partial "
                         f"run); rerun: {rerun}")
    resolved = summary.get("params")
    if not isinstance(resolved, dict):
        raise ValueError(f"{train_dir / strategy / 'summary.json'} records no resolved params; rerun: {rerun}")
    diff = params_mismatch(resolved, params.to_dict(), RUN_KEYS)
    if diff:
        raise ValueError(f"strategy {strategy} was measured with other params than the current ones "
                         f"({'; '.join(diff)}); rerun: {rerun}")
    steps = read_steps(train_dir / strategy / "steps.jsonl", rerun)
    if len({int(r["step"]) for r in steps}) != int(summary["steps"]):
        raise ValueError(f"{train_dir / strategy / 'steps.jsonl'} holds {len(steps)} steps but summary.json says "
                         f"{summary['steps']} (a partial or mixed run); rerun: {rerun}")
    return {"summary": summary, "steps": steps}


def grid_columns(rows: list[dict]) -> dict[str, np.ndarray]:
    """Shape table of the profile grid rows (from each row's sequence lengths)."""
    lengths, batches, kinds = [], [], []
    start = 0
    for r in rows:
        if not r.get("sequence_lengths"):
            raise ValueError("the profile grid rows lack sequence_lengths (an older grid.json); rerun: "
                             "snakemake results/profile/grid.json")
        ls = r["sequence_lengths"]
        lengths.extend(int(x) for x in ls)
        batches.append(np.arange(start, start + len(ls)))
        kinds.append(r["kind"])
        start += len(ls)
    arr = np.asarray(lengths, dtype=np.int64)
    per = [sm.batch_columns(arr, [b], kind=k, drafter=(np.array([float(r["positions"])]),
                                                        np.array([float(r["ctx_tokens"])]))
                            if "positions" in r else None)
           for b, k, r in zip(batches, kinds, rows)]
    return {key: np.concatenate([c[key] for c in per]) for key in per[0]} if per else {}


def fit_profile(profile_dir: Path, params: Params) -> dict:
    """Fit target and drafter step-time models on the profile grid (held-out model choice)."""
    rerun = "snakemake results/profile/grid.json"
    grid = _read_json(profile_dir / "grid.json", rerun)
    rows = grid["points"] if isinstance(grid, dict) else grid
    resolved_path = profile_dir / "params.json"
    if resolved_path.exists():
        diff = params_mismatch(json.loads(resolved_path.read_text()), params.to_dict(), PROFILE_KEYS)
        if diff:
            raise ValueError(f"the profile grid was timed with other params ({'; '.join(diff)}); rerun: {rerun}")
    cols = grid_columns(rows)
    fits = {}
    # "<role>" fits the step timed alone; "<role>_busy" (lockstep profile) the step timed while the
    # other role works; compare.contention picks which of them predict a pipelined run
    busy = bool(rows) and all("target_busy_seconds_median" in r and "drafter_busy_seconds_median" in r
                              for r in rows)
    for role in ("target", "drafter") + (("target_busy", "drafter_busy") if busy else ()):
        base = role.removesuffix("_busy")
        key = f"{base}_busy_seconds_median" if role.endswith("_busy") else f"{base}_seconds_median"
        secs = np.array([float(r[key]) for r in rows])
        best, cands = sm.select_model(cols, secs, role=role, candidates=sm.CANDIDATES[base],
                                      holdout_fraction=params.compare.holdout_fraction, seed=params.batching.seed)
        fits[role] = {"best": best, "candidates": cands}
    return {"rows": rows, "fits": fits}


# --------------------------------------------------------------------------- prediction


def step_kind(strategy: str) -> str:
    return "packed" if strategy == "packed" else "padded"


def _epoch_plan(lengths: np.ndarray, params: Params, strategy: str, edges: Any, *, epoch: int,
                target_ranks: int) -> list[np.ndarray]:
    """One epoch's global step order, as the train stage runs it (:func:`lenbatch.schedule.epoch_steps`)."""
    spec = BatchSpec.from_params(params, strategy=strategy, edges=edges)
    return [idx for _, _, idx in epoch_steps(lengths, strategy=strategy, spec=spec, target_ranks=target_ranks,
                                             epoch=epoch)]


def planned_batches(lengths: np.ndarray, params: Params, strategy: str, edges: Any, *, steps: int | None = None,
                    useful_tokens: int | None = None, target_ranks: int) -> list[tuple[int, np.ndarray]]:
    """(epoch, indices) of a run's global steps, in order: the train stage's schedule
    (:func:`lenbatch.schedule.build_schedule`) up to ``steps`` steps or to its stop rule at ``useful_tokens``."""
    assert (steps is None) != (useful_tokens is None)
    sched = build_schedule(lengths, strategy=strategy, params=params, edges=edges, target_ranks=target_ranks,
                           useful_tokens=useful_tokens, max_steps=steps)
    return [(s.epoch, s.indices) for s in sched]


class LossMasks:
    """Loss masks of the tokenized dataset, read on demand (the drafter's anchors depend on them)."""

    def __init__(self, data_dir: Path | None) -> None:
        self.ds = None
        self.cache: dict[int, np.ndarray] = {}
        path = None if data_dir is None else Path(data_dir) / "dataset"
        if path is not None and path.exists():
            import datasets

            self.ds = datasets.load_from_disk(str(path)).select_columns(["loss_mask"]).with_format("numpy")

    @property
    def available(self) -> bool:
        return self.ds is not None

    def get(self, indices: np.ndarray) -> list[np.ndarray]:
        missing = sorted({int(i) for i in indices} - set(self.cache))
        if missing:
            for i, m in zip(missing, self.ds[missing]["loss_mask"]):
                self.cache[i] = np.asarray(m, dtype=bool)
        return [self.cache[int(i)] for i in indices]


def step_columns(lengths: np.ndarray, steps: list[tuple[int, np.ndarray]], *, kind: str, params: Params,
                 masks: LossMasks) -> dict[str, np.ndarray]:
    """Shape table of a run's steps, with the drafter's exact work when the loss masks are available."""
    batches = [b for _, b in steps]
    d = params.drafter
    if not masks.available:
        return sm.batch_columns(lengths, batches, kind=kind, positions_per_seq=d.anchors_per_seq * (d.block_size - 1))
    work = [sm.drafter_work(lengths[b], masks.get(b), b, anchors_per_seq=d.anchors_per_seq, block_size=d.block_size,
                            seed=params.batching.seed, epoch=epoch, step=i) for i, (epoch, b) in enumerate(steps)]
    return sm.batch_columns(lengths, batches, kind=kind, drafter=(np.array([w[0] for w in work], dtype=float),
                                                                  np.array([w[1] for w in work], dtype=float)))


def predict_steps(cols: dict[str, np.ndarray], *, fits: dict, params: Params, target_ranks: int) -> dict:
    """Predicted step times, pipelined run time and useful tokens/s of a run's shape table.

    One process: the target and drafter steps add up (timed alone). Pipelined, by
    ``compare.contention`` when the grid has busy timings (else alone): busy times, alone
    times, or each step blended between the two by how much the other role works during it
    (:func:`lenbatch.stepmodel.blended_pipeline`).
    """
    target = fits["target"]["best"].predict(cols)
    drafter = fits["drafter"]["best"].predict(cols)
    mode = params.compare.contention if "target_busy" in fits else "alone"
    if params.train.nproc == 1:
        ends = sm.pipeline_ends(target + drafter)
    elif mode == "blend":
        tl = sm.blended_pipeline(target, fits["target_busy"]["best"].predict(cols), drafter,
                                 fits["drafter_busy"]["best"].predict(cols), queue_size=params.train.queue_size,
                                 target_ranks=target_ranks, ack_every=ACK_EVERY)
        target, drafter, ends = tl["target_s"], tl["drafter_s"], tl["end"]
    else:
        if mode == "busy":
            target, drafter = (fits[f"{r}_busy"]["best"].predict(cols) for r in ("target", "drafter"))
        ends = sm.pipeline_ends(target, drafter, queue_size=params.train.queue_size, target_ranks=target_ranks,
                                ack_every=ACK_EVERY)
    tput = sm.throughput(cols["useful_tokens"], ends, warmup_steps=params.train.warmup_steps)
    w = params.train.warmup_steps
    return {"columns": cols, "target_s": target, "drafter_s": drafter, "ends": ends,
            "tok_s": tput, "seconds": float(ends[-1] - (ends[w - 1] if w > 0 else 0.0))}


def components(pred: dict, fits: dict, *, warmup_steps: int) -> dict[str, float]:
    """Seconds each (role, feature) term of the step-time model adds over the counted steps."""
    out = {}
    for role in ("target", "drafter"):
        fit = fits[role]["best"]
        X = sm.design_matrix(pred["columns"], fit.features)[warmup_steps:]
        for f, c, total in zip(fit.features, fit.coef, X.sum(axis=0)):
            out[f"{role}.{f}"] = float(c * total)
    return out


def loss_curve(steps: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(useful tokens trained so far, loss) after every step of a run, from its steps.jsonl rows."""
    rows = sorted(steps, key=lambda r: int(r["step"]))
    toks = np.cumsum([float(r["useful_tokens"]) for r in rows])
    return toks, np.array([float(r["loss"]) for r in rows])


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Mask of points not dominated when both x and y are to be maximised. O(n^2), n is small."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.ones(x.size, dtype=bool)
    for i in range(x.size):
        dominated = (x >= x[i]) & (y >= y[i]) & ((x > x[i]) | (y > y[i]))
        keep[i] = not dominated.any()
    return keep


def ratio_ladder(comp: dict[str, dict[str, float]], useful: dict[str, float], tok_s: dict[str, float],
                 measured: dict[str, float]) -> dict[str, dict[str, float]]:
    """Throughput relative to sorted as the step-time model's terms are added one at a time.

    padding: only the per-token terms (the study's model: time proportional to computed tokens);
    +step: plus the fixed cost per step; +attention: plus the sum of length^2 terms;
    +sequences: plus the per-sequence terms (all terms, target and drafter run one after the other);
    pipelined: the full prediction (target and drafter overlap through the queue); measured.
    """
    levels = {"padding": ("computed_tokens", "useful_tokens"),
              "+step": ("computed_tokens", "useful_tokens", "const"),
              "+attention": ("computed_tokens", "useful_tokens", "const", "sum_len_sq"),
              "+sequences": ("computed_tokens", "useful_tokens", "const", "sum_len_sq", "sequences")}
    out: dict[str, dict[str, float]] = {}
    for s in comp:
        out[s] = {}
        for level, feats in levels.items():
            t = sum(v for k, v in comp[s].items() if k.split(".", 1)[1] in feats)
            t0 = sum(v for k, v in comp["sorted"].items() if k.split(".", 1)[1] in feats)
            out[s][level] = (useful[s] / t) / (useful["sorted"] / t0) if t > 0 and t0 > 0 else float("nan")
        out[s]["pipelined"] = tok_s[s] / tok_s["sorted"]
        out[s]["measured"] = measured[s] / measured["sorted"]
    return out


# --------------------------------------------------------------------------- the stage


def compare(*, params: Params, stats_dir: Path, boundaries_dir: Path, plans_dir: Path, profile_dir: Path,
            train_dir: Path, data_dir: Path, quality_dir: Path | None = None) -> dict:
    """Everything the report, metrics and plots show (pure function of the stage inputs).

    ``quality_dir``: the quality stage's output (held-out loss intervals); None leaves it out."""
    strategies = list(params.train.strategies)
    if "sorted" not in strategies:
        raise ValueError("train.strategies lacks 'sorted', the baseline every ratio is taken to; add it and rerun: "
                         "snakemake results/train/sorted/summary.json")
    histogram = _read_json(stats_dir / "histogram.json", "snakemake results/stats/stats.json")
    stats = _read_json(stats_dir / "stats.json", "snakemake results/stats/stats.json")
    bounds = _read_json(boundaries_dir / "boundaries.json", "snakemake results/boundaries/boundaries.json")
    sweep = _read_json(boundaries_dir / "sweep.json", "snakemake results/boundaries/sweep.json")
    plans = _read_json(plans_dir / "metrics.json", "snakemake results/plans/metrics.json")
    missing = [s for s in strategies if s not in plans]
    if missing:
        raise ValueError(f"{plans_dir / 'metrics.json'} lacks strategies {missing}; rerun: "
                         "snakemake results/plans/metrics.json")
    lengths_path = Path(data_dir) / "lengths.npy"
    if not lengths_path.exists():
        raise ValueError(f"{lengths_path} is missing; rerun: snakemake results/tokenize/lengths.npy")
    lengths = np.load(lengths_path).astype(np.int64)
    masks = LossMasks(data_dir)
    if not masks.available:
        log.info("no dataset under %s: the drafter's positions are estimated (anchors x (block - 1) per sequence)",
                 data_dir)
    profile = fit_profile(profile_dir, params)
    fits = profile["fits"]
    target_ranks = max(params.train.nproc - 1, 1)
    edges = tuple(int(e) for e in bounds["edges"])

    rows: dict[str, dict] = {}
    comp: dict[str, dict[str, float]] = {}
    # the fits whose terms the gap ladder adds up: busy ones when the prediction uses busy times
    busy_terms = params.train.nproc > 1 and params.compare.contention == "busy" and "target_busy" in fits
    term_fits = {r: fits[f"{r}_busy" if busy_terms else r] for r in ("target", "drafter")}
    for s in strategies:
        run = load_run(train_dir, s, params)
        summary, steps = run["summary"], run["steps"]
        trained = _trained_useful_per_step(steps)
        steps_plan = planned_batches(lengths, params, s, edges, steps=len(trained), target_ranks=target_ranks)
        batches = [b for _, b in steps_plan]
        planned = np.array([int(lengths[b].sum()) for b in batches])
        if not np.array_equal(planned, trained):
            bad = int(np.argmax(planned != trained))
            raise ValueError(f"strategy {s}: step {bad} trained {trained[bad]} useful tokens but the current plan "
                             f"gives {planned[bad]} (the run was planned with other data or params); rerun: "
                             f"snakemake results/train/{s}/summary.json")
        pred = predict_steps(step_columns(lengths, steps_plan, kind=step_kind(s), params=params, masks=masks),
                             fits=fits, params=params, target_ranks=target_ranks)
        comp[s] = components(pred, term_fits, warmup_steps=params.train.warmup_steps)
        measured = float(summary["useful_tokens_per_s"])
        pm = plans[s]
        rows[s] = {
            "padding_model_efficiency": float(bounds["predicted_efficiency"]) if s == "bucketed"
            else float(pm["padding_efficiency"]),
            "simulated_efficiency": float(pm["padding_efficiency"]),
            "measured_efficiency": float(summary.get("padding_efficiency", float("nan"))),
            "budget_fill": float(pm.get("budget_fill", float("nan"))),
            "predicted_tok_s": pred["tok_s"],
            "measured_tok_s": measured,
            "prediction_error": pred["tok_s"] / measured - 1.0,
            "composition_repeat": float(pm["composition_repeat"]),
            "length_mixing": float(pm["length_mixing"]),
            "steps": len(batches),
            "useful_tokens": float(planned[params.train.warmup_steps:].sum()),
            "predicted_seconds": pred["seconds"],
            "mean_target_s": float(pred["target_s"].mean()),
            "mean_drafter_s": float(pred["drafter_s"].mean()),
            "loss_curve": loss_curve(steps),
            **diagnose(steps, pred, params=params, target_ranks=target_ranks, measured=measured),
        }
    ref = rows["sorted"]
    for s, r in rows.items():
        r["ratio_to_sorted_measured"] = r["measured_tok_s"] / ref["measured_tok_s"]
        r["ratio_to_sorted_predicted"] = r["predicted_tok_s"] / ref["predicted_tok_s"]
        r["ratio_to_sorted_padding"] = r["padding_model_efficiency"] / ref["padding_model_efficiency"]
    quality = qr.load(quality_dir, strategies) if quality_dir is not None else None
    ladder = ratio_ladder(comp, {s: r["useful_tokens"] for s, r in rows.items()},
                          {s: r["predicted_tok_s"] for s, r in rows.items()},
                          {s: r["measured_tok_s"] for s, r in rows.items()})
    ksweep = predict_sweep(lengths, sweep, params=params, fits=fits, target_ranks=target_ranks)
    for s, r in rows.items():  # steady state: a whole epoch, ratio to sorted's whole epoch
        r["predicted_epoch_ratio_to_sorted"] = (
            epoch_tok_s(lengths, params, s, edges, fits=fits, target_ranks=target_ranks)
            / epoch_tok_s(lengths, params, "sorted", None, fits=fits, target_ranks=target_ranks))
    return {"rows": rows, "components": comp, "ladder": ladder, "sweep": ksweep, "fits": fits,
            "exact_drafter_work": masks.available,
            "grid_points": len(profile["rows"]), "edges": edges,
            "profile_cpu_share": grid_cpu_share(profile["rows"], threads=params.train.threads),
            "threads": params.train.threads, "num_buckets": int(bounds["num_buckets"]),
            "histogram": histogram, "stats": stats, "quality": quality,
            "recommendation": recommend(rows, ksweep, params=params)}


def diagnose(steps: list[dict], pred: dict, *, params: Params, target_ranks: int, measured: float) -> dict:
    """Where a prediction error comes from: step times or the pipeline.

    target/drafter_step_ratio: measured over predicted seconds of the post-warm-up steps
    (1 = the profile grid timed the steps right; > 1 = the run's steps were slower, e.g.
    a busier machine than while profiling). pipeline_error: the measured step times
    replayed through the pipeline model, against the measured throughput (0 = the
    pipeline model and the per-step overheads it ignores are right). target/drafter_cpu_share:
    the share of its cores each role got in the run (:func:`lenbatch.stepmodel.cpu_share`).
    """
    rows = sorted(steps, key=lambda r: int(r["step"]))
    if not all("target_s" in r and "drafter_s" in r for r in rows):
        return {"target_step_ratio": float("nan"), "drafter_step_ratio": float("nan"), "pipeline_error": float("nan"),
                "target_cpu_share": float("nan"), "drafter_cpu_share": float("nan")}
    w = params.train.warmup_steps
    t = np.array([float(r["target_s"]) for r in rows])
    d = np.array([float(r["drafter_s"]) for r in rows])
    useful = np.array([float(r["useful_tokens"]) for r in rows])
    if params.train.nproc == 1:
        ends = sm.pipeline_ends(t + d)
    else:
        ends = sm.pipeline_ends(t, d, queue_size=params.train.queue_size, target_ranks=target_ranks,
                                ack_every=ACK_EVERY)
    replay = sm.throughput(useful, ends, warmup_steps=w)
    share = {role: sm.steps_cpu_share(rows[w:], role, threads=params.train.threads) for role in ("target", "drafter")}
    return {"target_step_ratio": float(t[w:].sum() / pred["target_s"][w:].sum()),
            "drafter_step_ratio": float(d[w:].sum() / pred["drafter_s"][w:].sum()),
            "pipeline_error": replay / measured - 1.0,
            "target_cpu_share": share["target"], "drafter_cpu_share": share["drafter"]}


def _trained_useful_per_step(steps: list[dict]) -> np.ndarray:
    """Useful tokens of each trained step in step order (one row per step: the drafter rank's)."""
    by_step: dict[int, int] = {}
    for row in steps:
        by_step.setdefault(int(row["step"]), int(row["useful_tokens"]))
    order = sorted(by_step)
    return np.array([by_step[i] for i in order], dtype=np.int64)


def epoch_tok_s(lengths: np.ndarray, params: Params, strategy: str, edges: Any, *, fits: dict,
                target_ranks: int) -> float:
    """Predicted useful tokens/s over a whole epoch (epoch 0), the steady state of a long run.

    A run of train.useful_tokens covers only its first batches, which vary a lot from one
    plan to the next; comparing K over a whole epoch does not. The drafter's work is
    estimated from lengths here (anchors x (block - 1) positions per sequence, context =
    sequences x longest), the same way for every plan, so ratios stay comparable.
    Cost: one plan and O(steps) prediction.
    """
    d = params.drafter
    steps = [(0, b) for b in _epoch_plan(lengths, params, strategy, edges, epoch=0, target_ranks=target_ranks)]
    cols = sm.batch_columns(lengths, [b for _, b in steps], kind=step_kind(strategy),
                            positions_per_seq=d.anchors_per_seq * (d.block_size - 1))
    return predict_steps(cols, fits=fits, params=params, target_ranks=target_ranks)["tok_s"]


def predict_sweep(lengths: np.ndarray, sweep: list[dict], *, params: Params, fits: dict,
                  target_ranks: int) -> list[dict]:
    """Predicted steady-state (whole-epoch) useful tokens/s of ``bucketed`` for every K of the sweep,
    and its ratio to sorted's, predicted the same way."""
    ref = epoch_tok_s(lengths, params, "sorted", None, fits=fits, target_ranks=target_ranks)
    out = []
    for entry in sweep:
        tok_s = epoch_tok_s(lengths, params, "bucketed", tuple(int(e) for e in entry["edges"]), fits=fits,
                            target_ranks=target_ranks)
        out.append({"num_buckets": int(entry["num_buckets"]),
                    "simulated_efficiency": float(entry["simulated_efficiency"]),
                    "predicted_efficiency": float(entry["predicted_efficiency"]),
                    "composition_repeat": float(entry["composition_repeat"]),
                    "length_mixing": float(entry["length_mixing"]),
                    "predicted_tok_s": tok_s,
                    "predicted_ratio_to_sorted": tok_s / ref})
    return out


def recommend(rows: dict[str, dict], ksweep: list[dict], *, params: Params) -> dict:
    """The strategy to use and the K for bucketed.

    Strategy: the highest measured useful tokens/s among strategies whose batches change
    between epochs (composition_repeat <= compare.max_composition_repeat); sorted keeps
    its batches forever and is the baseline, not a candidate. K: the smallest K whose
    predicted throughput is within compare.k_tolerance of the best K (fewer buckets mix
    lengths more, so ties go to the smaller K).
    """
    limit = params.compare.max_composition_repeat
    ok = {s: r for s, r in rows.items() if r["composition_repeat"] <= limit}
    if not ok:
        raise ValueError(f"no strategy has composition_repeat <= compare.max_composition_repeat ({limit}); "
                         "raise compare.max_composition_repeat or train a shuffling strategy")
    best = max(ok, key=lambda s: ok[s]["measured_tok_s"])
    k_best = max(ksweep, key=lambda e: e["predicted_tok_s"]) if ksweep else None
    k_pick = None
    if k_best is not None:
        floor = (1 - params.compare.k_tolerance) * k_best["predicted_tok_s"]
        good = [e for e in ksweep if e["predicted_tok_s"] >= floor]
        k_pick = min(good, key=lambda e: e["num_buckets"])
    return {"strategy": best, "num_buckets": k_pick["num_buckets"] if k_pick else None,
            "k_best_throughput": k_best["num_buckets"] if k_best else None}


# --------------------------------------------------------------------------- outputs

METRIC_KEYS = ("padding_model_efficiency", "simulated_efficiency", "measured_efficiency", "predicted_tok_s",
               "measured_tok_s", "prediction_error", "ratio_to_sorted_padding", "ratio_to_sorted_predicted",
               "ratio_to_sorted_measured", "composition_repeat", "length_mixing", "steps",
               "target_step_ratio", "drafter_step_ratio", "pipeline_error", "predicted_epoch_ratio_to_sorted",
               "target_cpu_share", "drafter_cpu_share")


def _num(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 6)


# What users compare between experiments (``metrics.json``, DVC's metrics): per strategy the measured
# padding efficiency, predicted and measured throughput, the prediction error, diversity and loss; plus
# the recommendation. Everything else (fit errors, CPU shares, step ratios, the K sweep) is a
# diagnostic and goes to ``diagnostics.json``, so ``dvc exp show --only-changed`` stays readable.
USER_METRIC_KEYS = ("measured_efficiency", "predicted_tok_s", "measured_tok_s", "prediction_error",
                    "composition_repeat", "length_mixing",
                    # the quality stage's held-out loss at equal useful tokens, mean and 95% interval over seeds
                    "heldout_loss.mean", "heldout_loss.lo", "heldout_loss.hi")
USER_SUMMARY_KEYS = ("max_abs_prediction_error", "recommended.num_buckets", "recommended.strategy")


def user_metrics(flat: dict[str, Any]) -> dict[str, Any]:
    """The subset of :func:`flat_metrics` written to ``metrics.json`` (see ``USER_METRIC_KEYS``)."""
    keep = set(USER_SUMMARY_KEYS)
    return {k: v for k, v in flat.items() if k in keep or k.partition(".")[2] in USER_METRIC_KEYS
            and k.partition(".")[0] not in ("fit", "profile", "recommended")}


def flat_metrics(result: dict) -> dict[str, Any]:
    """Flat ``strategy.key`` metrics and diagnostics (``diagnostics.json``; :func:`user_metrics` picks
    ``metrics.json`` from them)."""
    out: dict[str, Any] = {}
    for s, r in result["rows"].items():
        for k in METRIC_KEYS:
            out[f"{s}.{k}"] = _num(r[k])
    for role, f in result["fits"].items():
        out[f"fit.{role}.holdout_error"] = _num(f["best"].holdout_error)
        out[f"fit.{role}.train_error"] = _num(f["best"].train_error)
    out["fit.grid_points"] = result["grid_points"]
    for role, v in result["profile_cpu_share"].items():
        out[f"profile.{role}_cpu_share"] = _num(v)
    out["max_abs_prediction_error"] = _num(max(abs(r["prediction_error"]) for r in result["rows"].values()))
    for e in result["sweep"]:
        out[f"bucketed_k{e['num_buckets']}.predicted_ratio_to_sorted"] = _num(e["predicted_ratio_to_sorted"])
    rec = result["recommendation"]
    out["recommended.num_buckets"] = rec["num_buckets"]
    out["recommended.strategy"] = rec["strategy"]
    out.update(qr.flat_metrics(result.get("quality"), _tok_s(result)))
    return out


def _tok_s(result: dict) -> dict[str, float]:
    return {s: r["measured_tok_s"] for s, r in result["rows"].items()}


def frontier_points(result: dict) -> list[dict]:
    """Every strategy and bucketed K = 1..max: efficiency, diversity, Pareto membership (DVC plot data)."""
    pts = [{"name": s, "kind": "strategy", "num_buckets": result["num_buckets"] if s == "bucketed" else None,
            "efficiency": r["simulated_efficiency"], "length_mixing": r["length_mixing"],
            "composition_repeat": r["composition_repeat"], "predicted_ratio_to_sorted": r["ratio_to_sorted_predicted"]}
           for s, r in result["rows"].items()]
    pts += [{"name": f"bucketed K={e['num_buckets']}", "kind": "sweep", "num_buckets": e["num_buckets"],
             "efficiency": e["simulated_efficiency"], "length_mixing": e["length_mixing"],
             "composition_repeat": e["composition_repeat"], "predicted_ratio_to_sorted": e["predicted_ratio_to_sorted"]}
            for e in result["sweep"]]
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


def write_plots(result: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    # 1. length histogram with the bucket edges
    fig, ax = plt.subplots(figsize=(7, 4))
    h = result["histogram"]
    lo = np.array([r["lo"] for r in h], dtype=float)
    hi = np.array([r["hi"] for r in h], dtype=float)
    ax.bar(lo, [r["count"] for r in h], width=hi - lo, align="edge", color="#8aa", edgecolor="#577")
    for e in result["edges"][1:-1]:
        ax.axvline(e, color="#c33", lw=1.2)
    ax.set_xlabel("length (tokens)")
    ax.set_ylabel("samples")
    ax.set_title(f"length histogram and the {result['num_buckets']} bucket edges (red)")
    paths.append(_save(fig, out / "histogram.png"))
    # 2. predicted vs measured throughput
    fig, ax = plt.subplots(figsize=(5.5, 5))
    rows = result["rows"]
    meas = np.array([r["measured_tok_s"] for r in rows.values()])
    pred = np.array([r["predicted_tok_s"] for r in rows.values()])
    pad = np.array([r["ratio_to_sorted_padding"] * rows["sorted"]["measured_tok_s"] for r in rows.values()])
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
    paths.append(_save(fig, out / "throughput.png"))
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
    paths.append(_save(fig, out / "frontier.png"))
    return paths


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _pct(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def answer_paragraph(result: dict, *, params: Params) -> str:
    rows, rec = result["rows"], result["recommendation"]
    s = rec["strategy"]
    r, ref = rows[s], rows["sorted"]
    sweep = {e["num_buckets"]: e for e in result["sweep"]}
    pts = frontier_points(result)
    text = (f"**Use `{s}`** for this data and model: it measured {r['measured_tok_s']:,.0f} useful tokens/s, "
            f"{_pct(r['ratio_to_sorted_measured'])} of `sorted` ({ref['measured_tok_s']:,.0f} tokens/s), "
            f"with padding efficiency {_pct(r['simulated_efficiency'])}, composition repeat "
            f"{r['composition_repeat']:.3f} (sorted: {ref['composition_repeat']:.3f}) and length mixing "
            f"{r['length_mixing']:.3f} (sorted: {ref['length_mixing']:.3f}). "
            + qr.answer_sentence(result.get("quality"), s, _tok_s(result)))
    k = rec["num_buckets"]
    if k is not None and k in sweep:
        e = sweep[k]
        kb = sweep[rec["k_best_throughput"]]
        lead = " Use it" if s == "bucketed" else " Where packing is not available, use `bucketed`"
        text += (f"{lead} with **K = {k}** buckets: predicted over a whole epoch at "
                 f"{_pct(e['predicted_ratio_to_sorted'])} of sorted at simulated efficiency "
                 f"{_pct(e['simulated_efficiency'])} and length mixing {e['length_mixing']:.3f}, the smallest K "
                 f"within {_pct(params.compare.k_tolerance)} of the best predicted K (K = {kb['num_buckets']}, "
                 f"{_pct(kb['predicted_ratio_to_sorted'])}).")
    study = 6
    if study in sweep:
        e = sweep[study]
        on = next(p for p in pts if p["kind"] == "sweep" and p["num_buckets"] == study)
        dominated_by = [p["name"] for p in pts if p["length_mixing"] >= on["length_mixing"]
                        and p["efficiency"] >= on["efficiency"] and p is not on
                        and (p["length_mixing"] > on["length_mixing"] or p["efficiency"] > on["efficiency"])]
        where = ("on the Pareto front of efficiency vs length mixing" if on["pareto_mixing"]
                 else f"behind the Pareto front (dominated by {', '.join(dominated_by[:3])})")
        text += (f" The study's choice, K = 6, sits {where}: simulated efficiency {_pct(e['simulated_efficiency'])}, "
                 f"length mixing {e['length_mixing']:.3f}, predicted {_pct(e['predicted_ratio_to_sorted'])} "
                 "of sorted")
        if on.get("pareto_padded") is not None:
            text += (", and " + ("on" if on["pareto_padded"] else "behind") +
                     " the front of the padded strategies (packing left out)")
        steps = [f"K = {kk}: {_pct(sweep[kk]['simulated_efficiency'])}" for kk in (study - 1, study + 1) if kk in sweep]
        text += (f"; its neighbours give {', '.join(steps)}." if steps else ".")
    return text


def gap_paragraph(result: dict) -> str:
    rows, lad, comp = result["rows"], result["ladder"], result["components"]
    s = "bucketed" if "bucketed" in rows else next(k for k in rows if k != "sorted")
    L = lad[s]
    steps_s, steps_ref = rows[s]["steps"], rows["sorted"]["steps"]
    const = {k: sum(v for n, v in comp[k].items() if n.endswith(".const")) for k in (s, "sorted")}
    attn = {k: sum(v for n, v in comp[k].items() if n.endswith(".sum_len_sq")) for k in (s, "sorted")}
    total = {k: sum(comp[k].values()) for k in (s, "sorted")}
    return (f"The study predicted `bucketed` at 86.8% of sorted from padding alone and measured 78%. Here the "
            f"padding model predicts `{s}` at {_pct(L['padding'])} of sorted and the run measured "
            f"{_pct(L['measured'])}. Adding the step-time model's terms one at a time: the fixed cost per step "
            f"gives {_pct(L['+step'])} (`{s}` takes {steps_s} steps to sorted's {steps_ref}; the fixed terms are "
            f"{const[s]:.1f} s of {total[s]:.1f} s modelled, sorted {const['sorted']:.1f} s of "
            f"{total['sorted']:.1f} s), the quadratic attention term gives {_pct(L['+attention'])} "
            f"({attn[s]:.1f} s vs sorted {attn['sorted']:.1f} s), the per-sequence term {_pct(L['+sequences'])}, "
            f"and overlapping target and drafter through the queue (the full prediction) {_pct(L['pipelined'])}.")


def busy_machine(result: dict) -> list[str]:
    """Signs that other work slowed the profile or the runs, from the share of their cores they got.

    - a run's role got a share differing from the profile's by more than ``1 - CPU_SHARE_WARN``
      (relative): profile and run ran under different loads, whatever the threads or device;
    - with one thread per process, anything below ``CPU_SHARE_WARN`` (with more threads a step
      need not keep every thread busy, so a low share alone proves nothing).
    """
    prof = result["profile_cpu_share"]
    one_thread = result["threads"] == 1
    low = [f"profile {role} {_pct(v)}" for role, v in prof.items() if one_thread and v < CPU_SHARE_WARN]
    for s, r in result["rows"].items():
        for role in ("target", "drafter"):
            x, p = r[f"{role}_cpu_share"], prof[role]
            if (one_thread and x < CPU_SHARE_WARN) or min(x, p) < CPU_SHARE_WARN * max(x, p):
                low.append(f"{s} run {role} {_pct(x)} (profile {_pct(p)})")
    return low


def noise_paragraph(result: dict) -> str:
    """Was the machine quiet while profiling and training? (Tells noise from model error.)"""
    prof = result["profile_cpu_share"]
    runs = [r[f"{role}_cpu_share"] for r in result["rows"].values() for role in ("target", "drafter")]
    runs = [x for x in runs if not math.isnan(x)]
    if math.isnan(prof["target"]) or not runs:
        return ("CPU shares were not recorded (a profile grid or runs from an older version), so a busy machine "
                "cannot be told from model error; rerun: snakemake --forcerun profile train")
    low = busy_machine(result)
    if low:
        return (f"**The machine was busy**: share of their cores {', '.join(low)}. A step that gets a share s "
                "of its cores takes about 1/s as long, so the errors above mix other work on the machine with model "
                "error. Rerun what was slowed on a quiet machine (`snakemake --forcerun profile` for the profile, "
                "`--forcerun train` for the runs).")
    return (f"The machine was quiet: the profile's steps got {_pct(prof['target'])} (target) and "
            f"{_pct(prof['drafter'])} (drafter) of their cores, the runs' steps at least {_pct(min(runs))}, so "
            "the errors above are the step-time model's and the run-to-run noise's, not other work's.")


def write_report(result: dict, out: Path, *, params: Params) -> Path:
    rows = result["rows"]
    lines = ["# Batching strategies: predicted vs measured", "", "## Answer", "",
             answer_paragraph(result, params=params),
             "", "## Why the padding-only prediction misses", "", gap_paragraph(result), "",
             "| strategy | padding only | +step cost | +attention | +sequences | pipelined (prediction) | measured |",
             "|---|---|---|---|---|---|---|"]
    for s, L in result["ladder"].items():
        lines.append(f"| {s} | " + " | ".join(_pct(L[k]) for k in
                                             ("padding", "+step", "+attention", "+sequences", "pipelined",
                                              "measured")) + " |")
    lines += ["", "(throughput relative to sorted as each term of the step-time model is added)", "",
              "## Every strategy", "",
              "| strategy | padding model eff. | simulated eff. | predicted tok/s | measured tok/s | error | "
              "ratio to sorted (meas.) | composition repeat | length mixing | held-out loss at equal tokens [95%] |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for s, r in rows.items():
        lines.append(f"| {s} | {_pct(r['padding_model_efficiency'])} | {_pct(r['simulated_efficiency'])} | "
                     f"{r['predicted_tok_s']:,.0f} | {r['measured_tok_s']:,.0f} | "
                     f"{100 * r['prediction_error']:+.1f}% | "
                     f"{_pct(r['ratio_to_sorted_measured'])} | {r['composition_repeat']:.3f} | "
                     f"{r['length_mixing']:.3f} | {qr.loss_cell(result.get('quality'), s)} |")
    lines += ["", "Where the prediction error comes from: measured / predicted step seconds of each role "
              "(1.00 = the profile timed the run's steps right), and the measured step times replayed through "
              "the pipeline model against the measured throughput (0% = the pipeline model is right).", "",
              "| strategy | target step ratio | drafter step ratio | pipeline replay error | "
              "target CPU share | drafter CPU share |", "|---|---|---|---|---|---|"]
    for s, r in rows.items():
        lines.append(f"| {s} | {r['target_step_ratio']:.2f} | {r['drafter_step_ratio']:.2f} | "
                     f"{100 * r['pipeline_error']:+.1f}% | {_pct(r['target_cpu_share'])} | "
                     f"{_pct(r['drafter_cpu_share'])} |")
    lines += ["", noise_paragraph(result)]
    if result.get("quality"):
        lines += ["", qr.section(result["quality"], tok_s=_tok_s(result))]
    lines += ["", "## Step-time model", "",
              f"Fitted by non-negative least squares on relative error over {result['grid_points']} profile grid "
              f"points (never on the runs it predicts); each candidate feature set scored on "
              f"{_pct(params.compare.holdout_fraction)} held-out points over 50 random splits. A larger set must "
              "lower the best held-out error by a tenth (and at least 0.2 points) to be chosen.", "",
              "| role | features | held-out mean error | held-out worst | fit error | chosen |",
              "|---|---|---|---|---|---|"]
    for role, f in result["fits"].items():
        for c in f["candidates"]:
            lines.append(f"| {role} | {c.name} | {_pct(c.holdout_error)} | {_pct(c.holdout_max_error)} | "
                         f"{_pct(c.train_error)} | {'yes' if c is f['best'] else ''} |")
    lines += [""]
    for role, f in result["fits"].items():
        b = f["best"]
        terms = " + ".join(f"{c:.3g}·{n}" for n, c in zip(b.features, b.coef))
        lines.append(f"- {role}: t = {terms} seconds")
    lines += ["", f"## bucketed for K = 1..{len(result['sweep'])}", "",
              "Predicted over a whole epoch (the steady state; a run's first batches vary too much to rank K), "
              "relative to sorted predicted the same way. Every strategy the same way: " + ", ".join(
                  f"{s} {_pct(r['predicted_epoch_ratio_to_sorted'])}" for s, r in rows.items()) + ".", "",
              "| K | simulated eff. | predicted ratio to sorted | composition repeat | length mixing |",
              "|---|---|---|---|---|"]
    for e in result["sweep"]:
        lines.append(f"| {e['num_buckets']} | {_pct(e['simulated_efficiency'])} | "
                     f"{_pct(e['predicted_ratio_to_sorted'])} | {e['composition_repeat']:.3f} | "
                     f"{e['length_mixing']:.3f} |")
    lines += ["", "## Plots", "", "![length histogram](histogram.png)", "",
              "![predicted vs measured](throughput.png)", "", "![frontier](frontier.png)", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def write_outputs(result: dict, out: Path, *, params: Params) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    metrics = flat_metrics(result)
    (out / "metrics.json").write_text(json.dumps(user_metrics(metrics), indent=2) + "\n")
    (out / "diagnostics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    (out / "frontier.json").write_text(json.dumps(frontier_points(result), indent=2) + "\n")
    tp = [{"strategy": s, "predicted_tok_s": r["predicted_tok_s"], "measured_tok_s": r["measured_tok_s"],
           "padding_model_tok_s": r["ratio_to_sorted_padding"] * result["rows"]["sorted"]["measured_tok_s"]}
          for s, r in result["rows"].items()]
    (out / "throughput.json").write_text(json.dumps(tp, indent=2) + "\n")
    fit = {role: {"chosen": f["best"].to_dict(), "candidates": [c.to_dict() for c in f["candidates"]]}
           for role, f in result["fits"].items()}
    (out / "stepmodel.json").write_text(json.dumps(fit, indent=2) + "\n")
    write_report(result, out, params=params)
    write_plots(result, out)
    write_resolved(params, out)
    return metrics


# --------------------------------------------------------------------------- CLI


def register(parser: argparse.ArgumentParser) -> None:
    from lenbatch.config import add_params_argument

    add_params_argument(parser)
    parser.add_argument("--stats", default="results/stats", help="stats stage output folder")
    parser.add_argument("--boundaries", default="results/boundaries", help="boundaries stage output folder")
    parser.add_argument("--plans", default="results/plans", help="plans stage output folder")
    parser.add_argument("--profile", default="results/profile", help="profile stage output folder")
    parser.add_argument("--train", default="results/train", help="folder of the train stage's <strategy>/ folders")
    parser.add_argument("--data", default="results/tokenize",
                        help="tokenize stage output the runs trained on: lengths.npy (to rebuild the planned "
                        "batches) and dataset/ (loss masks: the drafter's exact anchors; estimated without it)")
    parser.add_argument("--quality", default="results/quality", help="quality stage output folder (quality.json)")
    parser.add_argument("--out", default="results/compare", help="output folder")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    params = params_from_args(args)
    result = compare(params=params, stats_dir=Path(args.stats), boundaries_dir=Path(args.boundaries),
                     plans_dir=Path(args.plans), profile_dir=Path(args.profile), train_dir=Path(args.train),
                     data_dir=Path(args.data), quality_dir=Path(args.quality))
    metrics = write_outputs(result, Path(args.out), params=params)
    for s, r in result["rows"].items():
        log.info("%-9s predicted %8.0f tok/s  measured %8.0f tok/s  error %+5.1f%%", s, r["predicted_tok_s"],
                 r["measured_tok_s"], 100 * r["prediction_error"])
    log.info("recommended: %s, K = %s; max |error| %.1f%%; wrote %s", metrics["recommended.strategy"],
             metrics["recommended.num_buckets"], 100 * metrics["max_abs_prediction_error"], args.out)
    low = busy_machine(result)
    if low:
        log.warning("busy machine: %s of its cores; prediction errors mix other work with model error. Rerun on a "
                    "quiet machine: snakemake --forcerun profile train", ", ".join(low))
    return 0
