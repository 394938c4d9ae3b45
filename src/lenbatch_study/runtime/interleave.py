"""Interleaved measurement: every strategy timed in turns in one process, so a machine's drift falls on all alike.

Separate trainings run one after another; on a shared machine the reference step moves ~13% minute to
minute, so their throughput ratios cannot test a 3% prediction. Here one process steps every strategy's
own batches in short segments, round robin: each strategy first runs ``warmup`` untimed steps of its own,
then round ``k`` times segment ``k`` of every strategy (``segment_steps`` consecutive batches of its plan),
the order rotated by one each round so no strategy always follows the same one. A slow minute then slows
one round of every strategy, and the ratio of a round's throughputs cancels it.

* :func:`measure_interleaved`: the measurement (single process: target forward then drafter step, as
  :class:`lenbatch_study.runtime.runner.StepRunner` runs them in ``train.nproc: 1``);
* :func:`lenbatch_study.analysis.interleaved.ratio_intervals` turns it into ratios to sorted with their
  95% intervals, paired by round.

Cost: ``rounds x segment_steps`` timed steps per strategy plus its warm-up.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence


def round_orders(strategies: Sequence[str], rounds: int) -> list[list[str]]:
    """The order of each round: the strategies rotated by ``k`` in round ``k`` (pure, O(rounds x S))."""
    s = list(strategies)
    return [s[k % len(s):] + s[:k % len(s)] for k in range(rounds)]


def measure_interleaved(step: Callable[[str, int], int], strategies: Sequence[str], *, rounds: int,
                        segment_steps: int, warmup: int, clock: Callable[[], float] = time.perf_counter
                        ) -> dict[str, dict[str, list]]:
    """Time every strategy in turns: ``step(strategy, i)`` runs step ``i`` of that strategy's plan and
    returns its useful tokens. First each strategy's ``warmup`` steps (untimed, in strategy order), then
    ``rounds`` rounds (:func:`round_orders`), each timing segment ``k`` (steps ``warmup + k *
    segment_steps ...``) of every strategy.

    Returns ``{strategy: {"seconds": [per round], "useful_tokens": [per round], "position": [its place
    in each round]}}`` plus ``"order"`` under the key ``"_order"`` (the rounds as run).
    ``ValueError`` for rounds < 2 (no interval) or segment_steps < 1."""
    if rounds < 2:
        raise ValueError(f"interleaved rounds must be >= 2 (an interval needs two rounds), got {rounds}")
    if segment_steps < 1 or warmup < 0:
        raise ValueError(f"interleaved segment_steps must be >= 1 and warmup >= 0, got {segment_steps}, {warmup}")
    out: dict[str, dict[str, list]] = {s: {"seconds": [], "useful_tokens": [], "position": []} for s in strategies}
    for s in strategies:  # each strategy's own warm-up (its shapes compiled, its allocator warmed)
        for i in range(warmup):
            step(s, i)
    orders = round_orders(strategies, rounds)
    for k, order in enumerate(orders):
        for pos, s in enumerate(order):
            first = warmup + k * segment_steps
            t0 = clock()
            useful = sum(step(s, first + j) for j in range(segment_steps))
            out[s]["seconds"].append(clock() - t0)
            out[s]["useful_tokens"].append(int(useful))
            out[s]["position"].append(pos)
    out["_order"] = orders  # type: ignore[assignment]
    return out


__all__ = ["measure_interleaved", "round_orders"]
