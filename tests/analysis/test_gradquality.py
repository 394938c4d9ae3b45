"""Gradient quality measures recover known values on a synthetic linear model with a built-in
composition bias, and the seed intervals are computed right (known quantiles, coverage)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lenbatch_study.analysis import gradquality as gq
from lenbatch_study.core import intervals


# --------------------------------------------------------------------------- Student t and intervals


@pytest.mark.parametrize(
    "df, q", [(1, 12.706204736), (2, 4.302652730), (4, 2.776445105), (30, 2.042272456), (1000, 1.962339081)]
)
def test_t_quantile_matches_published_values(df, q):
    assert intervals.t_quantile(0.975, df) == pytest.approx(q, rel=1e-6)
    assert intervals.t_quantile(0.025, df) == pytest.approx(-q, rel=1e-6)
    assert intervals.t_cdf(q, df) == pytest.approx(0.975, abs=1e-9)


def test_t_cdf_of_one_degree_is_the_cauchy_distribution():
    for x in (-3.0, -0.5, 0.0, 0.7, 10.0):
        assert intervals.t_cdf(x, 1) == pytest.approx(0.5 + math.atan(x) / math.pi, abs=1e-12)


def test_mean_interval_by_hand():
    iv = intervals.mean_interval([1.0, 2.0, 3.0])
    half = 4.302652730 * 1.0 / math.sqrt(3)  # sd = 1
    assert iv["mean"] == 2.0 and iv["sd"] == pytest.approx(1.0)
    assert iv["half"] == pytest.approx(half, rel=1e-8)
    assert (iv["lo"], iv["hi"]) == pytest.approx((2 - half, 2 + half), rel=1e-8)
    assert math.isnan(intervals.mean_interval([5.0])["half"])
    with pytest.raises(ValueError):
        intervals.mean_interval([1.0, float("nan")])


def test_mean_interval_covers_the_true_mean_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    trials = 4000
    hits = 0
    for _ in range(trials):
        iv = intervals.mean_interval(rng.normal(3.0, 0.2, size=3))
        hits += iv["lo"] <= 3.0 <= iv["hi"]
    assert abs(hits / trials - 0.95) < 0.012, hits / trials


def test_welch_difference_by_hand_and_its_verdict():
    a, b = np.array([5.0, 5.2, 5.4]), np.array([4.0, 4.3, 4.5, 4.4])
    d = intervals.difference_interval(a, b)
    va, vb = a.var(ddof=1) / 3, b.var(ddof=1) / 4
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 3)
    half = intervals.t_quantile(0.975, df) * math.sqrt(va + vb)
    assert d["diff"] == pytest.approx(a.mean() - b.mean())
    assert d["df"] == pytest.approx(df)
    assert d["half"] == pytest.approx(half)
    assert d["distinguishable"]  # 0.9 apart, seeds within 0.5: beyond noise
    same = intervals.difference_interval([5.0, 5.3, 4.8], [5.1, 4.9, 5.2])
    assert not same["distinguishable"] and same["lo"] < 0 < same["hi"]
    with pytest.raises(ValueError, match="quality.seeds"):
        intervals.difference_interval([1.0], [2.0, 3.0])


def test_welch_interval_covers_the_true_difference_and_rarely_flags_noise():
    rng = np.random.default_rng(1)
    trials, covered, flagged = 2000, 0, 0
    for _ in range(trials):
        d = intervals.difference_interval(rng.normal(1.0, 0.1, 3), rng.normal(1.0, 0.3, 3))
        covered += d["lo"] <= 0.0 <= d["hi"]
        flagged += d["distinguishable"]
    assert covered + flagged == trials
    assert 0.93 < covered / trials < 0.975, covered / trials  # Welch is approximate with 3 seeds a side


# --------------------------------------------------------------------------- a linear model with composition bias


def linear_problem(n: int = 4000, p: int = 6, seed: int = 0):
    """Per-example squared-loss gradients of y = x.w* + noise at w = 0, two "length" groups whose
    inputs have different means (a built-in composition bias: each group's mean gradient differs)."""
    rng = np.random.default_rng(seed)
    group = np.repeat([0, 1], n // 2)
    length = np.where(group == 0, 200, 2000)
    shift = np.where(group[:, None] == 0, -1.0, 1.0) * np.array([1.5, 0, 0, 0, 0, 0])[:p]
    x = rng.normal(size=(n, p)) + shift
    w_star = np.linspace(1.0, 0.2, p)
    y = x @ w_star + rng.normal(scale=0.5, size=n) + 2.0 * group  # long samples are harder: higher loss
    w = np.zeros(p)
    resid = x @ w - y
    grads = resid[:, None] * x  # d/dw of 0.5 * resid^2
    loss = 0.5 * resid**2
    return grads, loss, length, group


def batches_of(order: np.ndarray, size: int) -> list[np.ndarray]:
    return [order[i : i + size] for i in range(0, order.size - size + 1, size)]


def measure(grads, loss, length, batches):
    g = np.stack([grads[b].mean(0) for b in batches])
    sizes = np.array([len(b) for b in batches], dtype=float)
    G = gq.full_gradient(g, sizes)
    out = gq.gradient_quality(g, sizes, G)
    out["r"] = gq.pearson(np.array([length[b].mean() for b in batches]), np.array([loss[b].mean() for b in batches]))
    return out, G


def test_random_batches_recover_the_per_example_covariance_and_noise_scale():
    grads, loss, length, _ = linear_problem()
    n, B = grads.shape[0], 20
    G_true = grads.mean(0)
    tr_true = float(((grads - G_true) ** 2).sum(1).mean())
    rng = np.random.default_rng(2)
    batches = [b for _ in range(150) for b in batches_of(rng.permutation(n), B)]  # 150 epochs
    m, G = measure(grads, loss, length, batches)
    assert np.allclose(G, G_true, rtol=1e-10)  # whole epochs: the weighted mean is the full gradient exactly
    expected = tr_true * (n - B) / (n - 1)  # sampling without replacement
    assert m["variance_per_token"] == pytest.approx(expected, rel=0.03)
    assert m["noise_scale"] == pytest.approx(expected / float(G_true @ G_true), rel=0.03)
    # cos(g_b, G) of an unbiased batch: about |G| / sqrt(|G|^2 + tr/B)
    approx_cos = math.sqrt(G_true @ G_true) / math.sqrt(G_true @ G_true + expected / B)
    assert m["cosine_mean"] == pytest.approx(approx_cos, abs=0.05)


def test_length_sorted_batches_show_the_composition_bias():
    grads, loss, length, group = linear_problem()
    n, B = grads.shape[0], 20
    G_true = grads.mean(0)
    rng = np.random.default_rng(3)
    sorted_order = np.argsort(length + rng.random(n), kind="stable")  # sorted by length, ties random
    sorted_batches = batches_of(sorted_order, B)
    random_batches = [b for _ in range(20) for b in batches_of(rng.permutation(n), B)]
    s, G = measure(grads, loss, length, sorted_batches)
    r, _ = measure(grads, loss, length, random_batches)
    assert np.allclose(G, G_true, rtol=1e-10)  # any epoch partition sums to the same full gradient
    # known value for one-group batches: E B||g_b - G||^2 = tr(within) + B * mean_g ||mu_g - G||^2
    mus = [grads[group == k].mean(0) for k in (0, 1)]
    within = np.mean([((grads[group == k] - mus[k]) ** 2).sum(1).mean() for k in (0, 1)])
    bias = np.mean([((mu - G_true) ** 2).sum() for mu in mus])
    assert s["variance_per_token"] == pytest.approx(within + B * bias, rel=0.1)
    # random batches see the bias divided by B like any other variance: tr = within + bias
    assert r["variance_per_token"] == pytest.approx((within + bias) * (n - B) / (n - 1), rel=0.1)
    assert s["variance_per_token"] > 1.4 * r["variance_per_token"]
    assert s["noise_scale"] > 1.4 * r["noise_scale"]
    assert s["cosine_mean"] < r["cosine_mean"]
    # the sawtooth: in sorted batches a batch's length predicts its loss, in random ones much less
    assert s["r"] > 0.9 and abs(r["r"]) < s["r"] - 0.3


def test_gradient_measures_refuse_bad_shapes_and_pearson_edge_cases():
    with pytest.raises(ValueError):
        gq.gradient_quality(np.zeros((3, 4)), np.ones(2), np.zeros(4))
    with pytest.raises(ValueError, match="weight"):
        gq.full_gradient(np.ones((2, 3)), np.array([1.0, 0.0]))
    assert gq.pearson(np.arange(5.0), 3 * np.arange(5.0) + 1) == pytest.approx(1.0)
    assert math.isnan(gq.pearson(np.ones(5), np.arange(5.0)))
