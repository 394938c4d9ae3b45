"""How the machine behaved while profiling and training: its load (CPU shares) and how far its speed moved
(the reference step timed at each measurement's start and end).

Reported, never a veto: the answer is decided on the ratios measured in turns
(:mod:`lenbatch_study.analysis.verdict`), which a drift cannot move; the trainings' absolute tokens/s and
their ratios can be moved, and ``details.md`` (:mod:`lenbatch_study.analysis.report_details`) says by how
much; compare's log warns with the same tests. Pure functions of a
:class:`lenbatch_study.analysis.report.CompareResult`; cost O(strategies).
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
    out = [
        f"profile {role} {_signed(v)}"
        for role, v in (result.profile_reference_drift or {}).items()
        if not math.isnan(v) and abs(v) > DRIFT_WARN
    ]
    for s, r in result.rows.items():
        for role in ("target", "drafter"):
            v = getattr(r, f"{role}_reference_drift")
            if not math.isnan(v) and abs(v) > DRIFT_WARN:
                out.append(f"{s} run {role} {_signed(v)}")
    return out


def quiet_paragraph(result: CompareResult) -> str:
    """Was the machine quiet while profiling and training? (Tells the trainings' noise from model error.)"""
    prof = result.profile_cpu_share
    runs = [getattr(r, f"{role}_cpu_share") for r in result.rows.values() for role in ("target", "drafter")]
    runs = [x for x in runs if not math.isnan(x)]
    if math.isnan(prof["target"]) or not runs:
        return (
            "CPU shares were not recorded (a profile grid or runs from an older version), so a busy machine "
            f"cannot be told from model error; rerun: {QUIET_RERUN}"
        )
    low = busy_machine(result)
    if low:
        return (
            f"**The machine was busy**: share of their cores {', '.join(low)}. A step that gets a share s "
            "of its cores takes about 1/s as long, so the errors above mix other work on the machine with model "
            "error (the ratios measured in turns, which the answer is decided on, share that load alike). Rerun "
            "what was slowed on a quiet machine (`snakemake --forcerun profile` for the profile, `--forcerun "
            "train` for the runs)."
        )
    shares = (
        f"the profile's steps got {_pct(prof['target'])} (target) and {_pct(prof['drafter'])} (drafter) "
        f"of their cores, the runs' steps at least {_pct(min(runs))}"
    )
    moved = unsteady_machine(result)
    if moved:
        return (
            f"**The machine's speed changed during the measurements**: {shares}, but the reference step moved "
            f"by more than {100 * DRIFT_WARN:.0f}% between start and end ({', '.join(moved)}; a virtual "
            "machine's stolen CPU time does not show in CPU shares). The trainings' errors and ratios above mix "
            "that drift with model error; the ratios measured in turns, which the answer is decided on, do not."
        )
    return (
        f"The machine was quiet: {shares}, and the reference step moved by at most {100 * DRIFT_WARN:.0f}% "
        "within the profile and every run, so the errors above are the step-time model's and the run-to-run "
        "noise's, not other work's."
    )


def _signed(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:+.1f}%"


def machine_sentence(result: CompareResult) -> str:
    """Where the profile and the runs were measured (compare refuses them unless it is one machine)."""
    if not result.machine:
        return "The machine the profile and the runs were measured on is not recorded."
    return (
        f"The profile and all {len(result.rows)} runs were measured on one machine: {machine.describe(result.machine)}."
    )


__all__ = ["DRIFT_WARN", "QUIET_RERUN", "busy_machine", "machine_sentence", "quiet_paragraph", "unsteady_machine"]
