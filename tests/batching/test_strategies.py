"""Every strategy's plan: lossless, equal counts per rank, budget respected, deterministic, fresh each epoch."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lenbatch import STRATEGIES, plan_epoch, plan_epoch_all
from lenbatch.batching.padding import composition_repeat
from lenbatch.batching.strategies import sortish_order


def _check_plan(x, ranks, strategy, budget, mbs):
    counts = {len(r) for r in ranks}
    assert len(counts) == 1, "every rank gets the same number of batches"
    flat = [b for r in ranks for b in r]
    allidx = np.concatenate(flat)
    np.testing.assert_array_equal(np.sort(allidx), np.arange(x.size))  # every sample exactly once
    for b in flat:
        assert b.dtype == np.int64 and 1 <= len(b) <= mbs
        lx = x[b]
        assert (lx.sum() if strategy == "packed" else len(b) * lx.max()) <= budget


@st.composite
def cases(draw):
    budget = draw(st.integers(8, 400))
    n = draw(st.integers(1, 120))
    x = np.asarray(draw(st.lists(st.integers(1, budget), min_size=n, max_size=n)), dtype=np.int64)
    mbs = draw(st.integers(1, 12))
    cuts = sorted(set(draw(st.lists(st.integers(int(x.min()) + 1, int(x.max()) + 1), max_size=4))) - {x.max() + 1})
    edges = [0, *cuts, int(x.max()) + 1]
    return x, budget, mbs, edges


@settings(max_examples=60, deadline=None)
@given(
    case=cases(),
    strategy=st.sampled_from(STRATEGIES),
    world_size=st.integers(1, 8),
    epoch=st.integers(0, 3),
    window=st.integers(1, 4),
)
def test_plans_are_lossless_balanced_and_within_budget(case, strategy, world_size, epoch, window):
    x, budget, mbs, edges = case
    kw = dict(
        strategy=strategy,
        epoch=epoch,
        seed=3,
        token_budget=budget,
        max_batch_size=mbs,
        edges=edges if strategy == "bucketed" else None,
        packed_window=window,
    )
    try:
        ranks = plan_epoch_all(x, world_size=world_size, **kw)
    except ValueError as err:  # only when there are fewer samples than the batches the ranks need
        nb = len(plan_epoch_all(x, world_size=1, **kw)[0])
        assert "world_size" in str(err) and -(-nb // world_size) * world_size > x.size
        return
    _check_plan(x, ranks, strategy, budget, mbs)
    again = plan_epoch_all(x, world_size=world_size, **kw)  # a function of its inputs alone
    assert all(len(a) == len(b) and all(np.array_equal(p, q) for p, q in zip(a, b)) for a, b in zip(ranks, again))
    for r in range(world_size):
        mine = plan_epoch(x, rank=r, world_size=world_size, **kw)
        assert all(np.array_equal(p, q) for p, q in zip(mine, ranks[r]))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_new_epoch_new_composition(strategy):
    x = np.random.default_rng(5).integers(1, 400, size=600)
    kw = dict(
        strategy=strategy,
        seed=0,
        token_budget=2048,
        max_batch_size=16,
        edges=[0, 100, 250, 400] if strategy == "bucketed" else None,
    )
    e0, e1 = (plan_epoch(x, epoch=e, **kw) for e in (0, 1))
    rep = composition_repeat(e0, e1, x.size)
    if strategy == "sorted":
        assert rep == 1.0
        assert any(not np.array_equal(a, b) for a, b in zip(e0, e1))  # the batch order is shuffled
    else:
        assert rep < 0.5
    assert plan_epoch(x, epoch=0, **dict(kw, seed=1))[0].tolist() != e0[0].tolist() or strategy == "sorted"


def test_hand_computable_plans():
    x = np.array([1, 2, 3, 4, 5, 6])
    # sorted, budget 8: [1,2] (2*2=4; 3*3=9>8), [3,4] (2*4=8), [5] (2*6=12>8), [6]
    got = sorted(b.tolist() for b in plan_epoch(x, strategy="sorted", token_budget=8, max_batch_size=8))
    assert got == [[0, 1], [2, 3], [4], [5]]
    # budget 12: [1,2,3] (3*3=9, 4*4=16>12), [4,5] (2*5=10), [6]
    got = sorted(b.tolist() for b in plan_epoch(x, strategy="sorted", token_budget=12, max_batch_size=8))
    assert got == [[0, 1, 2], [3, 4], [5]]
    # packed rows of at most 7 tokens: every row sums to <= 7 and 21 tokens need >= 3 rows
    rows = plan_epoch(x, strategy="packed", token_budget=7, max_batch_size=8, packed_window=8)
    assert all(x[r].sum() <= 7 for r in rows) and len(rows) == 3  # {6,1} {5,2} {4,3} is the only way
    # bucketed keeps buckets apart
    for b in plan_epoch(x, strategy="bucketed", token_budget=100, max_batch_size=8, edges=[0, 4, 7]):
        assert len(set((x[b] >= 4).tolist())) == 1


def test_world_size_splits_batches_instead_of_dropping():
    x = np.array([10, 10, 10])  # one batch of 3 on one rank
    assert [len(r) for r in plan_epoch_all(x, strategy="sorted", token_budget=30, max_batch_size=8)] == [1]
    ranks = plan_epoch_all(x, strategy="sorted", token_budget=30, max_batch_size=8, world_size=3)
    assert [len(r) for r in ranks] == [1, 1, 1]
    assert sorted(int(r[0][0]) for r in ranks) == [0, 1, 2]
    with pytest.raises(ValueError, match="world_size=4"):
        plan_epoch_all(x, strategy="sorted", token_budget=30, max_batch_size=8, world_size=4)


@pytest.mark.parametrize(
    "n,high,mbs",
    [(500, 100, 16), (37, 100, 16), (20_011, 5, 8), (90_000, 4096, 64)],
    ids=["500", "fewer-than-4-batches", "many-ties", "90k"],
)
def test_sortish_is_transformers_order(n, high, mbs):
    """The numpy order equals transformers' own get_length_grouped_indices, index for index
    (one megabatch when n < 4 batches; ties; several megabatches and a partial last one)."""
    import torch
    from transformers.trainer_pt_utils import get_length_grouped_indices

    x = np.random.default_rng(n).integers(1, high, size=n)
    for epoch_seed in (7, 8):
        order = sortish_order(x, np.random.default_rng(epoch_seed), mbs)
        assert sorted(order.tolist()) == list(range(n))
        seed = int(np.random.default_rng(epoch_seed).integers(0, 2**63 - 1))
        ref = get_length_grouped_indices(x.tolist(), mbs, generator=torch.Generator().manual_seed(seed))
        assert order.tolist() == ref


def test_packed_fills_the_budget():
    from lenbatch.batching.padding import budget_fill
    from _chat_lengths import chat_lengths

    x = chat_lengths(100_000)
    rows = plan_epoch(x, strategy="packed", token_budget=49152, max_batch_size=64, packed_window=8)
    assert budget_fill(x, rows, 49152, strategy="packed") >= 0.998


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(strategy="fifo"), "strategy"),
        (dict(token_budget=5), "token_budget"),
        (dict(strategy="bucketed", edges=None), "edges"),
        (dict(strategy="bucketed", edges=[2, 50]), "cover"),
        (dict(rank=2, world_size=2), "rank"),
        (dict(max_batch_size=0), "max_batch_size"),
    ],
)
def test_bad_input(kwargs, words):
    args = dict(strategy="random", token_budget=100, max_batch_size=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=words):
        plan_epoch(np.array([1, 7, 9, 3]), **args)
    with pytest.raises(ValueError, match="empty"):
        plan_epoch(np.array([], dtype=np.int64), strategy="random", token_budget=10, max_batch_size=2)


def test_a_strategy_is_an_object_carrying_its_layout_and_edges():
    """lb.Strategy states the strategies' rules once: bucketed needs edges, the others take none, edges are
    K+1 strictly increasing non-negative ints; its layout is the one word for padded vs packed."""
    import lenbatch as lb

    s = lb.Strategy("bucketed", edges=[0, 100, 1000])
    assert s.edges == (0, 100, 1000) and s.layout == "padded" and lb.Strategy("packed").layout == "packed"
    for bad, match in (
        (dict(name="bucketed"), "needs edges"),
        (dict(name="sorted", edges=[0, 5]), "only used by"),
        (dict(name="shuffled"), "unknown"),
        (dict(name="bucketed", edges=[-5, 100, 2000]), "below 0"),
        (dict(name="bucketed", edges=[0, 100, 100]), "strictly increasing"),
    ):
        with pytest.raises(ValueError, match=match):
            lb.Strategy(**bad)
    assert lb.Strategy.sharing("sorted", (0, 100)).edges is None  # one boundaries file handed to every strategy
    assert lb.Strategy.sharing("bucketed", (0, 100)).edges == (0, 100)


def test_the_planner_and_the_sampler_take_a_strategy_object():
    import lenbatch as lb

    x = np.random.default_rng(1).integers(1, 900, size=500)
    edges = lb.optimize_boundaries(x, num_buckets=3, token_budget=2048, max_batch_size=16).edges
    by_name = lb.plan_epoch(x, strategy="bucketed", edges=edges, epoch=2, token_budget=2048, max_batch_size=16)
    s = lb.Strategy("bucketed", edges=edges)
    assert lb.plan_epoch(x, strategy=s, epoch=2, token_budget=2048, max_batch_size=16) == by_name
    sampler = lb.LengthBatchSampler(x, strategy=s, token_budget=2048, max_batch_size=16, rank=0, world_size=1)
    sampler.set_epoch(2)
    assert [list(b) for b in sampler] == [list(b) for b in by_name]
    with pytest.raises(ValueError, match="carries its own edges"):
        lb.plan_epoch(x, strategy=s, edges=edges, token_budget=2048, max_batch_size=16)
