"""Interleaved measurement: every strategy timed in turns after its own warm-up, and ratios paired by round
that a drift common to a round cannot move."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

import lenbatch as lb
from lenbatch.batching.spec import BatchSpec
from lenbatch.loading import collate
from lenbatch_study.analysis.interleaved import predicted_ratios, ratio_intervals
from lenbatch_study.core.config import load_params
from lenbatch_study.runtime.interleave import measure_interleaved, round_orders

REPO = Path(__file__).resolve().parents[2]


def test_a_drift_common_to_a_round_leaves_ratios_and_intervals_unchanged():
    rng = np.random.default_rng(0)
    k = 8
    useful = {s: rng.integers(900, 1100, size=k).astype(float) for s in ("sorted", "packed", "random")}
    true = {"sorted": 1.0, "packed": 1.25, "random": 0.7}  # seconds per 1000 tokens scale as 1 / throughput ratio
    steady = {s: useful[s] / 1000.0 / true[s] * (1 + 0.01 * rng.standard_normal(k)) for s in useful}
    drift = np.exp(rng.uniform(np.log(0.5), np.log(1.3), size=k))  # -50%..+30% from round to round
    drifted = {s: steady[s] * drift for s in steady}
    a, b = ratio_intervals(steady, useful), ratio_intervals(drifted, useful)
    for s in useful:
        assert b[s]["ratio_to_sorted"] == pytest.approx(a[s]["ratio_to_sorted"], rel=1e-12)
        assert b[s]["ci95"] == pytest.approx(a[s]["ci95"], rel=1e-12)
        lo, hi = a[s]["ci95"]
        assert lo <= a[s]["ratio_to_sorted"] <= hi and a[s]["rounds"] == k
    assert a["sorted"]["ratio_to_sorted"] == 1.0 and a["sorted"]["ci95"] == [1.0, 1.0]
    assert a["packed"]["ci95"][0] < 1.25 < a["packed"]["ci95"][1] and a["packed"]["ci95"][0] > 1.15
    # the same seconds measured one strategy after another (the drift of each its own) do move the ratio
    apart = {s: steady[s] * drift[i] for i, s in enumerate(steady)}
    assert abs(ratio_intervals(apart, useful)["packed"]["ratio_to_sorted"] / 1.25 - 1) > 0.05
    pred = predicted_ratios({s: useful[s] / 1000.0 / true[s] for s in useful}, useful)
    assert pred == pytest.approx(true)


def test_bad_input_names_the_fix():
    with pytest.raises(ValueError, match="baseline strategy 'sorted'"):
        ratio_intervals({"packed": [1.0, 1.0]}, {"packed": [1, 1]})
    with pytest.raises(ValueError, match="same number"):
        ratio_intervals({"sorted": [1.0, 1.0], "packed": [1.0]}, {"sorted": [1, 1], "packed": [1]})
    with pytest.raises(ValueError, match="rounds must be >= 2"):
        measure_interleaved(lambda s, i: 1, ["sorted"], rounds=1, segment_steps=1, warmup=0)


def test_rounds_rotate_so_no_strategy_always_follows_the_same_one():
    orders = round_orders(["a", "b", "c"], 4)
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]


def test_real_steps_in_turns_after_each_strategys_own_warm_up(tmp_path):
    """A tiny target and drafter on CPU (StepRunner, as train.nproc: 1 runs them), three strategies' real
    plans: every strategy warms up on its own first batches, then each round times the next segment of
    every strategy; the useful tokens timed are exactly those of the plan's segment."""
    from lenbatch_study.runtime.runner import StepRunner

    over = tmp_path / "small.yaml"
    over.write_text(yaml.safe_dump({"data": {"max_len": 64}, "batching": {"token_budget": 128, "max_batch_size": 4},
                                    "model": {"vocab_size": 1024}, "train": {"nproc": 1, "threads": 1}}))
    params = load_params(REPO / "params.yaml", over)
    runner = StepRunner(params, device="cpu")
    lengths = np.random.default_rng(1).integers(8, 64, size=80)
    seqs = collate.synthetic_sequences(lengths, vocab_size=params.model.vocab_size, seed=0)
    strategies = ["sorted", "packed", "random"]
    plans = {s: lb.plan_epoch(lengths, strategy=s, token_budget=128, max_batch_size=4, seed=0) for s in strategies}
    calls = []

    def step(s: str, i: int) -> int:
        calls.append((s, i))
        idx = plans[s][i]
        batch = collate.collate([seqs[j] for j in idx], spec=BatchSpec.from_params(params, strategy=s))
        feats, _ = runner.target_step(batch)
        runner.drafter_step(batch, feats, step=i)
        return batch.useful_tokens

    res = measure_interleaved(step, strategies, rounds=3, segment_steps=2, warmup=1)
    assert calls[:3] == [("sorted", 0), ("packed", 0), ("random", 0)]  # each one's own warm-up first
    timed = calls[3:]
    assert [s for s, _ in timed[::2]] == [s for order in round_orders(strategies, 3) for s in order]
    for s in strategies:
        assert [i for t, i in timed if t == s] == list(range(1, 7))  # segments 1-2, 3-4, 5-6 in turn
        want = [int(sum(lengths[plans[s][i]].sum() for i in range(1 + 2 * k, 3 + 2 * k))) for k in range(3)]
        assert res[s]["useful_tokens"] == want and all(x > 0 for x in res[s]["seconds"])
        assert sorted(res[s]["position"]) == [0, 1, 2]
    table = ratio_intervals({s: res[s]["seconds"] for s in strategies}, {s: res[s]["useful_tokens"] for s in strategies})
    for s in strategies:
        lo, hi = table[s]["ci95"]
        assert 0 < lo <= table[s]["ratio_to_sorted"] <= hi
