"""The train stage's output, one folder per strategy: ``summary.json`` and ``steps.jsonl`` (and, for a
resume, ``checkpoint.pt``; ``params.json`` as every output folder).

Written by :mod:`lenbatch_study.stages.train` (``summary.json``) and :class:`lenbatch_study.runtime.records.Recorder`
(``steps.jsonl``) and :func:`lenbatch_study.runtime.checkpoint.save_checkpoint` (``checkpoint.pt``) at the
paths the stage names from here (the runtime layer sits below this one). Read by compare (:func:`read_run`).

* ``summary.json``: a mapping with ``useful_tokens_per_s``, ``steps`` (equal to ``planned_steps``: a
  complete run) and ``params`` (the resolved params it trained with), among others.
* ``steps.jsonl``: one JSON object per line and step (``step``, ``useful_tokens``, ``loss``, ...), every
  step of the summary present.

Cost: O(steps) to read.
"""

from __future__ import annotations

import json
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
RUN_FILES = (CHECKPOINT, f"{CHECKPOINT}.tmp", SUMMARY, f"{SUMMARY}.tmp", PARAMS, STEPS, f"{STEPS}.tmp", STOPPED,
             f"{STOPPED}.tmp")


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


def read_run(train_dir: str | Path, strategy: str) -> dict[str, Any]:
    """``{"summary", "steps"}`` of ``strategy``'s run under ``train_dir``: a complete run (every planned
    step trained, one ``steps.jsonl`` line set per step) that records its params."""
    run_dir = Path(train_dir) / strategy
    hint = rerun(run_dir, strategy)
    path = run_dir / SUMMARY
    summary = read_json(path, rerun=hint)
    require_keys(path, summary, ("useful_tokens_per_s", "steps", "params"), rerun=hint)
    planned = summary.get("planned_steps")
    if planned is not None and int(planned) != int(summary["steps"]):
        raise refuse(path, f"records {summary['steps']} of {planned} planned steps (a partial run)", rerun=hint)
    if not isinstance(summary["params"], dict):
        raise refuse(path, "records no resolved params", rerun=hint)
    steps = read_steps(run_dir / STEPS, rerun=hint)
    if len({int(r["step"]) for r in steps}) != int(summary["steps"]):
        raise refuse(run_dir / STEPS, f"holds {len(steps)} steps but {SUMMARY} says {summary['steps']} (a partial "
                     "or mixed run)", rerun=hint)
    return {"summary": summary, "steps": steps}


__all__ = ["CHECKPOINT", "RUN_FILES", "STEPS", "SUMMARY", "read_run", "read_steps", "rerun", "summary_path"]
