"""The profile stage's output: ``grid.json``, the step times of the target and the drafter on a grid of
batch shapes, and ``params.json``, the params it was timed with. Written by :mod:`lenbatch_study.stages.profile`
(with the names here); read by compare
(:func:`read_grid`, :func:`read_profile_params`).

``grid.json``: a mapping ``{"machine", "reference", "points"}`` — the machine fingerprint
(:mod:`lenbatch_study.core.machine`), the reference step timed before and after the grid
(:mod:`lenbatch_study.runtime.reference`) and the rows (an older grid is the bare list of rows) —, one row per shape: ``layout``
(padded/packed), ``sequence_lengths`` (the lengths timed), ``target_seconds_median``,
``drafter_seconds_median``, ``target_seconds_all`` and ``drafter_seconds_all`` (every timed pass, in order: what
compare fits) and, from a lockstep profile, ``*_busy_seconds_*``; ``positions``, ``ctx_tokens`` and
``lm_chunks`` (the drafter's work, means over the timed steps) when known; from a lockstep profile of a
pipelined run, the features' transport: ``transport_bytes``, ``transport_seconds_all`` (the drafter rank's
receive, every timed send), ``transport_stage_s_all`` (the target rank's copy onto the data group's device)
and ``transport_backend`` (:func:`read_transport`; a grid written before they were recorded has none, and
compare then predicts without the transport: rerun the profile to add it). Cost: one file read.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from lenbatch_study.pipeline.artifacts.reading import read_json, read_params, refuse, require_keys, rerun_hint

WRITER = "profile"
GRID = "grid.json"
GRID_PATH = f"results/{WRITER}/{GRID}"  # under the default results folder: what a rerun hint names
ROW_KEYS = (
    "layout",
    "sequence_lengths",
    "target_seconds_median",
    "drafter_seconds_median",
    "target_seconds_all",
    "drafter_seconds_all",
)


def rerun(profile_dir: Path) -> str:
    return rerun_hint(WRITER, GRID_PATH, profile_dir)


def read_grid(profile_dir: str | Path) -> list[dict[str, Any]]:
    """The grid rows of ``grid.json`` in the profile output folder ``profile_dir``, each checked."""
    return read_grid_document(profile_dir)["points"]


def read_grid_document(profile_dir: str | Path) -> dict[str, Any]:
    """``grid.json`` whole: ``{"machine", "reference", "points"}`` (None for the machine and reference of a
    grid written before they were recorded), every row checked."""
    d = Path(profile_dir)
    p = d / GRID
    doc = read_json(p, rerun=rerun(d))
    rows = doc.get("points") if isinstance(doc, dict) else doc
    if not isinstance(rows, list) or not rows:
        raise refuse(p, "holds no grid rows", rerun=rerun(d))
    for k, row in enumerate(rows):
        require_keys(p, row, ROW_KEYS, rerun=rerun(d), what=f" in row {k}")
    check_times(p, rows, rerun=rerun(d))
    whole = doc if isinstance(doc, dict) else {}
    return {
        "machine": whole.get("machine"),
        "reference": whole.get("reference"),
        "points": rows,
        "transport": read_transport(p, rows, rerun=rerun(d)),
    }


TRANSPORT_KEYS = ("transport_bytes", "transport_seconds_all", "transport_stage_s_all", "transport_backend")


def read_transport(path: Path, rows: list[dict[str, Any]], *, rerun: str) -> dict[str, Any] | None:
    """The features' transport the grid measured: ``{"backend", "bytes": [per row], "seconds": [per row: every
    timed receive], "stage": [per row: every timed staging]}``; None for a grid without it (profile.concurrent
    off, one process, or written before it was measured). Refuses a grid where some rows have it and others
    not, or a bytes count or staging time that is not a finite number >= 0 (the receive times are checked
    with the step times, :func:`check_times`). O(rows)."""
    have = [all(k in r for k in TRANSPORT_KEYS) for r in rows]
    if not any(have):
        return None
    if not all(have):
        raise refuse(
            path,
            f"has the features' transport ({', '.join(TRANSPORT_KEYS)}) in {sum(have)} of its "
            f"{len(rows)} rows (an interrupted or edited file)",
            rerun=rerun,
        )

    def ok(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0

    bad = [
        f"row {k} transport_bytes={r['transport_bytes']!r}" for k, r in enumerate(rows) if not ok(r["transport_bytes"])
    ]
    bad += [
        f"row {k} transport_stage_s_all={r['transport_stage_s_all']!r}"
        for k, r in enumerate(rows)
        if not isinstance(r["transport_stage_s_all"], list) or not all(ok(x) for x in r["transport_stage_s_all"])
    ]
    if bad:
        raise refuse(
            path, f"holds transport figures that are not finite numbers >= 0: {'; '.join(bad[:4])}", rerun=rerun
        )
    return {
        "backend": rows[0]["transport_backend"],
        "bytes": [float(r["transport_bytes"]) for r in rows],
        "seconds": [list(r["transport_seconds_all"]) for r in rows],
        "stage": [list(r["transport_stage_s_all"]) for r in rows],
    }


def check_times(path: Path, rows: list[dict[str, Any]], *, rerun: str) -> None:
    """:func:`refuse` naming every cell whose step time is not a finite number > 0 (NaN, inf, 0, a string):
    the step-model fit cannot use it (numpy's least squares fails with "SVD did not converge" on NaN). O(rows)."""

    def ok(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0

    bad = []
    for k, row in enumerate(rows):
        lengths = row.get("sequence_lengths") or []
        shape = f"{row.get('layout')}, {len(lengths)} x {max(lengths) if lengths else '?'} tokens"
        for key in sorted(x for x in row if x.endswith(("seconds_median", "seconds_all"))):
            value = row[key]
            if key.endswith("_all"):  # every timed pass: a list of at least one time
                if not isinstance(value, list) or not value:
                    bad.append(f"row {k} ({shape}) {key}={value!r}")
                bad.extend(f"row {k} ({shape}) {key}[{j}]={x!r}" for j, x in enumerate(value or []) if not ok(x))
            elif not ok(value):
                bad.append(f"row {k} ({shape}) {key}={value!r}")
    if bad:
        more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
        raise refuse(
            path,
            f"holds step times that are not finite positive seconds: {'; '.join(bad[:4])}{more} "
            "(a step that failed or was interrupted while it was timed)",
            rerun=rerun,
        )


def read_profile_params(profile_dir: str | Path) -> dict[str, Any] | None:
    """The resolved params the grid was timed with (``params.json``), None when the folder has none."""
    return read_params(profile_dir, rerun=rerun(Path(profile_dir)))


__all__ = [
    "GRID",
    "GRID_PATH",
    "TRANSPORT_KEYS",
    "check_times",
    "read_grid",
    "read_grid_document",
    "read_profile_params",
    "read_transport",
]
