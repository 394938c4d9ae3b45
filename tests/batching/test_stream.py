"""The stream planner by the in-memory planner's checks: every sample once per pass over all ranks, equal
batches per rank, no batch over the budget or the batch size, a function of its inputs alone, a new
shuffle per epoch; and its padding close to the in-memory plan's with a buffer of a few thousand."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lenbatch as lb
from _chat_lengths import chat_lengths
from lenbatch.batching.spec import BatchSpec
from lenbatch.batching.stream import STREAM_STRATEGIES, StreamPlanner, plan_stream
from test_strategies import _check_plan


def _spec(strategy, budget, mbs, window=8, seed=3):
    return BatchSpec(token_budget=budget, max_batch_size=mbs, seed=seed, packed_window=window)


@st.composite
def cases(draw):
    budget = draw(st.integers(8, 400))
    n = draw(st.integers(1, 150))
    x = np.asarray(draw(st.lists(st.integers(1, budget), min_size=n, max_size=n)), dtype=np.int64)
    mbs = draw(st.integers(1, 12))
    cuts = sorted(set(draw(st.lists(st.integers(2, budget), max_size=4))))
    edges = draw(st.sampled_from([None, [0, *cuts, budget + 1]]))
    return x, budget, mbs, edges


@settings(max_examples=80, deadline=None)
@given(
    case=cases(),
    strategy=st.sampled_from(STREAM_STRATEGIES),
    world_size=st.integers(1, 8),
    epoch=st.integers(0, 3),
    buffer_size=st.integers(1, 40),
    window=st.integers(1, 4),
)
def test_stream_plans_are_lossless_balanced_and_within_budget(case, strategy, world_size, epoch, buffer_size, window):
    x, budget, mbs, edges = case
    spec = _spec(strategy, budget, mbs, window)
    kw = dict(
        strategy=strategy,
        spec=spec,
        edges=edges if strategy == "bucketed" else None,
        buffer_size=buffer_size,
        epoch=epoch,
    )
    try:
        ranks = plan_stream(x, world_size=world_size, **kw)
    except ValueError as err:  # only when the stream has fewer samples than the ranks need batches
        nb = len(plan_stream(x, world_size=1, **kw)[0])
        assert "world_size" in str(err) and -(-nb // world_size) * world_size > x.size
        return
    _check_plan(x, ranks, strategy, budget, mbs)
    again = plan_stream(x, world_size=world_size, **kw)  # a function of its inputs alone
    assert all(len(a) == len(b) and all(np.array_equal(p, q) for p, q in zip(a, b)) for a, b in zip(ranks, again))


@pytest.mark.parametrize("strategy", STREAM_STRATEGIES)
@pytest.mark.parametrize("world_size", [1, 3, 8])
def test_the_ranks_take_turns_in_one_global_sequence(strategy, world_size):
    """Rank r's batches are the r-th of every step of the one-rank sequence, up to the split tail."""
    x = chat_lengths(3000, seed=2)
    spec = _spec(strategy, 16384, 64)
    one = plan_stream(x, strategy=strategy, spec=spec, buffer_size=500)[0]
    many = plan_stream(x, strategy=strategy, spec=spec, buffer_size=500, world_size=world_size)
    _check_plan(x, many, strategy, 16384, 64)
    steps = len(many[0])
    assert steps == -(-len(one) // world_size) or steps * world_size <= len(one) + world_size
    head = (len(one) // world_size - 2) * world_size  # steps released before the tail are untouched
    for i in range(head):
        assert np.array_equal(many[i % world_size][i // world_size], one[i])


@pytest.mark.parametrize("strategy", STREAM_STRATEGIES)
def test_padding_is_within_a_point_of_the_in_memory_plan(strategy):
    x = chat_lengths(60_000, seed=4)
    budget, mbs = 16384, 64
    edges = lb.optimize_boundaries(x, 6, token_budget=budget, max_batch_size=mbs).edges
    e = edges if strategy == "bucketed" else None
    stream = [
        b
        for r in plan_stream(
            x, strategy=strategy, spec=_spec(strategy, budget, mbs), edges=e, buffer_size=4096, world_size=8
        )
        for b in r
    ]
    memory = [
        b
        for r in lb.plan_epoch_all(x, strategy=strategy, token_budget=budget, max_batch_size=mbs, edges=e, world_size=8)
        for b in r
    ]
    for metric in (
        lambda b: lb.padding_efficiency(x, b, strategy=strategy),
        lambda b: lb.budget_fill(x, b, budget, strategy=strategy),
    ):
        assert abs(metric(stream) - metric(memory)) < 0.01
    assert abs(len(stream) - len(memory)) <= 0.01 * len(memory)


def test_estimated_edges_cover_every_later_length_and_pad_like_given_edges():
    x = chat_lengths(30_000, seed=5)
    spec = _spec("bucketed", 16384, 64)
    planner = StreamPlanner(strategy="bucketed", spec=spec, buffer_size=2000)
    for L in x.tolist():
        planner.push(L)
    planner.finish()
    assert planner.edges[0] == 0 and planner.edges[-1] == 16385 and len(planner.edges) == 7
    batches = [b for s in planner.take_steps() for b in s]
    given_edges = lb.optimize_boundaries(x, 6, token_budget=16384, max_batch_size=64).edges
    ref = plan_stream(x, strategy="bucketed", spec=_spec("bucketed", 16384, 64), edges=given_edges, buffer_size=2000)[0]
    assert lb.padding_efficiency(x, batches) > lb.padding_efficiency(x, ref) - 0.02


@pytest.mark.parametrize("strategy", STREAM_STRATEGIES)
def test_a_new_shuffle_every_epoch(strategy):
    x = chat_lengths(5000, seed=6)
    spec = _spec(strategy, 16384, 64)
    e0, e1 = (plan_stream(x, strategy=strategy, spec=spec, buffer_size=1000, epoch=e)[0] for e in (0, 1))
    assert lb.composition_repeat(e0, e1, x.size) < 0.5


def test_memory_is_bounded_by_the_buffer_and_the_open_batches():
    x = chat_lengths(20_000, seed=7)
    for strategy, extra in (("random", 64), ("bucketed", 6 * 64), ("packed", 8 * 64), ("sortish", 50 * 64)):
        planner = StreamPlanner(strategy=strategy, spec=_spec(strategy, 16384, 64), buffer_size=1000, world_size=4)
        for L in x.tolist():
            planner.push(L)
            planner.take_steps()
        held_back = 4 * 64 * 3  # about one step held back, a step being formed
        assert 1000 < planner.peak_held <= 1000 + extra + held_back, (strategy, planner.peak_held)


def test_a_stream_refuses_sorted_and_over_budget_samples():
    with pytest.raises(ValueError, match="sortish"):
        StreamPlanner(strategy="sorted", spec=_spec("sorted", 100, 4), buffer_size=10)
    p = StreamPlanner(strategy="random", spec=_spec("random", 100, 4), buffer_size=10)
    p.push(100)
    with pytest.raises(ValueError, match=r"sample 1 of the stream has 101 tokens.*raise token_budget"):
        p.push(101)
    p = StreamPlanner(strategy="bucketed", spec=_spec("bucketed", 100, 4), edges=[0, 10, 50], buffer_size=1)
    p.push(60)
    with pytest.raises(ValueError, match="outside the edges"):
        p.push(5)
    with pytest.raises(ValueError, match="buffer_size"):
        StreamPlanner(strategy="random", spec=_spec("random", 100, 4), buffer_size=0)


def test_too_few_samples_for_the_ranks_is_refused():
    x = np.full(3, 90)  # three one-sample batches cannot become four
    with pytest.raises(ValueError, match="world_size=4 needs 4 batches"):
        plan_stream(x, strategy="random", spec=_spec("random", 100, 4), buffer_size=2, world_size=4)


@pytest.mark.parametrize("strategy", STREAM_STRATEGIES)
def test_a_cost_caps_every_streamed_batch_and_balances_each_step(strategy):
    x = chat_lengths(20_000, seed=12)
    cost = lb.Cost(per_token=1.0, per_token_squared=1 / 2048)
    cap = float(cost.per_row(8191)) * 1.5
    spec = _spec(strategy, 16384, 64)
    kw = dict(strategy=strategy, spec=spec, buffer_size=2000, world_size=8)
    ranks = plan_stream(x, cost=cost, cost_budget=cap, **kw)
    _check_plan(x, ranks, strategy, 16384, 64)
    imbalance = {}
    for name, got in (("tokens", plan_stream(x, **kw)), ("cost", ranks)):
        per = np.stack([cost.of_batches(x, r, packed=strategy == "packed") for r in got])
        imbalance[name] = per.max(axis=0).sum() / per.mean(axis=0).sum() - 1
        if name == "cost":
            assert per.max() <= cap * (1 + 1e-9)
    assert imbalance["cost"] < 0.04 and imbalance["cost"] < imbalance["tokens"] / 2, imbalance
    again = plan_stream(x, cost=cost, cost_budget=cap, **kw)
    assert all(len(a) == len(b) and all(np.array_equal(p, q) for p, q in zip(a, b)) for a, b in zip(ranks, again))
