"""Process CPU time against wall time: did a timed step get its cores?

Every timed step (profile grid, training steps, quality) records its process CPU seconds; a
role's *CPU share* is its CPU seconds over (wall seconds x threads). About 1 on a quiet CPU
machine, well below 1 when other work took the cores. The train stage writes it into its
summary, profile warns on it and compare reports it. Pure numpy; cost O(steps).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def cpu_share(seconds: Sequence[float], cpu_seconds: Sequence[float], *, threads: int) -> float:
    """Share of its cores a role's steps got: sum cpu_seconds / (sum seconds x threads).

    About 1 on a quiet CPU machine (the cores were the step's own); well below 1 when other
    processes took them, which slows every step in a way no step-time model can predict.
    It can exceed 1 a little: process CPU time counts every thread of the process, and OpenMP
    workers spin-wait after a parallel region (CI measured 1.1 with 2 intra-op threads).
    (On a GPU the host spins while waiting, so it stays near 1 and says nothing.) NaN when
    there are no CPU times. Cost O(steps).
    """
    wall = float(np.sum(np.asarray(seconds, dtype=np.float64)))
    cpu = np.asarray(cpu_seconds, dtype=np.float64)
    if wall <= 0 or cpu.size == 0 or not np.all(np.isfinite(cpu)):
        return float("nan")
    return float(cpu.sum() / (wall * max(int(threads), 1)))


def steps_cpu_share(rows: Sequence[Mapping], role: str, *, threads: int) -> float:
    """:func:`cpu_share` of one role over training step rows (``<role>_s``, ``<role>_cpu_s``);
    NaN when a row lacks CPU seconds (a run from before they were recorded)."""
    if not rows or any(f"{role}_cpu_s" not in r for r in rows):
        return float("nan")
    return cpu_share([r[f"{role}_s"] for r in rows], [r[f"{role}_cpu_s"] for r in rows], threads=threads)


CPU_SHARE_WARN = 0.9


def grid_cpu_share(rows: list[dict], *, threads: int) -> dict[str, float]:
    """Share of its cores each role got over the whole grid (:func:`cpu_share`).

    NaN for a role when the grid has no CPU times (a grid.json from before they were recorded).
    """
    out = {}
    for role in ("target", "drafter"):
        if not rows or any(f"{role}_cpu_seconds_all" not in r for r in rows):
            out[role] = float("nan")
            continue
        wall = [x for r in rows for key in (f"{role}_seconds_all", f"{role}_busy_seconds_all") for x in r.get(key, [])]
        cpu = [
            x
            for r in rows
            for key in (f"{role}_cpu_seconds_all", f"{role}_busy_cpu_seconds_all")
            for x in r.get(key, [])
        ]
        out[role] = cpu_share(wall, cpu, threads=threads)
    return out
