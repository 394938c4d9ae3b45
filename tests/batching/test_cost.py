"""Cost-aware plans (lenbatch.Cost, cost_budget) by the in-memory planner's checks: every sample once, equal
batches per rank, no batch over the token budget, the batch size or the cost budget, a function of its
inputs; each step's batches balanced by cost; token-only plans unchanged when no cost is given."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lenbatch as lb
from _chat_lengths import chat_lengths
from lenbatch.batching.cost import cost_limit
from test_strategies import _check_plan, cases


def _within_cost(x, ranks, strategy, cost, cost_budget):
    for r in ranks:
        priced = cost.of_batches(x, r, packed=strategy == "packed")
        assert np.all(priced <= cost_budget * (1 + 1e-9)), (priced.max(), cost_budget)


@settings(max_examples=60, deadline=None)
@given(
    case=cases(),
    strategy=st.sampled_from(lb.STRATEGIES),
    world_size=st.integers(1, 6),
    epoch=st.integers(0, 2),
    a=st.sampled_from([0.0, 1.0, 2.5]),
    b=st.sampled_from([0.0, 0.01, 0.3]),
    slack=st.floats(1.0, 6.0),
)
def test_cost_aware_plans_are_lossless_balanced_and_within_both_budgets(case, strategy, world_size, epoch, a, b, slack):
    x, budget, mbs, edges = case
    if a == b == 0:
        a = 1.0
    cost = lb.Cost(per_token=a, per_token_squared=b)
    cost_budget = float(cost.per_row(x.max())) * slack  # the longest sample alone always fits
    kw = dict(
        strategy=strategy,
        epoch=epoch,
        seed=3,
        token_budget=budget,
        max_batch_size=mbs,
        edges=edges if strategy == "bucketed" else None,
        cost=cost,
        cost_budget=cost_budget,
    )
    try:
        ranks = lb.plan_epoch_all(x, world_size=world_size, **kw)
    except ValueError as err:
        nb = len(lb.plan_epoch_all(x, world_size=1, **kw)[0])
        assert "world_size" in str(err) and -(-nb // world_size) * world_size > x.size
        return
    _check_plan(x, ranks, strategy, budget, mbs)
    _within_cost(x, ranks, strategy, cost, cost_budget)
    again = lb.plan_epoch_all(x, world_size=world_size, **kw)
    assert all(len(p) == len(q) and all(np.array_equal(u, v) for u, v in zip(p, q)) for p, q in zip(ranks, again))
    for r in range(world_size):
        assert lb.plan_epoch(x, rank=r, world_size=world_size, **kw) == ranks[r]


@pytest.mark.parametrize("strategy", lb.STRATEGIES)
def test_each_steps_batches_cost_alike_across_ranks(strategy):
    x = chat_lengths(30_000, seed=8)
    cost = lb.Cost(per_token=1.0, per_token_squared=1 / 4096)
    e = lb.optimize_boundaries(x, 6, token_budget=16384, max_batch_size=64).edges if strategy == "bucketed" else None
    kw = dict(strategy=strategy, token_budget=16384, max_batch_size=64, edges=e, world_size=8)
    imbalance = {}
    for name, c in (("tokens", None), ("cost", cost)):
        ranks = lb.plan_epoch_all(x, cost=c, **kw)
        per = np.stack([cost.of_batches(x, r, packed=strategy == "packed") for r in ranks])
        imbalance[name] = per.max(axis=0).sum() / per.mean(axis=0).sum() - 1
    assert imbalance["cost"] < 0.02 < imbalance["tokens"], imbalance


def test_a_binding_cost_budget_makes_more_cheaper_batches():
    x = chat_lengths(20_000, seed=9)
    cost = lb.Cost(per_token=1.0, per_token_squared=1 / 2048)
    cap = float(cost.per_row(8191)) * 1.2
    for strategy in ("random", "packed"):
        free = lb.plan_epoch(x, strategy=strategy, token_budget=16384, max_batch_size=64)
        capped = lb.plan_epoch(x, strategy=strategy, token_budget=16384, max_batch_size=64, cost=cost, cost_budget=cap)
        assert len(capped) > len(free)
        assert cost.of_batches(x, free, packed=strategy == "packed").max() > cap
        assert cost.of_batches(x, capped, packed=strategy == "packed").max() <= cap * (1 + 1e-9)


def test_without_a_cost_the_plan_is_the_token_only_one():
    x = chat_lengths(5000, seed=10)
    for strategy in lb.STRATEGIES:
        e = [0, 1000, 3000, 8192] if strategy == "bucketed" else None
        kw = dict(strategy=strategy, token_budget=16384, max_batch_size=64, edges=e, world_size=3, epoch=1)
        assert lb.plan_epoch_all(x, **kw) == lb.plan_epoch_all(x, cost=None, cost_budget=None, **kw)


def test_the_effective_lengths_hold_exactly_the_cap():
    x = np.arange(1, 3000)
    cost = lb.Cost(per_token=1.0, per_token_squared=0.001)
    lim = cost_limit(x, token_budget=16384, max_batch_size=64, cost=cost, cost_budget=50_000.0)
    for m in (1, 10, 99, 100, 700, 2999):
        cap = min(64, 16384 // m, int(np.floor(50_000.0 / float(cost.per_row(m)))))
        e = int(lim.effective[m])
        assert cap * e <= lim.k < (cap + 1) * e


def test_bad_cost_input_is_named():
    x = chat_lengths(100)
    with pytest.raises(ValueError, match="cost_budget needs cost="):
        lb.plan_epoch(x, strategy="random", token_budget=16384, max_batch_size=64, cost_budget=10.0)
    with pytest.raises(ValueError, match="alone cost more than cost_budget"):
        lb.plan_epoch(x, strategy="random", token_budget=16384, max_batch_size=64, cost=lb.Cost(), cost_budget=10.0)
    with pytest.raises(ValueError, match="cost_budget must be a number > 0"):
        lb.plan_epoch(x, strategy="random", token_budget=16384, max_batch_size=64, cost=lb.Cost(), cost_budget=-1)
    with pytest.raises(ValueError, match="lenbatch.Cost"):
        lb.plan_epoch(x, strategy="random", token_budget=16384, max_batch_size=64, cost=(1.0, 0.0))
