"""The train stage's output, one folder per strategy: ``summary.json`` and ``steps.jsonl`` (and, for a
resume, ``checkpoint.pt``; ``params.json`` as every output folder).

Written by :mod:`lenbatch_study.stages.train` (``summary.json``) and :class:`lenbatch_study.runtime.records.Recorder`
(``steps.jsonl``) and :func:`lenbatch_study.runtime.checkpoint.save_checkpoint` (``checkpoint.pt``) at the
paths the stage names from here (the runtime layer sits below this one). Read by compare (:func:`read_run`).

* ``summary.json``: a mapping with ``useful_tokens_per_s``, ``steps`` (equal to ``planned_steps``: a
  complete run) and ``params`` (the resolved params it trained with), among others.
* ``steps.jsonl``: one JSON object per line and step (``step``, ``useful_tokens``, ``loss``, ...), every
  step of the summary present.

Every number either file holds is checked (:func:`check_summary_numbers`, :func:`check_step_numbers`): none
is negative, NaN or infinite, and the throughput, the steps and each step's useful tokens are > 0 (a
``useful_tokens_per_s: -5`` was reported as an error of -136471%).

Cost: O(steps) to read.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from lenbatch_study.pipeline.artifacts.reading import read_json, refuse, require_keys, rerun_hint
from lenbatch_study.pipeline.artifacts.writing import PARAMS

WRITER = "train"
SUMMARY = "summary.json"
STEPS = "steps.jsonl"
CHECKPOINT = "checkpoint.pt"
STOPPED = "stopped.json"  # beside the checkpoint of a run stopped on a signal (lenbatch_study.runtime.stopping)
# what a fresh run removes from its folder first (with the temp files their atomic writes leave when killed)
RUN_FILES = (
    CHECKPOINT,
    f"{CHECKPOINT}.tmp",
    SUMMARY,
    f"{SUMMARY}.tmp",
    PARAMS,
    STEPS,
    f"{STEPS}.tmp",
    STOPPED,
    f"{STOPPED}.tmp",
)


def summary_path(strategy: str) -> str:
    """``strategy``'s ``summary.json`` under the default results folder: what a rerun hint names."""
    return f"results/{WRITER}/{strategy}/{SUMMARY}"


def rerun(run_dir: Path, strategy: str) -> str:
    return rerun_hint(WRITER, summary_path(strategy), run_dir, flags=f"--strategy {strategy}")


def read_steps(path: str | Path, *, rerun: str) -> list[dict[str, Any]]:
    """Every line of a ``steps.jsonl`` as a mapping (blank lines skipped); at least one."""
    p = Path(path)
    if not p.exists():
        raise refuse(p, "does not exist", rerun=rerun)
    rows = []
    for i, line in enumerate(p.read_text().splitlines()):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise refuse(p, f"line {i + 1} is not JSON (a partial run?)", rerun=rerun) from None
    if not rows:
        raise refuse(p, "holds no steps", rerun=rerun)
    return rows


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# Numbers a run records that are not measurements and may be negative: identities, finite all the same (the
# drafters' weight checksums of a multi-node run are signed sums).
SIGNED = ("weights_checksums",)


def _bad(values: dict[str, Any], *, positive: tuple[str, ...], where: str = "", signed: bool = False) -> list[str]:
    """``key=value`` of every number in ``values`` (nested mappings and lists included) that is NaN, infinite
    or negative (but under a key of :data:`SIGNED`), or 0 for a key of ``positive``."""
    out = []
    for key, x in values.items():
        name = f"{where}{key}"
        inner = signed or key in SIGNED
        if isinstance(x, dict):
            out += _bad(x, positive=(), where=f"{name}.", signed=inner)
        elif isinstance(x, list):
            out += _bad({f"[{j}]": v for j, v in enumerate(x)}, positive=(), where=name, signed=inner)
        elif _number(x) and (not math.isfinite(x) or (x < 0 and not inner) or (x == 0 and key in positive)):
            out.append(f"{name}={x!r}")
    return out


def check_summary_numbers(path: Path, summary: dict[str, Any], *, rerun: str) -> None:
    """:func:`refuse` naming the summary's numbers that no run measures: NaN, infinite or negative anywhere
    (counts, seconds, shares, losses, the reference step's times; ``params`` is checked where it is loaded),
    a throughput or a step count of 0, a padding efficiency above 1."""
    bad = _bad(
        {k: v for k, v in summary.items() if k != "params"},
        positive=("useful_tokens_per_s", "steps", "useful_tokens", "padding_efficiency"),
    )
    eff = summary.get("padding_efficiency")
    if _number(eff) and eff > 1:
        bad.append(f"padding_efficiency={eff!r} (above 1)")
    if not (isinstance(summary["steps"], int) and not isinstance(summary["steps"], bool)):
        bad.append(f"steps={summary['steps']!r} (not a count)")
    if bad:
        more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
        raise refuse(
            path,
            f"holds numbers that no run measures: {'; '.join(bad[:4])}{more} (an edited or corrupt file)",
            rerun=rerun,
        )


def check_step_numbers(path: Path, rows: list[dict[str, Any]], *, rerun: str) -> None:
    """:func:`refuse` naming the first rows whose numbers no step measures: a ``step`` that is not a whole
    number >= 0, useful tokens that are not a whole number > 0, any number NaN, infinite or negative."""
    bad = []
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            bad.append(f"line {i + 1} is {type(r).__name__}, not a mapping")
            continue
        found = _bad(r, positive=("useful_tokens",))
        for key in ("step", "useful_tokens"):
            if not (isinstance(r.get(key), int) and not isinstance(r.get(key), bool)):
                found.append(f"{key}={r.get(key)!r} (not a whole number)")
        bad += [f"line {i + 1} {x}" for x in found]
    if bad:
        more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
        raise refuse(
            path,
            f"holds numbers that no step measures: {'; '.join(bad[:4])}{more} (an edited or corrupt file)",
            rerun=rerun,
        )


def read_run(train_dir: str | Path, strategy: str) -> dict[str, Any]:
    """``{"summary", "steps"}`` of ``strategy``'s run under ``train_dir``: a complete run (every planned
    step trained, one ``steps.jsonl`` line set per step) that records its params."""
    run_dir = Path(train_dir) / strategy
    hint = rerun(run_dir, strategy)
    path = run_dir / SUMMARY
    summary = read_json(path, rerun=hint)
    require_keys(path, summary, ("useful_tokens_per_s", "steps", "params"), rerun=hint)
    check_summary_numbers(path, summary, rerun=hint)
    planned = summary.get("planned_steps")
    if planned is not None and int(planned) != int(summary["steps"]):
        raise refuse(path, f"records {summary['steps']} of {planned} planned steps (a partial run)", rerun=hint)
    if not isinstance(summary["params"], dict):
        raise refuse(path, "records no resolved params", rerun=hint)
    steps = read_steps(run_dir / STEPS, rerun=hint)
    check_step_numbers(run_dir / STEPS, steps, rerun=hint)
    if len({int(r["step"]) for r in steps}) != int(summary["steps"]):
        raise refuse(
            run_dir / STEPS,
            f"holds {len(steps)} steps but {SUMMARY} says {summary['steps']} (a partial or mixed run)",
            rerun=hint,
        )
    return {"summary": summary, "steps": steps}


__all__ = [
    "CHECKPOINT",
    "RUN_FILES",
    "STEPS",
    "SUMMARY",
    "check_step_numbers",
    "check_summary_numbers",
    "read_run",
    "read_steps",
    "rerun",
    "summary_path",
]
