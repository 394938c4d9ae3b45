"""A run's steps as a shape table and their predicted times: the dataset's loss masks read on demand
(:class:`LossMasks`, the drafter's anchors depend on them), the shape table of a run's steps with the
drafter's exact work (:func:`step_columns`), the step-time model's step seconds, pipelined run time and
useful tokens/s for it (:func:`predict_steps`), and a run's loss curve (:func:`loss_curve`).

Separate from :mod:`lenbatch_study.stages.compare` (which plans the runs' steps, predicts every strategy
and K and builds the result; it imports these names): predicting the steps of a given plan, apart from
which plans are predicted and compared. Cost: O(steps) per prediction (the drafter's exact work: its
anchors drawn per step).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lenbatch_study.analysis import shapes
from lenbatch_study.analysis import stepmodel as sm, transport_model as tm
from lenbatch_study.core.config import Params
from lenbatch_study.pipeline.artifacts import tokenized

# The train stage's drafter rank never waits on its outstanding acknowledgements, so the pipeline is
# replayed without that stall (stepmodel.pipeline_ends(ack_every=...) can simulate one: waiting once
# more than 4 x queue_size were pending cost up to 6% of a 20-step run); replaying measured step times
# this way matches the runs within 0.8%.
ACK_EVERY: int | None = None


class LossMasks:
    """Loss masks of the tokenized dataset, read on demand (the drafter's anchors depend on them); none when
    ``data_dir`` has no dataset (then the drafter's work is estimated)."""

    def __init__(self, data_dir: Path | None, lengths: np.ndarray | None = None) -> None:
        self.ds = None
        self.cache: dict[int, np.ndarray] = {}
        if data_dir is not None and (Path(data_dir) / tokenized.DATASET).exists():
            if lengths is None:
                lengths = tokenized.read_lengths(data_dir)
            self.ds = tokenized.read_dataset(data_dir, lengths, columns=("loss_mask",))

    @property
    def available(self) -> bool:
        return self.ds is not None

    def get(self, indices: np.ndarray) -> list[np.ndarray]:
        missing = sorted({int(i) for i in indices} - set(self.cache))
        if missing:
            for i, m in zip(missing, self.ds.loss_masks(missing)):
                self.cache[i] = m
        return [self.cache[int(i)] for i in indices]


def step_columns(
    lengths: np.ndarray,
    steps: list[tuple[int, np.ndarray]],
    *,
    layout: str,
    params: Params,
    masks: LossMasks,
    numbers: list[int] | None = None,
) -> dict[str, np.ndarray]:
    """Shape table of a run's steps, with the drafter's exact work when the loss masks are available
    (its anchors drawn for step ``numbers[i]``, default ``i``: the run's global step numbers)."""
    batches = [b for _, b in steps]
    d = params.drafter
    if not masks.available:
        return shapes.batch_columns(
            lengths, batches, layout=layout, positions_per_seq=d.anchors_per_seq * (d.block_size - 1)
        )
    work = [
        shapes.drafter_work(
            lengths[b],
            masks.get(b),
            b,
            anchors_per_seq=d.anchors_per_seq,
            block_size=d.block_size,
            seed=params.batching.seed,
            epoch=epoch,
            step=i if numbers is None else numbers[i],
        )
        for i, (epoch, b) in enumerate(steps)
    ]
    return shapes.batch_columns(
        lengths,
        batches,
        layout=layout,
        drafter=(np.array([w[0] for w in work], dtype=float), np.array([w[1] for w in work], dtype=float)),
    )


def predict_steps(
    cols: dict[str, np.ndarray],
    *,
    fits: dict,
    params: Params,
    target_ranks: int,
    scale: dict[str, float] | None = None,
    allreduce_s: float = 0.0,
    transport: dict | None = None,
) -> dict:
    """Predicted step times, pipelined run time and useful tokens/s of a run's shape table.

    One process: the target and drafter steps add up (timed alone). Pipelined, by
    ``compare.contention`` when the grid has busy timings (else alone): busy times, alone
    times, or each step blended between the two by how much the other role works during it
    (:func:`lenbatch_study.analysis.stepmodel.blended_pipeline`). ``scale``: each role's step times
    (alone and busy) multiplied by its reference ratio (the calibrated prediction,
    :mod:`lenbatch_study.analysis.calibration`); None: the raw prediction. ``train.nodes`` > 1: the nodes'
    drafters step together, each cluster step ending ``allreduce_s`` (the measured all-reduce) after the
    slowest node's drafter step (:func:`lenbatch_study.analysis.stepmodel.pipeline_timeline`).
    ``transport``: the features' receive on the drafter's path, staging on the target's (:mod:`.transport_model`).
    """
    moved, stage = tm.step_transport(cols, transport, params)
    nodes = {"nodes": params.train.nodes, "allreduce_s": allreduce_s, "transport_s": moved}

    def predict(role: str) -> np.ndarray:
        return fits[role]["best"].predict(cols) * (scale or {}).get(role.removesuffix("_busy"), 1.0)

    target = predict("target")
    drafter = predict("drafter")
    mode = params.compare.contention if "target_busy" in fits else "alone"
    if params.train.nproc == 1:
        ends = sm.pipeline_ends(target + drafter)
    elif mode == "blend":
        tl = sm.blended_pipeline(
            target + stage,
            predict("target_busy") + stage,
            drafter,
            predict("drafter_busy"),
            queue_size=params.train.queue_size,
            target_ranks=target_ranks,
            ack_every=ACK_EVERY,
            **nodes,
        )
        target, drafter, ends = tl["target_s"] - stage, tl["drafter_s"], tl["end"]
    else:
        if mode == "busy":
            target, drafter = (predict(f"{r}_busy") for r in ("target", "drafter"))
        ends = sm.pipeline_ends(
            target + stage,
            drafter,
            queue_size=params.train.queue_size,
            target_ranks=target_ranks,
            ack_every=ACK_EVERY,
            **nodes,
        )
    tput = sm.throughput(cols["useful_tokens"], ends, warmup_steps=params.train.warmup_steps)
    w = params.train.warmup_steps
    return {
        "columns": cols,
        "target_s": target,
        "drafter_s": drafter,
        "ends": ends,
        "transport_s": moved,
        "stage_s": stage,
        "tok_s": tput,
        "seconds": float(ends[-1] - (ends[w - 1] if w > 0 else 0.0)),
    }


def loss_curve(steps: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(useful tokens trained so far, loss) after every step of a run, from its steps.jsonl rows."""
    rows = sorted(steps, key=lambda r: int(r["step"]))
    toks = np.cumsum([float(r["useful_tokens"]) for r in rows])
    return toks, np.array([float(r["loss"]) for r in rows])
