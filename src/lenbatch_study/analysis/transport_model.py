"""The features' transport in the trainings' prediction (compare's; numpy only).

A separate (multi-process) training moves every step's batch and features from its target rank to the drafter
rank (:mod:`lenbatch_study.runtime.transport`): the target rank copies them onto the data group's device
(``stage``: device -> host under gloo, ~0 on CPU), the drafter rank receives them (``receive``: gloo through the
host, or NCCL device to device, plus the copy onto its device). The profile measures both on its grid's batches
(:func:`lenbatch_study.pipeline.artifacts.profile_grid.read_transport`); here they are fitted as seconds linear
in bytes (:func:`lenbatch_study.analysis.stepmodel.fit_transport`) and predicted for a plan's steps from their
bytes (:func:`lenbatch_study.analysis.shapes.transport_bytes`); the step model puts the receive on the
drafter's critical path (:func:`lenbatch_study.analysis.step_timeline.pipeline_timeline`, ``transport_s``) and
the staging on the target rank's. One process (``train.nproc`` 1, the interleave stage) moves nothing.
"""

from __future__ import annotations

import numpy as np

from lenbatch_study.analysis import shapes, stepmodel as sm
from lenbatch_study.core.config import Params


def fit_transport(measured: dict | None) -> dict | None:
    """The features' transport fitted on the profile's measurement (``profile_grid.read_transport``): the drafter
    rank's receive and the target rank's staging, seconds linear in bytes
    (:func:`lenbatch_study.analysis.stepmodel.fit_transport`), with the backend; None for a grid without it."""
    if measured is None:
        return None
    stage = [[max(float(x), 1e-9) for x in st] for st in measured["stage"]]  # a no-op copy may time as 0
    return {
        "backend": measured["backend"],
        "receive": sm.fit_transport(measured["bytes"], measured["seconds"], role="receive"),
        "stage": sm.fit_transport(measured["bytes"], stage, role="stage"),
    }


def transport_seconds(cols: dict[str, np.ndarray], transport: dict, params: Params) -> tuple[np.ndarray, np.ndarray]:
    """Predicted (receive, staging) seconds of each step of a shape table: its bytes on the wire
    (:func:`lenbatch_study.analysis.shapes.transport_bytes`) through the profile's transport fits."""
    m = params.model
    nbytes = shapes.transport_bytes(
        cols["computed_tokens"],
        cols["sequences"],
        feature_dim=len(m.target_layers) * m.hidden_size,
        itemsize=shapes.ITEMSIZE[m.dtype],
    )
    return transport["receive"].predict(nbytes), transport["stage"].predict(nbytes)


def step_transport(
    cols: dict[str, np.ndarray], transport: dict | None, params: Params
) -> tuple[np.ndarray | None, np.ndarray]:
    """:func:`transport_seconds` of a separate training (``train.nproc`` > 1) whose profile measured the
    transport; (None, zeros) otherwise: one process moves no features, a grid without it predicts without."""
    if transport is None or params.train.nproc == 1:
        return None, np.zeros(len(cols["computed_tokens"]))
    return transport_seconds(cols, transport, params)


def measured_transport(rows: list[dict]) -> tuple[np.ndarray | None, np.ndarray | float]:
    """A run's measured (receive, staging) seconds per step, from its ``steps.jsonl`` rows in step order, for
    replaying it through the pipeline model; (None, 0.0) for a run that recorded no transport."""
    if not rows or not all("transport_s" in r and "stage_s" in r for r in rows):
        return None, 0.0
    return (np.array([float(r["transport_s"]) for r in rows]), np.array([float(r["stage_s"]) for r in rows]))


def describe(transport: dict | None) -> dict | None:
    """The transport fits as plain numbers (the report's and diagnostics' ``fit.transport.*``)."""
    if transport is None:
        return None
    return {"backend": transport["backend"], **{k: transport[k].to_dict() for k in ("receive", "stage")}}


def transport_row(rows: list[dict], pred: dict, *, warmup_steps: int) -> dict[str, float]:
    """Mean transport seconds per post-warm-up step (``rows``: a run's ``steps.jsonl`` rows in step order),
    predicted (the drafter rank's receive of ``pred["transport_s"]``, NaN where none was modelled) and measured
    (the run's ``transport_s``, NaN for a run that recorded none)."""
    rows = rows[warmup_steps:]
    measured = (
        float(np.mean([float(r["transport_s"]) for r in rows]))
        if rows and all("transport_s" in r for r in rows)
        else float("nan")
    )
    moved = pred.get("transport_s")
    predicted = float(np.mean(moved[warmup_steps:])) if moved is not None else float("nan")
    return {"predicted_transport_s": predicted, "measured_transport_s": measured}
