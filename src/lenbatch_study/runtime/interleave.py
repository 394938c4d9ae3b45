"""Interleaved measurement: every strategy timed in turns in one process, so a machine's drift falls on all alike.

Separate trainings run one after another; on a shared machine the reference step moves ~13% minute to
minute, so their throughput ratios cannot test a 3% prediction. Here one process steps every strategy's
own batches in short segments, round robin. Each strategy has one segment: ``segment_steps`` steps of its
plan. First every strategy runs ``warmup`` untimed passes over its own segment (its shapes allocated, and
on a GPU its kernels compiled and autotuned, on exactly the shapes that are then timed); then in each of
``rounds`` rounds every strategy times its segment once, in turns of one step (step 0 of every strategy,
then step 1 of every strategy, ...), the order rotated by one each round and each step so no strategy
always follows the same one. A slow minute then slows one round of every strategy, and the ratio of a
round's throughputs cancels it; a drift within the round falls on every strategy's steps alike, however
many steps a segment holds (segments timed one after another would each take a different part of it).

The segment is the same steps in every round, not the next steps of the plan: a round's ratio then
varies only with the timing (the machine), not with which batches fell in it. Distinct batches would fold
the batch-to-batch spread of a plan (a random plan's padding efficiency moves by tens of percent from one
batch to the next) into an interval meant to say how well the machine let the ratio be measured; the
prediction is taken over the same steps (:func:`lenbatch_study.analysis.interleaved.predicted_ratios`), so
how representative the steps are is a question of which steps, answered by the stage
(:mod:`lenbatch_study.stages.interleave` spreads them over the training run's post-warm-up steps).

* :func:`measure_interleaved`: the measurement (``step`` runs one step: single process, target forward
  then drafter step, as :class:`lenbatch_study.runtime.runner.StepRunner` runs them in ``train.nproc: 1``);
* :func:`lenbatch_study.core.intervals.ratio_intervals` turns it into ratios to sorted with their
  95% intervals, paired by round.

Cost: ``(warmup + rounds) x segment_steps`` steps per strategy.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, Sequence


def round_orders(strategies: Sequence[str], rounds: int) -> list[list[str]]:
    """The order of each round: the strategies rotated by ``k`` in round ``k`` (pure, O(rounds x S))."""
    s = list(strategies)
    return [s[k % len(s) :] + s[: k % len(s)] for k in range(rounds)]


def measure_interleaved(
    step: Callable[[str, int], int],
    strategies: Sequence[str],
    *,
    rounds: int,
    segment_steps: int,
    warmup: int,
    clock: Callable[[], float] = time.perf_counter,
    on_round: Optional[Callable[[int, dict[str, dict[str, list]]], None]] = None,
    max_rounds: Optional[int] = None,
    enough: Optional[Callable[[dict[str, dict[str, list]]], bool]] = None,
    done: Optional[dict[str, Any]] = None,
) -> dict[str, dict[str, list]]:
    """Time every strategy in turns: ``step(strategy, j)`` runs step ``j`` (0 .. segment_steps - 1) of that
    strategy's segment and returns its useful tokens. First each strategy's ``warmup`` untimed passes over
    its segment (strategy by strategy), then ``rounds`` rounds (:func:`round_orders`), each timing one pass
    over the segment of every strategy, in turns of one step: step 0 of every strategy in the round's order,
    then step 1 in that order rotated by one, and so on (``clock`` read around each step; a strategy's
    seconds in the round are the sum over its steps). A drift within the round then falls on every
    strategy's steps alike however long the segment is. ``on_round(k, so_far)`` is called after round
    ``k``, outside the timing, with the measurement so far. With ``max_rounds`` (>= ``rounds``) and
    ``enough``, rounds go on after the first ``rounds`` one at a time until ``enough(measured so far)`` is
    true or ``max_rounds`` have run (a sequential stop: the minimum ``rounds`` keeps an early lucky streak
    from ending it). ``done``: the rounds an interrupted run measured (what this function returned after them,
    with ``"_order"``): they are kept, and the rounds go on from the next, in the order the run would have
    taken (the warm-up runs again: a new process).

    Returns ``{strategy: {"seconds": [per round], "useful_tokens": [per round], "position": [its place in
    each round]}}`` plus the rounds as run under the key ``"_order"``. Cost: (warmup + rounds) x
    segment_steps x S calls of ``step``. ``ValueError`` for rounds < 2 (no interval), segment_steps < 1 or
    warmup < 0."""
    if rounds < 2:
        raise ValueError(f"interleave.rounds must be >= 2 (an interval needs two rounds), got {rounds}")
    if segment_steps < 1 or warmup < 0:
        raise ValueError(
            f"interleave.segment_steps must be >= 1 and interleave.warmup >= 0, got {segment_steps}, {warmup}"
        )
    if max_rounds is not None and max_rounds < rounds:
        raise ValueError(
            f"interleave.max_rounds ({max_rounds}) is below interleave.rounds ({rounds}); set max_rounds >= rounds"
        )
    out: dict[str, dict[str, list]] = {s: {"seconds": [], "useful_tokens": [], "position": []} for s in strategies}
    orders: list[list[str]] = []
    if done:
        orders = [list(o) for o in done["_order"]]
        for s in strategies:
            out[s] = {key: list(done[s][key]) for key in ("seconds", "useful_tokens", "position")}
    for s in strategies:  # each strategy's own warm-up, on the very steps it then times
        for _ in range(warmup):
            for j in range(segment_steps):
                step(s, j)
    last = rounds if max_rounds is None or enough is None else max_rounds
    for k, order in enumerate(round_orders(strategies, last)):
        if k < len(orders):  # measured before the interruption
            continue
        if k >= rounds and enough(out):  # type: ignore[misc]
            break
        orders.append(order)
        seconds, useful = dict.fromkeys(order, 0.0), dict.fromkeys(order, 0)
        # step j of every strategy, in the round's order rotated by j: turns of one step each
        for j, turn in enumerate(round_orders(order, segment_steps)):
            for s in turn:
                t0 = clock()
                useful[s] += int(step(s, j))
                seconds[s] += clock() - t0
        for pos, s in enumerate(order):
            out[s]["seconds"].append(seconds[s])
            out[s]["useful_tokens"].append(useful[s])
            out[s]["position"].append(pos)
        if on_round is not None:
            on_round(k, out)
    out["_order"] = orders  # type: ignore[assignment]
    return out


__all__ = ["measure_interleaved", "round_orders"]
