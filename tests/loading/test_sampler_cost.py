"""LengthBatchSampler passes cost=/cost_budget= to the planner: it yields the cost-aware plan, resumes it, and
refuses a state saved under another cost (or none)."""

import numpy as np
import pytest

import lenbatch as lb

X = np.clip(np.rint(np.random.default_rng(12).lognormal(7.2, 0.8, 4000)), 48, 8191).astype(np.int64)
COST = lb.Cost(per_token=1.0, per_token_squared=1 / 2048)
CAP = float(COST.per_row(8191)) * 1.5
KW = dict(strategy="packed", token_budget=16384, max_batch_size=64, seed=0, rank=1, world_size=4)


def test_the_sampler_yields_the_cost_aware_plan_and_resumes_it():
    s = lb.LengthBatchSampler(X, cost=COST, cost_budget=CAP, **KW)
    s.set_epoch(1)
    want = lb.plan_epoch(X, epoch=1, cost=COST, cost_budget=CAP, **KW)
    got = list(s)
    assert [list(b) for b in want] == got
    assert want != lb.plan_epoch(X, epoch=1, **KW)  # the cost changed the plan
    assert COST.of_batches(X, want, packed=True).max() <= CAP * (1 + 1e-9)
    it = iter(s)
    for _ in range(3):
        next(it)
    state = s.state_dict()
    again = lb.LengthBatchSampler(X, cost=COST, cost_budget=CAP, **KW)
    again.load_state_dict(state)
    again.set_epoch(1)
    assert list(again) == got[3:]
    with pytest.raises(ValueError, match="another plan"):
        lb.LengthBatchSampler(X, **KW).load_state_dict(state)
    with pytest.raises(ValueError, match="another plan"):
        lb.LengthBatchSampler(X, cost=COST, cost_budget=CAP * 2, **KW).load_state_dict(state)


def test_bad_cost_is_refused_when_the_sampler_is_built():
    with pytest.raises(ValueError, match="alone cost more than cost_budget"):
        lb.LengthBatchSampler(X, cost=COST, cost_budget=100.0, **KW)
