"""A small-settings experiment under DVC in one flag (issue 43): the shipped params.yaml, then `dvc exp run
-S settings=tiny`, for real (the whole tiny DAG, a few minutes on 2 cores). The stages get tiny's resolved
values and `dvc exp show --only-changed` lists one param, the one the user changed."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil

import pytest

from lenbatch_study.core.config import load_params
from _e2e import git_commit
from test_workflow import ROOT, copy_workflow, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    work = copy_workflow(tmp_path_factory.mktemp("settings"))
    shutil.copy2(ROOT / ".gitignore", work / ".gitignore")
    for args in (
        ["git", "init", "-q"],
        ["git", "config", "user.email", "ci@lenbatch"],
        ["git", "config", "user.name", "lenbatch ci"],
        ["dvc", "init", "-q"],
    ):
        run(args, cwd=work)
    for name in ("config", ".gitignore"):
        shutil.copy2(ROOT / ".dvc" / name, work / ".dvc" / name)
    git_commit(work, "the shipped params")
    out = run(["dvc", "exp", "run", "-n", "tiny", "-S", "settings=tiny"], cwd=work, timeout=1800)
    return work, out.stdout + out.stderr


def test_one_flag_runs_the_tiny_setting(experiment):
    work, text = experiment
    ran = set(re.findall(r"Running stage '([\w@-]+)'", text))
    assert {"tokenize", "profile", "train@sorted", "interleave", "compare"} <= ran, text
    tiny = load_params(ROOT / "params.yaml", ROOT / "configs/tiny.yaml")
    assert load_params(work / "params.yaml") == tiny  # the one loader, as every stage reads it
    for stage in ("tokenize", "profile", "interleave"):  # what each stage recorded it ran with: tiny's values
        recorded = json.loads((work / f"results/{stage}/params.json").read_text())
        assert recorded["data"]["max_len"] == tiny.data.max_len == 1024, stage
    assert json.loads((work / "results/interleave/interleave.json").read_text())["max_rounds"] == 6
    assert not (work / "results/tiny").exists()  # the overlay's results_dir is for --configfile runs


def test_exp_show_lists_only_the_changed_param(experiment):
    work, _ = experiment
    shown = run(["dvc", "exp", "show", "--only-changed", "--csv"], cwd=work).stdout
    columns = next(csv.reader(io.StringIO(shown)))
    params = [
        c
        for c in columns
        if re.match(
            r"^(settings|data|stats|boundaries|batching|plans|model|drafter|train|"
            r"profile|interleave|compare|quality)(\.|$)",
            c,
        )
    ]
    assert params == ["settings"], columns
