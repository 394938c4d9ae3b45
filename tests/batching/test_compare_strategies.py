"""compare_strategies: one row per strategy whose numbers are the plan metrics of the plans it makes, the
Cost model by hand, bad input named, and ``python -m lenbatch compare`` printing the same rows."""

import json
import subprocess
import sys

import numpy as np
import pytest

import lenbatch as lb
from _chat_lengths import chat_lengths

X = chat_lengths(4000, seed=3)
KW = dict(token_budget=16384, max_batch_size=64)


def test_every_strategy_has_a_row_of_its_plans_metrics():
    rows = lb.compare_strategies(X, **KW, seed=2)
    assert [r["strategy"] for r in rows] == list(lb.STRATEGIES)
    by = {r["strategy"]: r for r in rows}
    edges = by["bucketed"]["edges"]
    assert edges == list(lb.optimize_boundaries(X, 6, **KW).edges)
    for s in lb.STRATEGIES:
        e = edges if s == "bucketed" else None
        e0, e1 = (lb.plan_epoch(X, strategy=s, epoch=k, seed=2, edges=e, **KW) for k in (0, 1))
        r = by[s]
        assert r["steps"] == len(e0)
        assert r["padding_efficiency"] == pytest.approx(lb.padding_efficiency(X, e0))
        assert r["budget_fill"] == pytest.approx(lb.budget_fill(X, e0, 16384))
        assert r["composition_repeat"] == pytest.approx(lb.composition_repeat(e0, e1, X.size))
    assert by["sorted"]["composition_repeat"] == 1.0 and by["random"]["length_mixing"] == pytest.approx(1.0)
    assert by["packed"]["padding_efficiency"] == 1.0 and by["random"]["padding_efficiency"] < 0.8


def test_the_cost_of_a_batch_by_hand():
    c = lb.Cost(per_token=2.0, per_token_squared=0.5)
    x = np.array([3, 5, 4])
    padded = c.of_batches(x, [np.array([0, 1]), np.array([2])], packed=False)
    assert padded.tolist() == [2 * (2 * 5 + 0.5 * 25), 1 * (2 * 4 + 0.5 * 16)]
    packed = c.of_batches(x, [np.array([0, 1, 2])], packed=True)
    assert packed.tolist() == [2 * 12 + 0.5 * (9 + 25 + 16)]


def test_relative_cost_is_the_costliest_ranks_per_step_over_the_cheapest_strategy():
    cost = lb.Cost(per_token=1.0, per_token_squared=1 / 4096)
    rows = lb.compare_strategies(X, **KW, world_size=4, cost=cost, strategies=("random", "packed"))
    by = {r["strategy"]: r for r in rows}
    plans = lb.plan_epoch_all(X, strategy="random", world_size=4, **KW)
    per_rank = np.stack([cost.of_batches(X, p, packed=False) for p in plans])
    assert by["random"]["cost"] == pytest.approx(per_rank.max(axis=0).sum())
    assert min(r["relative_cost"] for r in rows) == 1.0
    assert by["random"]["relative_cost"] == pytest.approx(by["random"]["cost"] / by["packed"]["cost"])
    assert by["random"]["relative_cost"] > 1.2  # padding costs tokens and attention


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(cost=3.0), "lenbatch.Cost"),
        (dict(strategies=("sorted", "nope")), "choose among"),
        (dict(token_budget=100), "longer than token_budget=100"),
    ],
)
def test_bad_input_is_named(kwargs, words):
    with pytest.raises(ValueError, match=words):
        lb.compare_strategies(X, **dict(KW, **kwargs))


def test_a_cost_refuses_negative_or_all_zero_coefficients():
    with pytest.raises(ValueError, match="per_token=-1"):
        lb.Cost(per_token=-1)
    with pytest.raises(ValueError, match="prices every batch at 0"):
        lb.Cost(per_token=0, per_token_squared=0)


def test_the_command_prints_the_same_rows(tmp_path):
    np.save(tmp_path / "l.npy", X)

    def run(*a):
        return subprocess.run([sys.executable, "-m", "lenbatch", "compare", *a], capture_output=True, text=True)

    out = run(
        str(tmp_path / "l.npy"),
        "--token-budget",
        "16384",
        "--max-batch-size=64",
        "--json",
        "--per-token",
        "1",
        "--per-token-squared",
        "0.001",
    )
    assert out.returncode == 0, out.stderr
    want = lb.compare_strategies(X, **KW, cost=lb.Cost(1, 0.001))
    assert json.loads(out.stdout) == json.loads(json.dumps(want))
    (tmp_path / "l.txt").write_text("\n".join(map(str, X.tolist())))
    table = run(str(tmp_path / "l.txt"), "--token-budget", "16384", "--max-batch-size", "64").stdout.splitlines()
    assert len(table) == 7 and table[2].startswith("| `sorted` |") and "relative cost" not in table[0]
    bad = run(str(tmp_path / "l.npy"), "--token-budget", "16384")
    assert bad.returncode == 2 and "--max-batch-size is required" in bad.stderr
    bad = run(str(tmp_path / "l.npy"), "--token-budget", "lots", "--max-batch-size", "64")
    assert bad.returncode == 2 and "--token-budget takes an integer" in bad.stderr
