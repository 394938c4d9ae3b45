"""Boundary optimizers: dp is the exact optimum on its grid, and the objective predicts real plans."""

import itertools

import numpy as np
import pytest
from _chat_lengths import chat_lengths
from _core_real import real_lengths
from hypothesis import given, settings
from hypothesis import strategies as st

from lenbatch import optimize_boundaries, sweep_num_buckets
from lenbatch.batching.boundaries import candidate_values, cost_matrix, coordinate_path, dp_partition, geometric_path
from lenbatch.batching.padding import Objective, bucket_computed, padding_efficiency, predict_bucketed, value_counts
from lenbatch.batching.strategies import plan_epoch_all


# a second objective, given as an Objective without its own matrix (priced bucket by bucket): n * max
MAX_PADDED = Objective("n_max", lambda v, c, budget, mbs: float(np.sum(c) * v[-1]))


def _brute_force(cost, k):
    last = cost.shape[0] - 1
    best = np.inf
    for inner in itertools.combinations(range(1, last), k - 1):
        path = (0, *inner, last)
        best = min(best, sum(cost[a, b] for a, b in zip(path[:-1], path[1:])))
    return best


lengths_st = st.lists(st.integers(1, 60), min_size=4, max_size=80).map(np.asarray)


@settings(max_examples=40, deadline=None)
@given(
    x=lengths_st,
    k=st.integers(1, 4),
    budget=st.integers(60, 300),
    mbs=st.integers(1, 9),
    ncand=st.integers(3, 12),
    objective=st.sampled_from(["greedy", MAX_PADDED]),
)
def test_dp_equals_brute_force_and_beats_coordinate_and_geometric(x, k, budget, mbs, ncand, objective):
    cand = candidate_values(x, ncand)
    if k - 1 > cand.size:
        return
    cost, P, v = cost_matrix(x, cand, budget, mbs, objective)
    # the vectorised matrix equals the per-bucket model it stands for
    vv, cc = value_counts(x)
    for a, b in [(0, len(P) - 1), (0, 1), (len(P) - 2, len(P) - 1)]:
        assert cost[a, b] == pytest.approx(
            bucket_computed(vv[P[a] : P[b]], cc[P[a] : P[b]], budget, mbs, objective), rel=1e-9
        )
    best, path = dp_partition(cost, k)
    assert best == pytest.approx(_brute_force(cost, k), rel=1e-12)
    assert len(path) == k + 1 and all(a < b for a, b in zip(path[:-1], path[1:]))
    geo = geometric_path(v, cand, P, k)
    coord, _ = coordinate_path(cost, geo)
    for other in (geo, coord):
        assert best <= sum(cost[a, b] for a, b in zip(other[:-1], other[1:])) * (1 + 1e-12)


def test_cost_matrix_matches_direct_model_on_real_lengths():
    x = real_lengths()
    cand = candidate_values(x, 120)
    vv, cc = value_counts(x)
    for objective in ("greedy", MAX_PADDED):
        cost, P, _ = cost_matrix(x, cand, 16384, 64, objective)
        for a in range(0, len(P) - 1, 9):
            for b in range(a + 1, len(P), 11):
                direct = bucket_computed(vv[P[a] : P[b]], cc[P[a] : P[b]], 16384, 64, objective)
                assert cost[a, b] == pytest.approx(direct, rel=1e-9)


def test_edges_contract_and_methods_on_small_data():
    x = np.array([3, 5, 5, 8, 13, 21, 21, 34, 55, 89])
    for method in ("dp", "coordinate", "geometric"):
        b = optimize_boundaries(x, 3, token_budget=200, max_batch_size=4, method=method)
        assert len(b.edges) == 4 and b.edges[0] <= x.min() and b.edges[-1] > x.max()
        assert list(b.edges) == sorted(set(b.edges))
        assert 0 < b.predicted_efficiency <= 1
    # with every distinct value a candidate, K = distinct lengths gives one value per bucket: no padding
    k = np.unique(x).size
    b = optimize_boundaries(x, k, token_budget=200, max_batch_size=4)
    assert b.predicted_efficiency == pytest.approx(1.0)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(num_buckets=9), "distinct"),
        (dict(method="kmeans"), "method"),
        (dict(objective="nope"), "objective"),
        (dict(token_budget=50), "token_budget"),
    ],
)
def test_bad_input(kwargs, words):
    args = dict(num_buckets=2, token_budget=200, max_batch_size=4, method="dp")
    args.update(kwargs)
    with pytest.raises(ValueError, match=words):
        optimize_boundaries([1, 2, 3, 60, 60, 7, 8, 9, 10], **args)


def test_dp_on_a_chat_corpus_beats_the_study_edges_and_predicts_the_plan():
    x = chat_lengths(900_000)
    kw = dict(token_budget=49152, max_batch_size=64)
    dp = optimize_boundaries(x, 6, method="dp", **kw)
    study = predict_bucketed(x, [0, 770, 1216, 1728, 2432, 3296, 8192], **kw)["efficiency"]
    assert dp.predicted_efficiency >= study + 0.03  # measured: 0.808 against 0.760
    plan = plan_epoch_all(x, strategy="bucketed", epoch=0, seed=0, edges=dp.edges, **kw)[0]
    assert abs(padding_efficiency(x, plan) - dp.predicted_efficiency) < 0.005
    cand = candidate_values(x, 290)
    for objective in ("greedy", MAX_PADDED):
        cost, P, v = cost_matrix(x, cand, 49152, 64, objective)
        best, _ = dp_partition(cost, 6)
        geo = geometric_path(v, cand, P, 6)
        coord, hist = coordinate_path(cost, geo)
        costs = [h["cost"] for h in hist]
        # the coordinate search improves monotonically from its geometric start, and dp is never worse
        assert costs == sorted(costs, reverse=True) and costs[-1] < costs[0] * 0.95
        assert best <= costs[-1] * (1 + 1e-12)


def test_real_lengths_prediction_and_sweep():
    x = real_lengths()
    rows = sweep_num_buckets(x, 6, token_budget=16384, max_batch_size=64, seed=0)
    assert [r["num_buckets"] for r in rows] == [1, 2, 3, 4, 5, 6]
    for r in rows:
        assert abs(r["predicted_efficiency"] - r["simulated_efficiency"]) < 0.01  # one epoch of 1,500 samples
        assert len(r["edges"]) == r["num_buckets"] + 1
        assert 0 <= r["composition_repeat"] <= 1 and r["length_mixing"] >= 0
    # more buckets: more efficient and less mixed
    assert rows[-1]["predicted_efficiency"] > rows[0]["predicted_efficiency"] + 0.1
    assert rows[-1]["length_mixing"] < rows[0]["length_mixing"]


def test_the_coordinate_sweep_gives_each_k_the_edges_optimize_boundaries_gives():
    """sweep_num_buckets(method="coordinate") solves every K from one cost matrix; each K's edges are those of
    optimize_boundaries with the same method (the coordinate sweep is a path of its own in _solve_all)."""
    rng = np.random.default_rng(3)
    x = np.clip(rng.lognormal(6, 0.8, 5000).astype(np.int64), 8, 4096)
    rows = sweep_num_buckets(x, 4, token_budget=8192, max_batch_size=32, method="coordinate", simulate=False)
    assert [r["num_buckets"] for r in rows] == [1, 2, 3, 4]
    for r in rows[1:]:
        one = optimize_boundaries(x, r["num_buckets"], token_budget=8192, max_batch_size=32, method="coordinate")
        assert tuple(r["edges"]) == tuple(one.edges)


def test_an_objective_is_recorded_by_name_and_prices_the_prediction():
    x = np.array([3, 5, 5, 8, 13, 21, 21, 34, 55, 89])
    b = optimize_boundaries(x, 3, token_budget=200, max_batch_size=4, objective=MAX_PADDED)
    assert b.objective == "n_max"
    pred = predict_bucketed(x, b.edges, token_budget=200, max_batch_size=4, objective=MAX_PADDED)
    assert pred["objective"] == "n_max" and pred["efficiency"] == pytest.approx(b.predicted_efficiency)
