"""compare's inputs, read and checked: a training run (its summary and steps, refused when it was measured
with other params than the current ones, :data:`RUN_KEYS`), the profile grid's shape table
(:func:`grid_columns`) and the step-time models fitted on it (:func:`fit_profile`, refused when the grid was
timed with other params, :data:`PROFILE_KEYS`).

Separate from :mod:`lenbatch_study.stages.compare` (which predicts every run from these and builds the
result; it imports these names): what may be compared, and the fits it is predicted with, apart from the
prediction. Cost: the files' reads; the fits' held-out splits.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lenbatch_study.analysis import shapes
from lenbatch_study.analysis import stepmodel as sm, transport_model as tm
from lenbatch_study.core.config import Params
from lenbatch_study.pipeline.artifacts import profile_grid, train_runs

# Params a training run must share with the current params to be compared (section -> keys; None: all).
RUN_KEYS: dict[str, tuple[str, ...] | None] = {
    "batching": None,
    "model": None,
    "drafter": None,
    "train": ("nproc", "nodes", "useful_tokens", "warmup_steps", "queue_size", "threads"),
}
# Params the profile grid must share with the current params (the shapes are timed on this model).
PROFILE_KEYS: dict[str, tuple[str, ...] | None] = {
    "model": None,
    "drafter": None,
    "train": ("nproc", "threads", "kernels", "reuse_host_memory"),
}


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


def load_run(train_dir: Path, strategy: str, params: Params) -> dict:
    """summary.json + steps.jsonl of one strategy (:func:`lenbatch_study.pipeline.artifacts.train_runs.read_run`),
    checked against the current params."""
    run = train_runs.read_run(train_dir, strategy)
    diff = params_mismatch(run["summary"]["params"], params.to_dict(), RUN_KEYS)
    if diff:
        raise ValueError(
            f"strategy {strategy} was measured with other params than the current ones "
            f"({'; '.join(diff)}); rerun: {train_runs.rerun(Path(train_dir) / strategy, strategy)}"
        )
    return run


def grid_columns(rows: list[dict]) -> dict[str, np.ndarray]:
    """Shape table of the profile grid rows (from each row's sequence lengths)."""
    lengths, batches, layouts = [], [], []
    start = 0
    for r in rows:
        if not r.get("sequence_lengths"):
            raise ValueError(
                "the profile grid rows lack sequence_lengths (an older grid.json); rerun: "
                f"snakemake {profile_grid.GRID_PATH}"
            )
        ls = r["sequence_lengths"]
        lengths.extend(int(x) for x in ls)
        batches.append(np.arange(start, start + len(ls)))
        layouts.append(r["layout"])
        start += len(ls)
    arr = np.asarray(lengths, dtype=np.int64)
    # a grid without lm_chunks (recorded since the chunk term) leaves them NaN: chunks of a mean would mislead
    per = [
        shapes.batch_columns(
            arr,
            [b],
            layout=k,
            drafter=(np.array([float(r["positions"])]), np.array([float(r["ctx_tokens"])]))
            if "positions" in r
            else None,
            lm_chunks=np.array([float(r.get("lm_chunks", np.nan))]),
        )
        for b, k, r in zip(batches, layouts, rows)
    ]
    return {key: np.concatenate([c[key] for c in per]) for key in per[0]} if per else {}


def fit_profile(profile_dir: Path, params: Params) -> dict:
    """Fit target and drafter step-time models on the profile grid (held-out model choice), each point's
    seconds taken from its timed passes with the machine's drift between passes taken out
    (:func:`lenbatch_study.analysis.stepmodel.pass_corrected_seconds`)."""
    grid = profile_grid.read_grid_document(profile_dir)
    rows = grid["points"]
    resolved = profile_grid.read_profile_params(profile_dir)
    if resolved is not None:
        diff = params_mismatch(resolved, params.to_dict(), PROFILE_KEYS)
        if diff:
            raise ValueError(
                f"the profile grid was timed with other params ({'; '.join(diff)}); rerun: "
                f"{profile_grid.rerun(Path(profile_dir))}"
            )
    cols = grid_columns(rows)
    fits = {}
    # "<role>" fits the step timed alone; "<role>_busy" (lockstep profile) the step timed while the
    # other role works; compare.contention picks which of them predict a pipelined run
    busy = bool(rows) and all("target_busy_seconds_median" in r and "drafter_busy_seconds_median" in r for r in rows)
    for role in ("target", "drafter") + (("target_busy", "drafter_busy") if busy else ()):
        fits[role] = sm.fit_role(
            cols,
            [r[f"{role}_seconds_all"] for r in rows],
            role=role,
            holdout_fraction=params.compare.holdout_fraction,
            seed=params.batching.seed,
        )
    return {
        "rows": rows,
        "fits": fits,
        "machine": grid["machine"],
        "reference": grid["reference"],
        "transport": tm.fit_transport(grid["transport"]),
    }
