"""A run's planned steps as compare replays them: one epoch's global step order (:func:`_epoch_plan`) and a
run's (epoch, indices) per global step up to a step count or the stop rule (:func:`planned_batches`), from
the train stage's own schedule (:mod:`lenbatch_study.runtime.schedule`).

Separate from :mod:`lenbatch_study.stages.compare` (which imports these names to rebuild the trained and
interleaved steps and to predict whole epochs): which batches a run trains is the runtime's schedule, apart
from predicting them. Cost: one plan per call.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lenbatch_study.core.batchspec import batch_spec, batch_strategy
from lenbatch_study.core.config import Params
from lenbatch_study.runtime.schedule import build_schedule, epoch_steps


def _epoch_plan(
    lengths: np.ndarray, params: Params, strategy: str, edges: Any, *, epoch: int, target_ranks: int
) -> list[np.ndarray]:
    """One epoch's global step order, as the train stage runs it (:func:`lenbatch_study.runtime.schedule.epoch_steps`)."""
    spec = batch_spec(params)
    return [
        idx
        for _, _, idx in epoch_steps(
            lengths, strategy=batch_strategy(strategy, edges), spec=spec, target_ranks=target_ranks, epoch=epoch
        )
    ]


def planned_batches(
    lengths: np.ndarray,
    params: Params,
    strategy: str,
    edges: Any,
    *,
    steps: int | None = None,
    useful_tokens: int | None = None,
    target_ranks: int,
) -> list[tuple[int, np.ndarray]]:
    """(epoch, indices) of a run's global steps, in order: the train stage's schedule
    (:func:`lenbatch_study.runtime.schedule.build_schedule`) up to ``steps`` steps or to its stop rule at ``useful_tokens``."""
    assert (steps is None) != (useful_tokens is None)
    sched = build_schedule(
        lengths,
        strategy=strategy,
        params=params,
        edges=edges,
        target_ranks=target_ranks,
        useful_tokens=useful_tokens,
        max_steps=steps,
    )
    return [(s.epoch, s.indices) for s in sched]
