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
