"""Helpers of the end-to-end tests: the repo's Makefile with this test run's venv, and git commits."""

from __future__ import annotations

import sys
from pathlib import Path

from test_workflow import run

VENV = Path(sys.executable).parent.parent
STAMP = VENV / ".lenbatch-installed"


def make(work: Path, target: str, timeout: int = 1200):
    """`make <target>` of the repo's Makefile in ``work`` with this test run's venv (never reinstalled)."""
    return run(["make", "-o", str(STAMP), f"VENV={VENV}", target], cwd=work, timeout=timeout)


def git_commit(work: Path, message: str) -> None:
    run(["git", "add", "-A"], cwd=work)
    run(["git", "commit", "-qm", message], cwd=work)


def changed_stages(status: dict) -> list[str]:
    """Stage names in `dvc status --json` output (keys may carry ``dvc.yaml:``), in DVC's order; a stage DVC
    names only because it is ``always_changed`` (machine, source: their commands leave the file as it is
    unless it changed) is no change."""
    return [name.split(":")[-1] for name, what in status.items() if what != ["always changed"]]


def resolve_stage(dvc_yaml: dict, name: str) -> dict | None:
    """Stage ``name`` of a parsed dvc.yaml: a plain stage as written, ``<stage>@<key>`` of a ``foreach`` stage
    its ``do:`` body with ``${item}`` replaced by ``key`` (`lenbatch dvc-yaml` writes ``${item}`` in paths
    only); None when not defined."""
    defined = dvc_yaml.get("stages", {})
    if name in defined and "do" not in defined[name]:
        return defined[name]
    base, at, key = name.partition("@")
    if not at or "do" not in defined.get(base, {}):
        return None

    def sub(x):
        if isinstance(x, str):
            return x.replace("${item}", key)
        if isinstance(x, list):
            return [sub(v) for v in x]
        if isinstance(x, dict):
            return {sub(k): sub(v) for k, v in x.items()}
        return x

    return sub(defined[base]["do"])
