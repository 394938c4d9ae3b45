"""Length statistics and the seed profile."""

import json

import numpy as np
import pytest

from lenbatch_study.core.objective import STUDY
from lenbatch_study.cli import main
from lenbatch.batching.lengths import bucket_counts, check_lengths, histogram, length_stats
from lenbatch_study.corpus.seed_profile import SEED_COUNT, SEED_PERCENTILES, SEED_VALUES, seed_profile


@pytest.fixture(scope="module")
def profile():
    return seed_profile()


def test_seed_profile_hits_published_percentiles_and_mean(profile):
    assert profile.size == SEED_COUNT
    got = np.percentile(profile, SEED_PERCENTILES)
    np.testing.assert_array_equal(got, np.asarray(SEED_VALUES, dtype=float))
    assert abs(profile.mean() - 2068) < 0.01
    assert abs(profile.sum() / 1e9 - 1.866) < 0.001  # the study's 1.866 B tokens


def test_seed_profile_is_deterministic_and_seeded(profile):
    again = seed_profile()
    np.testing.assert_array_equal(profile, again)
    other = seed_profile(seed=1)
    assert not np.array_equal(profile, other)
    np.testing.assert_array_equal(np.percentile(other, SEED_PERCENTILES), np.asarray(SEED_VALUES, dtype=float))


def test_on_the_seed_profile_dp_edges_beat_the_study_edges_and_the_greedy_model_predicts_both_plans(profile):
    """The study's numbers through the library's planner: on the seed profile at the study's setting, the dp
    edges beat the study's published edges, the greedy model predicts each bucketed plan within half a point,
    and the study's own padding model misses its plan by more than 1.5 points (it ignores adaptive batch sizes)."""
    import lenbatch as lb
    from lenbatch.batching.padding import predict_bucketed

    x = profile.astype(np.int64)
    kw = dict(token_budget=49152, max_batch_size=64)
    study_edges = [0, 770, 1216, 1728, 2432, 3296, 8192]
    dp = lb.optimize_boundaries(x, 6, method="dp", **kw)
    measured = {}
    for name, edges in (("dp", dp.edges), ("study", study_edges)):
        plan = lb.plan_epoch_all(x, strategy="bucketed", epoch=0, seed=0, edges=edges, **kw)[0]
        measured[name] = lb.padding_efficiency(x, plan)
        assert abs(predict_bucketed(x, edges, **kw)["efficiency"] - measured[name]) < 0.005, name
    assert measured["dp"] > measured["study"] + 0.005  # measured: 0.832 against 0.823
    assert measured["study"] - predict_bucketed(x, study_edges, objective=STUDY, **kw)["efficiency"] > 0.015


def test_length_stats_hand_case():
    st = length_stats([1, 2, 3, 4, 10])
    assert st["count"] == 5 and st["total_tokens"] == 20 and st["mean"] == 4.0
    assert st["min"] == 1 and st["max"] == 10
    assert st["percentiles"]["p50"] == 3.0 and st["percentiles"]["p100"] == 10.0
    assert st["percentiles"]["p25"] == 2.0


def test_histogram_and_bucket_counts_add_up():
    x = np.array([1, 1, 2, 5, 9, 9, 9])
    h = histogram(x, bins=3)
    assert [r["count"] for r in h] == [3, 1, 3]
    assert sum(r["count"] for r in h) == x.size
    rows = bucket_counts(x, [0, 2, 6, 10])
    assert [r["count"] for r in rows] == [2, 2, 3]
    assert [r["tokens"] for r in rows] == [2, 7, 27]


@pytest.mark.parametrize(
    "bad, words", [([], "empty"), ([3, 0, 2], "zero or negative"), ([[1, 2]], "1-D"), ([1.5, 2], "integer")]
)
def test_bad_lengths_name_the_problem(bad, words):
    with pytest.raises(ValueError, match=words):
        check_lengths(np.asarray(bad))


@pytest.mark.parametrize("edges", [[1, 5], [0, 3, 2, 20], [3, 20]])
def test_edges_must_cover_and_increase(edges):
    with pytest.raises(ValueError, match="edges"):
        bucket_counts([2, 4, 9], edges)


def test_stats_cli_writes_the_contract(tmp_path):
    x = np.random.default_rng(0).integers(1, 500, size=300).astype(np.int32)
    np.save(tmp_path / "lengths.npy", x)
    rc = main(
        [
            "stats",
            "--params",
            "params.yaml",
            "--lengths",
            str(tmp_path / "lengths.npy"),
            "--out",
            str(tmp_path / "out"),
            "--bins",
            "8",
        ]
    )
    assert rc == 0
    st = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert st["count"] == 300 and st["total_tokens"] == int(x.sum())
    assert set(st["percentiles"]) == {"p10", "p25", "p50", "p75", "p90", "p95", "p99", "p100"}
    hist = json.loads((tmp_path / "out" / "histogram.json").read_text())
    assert len(hist) == 8 and sum(r["count"] for r in hist) == 300
    assert (tmp_path / "out" / "histogram.png").stat().st_size > 1000
    assert (tmp_path / "out" / "params.json").exists()


def test_negative_edges_are_refused():
    """`lenbatch stats --edges -5 100 2000` was accepted: a bucket edge is a length in tokens."""
    with pytest.raises(ValueError, match=r"edges \[-5, 100, 2000\] start below 0 tokens"):
        bucket_counts([2, 4, 9], [-5, 100, 2000])
