"""The study's boundary objective (lenbatch_study.core.objective), given to the library's optimizers as an
``Objective``: its vectorised matrix equals its per-bucket model, dp is exact under it, it is recorded by
name, and it misses the real greedy plan by several points (why the library minimises its own model)."""

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _core_real import real_lengths
from lenbatch import optimize_boundaries
from lenbatch.batching.boundaries import candidate_values, cost_matrix, dp_partition
from lenbatch.batching.padding import bucket_computed, padding_efficiency, predict_bucketed, value_counts
from lenbatch.batching.strategies import plan_epoch_all
from lenbatch_study.core.objective import OBJECTIVES, STUDY, objective_named

sys.path.insert(0, str(Path(__file__).parents[1] / "batching"))
from _chat_lengths import chat_lengths  # noqa: E402

STUDY_EDGES = [0, 770, 1216, 1728, 2432, 3296, 8192]


def _brute_force(cost, k):
    last = cost.shape[0] - 1
    return min(
        sum(cost[a, b] for a, b in zip(p[:-1], p[1:]))
        for p in ((0, *inner, last) for inner in itertools.combinations(range(1, last), k - 1))
    )


@settings(max_examples=30, deadline=None)
@given(
    x=st.lists(st.integers(1, 60), min_size=4, max_size=80).map(np.asarray),
    k=st.integers(1, 4),
    budget=st.integers(60, 300),
    mbs=st.integers(1, 9),
    ncand=st.integers(3, 12),
)
def test_the_study_matrix_is_its_bucket_model_and_dp_is_exact(x, k, budget, mbs, ncand):
    cand = candidate_values(x, ncand)
    if k - 1 > cand.size:
        return
    cost, P, _ = cost_matrix(x, cand, budget, mbs, STUDY)
    vv, cc = value_counts(x)
    for a, b in [(0, len(P) - 1), (0, 1), (len(P) - 2, len(P) - 1)]:
        assert cost[a, b] == pytest.approx(
            bucket_computed(vv[P[a] : P[b]], cc[P[a] : P[b]], budget, mbs, STUDY), rel=1e-9
        )
    best, _ = dp_partition(cost, k)
    assert best == pytest.approx(_brute_force(cost, k), rel=1e-12)


def test_the_study_matrix_on_real_lengths():
    x = real_lengths()
    cand = candidate_values(x, 120)
    vv, cc = value_counts(x)
    cost, P, _ = cost_matrix(x, cand, 16384, 64, STUDY)
    for a in range(0, len(P) - 1, 9):
        for b in range(a + 1, len(P), 11):
            assert cost[a, b] == pytest.approx(STUDY.bucket(vv[P[a] : P[b]], cc[P[a] : P[b]], 16384, 64), rel=1e-9)


def test_params_names_map_to_what_the_library_takes():
    assert OBJECTIVES == ("greedy", "study")
    assert objective_named("greedy") == "greedy" and objective_named("study") is STUDY
    with pytest.raises(ValueError, match="boundaries.objective 'nope' unknown"):
        objective_named("nope")
    b = optimize_boundaries(
        np.array([3, 5, 5, 8, 13, 21, 21, 34, 55, 89]), 3, token_budget=200, max_batch_size=4, objective=STUDY
    )
    assert b.objective == "study"


def test_the_study_model_misses_the_greedy_plan_by_points():
    x = chat_lengths(900_000)
    kw = dict(token_budget=49152, max_batch_size=64)
    study = predict_bucketed(x, STUDY_EDGES, objective=STUDY, **kw)["efficiency"]
    plan = plan_epoch_all(x, strategy="bucketed", epoch=0, seed=0, edges=STUDY_EDGES, **kw)[0]
    assert padding_efficiency(x, plan) - study > 0.015  # measured: 0.019 (the greedy model: within 0.1 pp)
