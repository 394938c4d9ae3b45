"""The answer is decided on the ratios measured in turns (lenbatch_study.analysis.verdict): use, tie, not settled."""

from __future__ import annotations

import pytest

from lenbatch_study.analysis.verdict import NOT_SETTLED, TIE, USE, decide, missed_beyond_noise

REPEAT = {"sorted": 1.0, "random": 0.0, "bucketed": 0.01, "sortish": 0.1, "packed": 0.0}


def row(ratio: float, half: float, predicted: float | None = None, rounds: int = 18) -> dict:
    lo, hi = ratio * (1 - half), ratio * (1 + half)
    p = ratio if predicted is None else predicted
    return {
        "ratio_to_sorted": ratio,
        "ci95": [lo, hi],
        "half_width": half,
        "predicted_ratio": p,
        "prediction_error": p / ratio - 1,
        "rounds": rounds,
    }


def table(**rows: dict) -> dict:
    return {"sorted": row(1.0, 0.0), **rows}


def repeat(t: dict) -> dict:
    """The composition repeat of the strategies trained (those the table holds)."""
    return {s: REPEAT[s] for s in t}


def test_use_the_strategy_whose_interval_lies_above_every_other():
    t = table(random=row(0.59, 0.01), bucketed=row(0.88, 0.018), sortish=row(1.003, 0.019), packed=row(0.934, 0.019))
    v = decide(t, repeat(t), max_composition_repeat=0.5)
    assert (v.kind, v.strategy, v.top, v.settled) == (USE, "sortish", ("sortish",), True)
    assert v.candidates == ("sortish", "packed", "bucketed", "random") and v.rounds == 18


def test_overlapping_narrow_intervals_are_a_named_tie_and_wide_ones_settle_nothing():
    narrow = table(random=row(0.59, 0.01), sortish=row(0.95, 0.015), packed=row(0.94, 0.015))
    v = decide(narrow, repeat(narrow), max_composition_repeat=0.5)
    assert (v.kind, v.top, v.strategy, v.settled) == (TIE, ("sortish", "packed"), None, True)
    wide = table(random=row(0.59, 0.01), sortish=row(0.95, 0.03), packed=row(0.94, 0.015))
    v = decide(wide, repeat(wide), max_composition_repeat=0.5)
    assert (v.kind, v.top, v.wide, v.settled) == (NOT_SETTLED, ("sortish", "packed"), ("sortish",), False)
    # a wide interval that overlaps nothing does not stop the answer: the top is clear anyway
    apart = table(random=row(0.59, 0.05), sortish=row(0.95, 0.01))
    assert decide(apart, repeat(apart), max_composition_repeat=0.5).kind == USE


def test_a_prediction_missing_beyond_its_interval_and_the_target_settles_nothing():
    assert not missed_beyond_noise(row(0.9, 0.02, predicted=0.91))  # inside the interval
    assert not missed_beyond_noise(row(0.9, 0.001, predicted=0.92))  # outside, but within 3%
    assert missed_beyond_noise(row(0.9, 0.01, predicted=0.95))  # outside and 5.6% off
    # a miss on a strategy in contention settles nothing: the model and the measurement disagree about it
    t = table(random=row(0.59, 0.01), sortish=row(1.0, 0.01, predicted=1.05), packed=row(0.93, 0.01))
    v = decide(t, repeat(t), max_composition_repeat=0.5)
    assert (v.kind, v.missed, v.top) == (NOT_SETTLED, ("sortish",), ("sortish",))
    # one out of contention is named beside the answer: the measurement separates it from the top anyway
    t = table(random=row(0.59, 0.01, predicted=0.66), sortish=row(1.0, 0.01), packed=row(0.93, 0.01))
    v = decide(t, repeat(t), max_composition_repeat=0.5)
    assert (v.kind, v.strategy, v.missed) == (USE, "sortish", ("random",))


def test_sorted_and_strategies_that_keep_their_batches_are_never_recommended():
    # sorted measures highest but is the baseline; bucketed's batches repeat beyond the limit
    t = table(bucketed=row(1.2, 0.01), packed=row(0.9, 0.01))
    v = decide(t, {**repeat(t), "bucketed": 0.9}, max_composition_repeat=0.5)
    assert v.strategy == "packed" and "bucketed" not in v.candidates
    with pytest.raises(ValueError, match="compare.max_composition_repeat"):
        decide(t, {"sorted": 1.0, "bucketed": 0.9}, max_composition_repeat=0.5)


def test_without_ratios_in_turns_nothing_is_settled_and_a_missing_strategy_is_named():
    v = decide(None, REPEAT, max_composition_repeat=0.5)
    assert (v.kind, v.measured) == (NOT_SETTLED, False)
    with pytest.raises(ValueError, match="lacks packed: rerun the interleave stage"):
        decide(
            table(random=row(0.6, 0.01), bucketed=row(0.9, 0.01), sortish=row(1.0, 0.01)),
            REPEAT,
            max_composition_repeat=0.5,
        )


def test_timed_steps_that_do_not_stand_for_their_run_settle_nothing_in_contention():
    """steps_gap: the step model's ratio over the timed steps against its ratio over the whole run."""

    def gap(r: dict, g: float) -> dict:
        return {**r, "steps_gap": g, "run_predicted_ratio": r["predicted_ratio"] / (1 + g)}

    t = table(random=row(0.59, 0.01), sortish=gap(row(1.0, 0.01), 0.25), packed=row(0.93, 0.01))
    v = decide(t, repeat(t), max_composition_repeat=0.5)
    assert (v.kind, v.unrepresentative, v.top) == (NOT_SETTLED, ("sortish",), ("sortish",))
    # within 3%: the steps stand for the run
    t = table(random=row(0.59, 0.01), sortish=gap(row(1.0, 0.01), 0.02), packed=row(0.93, 0.01))
    assert decide(t, repeat(t), max_composition_repeat=0.5).kind == USE
    # out of contention: named, not a veto
    t = table(random=gap(row(0.59, 0.01), -0.2), sortish=row(1.0, 0.01), packed=row(0.93, 0.01))
    v = decide(t, repeat(t), max_composition_repeat=0.5)
    assert (v.kind, v.strategy, v.unrepresentative) == (USE, "sortish", ("random",))


def test_a_miss_names_the_profile_rerun_only_where_it_can_help():
    """miss_cause: a profile whose passes moved, or a step beyond its grid, is remeasured; a steady profile
    with every step inside its grid would give the same fits, so the advice says the model misses instead."""
    from lenbatch_study.analysis.report import miss_cause

    steady = {"target": [0.99, 1.0, 1.01], "drafter": [0.98, 1.0, 1.02]}
    t = {"sortish": {**row(1.33, 0.01, predicted=1.42), "profile_pass_factors": steady, "beyond_grid": {}}}
    said = miss_cause(t, ["sortish"], rerun="snakemake --forcerun profile")
    assert "would give the same fits" in said and "--forcerun profile" not in said and "agree within 2%" in said
    moved = {**steady, "target": [0.8, 1.0, 1.05]}
    t["sortish"]["profile_pass_factors"] = moved
    assert "Remeasure the profile: `snakemake --forcerun profile`" in miss_cause(
        t, ["sortish"], rerun="snakemake --forcerun profile"
    )
    t["sortish"].update(profile_pass_factors=steady, beyond_grid={"drafter ctx_tokens": 1.4})
    assert "Remeasure the profile" in miss_cause(t, ["sortish"], rerun="x")
