"""Interleaved measurement: every strategy timed in turns after its own warm-up, and ratios paired by round
that a drift common to a round cannot move."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

import lenbatch as lb
from lenbatch_study.runtime.synthetic import synthetic_sequences
from lenbatch_study.core.batchspec import batch_spec
from lenbatch.loading import collate
from lenbatch_study.analysis.interleaved import USER_METRIC_KEYS, flat_metrics, judge, predicted_ratios, section_lines
from lenbatch_study.core.intervals import ratio_intervals
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
    with pytest.raises(ValueError, match="interleave.rounds must be >= 2"):
        measure_interleaved(lambda s, i: 1, ["sorted"], rounds=1, segment_steps=1, warmup=0)


def test_rounds_go_on_until_enough_within_the_bounds():
    """After the minimum ``rounds``, one round at a time until ``enough`` says so or ``max_rounds`` ran;
    ``enough`` is never asked before the minimum."""
    asked = []

    def enough_after(n):
        def enough(so_far):
            asked.append(len(so_far["a"]["seconds"]))
            return len(so_far["a"]["seconds"]) >= n

        return enough

    def rounds_run(**kw):
        res = measure_interleaved(lambda s, j: 1, ["a", "b"], rounds=3, segment_steps=1, warmup=0, **kw)
        assert len(res["a"]["seconds"]) == len(res["b"]["seconds"]) == len(res["_order"])
        return len(res["_order"])

    assert rounds_run(max_rounds=10, enough=enough_after(5)) == 5 and asked == [3, 4, 5]
    assert rounds_run(max_rounds=10, enough=enough_after(1)) == 3  # the minimum holds
    assert rounds_run(max_rounds=7, enough=enough_after(99)) == 7  # never enough: the maximum
    assert rounds_run(max_rounds=7) == 3  # no rule: exactly `rounds`
    with pytest.raises(ValueError, match=r"interleave.max_rounds \(2\) is below interleave.rounds \(3\)"):
        rounds_run(max_rounds=2, enough=enough_after(1))


def test_rounds_rotate_so_no_strategy_always_follows_the_same_one():
    orders = round_orders(["a", "b", "c"], 4)
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    # a fake clock that advances 1 s per step: the warm-up is never timed, each round's hook comes after it
    now, log = [0.0], []

    def step(s: str, j: int) -> int:
        now[0] += 1.0
        log.append(s)
        return 10 * (j + 1)

    res = measure_interleaved(
        step,
        ["a", "b"],
        rounds=2,
        segment_steps=3,
        warmup=2,
        clock=lambda: now[0],
        on_round=lambda k, so_far: log.append(f"round {k}"),
    )
    # warm-up strategy by strategy; then turns of one step, each step's order the round's rotated by the step
    assert log == ["a"] * 6 + ["b"] * 6 + [
        "a",
        "b",
        "b",
        "a",
        "a",
        "b",
        "round 0",
        "b",
        "a",
        "a",
        "b",
        "b",
        "a",
        "round 1",
    ]
    assert res["a"] == {"seconds": [3.0, 3.0], "useful_tokens": [60, 60], "position": [0, 1]}
    # a drift within a round falls on every strategy alike: the clock runs 1 s per step in the first half of
    # each round and 3 s per step in the second; a's steps take 1 s and b's 2 s at the drift's base speed
    base = {"a": 1.0, "b": 2.0}
    calls = [0]

    def drifting(s: str, j: int) -> int:
        calls[0] += 1
        now[0] += base[s] * (1.0 if (calls[0] - 1) % 8 < 4 else 3.0)
        return 1

    res = measure_interleaved(drifting, ["a", "b"], rounds=2, segment_steps=4, warmup=0, clock=lambda: now[0])
    # each strategy gets two steps in each half: b's seconds are exactly twice a's, as at a steady speed
    # (segments one after another would give a 4 s, all in the slow half's start, and b 24 s: 6x)
    assert res["a"]["seconds"] == [8.0, 8.0] and res["b"]["seconds"] == [16.0, 16.0], res


def test_real_steps_in_turns_after_each_strategys_own_warm_up(tmp_path):
    """A tiny target and drafter on CPU (StepRunner, as train.nproc: 1 runs them), three strategies' real
    plans: every strategy first warms up on its own segment, then each round times that same segment of
    every strategy, in turns of one step in rotated order; the useful tokens timed are exactly those of the
    segment's batches."""
    from lenbatch_study.runtime.runner import StepRunner

    over = tmp_path / "small.yaml"
    over.write_text(
        yaml.safe_dump(
            {
                "data": {"max_len": 64},
                "batching": {"token_budget": 128, "max_batch_size": 4},
                "model": {"vocab_size": 1024},
                "train": {"nproc": 1, "threads": 1},
            }
        )
    )
    params = load_params(REPO / "params.yaml", over)
    runner = StepRunner(params, device="cpu")
    lengths = np.random.default_rng(1).integers(8, 64, size=80)
    seqs = synthetic_sequences(lengths, vocab_size=params.model.vocab_size, seed=0)
    strategies = ["sorted", "packed", "random"]
    plans = {s: lb.plan_epoch(lengths, strategy=s, token_budget=128, max_batch_size=4, seed=0) for s in strategies}
    segment = {s: [3, 7] for s in strategies}  # the plan steps each strategy's segment holds
    calls = []

    def step(s: str, j: int) -> int:
        i = segment[s][j]
        calls.append((s, i))
        idx = plans[s][i]
        batch = collate.collate([seqs[k] for k in idx], layout=lb.Strategy(s), spec=batch_spec(params))
        feats, _ = runner.target_step(batch)
        runner.drafter_step(batch, feats, step=i)
        return batch.useful_tokens

    res = measure_interleaved(step, strategies, rounds=3, segment_steps=2, warmup=1)
    # each one's own warm-up first, on its own segment
    assert calls[:6] == [("sorted", 3), ("sorted", 7), ("packed", 3), ("packed", 7), ("random", 3), ("random", 7)]
    timed = calls[6:]
    # in turns of one step: each strategy's first step in the round's order, then its second in that order
    # rotated by one
    want = [
        c
        for order in round_orders(strategies, 3)
        for c in [(s, 3) for s in order] + [(s, 7) for s in order[1:] + order[:1]]
    ]
    assert timed == want  # the same segment in every round
    for s in strategies:
        want = int(lengths[plans[s][3]].sum() + lengths[plans[s][7]].sum())
        assert res[s]["useful_tokens"] == [want] * 3 and all(x > 0 for x in res[s]["seconds"])
        assert sorted(res[s]["position"]) == [0, 1, 2]
    table = ratio_intervals(
        {s: res[s]["seconds"] for s in strategies}, {s: res[s]["useful_tokens"] for s in strategies}
    )
    for s in strategies:
        lo, hi = table[s]["ci95"]
        assert 0 < lo <= table[s]["ratio_to_sorted"] <= hi


def test_the_interval_on_known_rounds():
    """Three rounds whose log throughput ratios to sorted are 0, 0.1 and 0.2 (mean 0.1, sd 0.1): the ratio is
    e^0.1 and the interval e^(0.1 +- t(0.975, 2) 0.1 / sqrt 3), t(0.975, 2) = 4.302653; the segments' useful
    tokens differ between strategies and enter through the throughput."""
    seconds = {"sorted": [1.0, 2.0, 4.0], "packed": [2.0 / np.exp(0.0), 4.0 / np.exp(0.1), 8.0 / np.exp(0.2)]}
    useful = {"sorted": [100, 200, 400], "packed": [200, 400, 800]}
    r = ratio_intervals(seconds, useful)["packed"]
    half = 4.302653 * 0.1 / np.sqrt(3)
    assert r["ratio_to_sorted"] == pytest.approx(np.exp(0.1), rel=1e-12)
    assert r["ci95"] == pytest.approx([np.exp(0.1 - half), np.exp(0.1 + half)], rel=1e-6)
    # the prediction of the same steps, judged on ratios: 1.2 predicted against e^0.1 = 1.105 measured
    table = judge(seconds, useful, {"sorted": [1.0, 1.0], "packed": [1.0]}, {"sorted": [50, 50], "packed": [60]})
    p = table["packed"]
    assert p["predicted_ratio"] == pytest.approx(1.2) and p["prediction_error"] == pytest.approx(1.2 / np.exp(0.1) - 1)
    assert p["half_width"] == pytest.approx(np.exp(half) - 1) and not p["interval_ok"] and not p["prediction_ok"]
    assert table["sorted"]["interval_ok"] and table["sorted"]["prediction_ok"]
    close = judge(
        {"sorted": [1.0, 1.0], "packed": [0.5, 0.5 * 1.001]},
        {"sorted": [1, 1], "packed": [1, 1]},
        {"sorted": [1.0], "packed": [0.51]},
        {"sorted": [1], "packed": [1]},
    )["packed"]
    assert close["interval_ok"] and close["prediction_ok"]  # 2.0 +- 0.6% measured, 1.96 predicted (-2%)


def test_metrics_keys_and_report_section():
    """metrics.json's keys: ratio, interval (low and high: DVC shows no list) and predicted ratio of every
    strategy but sorted (1 by definition), the error beside them in diagnostics; the report's table names each
    strategy with its three numbers."""
    table = {
        "sorted": {
            "ratio_to_sorted": 1.0,
            "ci95": [1.0, 1.0],
            "predicted_ratio": 1.0,
            "rounds": 6,
            "half_width": 0.0,
            "prediction_error": 0.0,
            "interval_ok": True,
            "prediction_ok": True,
        },
        "packed": {
            "ratio_to_sorted": 1.21,
            "ci95": [1.19, 1.23],
            "predicted_ratio": 1.18,
            "rounds": 6,
            "half_width": 0.0165,
            "prediction_error": 1.18 / 1.21 - 1,
            "interval_ok": True,
            "prediction_ok": True,
        },
        "random": {
            "ratio_to_sorted": 0.6,
            "ci95": [0.57, 0.63],
            "predicted_ratio": 0.64,
            "rounds": 6,
            "half_width": 0.05,
            "prediction_error": 0.64 / 0.6 - 1,
            "interval_ok": False,
            "prediction_ok": False,
        },
    }
    flat = flat_metrics(table)
    assert set(flat) == {
        f"{s}.interleaved.{k}"
        for s in ("packed", "random")
        for k in ("ratio_to_sorted", "ci95.low", "ci95.high", "predicted_ratio", "prediction_error")
    }
    assert (flat["packed.interleaved.ci95.low"], flat["packed.interleaved.ci95.high"]) == (1.19, 1.23)
    assert flat["random.interleaved.predicted_ratio"] == 0.64
    assert {k for k in flat if k.partition(".")[2] in USER_METRIC_KEYS} == {
        f"{s}.interleaved.{k}"
        for s in ("packed", "random")
        for k in ("ratio_to_sorted", "ci95.low", "ci95.high", "predicted_ratio")
    }
    assert flat_metrics(None) == {} and section_lines(None) == []
    text = "\n".join(section_lines(table))
    assert "## Ratios measured in turns" in text and "6 rounds" in text
    assert "| packed | 1.210 | [1.190, 1.230] | 1.180 | -2.5% |" in text
    assert "| random | 0.600 | [0.570, 0.630] | 0.640 | +6.7% |" in text and "| sorted |" not in text
    assert "intervals of `random` are wider than ±2%" in text and "for 1 of 2 strategies (not `random`)" in text
    assert "on wall seconds" in text and "nonetheless" not in text  # 0.64 is above [0.57, 0.63]
    table["random"].update(predicted_ratio=0.62, prediction_error=0.62 / 0.6 - 1)
    for r in table.values():
        r["clock"] = "cpu"
    text = "\n".join(section_lines(table))
    assert "Within the measured interval nonetheless: `random`" in text and "on the process's CPU seconds" in text


def test_a_missed_prediction_names_the_profiles_drift_and_the_rerun():
    """A predicted ratio off by more than 3%: the report names how far the profile's timed passes moved (per role,
    against the median pass), says which moved more than 10%, and gives the profile's rerun; a prediction
    within 3% adds nothing about the profile."""
    from lenbatch_study.analysis.provenance import profile_rerun

    row = {
        "ratio_to_sorted": 1.105,
        "ci95": [1.087, 1.123],
        "predicted_ratio": 1.029,
        "rounds": 54,
        "half_width": 0.016,
        "prediction_error": 1.029 / 1.105 - 1,
        "interval_ok": True,
        "prediction_ok": False,
        "clock": "cpu",
        "profile_pass_factors": {
            "target": [1.0, 0.954, 0.974, 1.11, 1.267],
            "drafter": [1.0, 0.982, 0.95, 1.027, 1.09],
        },
    }
    table = {
        "sorted": {
            **row,
            "ratio_to_sorted": 1.0,
            "ci95": [1.0, 1.0],
            "predicted_ratio": 1.0,
            "prediction_error": 0.0,
            "prediction_ok": True,
        },
        "packed": row,
    }
    text = "\n".join(section_lines(table))
    assert "The profile's timed passes took 0.95-1.27x (target) and 0.95-1.09x (drafter) the seconds" in text
    assert "more than 10% off the median (target) means the machine's speed moved" in text
    assert profile_rerun() in text
    # a steady profile: its passes are named, no drift is claimed
    for r in table.values():  # one profile: every row carries the same factors
        r["profile_pass_factors"] = {"target": [1.0, 0.97, 1.04], "drafter": [0.99, 1.0, 1.02]}
    text = "\n".join(section_lines(table))
    assert "0.97-1.04x (target)" in text and "more than 10%" not in text and profile_rerun() in text
    # a slow pass counts as much as a fast one: 0.89 is 1/0.89 - 1 = 12% off
    for r in table.values():
        r["profile_pass_factors"] = {"target": [1.0, 0.89, 1.04], "drafter": [0.99, 1.0, 1.02]}
    assert "more than 10% off the median (target)" in "\n".join(section_lines(table))
    # within 3%: nothing about the profile
    row.update(predicted_ratio=1.09, prediction_error=1.09 / 1.105 - 1, prediction_ok=True)
    text = "\n".join(section_lines(table))
    assert "timed passes" not in text and profile_rerun() not in text


def test_steps_beyond_the_grid_are_named_per_fitted_feature():
    """beyond_grid: a fitted feature whose largest step value passes the grid's largest by more than 5% is named
    with that ratio (const and features the model does not use never are); the report names the strategy."""
    from lenbatch_study.analysis.interleaved import beyond_grid

    grid = {
        "computed_tokens": np.array([512.0, 16384.0]),
        "ctx_tokens": np.array([300.0, 24000.0]),
        "sequences": np.array([1.0, 32.0]),
    }
    steps = {
        "computed_tokens": np.array([16376.0, 16380.0]),
        "ctx_tokens": np.array([28294.0, 20000.0]),
        "sequences": np.array([14.0, 40.0]),
    }
    assert beyond_grid(grid, steps, ("const", "ctx_tokens", "sequences")) == pytest.approx(
        {"ctx_tokens": 28294 / 24000, "sequences": 40 / 32}
    )
    assert beyond_grid(grid, steps, ("const", "computed_tokens")) == {}  # within the grid
    steps["ctx_tokens"] = np.array([25000.0])  # 4% past: inside the margin
    assert beyond_grid(grid, steps, ("ctx_tokens",)) == {}
    row = {
        "ratio_to_sorted": 1.1,
        "ci95": [1.09, 1.11],
        "predicted_ratio": 1.1,
        "rounds": 9,
        "half_width": 0.01,
        "prediction_error": 0.0,
        "interval_ok": True,
        "prediction_ok": True,
    }
    table = {"sorted": {**row, "beyond_grid": {}}, "packed": {**row, "beyond_grid": {"drafter ctx_tokens": 1.2146}}}
    text = "\n".join(section_lines(table))
    assert "Beyond the profile grid (`packed`: drafter ctx_tokens 1.21x the grid's largest value)" in text
    table["packed"]["beyond_grid"] = {}
    assert "Beyond the profile grid" not in "\n".join(section_lines(table))
