"""The finished tiny workflow that the end-to-end tests share (one `make run`, ~90 s), in a git repo of its own."""

from __future__ import annotations

import shutil

import pytest
import yaml

from lenbatch_study.core.config import deep_merge
from _e2e import git_commit, make
from test_workflow import ROOT, copy_workflow, run


@pytest.fixture(scope="session")
def finished(tmp_path_factory):
    """configs/tiny.yaml merged into params.yaml, committed with the repo's Makefile and .dvc/config, then
    `make run` (dvc repro, then snakemake --touch) and its results committed: what a user's repo looks like."""
    work = copy_workflow(tmp_path_factory.mktemp("e2e"))
    merged = deep_merge(
        yaml.safe_load((work / "params.yaml").read_text()), yaml.safe_load((work / "configs/tiny.yaml").read_text())
    )
    merged.pop("results_dir")  # the tiny params as *the* params: results/, what dvc.yaml tracks
    (work / "params.yaml").write_text(yaml.safe_dump(merged, sort_keys=False))
    shutil.copy2(ROOT / ".gitignore", work / ".gitignore")
    shutil.copy2(ROOT / "Makefile", work / "Makefile")
    for args in (
        ["git", "init", "-q"],
        ["git", "config", "user.email", "ci@lenbatch"],
        ["git", "config", "user.name", "lenbatch ci"],
        ["dvc", "init", "-q"],
    ):
        run(args, cwd=work)
    for name in ("config", ".gitignore"):  # the project's DVC settings (plots.html_template), not dvc init's
        shutil.copy2(ROOT / ".dvc" / name, work / ".dvc" / name)
    git_commit(work, "tiny workflow")
    make(work, "run")
    git_commit(work, "tiny run")
    return work
