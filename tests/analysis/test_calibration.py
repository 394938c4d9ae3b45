"""The calibration's arithmetic and the one-machine rule, on records shaped as the stages write them."""

from __future__ import annotations

import math

import pytest

from lenbatch_study.analysis import calibration, provenance

SHAPE = {"layout": "padded", "sequences": 8, "length": 512}


def _ref(target_start, target_end, drafter_start, drafter_end, shape=SHAPE):
    return {
        "shape": shape,
        "target": {"start": target_start, "end": target_end},
        "drafter": {"start": drafter_start, "end": drafter_end},
    }


def test_the_reference_time_is_the_midpoint_of_the_start_and_end_medians():
    run = _ref([1.0, 1.2, 9.0], [1.4, 1.4, 1.3], [2.0, 2.0, 2.0], [2.2, 2.2, 2.2])  # one outlier start step
    prof = _ref([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [2.0, 2.0, 2.0], [2.0, 2.0, 2.0])
    assert calibration.reference_seconds(run, "target") == pytest.approx((1.2 + 1.4) / 2)  # medians: no outlier
    assert calibration.drift(run, "target") == pytest.approx(1.4 / 1.2 - 1)
    assert calibration.ratios(run, prof) == pytest.approx({"target": 1.3, "drafter": 1.05})
    assert math.isnan(calibration.reference_seconds({"shape": SHAPE}, "drafter"))  # a role not timed
    other = _ref([1.0], [1.0], [2.0], [2.0], shape={**SHAPE, "sequences": 4})
    with pytest.raises(ValueError, match="differs from the profile's"):
        calibration.ratios(other, prof)


def _fp(id_: str, torch: str = "2.13.0") -> dict:
    return {
        "id": id_,
        "cpu": {"model": "cpu"},
        "memory_gib": 8.0,
        "accelerator": None,
        "versions": {"python": "3.11.7", "torch": torch},
    }


def test_one_machine_passes_and_a_mix_names_what_to_rerun_from_where_compare_runs():
    a, b = _fp("aaaa"), _fp("bbbb", torch="2.11.0")
    assert provenance.check_one_machine(a, {"sorted": a, "random": a}, here=lambda: a) is a
    # compare runs on the profile's machine: the one run from elsewhere is rerun here
    with pytest.raises(
        ValueError,
        match=r"this machine is aaaa: rerun here what was measured elsewhere: snakemake "
        r"--cores all --forcerun results/train/random/summary.json",
    ):
        provenance.check_one_machine(a, {"sorted": a, "random": b}, here=lambda: a)
    # on the runs' machine: the profile is the one to rerun
    with pytest.raises(
        ValueError,
        match=r"this machine is bbbb: .*--forcerun profile \(DVC: dvc repro --force "
        r"--single-item profile, then dvc repro\)$",
    ):
        provenance.check_one_machine(a, {"sorted": b, "random": b}, here=lambda: b)
    # on a third machine: the runs that differ from the profile, on its machine, or everything here
    with pytest.raises(
        ValueError,
        match=r"none was measured on this machine \(cccc\): on the profile's machine aaaa "
        r"rerun .*results/train/random/summary.json.*or, to predict for this machine, "
        r"rerun everything here",
    ):
        provenance.check_one_machine(a, {"sorted": a, "random": b}, here=lambda: _fp("cccc"))
    with pytest.raises(ValueError, match=r"versions.torch: '2.13.0' -> '2.11.0'"):
        provenance.check_one_machine(a, {"random": b}, here=lambda: a)
