"""BatchSpec (one validated batch specification) and the run schedule (issue 10)."""

import re

import numpy as np
import pytest

import lenbatch as lb
from lenbatch.batching.scan import greedy_starts
from lenbatch.batching.padding import batch_tokens
from lenbatch.loading.sampler import LengthBatchSampler
from lenbatch_study.core.batchspec import batch_spec
from lenbatch_study.runtime.schedule import build_schedule

X = np.random.default_rng(1).integers(1, 300, size=300)
EDGES = (0, 60, 150, 300)


SPEC4 = lb.BatchSpec(token_budget=1024, max_batch_size=16, seed=3, packed_window=4)


def strategy_for(strategy: str) -> lb.Strategy:
    return lb.Strategy.sharing(strategy, EDGES)  # the edges serve bucketed alone


@pytest.mark.parametrize("strategy", lb.STRATEGIES)
@pytest.mark.parametrize("target_ranks", [1, 2])
def test_the_sampler_yields_exactly_the_schedules_batches(strategy, target_ranks):
    """The one check that the schedule the train stage runs is what each rank's sampler yields,
    across an epoch boundary, and that a sampler restored from the schedule's state (what a
    checkpoint stores) continues with the schedule's next batch of its rank."""
    spec, strategy = SPEC4, strategy_for(strategy)
    sched = build_schedule(
        X, strategy=strategy, spec=spec, target_ranks=target_ranks, useful_tokens=int(X.sum()) + int(X.sum()) // 2
    )
    assert {s.epoch for s in sched} == {0, 1} and [s.step for s in sched] == list(range(len(sched)))
    for r in range(target_ranks):
        sampler = LengthBatchSampler(X, strategy=strategy, spec=spec, rank=r, world_size=target_ranks)
        yielded = []
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            yielded += [(epoch, b) for b in sampler]
        mine = [s for s in sched if s.rank == r]
        assert [(s.epoch, s.indices.tolist()) for s in mine] == yielded[: len(mine)]
        for done in (0, 1, len(sched) // 2, len(sched) - 1):
            resumed = LengthBatchSampler(X, strategy=strategy, spec=spec, rank=r, world_size=target_ranks)
            state = sched.sampler_states(done)[r]
            resumed.load_state_dict(state)
            resumed.set_epoch(state["epoch"])
            nxt = next((s for s in sched[done:] if s.rank == r), None)
            if nxt is None:
                continue
            got = next(iter(resumed), None)
            if got is None:  # the restored epoch is used up: the rank's next batch opens the next epoch
                resumed.set_epoch(state["epoch"] + 1)
                got = next(iter(resumed))
            assert got == nxt.indices.tolist()
    # a checkpoint whose sampler state is off by one batch is refused with the fix
    states = sched.sampler_states(3)
    states[0] = dict(states[0], position=states[0]["position"] + 1)
    with pytest.raises(ValueError, match="does not give the planned batch.*without --resume"):
        sched.check_sampler_states(states, 3)
    sched.check_sampler_states(sched.sampler_states(3), 3)


def test_spec_is_validated_once_and_keywords_build_the_same_plan():
    with pytest.raises(ValueError, match="token_budget must be an int"):
        lb.BatchSpec(token_budget=1024.0, max_batch_size=16)
    with pytest.raises(ValueError, match="max_batch_size must be >= 1"):
        lb.BatchSpec(token_budget=1024, max_batch_size=0)
    with pytest.raises(ValueError, match="layout 'rows' unknown"):
        SPEC4.fits(1, 1, layout="rows")
    with pytest.raises(ValueError, match="strictly increasing"):
        lb.Strategy("bucketed", edges=[0, 50, 50, 300])
    with pytest.raises(ValueError, match="either spec= or the batching arguments"):
        lb.plan_epoch(X, strategy="sorted", spec=SPEC4, token_budget=2048)
    spec = SPEC4
    for strategy in lb.STRATEGIES:
        kw = dict(
            token_budget=1024,
            max_batch_size=16,
            seed=3,
            packed_window=4,
            edges=EDGES if strategy == "bucketed" else None,
        )
        a = lb.plan_epoch_all(X, strategy=strategy, epoch=1, world_size=3, **kw)
        s = strategy_for(strategy)
        b = lb.plan_epoch_all(X, strategy=s, epoch=1, world_size=3, spec=spec)
        assert [[x.tolist() for x in r] for r in a] == [[x.tolist() for x in r] for r in b]
        # every batch fits the spec in the strategy's layout, and cost() is the computed tokens the simulation counts
        flat = [x for r in b for x in r]
        assert all(spec.fits(len(x), int(X[x].sum() if s.packed else X[x].max()), layout=s) for x in flat)
        assert [spec.cost(X[x], layout=s) for x in flat] == batch_tokens(X, flat, packed=s.packed)[1].tolist()


def test_fits_is_the_greedy_packers_rule():
    """A greedy batch of the sorted plan fits, and adding the sample that opened the next batch would not."""
    spec = SPEC4
    order = np.argsort(X, kind="stable")
    batches = np.split(order, greedy_starts(X[order], spec.token_budget, spec.max_batch_size)[1:])
    for cur, nxt in zip(batches[:-1], batches[1:]):
        assert spec.fits(len(cur), int(X[cur].max()), layout="padded")
        assert not spec.fits(len(cur) + 1, int(max(X[cur].max(), X[nxt[0]])), layout="padded")


def test_useful_tokens_beyond_ten_thousand_epochs_is_a_value_error_naming_the_setting():
    """Issue 48.5: train.useful_tokens beyond the 10,000-epoch bound planned 10,000 epochs, then raised an
    AssertionError; now a ValueError names the setting and its largest value before anything is planned."""
    spec = SPEC4
    most = 10_000 * int(X.sum())
    with pytest.raises(
        ValueError,
        match=rf"useful_tokens \(train.useful_tokens\) is {most + 1:,}, more than "
        rf"10,000 epochs of these 300 samples .*lower it to at most {most:,}",
    ):
        build_schedule(X, strategy="sorted", spec=spec, target_ranks=1, useful_tokens=most + 1)
    sched = build_schedule(X[:3], strategy="sorted", spec=spec, target_ranks=1, useful_tokens=10_000 * int(X[:3].sum()))
    assert sched[-1].epoch == 9_999  # the bound itself is reachable


# the spec rule of tests/batching/test_spec.py, for the study's schedule and its params
KW = {"token_budget": 512, "max_batch_size": 8}
SPEC = lb.BatchSpec(**KW)
BOTH = re.escape("pass either spec= or the batching arguments, not both")


def test_build_schedule_follows_the_spec_rule():
    from types import SimpleNamespace

    # params= is any object with a .batching section (the study hands its Params: tests/core/test_config.py)
    params = SimpleNamespace(batching=SimpleNamespace(**KW, seed=0, packed_window=8))
    with pytest.raises(ValueError, match=BOTH):
        build_schedule(X, strategy="sorted", target_ranks=1, spec=SPEC, params=params, max_steps=2)
    with pytest.raises(ValueError, match="build_schedule needs its batching"):
        build_schedule(X, strategy="sorted", target_ranks=1, max_steps=2)
    a = build_schedule(X, strategy="sorted", target_ranks=1, params=params, max_steps=3)
    b = build_schedule(X, strategy="sorted", target_ranks=1, spec=SPEC, max_steps=3)
    assert [s.indices.tolist() for s in a] == [s.indices.tolist() for s in b]


def test_a_spec_for_bucketed_can_be_built_before_its_edges_are_known():
    """The boundaries stage builds the spec from the params first and finds the edges after: the spec holds
    no edges (the strategy does), and planning bucketed without edges is what gets refused."""
    from types import SimpleNamespace

    from lenbatch_study.core.batchspec import batch_strategy

    params = SimpleNamespace(batching=SimpleNamespace(token_budget=2048, max_batch_size=16, seed=0, packed_window=8))
    spec = batch_spec(params)
    assert not hasattr(spec, "edges") and not hasattr(spec, "layout")
    assert batch_strategy("sorted", (0, 100, 3000)) == lb.Strategy("sorted")
    assert batch_strategy("bucketed", (0, 100, 3000)).edges == (0, 100, 3000)
    with pytest.raises(ValueError, match="needs edges"):
        lb.plan_epoch(np.array([5, 50, 500]), strategy="bucketed", spec=spec)
