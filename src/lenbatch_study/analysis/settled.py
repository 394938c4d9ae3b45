"""Whether the measurements can pick a strategy, and how the report says so: the machine's load and speed
while profiling and training, and the predictions' misses against the step-time model's own error.

Rendered by :mod:`lenbatch_study.analysis.report` (the answer's "Not settled" opening, the paragraph on the
machine, the drift-calibration table); compare's log warns of a busy or unsteady machine with the same tests. Pure functions of a
:class:`lenbatch_study.analysis.report.CompareResult`; cost O(strategies + fits).
"""

from __future__ import annotations

import math
from typing import Any

from lenbatch_study.core import machine
from lenbatch_study.core.cpu import CPU_SHARE_WARN

CompareResult = Any  # lenbatch_study.analysis.report.CompareResult (which imports this module)


def _pct(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def busy_machine(result: CompareResult) -> list[str]:
    """Signs that other work slowed the profile or the runs, from the share of their cores they got.

    - a run's role got a share differing from the profile's by more than ``1 - CPU_SHARE_WARN``
      (relative): profile and run ran under different loads, whatever the threads or device;
    - with one thread per process, anything below ``CPU_SHARE_WARN`` (with more threads a step
      need not keep every thread busy, so a low share alone proves nothing).
    """
    prof = result.profile_cpu_share
    one_thread = result.threads == 1
    low = [f"profile {role} {_pct(v)}" for role, v in prof.items() if one_thread and v < CPU_SHARE_WARN]
    for s, r in result.rows.items():
        for role in ("target", "drafter"):
            x, p = getattr(r, f"{role}_cpu_share"), prof[role]
            if (one_thread and x < CPU_SHARE_WARN) or min(x, p) < CPU_SHARE_WARN * max(x, p):
                low.append(f"{s} run {role} {_pct(x)} (profile {_pct(p)})")
    return low


# A reference step that moved more than this between a measurement's start and end: the machine's speed
# changed under it (a VM's CPU steal does not show in the process's CPU shares; the reference does).
DRIFT_WARN = 0.10
# what reruns the measurements of a busy or unsteady machine (the report and compare's warnings say it)
QUIET_RERUN = "snakemake --forcerun profile train"


def unsteady_machine(result: CompareResult) -> list[str]:
    """Measurements whose reference step (lenbatch_study.runtime.reference) moved by more than ``DRIFT_WARN``
    between their start and end: the machine ran at another speed at the end than at the start, whatever
    the CPU shares say (a virtual machine's stolen time is invisible to the process)."""
    out = [f"profile {role} {_signed(v)}" for role, v in (result.profile_reference_drift or {}).items()
           if not math.isnan(v) and abs(v) > DRIFT_WARN]
    for s, r in result.rows.items():
        for role in ("target", "drafter"):
            v = getattr(r, f"{role}_reference_drift")
            if not math.isnan(v) and abs(v) > DRIFT_WARN:
                out.append(f"{s} run {role} {_signed(v)}")
    return out


def prediction_noise(result: CompareResult) -> float:
    """How far a prediction may miss with nothing wrong: the step-time model's own miss on profile points it was
    not fitted on (the largest held-out mean error of the chosen fits; :mod:`lenbatch_study.analysis.stepmodel`),
    and at least :data:`DRIFT_WARN`, what the reference step may move on a machine the report calls steady."""
    errs = [f["best"].holdout_error for f in result.fits.values() if f.get("best") is not None]
    errs = [e for e in errs if e is not None and not math.isnan(e)]
    return max([DRIFT_WARN, *errs])


def errors_beyond_noise(result: CompareResult) -> list[str]:
    """Strategies whose prediction missed the measurement by more than :func:`prediction_noise`, raw and drift-
    calibrated both: the profile does not describe those runs (the machine or the setting changed between them)."""
    noise = prediction_noise(result)
    out = []
    for s, r in result.rows.items():
        errs = [e for e in (r.prediction_error, r.calibrated_prediction_error) if not math.isnan(e)]
        if errs and min(abs(e) for e in errs) > noise:
            out.append(f"{s} {_signed(r.prediction_error)}")
    return out


def not_settled(result: CompareResult) -> str:
    """The answer's opening when the measurements cannot pick a strategy ('' when they can): a busy machine, an
    unsteady one, or predictions that missed by more than the model's own error, in that order."""
    def listed(items: list[str]) -> str:
        return ", ".join(items[:3]) + (", ..." if len(items) > 3 else "")

    busy, moved, errs = busy_machine(result), unsteady_machine(result), errors_beyond_noise(result)
    if busy or moved:
        return (f"**Not settled: the machine was {'busy' if busy else 'unsteady'} while measuring** "
                f"({listed(busy or moved)}; see \"Every strategy\" below), so these measurements cannot pick a "
                "strategy.")
    if errs:
        return (f"**Not settled: the predictions missed by more than the step-time model's own error** "
                f"({listed(errs)}, against the {_pct(prediction_noise(result))} the step-time model misses by on "
                "profile points it was not fitted on, or a steady machine's drift), so the profile does not describe "
                "these runs: the machine or the setting changed between them, and the measurements cannot pick a "
                "strategy.")
    return ""


def noise_paragraph(result: CompareResult) -> str:
    """Where it was measured, and was the machine quiet while profiling and training? (Tells noise from
    model error.)"""
    return machine_sentence(result) + " " + _quiet_paragraph(result)


def _quiet_paragraph(result: CompareResult) -> str:
    prof = result.profile_cpu_share
    runs = [getattr(r, f"{role}_cpu_share") for r in result.rows.values() for role in ("target", "drafter")]
    runs = [x for x in runs if not math.isnan(x)]
    if math.isnan(prof["target"]) or not runs:
        return ("CPU shares were not recorded (a profile grid or runs from an older version), so a busy machine "
                f"cannot be told from model error; rerun: {QUIET_RERUN}")
    low = busy_machine(result)
    if low:
        return (f"**The machine was busy**: share of their cores {', '.join(low)}. A step that gets a share s "
                "of its cores takes about 1/s as long, so the errors above mix other work on the machine with model "
                "error. Rerun what was slowed on a quiet machine (`snakemake --forcerun profile` for the profile, "
                "`--forcerun train` for the runs).")
    shares = (f"the profile's steps got {_pct(prof['target'])} (target) and {_pct(prof['drafter'])} (drafter) "
              f"of their cores, the runs' steps at least {_pct(min(runs))}")
    moved = unsteady_machine(result)
    if moved:
        return (f"**The machine's speed changed during the measurements**: {shares}, but the reference step moved "
                f"by more than {100 * DRIFT_WARN:.0f}% between start and end ({', '.join(moved)}; a virtual "
                "machine's stolen CPU time does not show in CPU shares). The errors above mix that drift with "
                "model error, and a start/end reference cannot calibrate a drift that is not linear in time. Rerun "
                f"on a steadier machine: `{QUIET_RERUN}`.")
    return (f"The machine was quiet: {shares}, and the reference step moved by at most {100 * DRIFT_WARN:.0f}% "
            "within the profile and every run, so the errors above are the step-time model's and the run-to-run "
            "noise's, not other work's.")


def _signed(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:+.1f}%"


def machine_sentence(result: CompareResult) -> str:
    """Where the profile and the runs were measured (compare refuses them unless it is one machine)."""
    if not result.machine:
        return "The machine the profile and the runs were measured on is not recorded."
    return (f"The profile and all {len(result.rows)} runs were measured on one machine: "
            f"{machine.describe(result.machine)}.")


def calibration_section(result: CompareResult) -> str:
    """Raw and calibrated prediction side by side, with the reference ratios they differ by."""
    rows = result.rows
    shape = result.reference_shape or {}
    drift = result.profile_reference_drift or {}
    run_s = [r.reference_seconds for r in rows.values() if not math.isnan(r.reference_seconds)]
    lines = ["## Drift calibration", "",
             f"The profile and every run timed one reference step ({shape.get('sequences')} x {shape.get('length')} "
             "padded tokens: the target's forward and the drafter's forward and backward, each alone) at their "
             "start and end. The calibrated prediction multiplies each role's predicted step times by the run's "
             "reference ratio (run / profile, the mean of the start and end medians): above 1 the machine was "
             "slower during the run than during the profile. Where the reference ratio is close to the measured / "
             "predicted step ratio, the drift explains the raw error. Within the profile the reference moved by "
             f"{_signed(drift.get('target'))} (target) and {_signed(drift.get('drafter'))} (drafter), end against "
             "start.", "",
             "| strategy | predicted tok/s | error | calibrated tok/s | calibrated error | target reference ratio | "
             "target step ratio | drafter reference ratio | drafter step ratio | reference drift in the run "
             "(target, drafter) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for s, r in rows.items():
        lines.append(f"| {s} | {r.predicted_tok_s:,.0f} | {_signed(r.prediction_error)} | {r.calibrated_tok_s:,.0f} | "
                     f"{_signed(r.calibrated_prediction_error)} | {r.target_reference_ratio:.3f} | "
                     f"{r.target_step_ratio:.3f} | {r.drafter_reference_ratio:.3f} | {r.drafter_step_ratio:.3f} | "
                     f"{_signed(r.target_reference_drift)}, {_signed(r.drafter_reference_drift)} |")
    cost = (f"The reference step took {result.profile_reference_seconds:.1f} s of the profile and "
            f"{min(run_s):.1f}-{max(run_s):.1f} s of each run, outside the measured steps." if run_s else "")
    return "\n".join(lines + ["", cost])


__all__ = ["DRIFT_WARN", "QUIET_RERUN", "busy_machine", "calibration_section", "errors_beyond_noise",
           "machine_sentence", "noise_paragraph", "not_settled", "prediction_noise", "unsteady_machine"]
