"""The padding model: exact E[max], the greedy plan, plan metrics, and the bucket predictors."""

import itertools

import numpy as np
import pytest
from _chat_lengths import chat_lengths
from _core_real import real_lengths

import lenbatch as lb
from lenbatch.batching.padding import (
    budget_fill,
    composition_repeat,
    expected_max,
    greedy_batches,
    greedy_bucket_computed,
    greedy_starts,
    length_mixing,
    padding_efficiency,
    predict_bucketed,
    value_counts,
)
from lenbatch.batching.spec import BatchSpec
from lenbatch.batching.strategies import plan_epoch_all

STUDY_EDGES = [0, 770, 1216, 1728, 2432, 3296, 8192]
CORPUS = 900_000  # samples: one simulated epoch then matches the prediction within 0.1 pp


def test_expected_max_hand_case():
    # draws of 2 from {1, 2, 3}: {1,2}->2, {1,3}->3, {2,3}->3
    assert expected_max([1, 2, 3], 2) == pytest.approx(8 / 3)
    assert expected_max([5, 5, 5], 2) == pytest.approx(5)
    assert expected_max([1, 2, 3], 3) == pytest.approx(3)
    assert expected_max([4, 1, 9], 1) == pytest.approx(14 / 3)


def test_expected_max_equals_enumeration():
    rng = np.random.default_rng(1)
    for _ in range(20):
        x = rng.integers(1, 30, size=int(rng.integers(1, 9)))
        for b in range(1, x.size + 1):
            brute = np.mean([max(c) for c in itertools.combinations(x.tolist(), b)])
            assert expected_max(x, b) == pytest.approx(brute, rel=1e-10)


def test_expected_max_large_is_stable():
    """On 100,000 lengths the exact formula agrees with the mean maximum of 4,000 random draws of 64."""
    x = chat_lengths(100_000)
    e = expected_max(x, 64)
    rng = np.random.default_rng(7)
    maxima = np.array([x[rng.choice(x.size, 64, replace=False)].max() for _ in range(4000)], dtype=np.float64)
    assert x.max() >= e > np.percentile(x, 95)
    assert abs(e - maxima.mean()) < 4 * maxima.std(ddof=1) / np.sqrt(maxima.size)


def test_greedy_plan_hand_case():
    # budget 10: [2, 3] -> 2*3=6, adding 5 -> 3*5=15 > 10; [5, 1] -> 2*5=10; [4, 4] -> 8; [9] alone
    x = [2, 3, 5, 1, 4, 4, 9]
    assert greedy_starts(x, 10, 64).tolist() == [0, 2, 4, 6]
    # the count limit closes batches too
    assert greedy_starts([1, 1, 1, 1, 1], 100, 2).tolist() == [0, 2, 4]
    batches = greedy_batches(np.arange(7), np.asarray(x), 10, 64)
    assert [b.tolist() for b in batches] == [[0, 1], [2, 3], [4, 5], [6]]
    # computed 6 + 10 + 8 + 9 = 33, useful 28
    assert padding_efficiency(x, batches) == pytest.approx(28 / 33)
    assert budget_fill(x, batches, 10) == pytest.approx(33 / 40)
    assert padding_efficiency(x, batches, strategy="packed") == 1.0
    assert budget_fill(x, batches, 10, strategy="packed") == pytest.approx(28 / 40)


def test_composition_repeat_hand_cases():
    a = [np.array([0, 1, 2]), np.array([3, 4])]
    assert composition_repeat(a, a, 5) == 1.0
    b = [np.array([0, 3]), np.array([1, 4]), np.array([2])]
    assert composition_repeat(a, b, 5) == 0.0
    c = [np.array([0, 1]), np.array([2, 3, 4])]
    # pairs in a: (0,1),(0,2),(1,2),(3,4) = 4; again in c: (0,1),(3,4) = 2
    assert composition_repeat(a, c, 5) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="every sample"):
        composition_repeat(a, [np.array([0, 1])], 5)


def test_length_mixing_extremes():
    x = np.repeat(np.arange(1, 101), 10)
    srt = np.argsort(x, kind="stable")
    sorted_batches = np.split(srt, 100)  # equal lengths inside each batch
    assert length_mixing(x, sorted_batches) == 0.0
    assert length_mixing(x, sorted_batches, reference=np.split(np.arange(x.size), 100)) == 0.0
    assert length_mixing(x, [np.arange(x.size)]) == pytest.approx(1.0)  # one batch: its variance is the data's


def _mixing_data():
    rng = np.random.default_rng(7)
    return {
        "uniform": rng.integers(16, 4097, 3000),
        "lognormal": np.clip(rng.lognormal(6.0, 1.2, 3000).astype(np.int64) + 1, 1, 4096),
        "bimodal": np.clip(np.concatenate([rng.normal(200, 50, 2000), rng.normal(3000, 300, 1000)]), 1, 4096).astype(
            np.int64
        ),
    }


def _tolerance(x, dof):
    """4 standard errors of the ratio of two independent pooled variances over ``dof`` degrees of
    freedom: one pooled variance has relative variance (kurtosis - 1) / dof (that of a sample variance),
    so the ratio of two has about twice it."""
    z = (x - x.mean()) / x.std()
    return 4 * np.sqrt(2 * (np.mean(z**4) - 1) / dof)


@pytest.mark.parametrize("name", ["uniform", "lognormal", "bimodal"])
def test_length_mixing_without_reference_has_expectation_one_for_fixed_size_random_batches(name):
    # E[sum_i (x_i - mean_b)^2] = (n_b - 1) s^2 for a batch drawn without replacement: the mean over
    # many random equal-size partitions is 1 within its standard error
    x = _mixing_data()[name]
    rng = np.random.default_rng(0)
    sizes = np.cumsum(rng.integers(1, 40, 200))
    sizes = sizes[sizes < x.size]
    vals = np.array([length_mixing(x, np.split(rng.permutation(x.size), sizes)) for _ in range(200)])
    assert abs(vals.mean() - 1) < 4 * vals.std(ddof=1) / np.sqrt(vals.size)


@pytest.mark.parametrize("name", ["uniform", "lognormal", "bimodal"])
def test_length_mixing_is_zero_sorted_one_random_and_about_one_packed(name):
    x = _mixing_data()[name]
    spec = BatchSpec(token_budget=4 * 4096, max_batch_size=64, seed=0)

    def flat(strategy, epoch, s=spec):
        return [b for r in plan_epoch_all(x, strategy=strategy, epoch=epoch, spec=s) for b in r]

    ref = flat("random", 0)
    assert length_mixing(x, ref, reference=ref) == 1.0
    other = flat("random", 1)
    tol = _tolerance(x.astype(float), x.size - len(other))
    assert abs(length_mixing(x, other, reference=ref) - 1) < tol
    # a sorted batch spans a narrow length range: at most 64 neighbours among 3,000 sorted lengths
    assert length_mixing(x, flat("sorted", 0), reference=ref) < 0.01
    bucketed = flat(lb.Strategy("bucketed", (0, 500, 1000, 2000, 4097)), 0)
    assert 0.01 < length_mixing(x, bucketed, reference=ref) < 0.3
    # packed rows are a shuffled order filled by tokens: about a random order's mixing (slightly more,
    # since random padded batches keep long samples in small batches)
    packed = flat("packed", 0)
    assert 1 - tol < length_mixing(x, packed, reference=ref) < 1.1
    # without the reference a random padded plan scores below 1 on the heavy tail: the greedy bias
    if name == "lognormal":
        assert length_mixing(x, ref) < 0.95


def _simulate_bucketed(x, edges, budget, mbs, reps, seed=0):
    ids = np.searchsorted(edges, x, side="right") - 1
    effs = []
    for r in range(reps):
        rng = np.random.default_rng(seed + r)
        batches = []
        for k in range(len(edges) - 1):
            batches += greedy_batches(rng.permutation(np.flatnonzero(ids == k)), x, budget, mbs)
        effs.append(padding_efficiency(x, batches))
    return float(np.mean(effs))


def test_greedy_model_predicts_a_chat_corpus_within_half_a_point():
    x = chat_lengths(CORPUS)
    for edges in (STUDY_EDGES, [0, 8192], [0, 958, 1598, 2306, 3182, 4445, 8192]):
        pred = predict_bucketed(x, edges, token_budget=49152, max_batch_size=64)["efficiency"]
        sim = _simulate_bucketed(x, np.asarray(edges), 49152, 64, reps=1)
        assert abs(pred - sim) < 0.005, (edges, pred, sim)
        assert abs(pred - sim) < 0.001  # measured: within 0.04 pp on seeds 0-2


@pytest.mark.parametrize("budget", [8192, 16384, 49152])
def test_greedy_model_predicts_real_sharegpt_lengths(budget):
    x = real_lengths()
    for edges in ([0, 4097], [0, 500, 1000, 1500, 2000, 3000, 4097], [0, 300, 1900, 4097]):
        pred = predict_bucketed(x, edges, token_budget=budget, max_batch_size=64)["efficiency"]
        sim = _simulate_bucketed(x, np.asarray(edges), budget, 64, reps=20)
        assert abs(pred - sim) < 0.005, (budget, edges, pred, sim)


def test_count_limited_bucket_is_exact():
    # every batch holds exactly 4 samples: computed = full batches * E[max of 4] + last batch
    x = np.arange(1, 11)  # 10 samples, budget 40 >= 4 * 10
    v, c = value_counts(x)
    model = greedy_bucket_computed(v, c, 40, 4)
    rng = np.random.default_rng(0)
    sims = []
    for _ in range(4000):
        b = greedy_batches(rng.permutation(10), x, 40, 4)
        sims.append(sum(len(bb) * x[bb].max() for bb in b))
    assert model == pytest.approx(np.mean(sims), rel=0.01)
