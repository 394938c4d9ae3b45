"""The study's run schedule: the global step order over the target ranks and the useful-token stop rule.

One function of (lengths, strategy, :class:`lenbatch.BatchSpec`, target ranks) that the train stage
runs and the compare stage predicts, so both walk the same steps:

* epoch ``e`` is planned once for all target ranks (``plan_epoch_all(..., world_size=R)``: the
  ranks get equally many batches); global step ``g`` of the epoch is batch ``g // R`` of target
  rank ``g % R`` (the drafter rank takes the ranks round-robin);
* epochs 0, 1, ... follow one another; the run stops at the first step at which the useful tokens
  trained reach ``useful_tokens``, or after ``max_steps`` steps, whichever comes first.

Across nodes (``nodes`` machines of ``ranks_per_node`` target ranks and one drafter each) the plan is
sharded over all ``nodes x ranks_per_node`` target ranks; target rank ``r`` lives on node
``r // ranks_per_node``, whose drafter takes that node's steps in schedule order. Cluster step ``c`` is
every node's ``c``-th step (:func:`cluster_steps`): the drafters train one model on them at once. After
whole rounds of ``R`` global steps every node has trained the same number of steps, so a checkpoint is
taken only where the steps trained are a prefix of the schedule.

Every step carries its batch's sample indices, so a target rank trains ``step.indices`` without
planning again. The sampler state of every rank after any step is a function of the schedule
(:meth:`Schedule.sampler_states`): a checkpoint stores the same dicts
:meth:`lenbatch.LengthBatchSampler.state_dict` returns, and ``LengthBatchSampler.load_state_dict``
of them resumes at the schedule's next batch of that rank (tests/runtime/test_schedule.py checks this once).

Cost: one ``plan_epoch_all`` per epoch the run touches, O(steps) beyond that.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from lenbatch.batching.spec import BatchSpec, check_int, refuse_both
from lenbatch.batching.state import sampler_state
from lenbatch.batching.strategies import check_plan, plan_epoch_all
from lenbatch.batching.strategy import Strategy
from lenbatch_study.core.batchspec import batch_spec, batch_strategy


@dataclass(frozen=True)
class ScheduledStep:
    step: int  # global step (drafter optimizer step)
    epoch: int
    rank: int  # target rank that computes it
    local: int  # index of the batch in that rank's epoch plan
    indices: np.ndarray
    useful: int


def round_robin(plans: list[Any]) -> Iterator[tuple[int, int, np.ndarray]]:
    """(rank, local, indices) of one epoch's global steps, in order: batch ``local`` of every rank
    in turn, from every rank's plan of the epoch (``plan_epoch_all``)."""
    sizes = {len(p) for p in plans}
    assert len(sizes) == 1, f"ranks got different batch counts {sizes}: the plan broke its contract"
    for local in range(sizes.pop()):
        for r in range(len(plans)):
            yield r, local, np.asarray(plans[r][local], dtype=np.int64)


def epoch_steps(
    lengths: np.ndarray, *, strategy: "str | Strategy", spec: BatchSpec, target_ranks: int, epoch: int
) -> Iterator[tuple[int, int, np.ndarray]]:
    """(rank, local, indices) of one epoch's global steps (planned once for all target ranks)."""
    return round_robin(plan_epoch_all(lengths, strategy=strategy, epoch=epoch, world_size=target_ranks, spec=spec))


class Schedule(list):
    """Every global step of a run (a ``list`` of :class:`ScheduledStep`), with what made it."""

    def __init__(
        self,
        steps: list[ScheduledStep],
        *,
        lengths: np.ndarray,
        strategy: "str | Strategy",
        spec: BatchSpec,
        target_ranks: int,
    ) -> None:
        super().__init__(steps)
        self.plan_strategy = Strategy.of(strategy)
        self.strategy = self.plan_strategy.name
        self.spec = spec
        self.target_ranks = target_ranks
        self.fingerprint = spec.fingerprint(lengths, self.plan_strategy)

    def sampler_states(self, done: int) -> list[dict[str, Any]]:
        """Each target rank's ``LengthBatchSampler`` state once steps ``0 .. done-1`` are trained:
        the epoch of the rank's last trained batch and the batches of it handed out (epoch 0,
        position 0 before its first)."""
        last: dict[int, ScheduledStep] = {}
        for s in self[:done]:
            last[s.rank] = s
        return [
            sampler_state(
                epoch=last[r].epoch if r in last else 0,
                position=last[r].local + 1 if r in last else 0,
                world_size=self.target_ranks,
                rank=r,
                fingerprint=self.fingerprint,
                strategy=self.strategy,
            )
            for r in range(self.target_ranks)
        ]

    def check_sampler_states(self, states: Any, done: int) -> None:
        """``ValueError`` when a checkpoint's sampler states are not the schedule's after ``done`` steps
        (the checkpoint, the data or the planning code changed since it was written)."""
        expected = self.sampler_states(done)
        states = list(states) if isinstance(states, (list, tuple)) else [states]
        for r, want in enumerate(expected):
            if r < len(states) and states[r] == want:
                continue
            step = next((s.step for s in self[done:] if s.rank == r), done)
            raise ValueError(
                f"the checkpoint's sampler state (rank {r}) does not give the planned batch "
                f"of step {step}: the data, the planning code or the checkpoint changed since it "
                "was written; run without --resume to start afresh"
            )


def node_of(target_rank: int, *, ranks_per_node: int) -> int:
    """The node of global target rank ``target_rank`` (``ranks_per_node`` target ranks per node)."""
    return int(target_rank) // int(ranks_per_node)


def cluster_steps(
    steps: Sequence[ScheduledStep], *, nodes: int, ranks_per_node: int
) -> list[list[Optional[ScheduledStep]]]:
    """The cluster steps of ``steps`` (a schedule or its tail from a round boundary): entry ``c`` holds, per
    node, that node's ``c``-th step in schedule order (None for a node whose steps ran out: only in the last
    ``ranks_per_node`` cluster steps, which a stop inside a round leaves short). ``nodes = 1``: one step each,
    the schedule's order. Pure; O(steps)."""
    per_node: list[list[ScheduledStep]] = [[] for _ in range(nodes)]
    for s in steps:
        per_node[node_of(s.rank, ranks_per_node=ranks_per_node)].append(s)
    n = max((len(p) for p in per_node), default=0)
    return [[p[c] if c < len(p) else None for p in per_node] for c in range(n)]


# the longest schedule build_schedule plans, in epochs of the whole data set
_MAX_EPOCHS = 10_000


def build_schedule(
    lengths: np.ndarray,
    *,
    strategy: "str | Strategy",
    target_ranks: int,
    spec: Optional[BatchSpec] = None,
    params: Any = None,
    edges: Any = None,
    useful_tokens: Optional[int] = None,
    max_steps: Optional[int] = None,
) -> Schedule:
    """Every global step of the run: round-robin over target ranks, epochs 0, 1, ... until
    ``useful_tokens`` useful tokens (or ``max_steps`` steps). The limits come whole as ``spec`` or from
    ``params``, not both; ``strategy`` is a name (``edges`` beside it, kept for ``bucketed`` alone) or a
    :class:`lenbatch.Strategy`. Pure; O(epochs * plan cost)."""
    refuse_both(spec, params=params)
    if spec is None:
        if params is None:
            raise ValueError("build_schedule needs its batching: pass spec=lenbatch.BatchSpec(...) or params=")
        spec = batch_spec(params)
    strategy = batch_strategy(strategy, edges)
    if useful_tokens is None and max_steps is None:
        raise ValueError("build_schedule needs a stop: pass useful_tokens= (train.useful_tokens) or max_steps=")
    target_ranks = check_int("target_ranks", target_ranks, minimum=1)
    x = check_plan(lengths, strategy=strategy, spec=spec)
    per_epoch = int(x.sum())  # every epoch trains every sample once
    if useful_tokens is not None and max_steps is None and useful_tokens > _MAX_EPOCHS * per_epoch:
        # refused before planning: the loop below would plan 10,000 epochs first
        raise ValueError(
            f"useful_tokens (train.useful_tokens) is {useful_tokens:,}, more than {_MAX_EPOCHS:,} epochs "
            f"of these {x.size:,} samples ({per_epoch:,} useful tokens an epoch); lower it to at most "
            f"{_MAX_EPOCHS * per_epoch:,} or train on more data"
        )
    steps: list[ScheduledStep] = []
    done, epoch = 0, 0
    while True:
        plans = plan_epoch_all(x, strategy=strategy, epoch=epoch, world_size=target_ranks, spec=spec)
        for r, local, idx in round_robin(plans):
            useful = int(x[idx].sum())
            steps.append(ScheduledStep(len(steps), epoch, r, local, idx, useful))
            done += useful
            if (useful_tokens is not None and done >= useful_tokens) or (
                max_steps is not None and len(steps) >= max_steps
            ):
                return Schedule(steps, lengths=x, strategy=strategy, spec=spec, target_ranks=target_ranks)
        epoch += 1
        if epoch > _MAX_EPOCHS:  # only with max_steps: useful_tokens beyond the bound is refused above
            raise ValueError(
                f"the schedule reached {_MAX_EPOCHS:,} epochs before max_steps={max_steps:,} or "
                f"useful_tokens (train.useful_tokens); lower them"
            )
