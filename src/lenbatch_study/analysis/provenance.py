"""Where a prediction's inputs were measured: one machine for the profile and every run, and the reference
steps that calibrate between them, checked before compare predicts.

:func:`check_one_machine` refuses a profile and runs whose machine fingerprints (:mod:`lenbatch_study.core.machine`)
differ, or that record none (results from before fingerprints: refused, not guessed), and names what to
remeasure with the exact Snakemake and DVC commands; :func:`reference_ratios` refuses a run or profile without
a reference step (:mod:`lenbatch_study.analysis.calibration`). Cost: O(runs).
"""

from __future__ import annotations

from typing import Any

from lenbatch_study.analysis import calibration
from lenbatch_study.core import machine
from lenbatch_study.pipeline.artifacts.train_runs import summary_path


def profile_rerun() -> str:
    """The commands that remeasure the profile grid (and then everything downstream of it)."""
    return "snakemake --cores all --forcerun profile (DVC: dvc repro --force --single-item profile, then dvc repro)"


def runs_rerun(strategies: list[str]) -> str:
    """The commands that remeasure the training runs of ``strategies`` (and then compare)."""
    files = " ".join(summary_path(s) for s in strategies)
    stages = " ".join(f"train@{s}" for s in strategies)
    return f"snakemake --cores all --forcerun {files} (DVC: dvc repro --force --single-item {stages}, then dvc repro)"


def _rerun(names: list[str]) -> str:
    """The commands that remeasure ``names`` ("profile" and strategies), profile first."""
    runs = [n for n in names if n != "profile"]
    parts = ([profile_rerun()] if "profile" in names else []) + ([runs_rerun(runs)] if runs else [])
    return "; and ".join(parts)


def check_one_machine(profile_machine: dict | None, run_machines: dict[str, dict | None], *, here: Any = None) -> dict:
    """The fingerprint (:mod:`lenbatch_study.core.machine`) the profile and every run share.

    ``ValueError`` naming the rerun when one records none (an older result: refused rather than
    guessed) or when their ids differ: the step-time model of one machine does not predict another's
    runs. The fix names what to remeasure: what differs from this machine (``here``: a callable giving
    its fingerprint, asked only on a mismatch) or, when this machine measured none of them, the runs
    that differ from the profile. Cost: O(runs)."""
    named = {"profile": profile_machine, **run_machines}
    missing = [n for n, fp in named.items() if not isinstance(fp, dict) or not fp.get("id")]
    if missing:
        raise ValueError(
            f"{_names(missing)} record no machine fingerprint (measured by a lenbatch that did not "
            "record where it measured), so compare cannot tell whether they ran on one machine; "
            f"rerun them on the machine to predict for: {_rerun(missing)}"
        )
    ids = {n: fp["id"] for n, fp in named.items()}
    if len(set(ids.values())) == 1:
        return profile_machine
    groups: dict[str, list[str]] = {}
    for n, i in ids.items():
        groups.setdefault(i, []).append(n)
    what = "; ".join(
        f"{_names(ns)} on machine {i}"
        + (
            ""
            if i == ids["profile"]
            else " (" + ", ".join(machine.differences(profile_machine, named[ns[0]])[:6]) + ")"
        )
        for i, ns in groups.items()
    )
    try:
        this = (here or machine.fingerprint)()["id"]
    except Exception:  # noqa: BLE001 (the error below still names a fix)
        this = None
    if this in groups:
        stale = [n for n in named if ids[n] != this]
        fix = f"this machine is {this}: rerun here what was measured elsewhere: {_rerun(stale)}"
    else:
        stale = [n for n in named if ids[n] != ids["profile"]]
        fix = (
            f"none was measured on this machine ({this}): on the profile's machine {ids['profile']} rerun "
            f"{_rerun(stale)}; or, to predict for this machine, rerun everything here: "
            f"{_rerun(list(named))}"
        )
    raise ValueError(
        f"the profile and the runs were measured on different machines ({what}); compare never mixes "
        f"machines: the step times of one do not predict another's runs. {fix}"
    )


def _names(names: list[str]) -> str:
    runs = [n for n in names if n != "profile"]
    parts = (["the profile grid"] if "profile" in names else []) + (
        [f"the run{'s' if len(runs) > 1 else ''} of {', '.join(runs)}"] if runs else []
    )
    return " and ".join(parts)


def reference_ratios(run_ref: dict | None, profile_ref: dict | None, *, strategy: str) -> dict[str, float]:
    """Per role: the run's reference step time over the profile's (:func:`lenbatch_study.analysis.calibration.ratios`);
    ``ValueError`` naming the rerun when either lacks one (an older result) or their shapes differ."""
    if not profile_ref:
        raise ValueError(
            f"the profile grid records no reference step (an older grid.json), so the prediction "
            f"cannot be calibrated; rerun: {profile_rerun()}"
        )
    if not run_ref:
        raise ValueError(
            f"the run of {strategy} records no reference step (an older summary.json), so its "
            f"prediction cannot be calibrated; rerun: {runs_rerun([strategy])}"
        )
    try:
        out = calibration.ratios(run_ref, profile_ref)
    except ValueError as err:
        raise ValueError(
            f"strategy {strategy}: {err}; rerun both with the same params: {profile_rerun()}; and "
            f"{runs_rerun([strategy])}"
        ) from None
    missing = [r for r in ("target", "drafter") if r not in out]
    if missing:
        raise ValueError(
            f"strategy {strategy}: no {' or '.join(missing)} reference time in the run or the "
            f"profile; rerun: {profile_rerun()}; and {runs_rerun([strategy])}"
        )
    return out


__all__ = ["check_one_machine", "profile_rerun", "reference_ratios", "runs_rerun"]
