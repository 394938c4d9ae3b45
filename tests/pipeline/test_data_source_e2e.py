"""The data source is tokenize's input in both tools, by content (issue 43): a user's JSONL in params.yaml,
tracked with `dvc add` as docs/experiments.md says, then appended to, touched, and run in a `--temp`
experiment. Real DVC and Snakemake on the tiny setting, tokenize alone (its upstream: the source stage)."""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pytest
import yaml

from lenbatch_study.core.config import deep_merge
from _e2e import git_commit
from test_experiments_e2e import write_chats
from test_workflow import ROOT, copy_workflow, run

pytestmark = pytest.mark.slow

DATA = "data/chats.jsonl"
LENGTHS = "results/tokenize/lengths.npy"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A user's repo: the tiny params with data.source = their JSONL (dvc add-ed, dvc.yaml regenerated), and
    `dvc repro tokenize` run."""
    work = copy_workflow(tmp_path_factory.mktemp("source"))
    (work / "data").mkdir()
    write_chats(work / DATA, n=40)
    merged = deep_merge(
        yaml.safe_load((work / "params.yaml").read_text()), yaml.safe_load((work / "configs/tiny.yaml").read_text())
    )
    merged.pop("results_dir")
    merged["data"].update(source=DATA, limit=None)
    (work / "params.yaml").write_text(yaml.safe_dump(merged, sort_keys=False))
    shutil.copy2(ROOT / ".gitignore", work / ".gitignore")
    for args in (
        ["git", "init", "-q"],
        ["git", "config", "user.email", "ci@lenbatch"],
        ["git", "config", "user.name", "lenbatch ci"],
        ["dvc", "init", "-q"],
        ["lenbatch", "dvc-yaml"],
        ["dvc", "add", "-q", DATA],
    ):
        run(args, cwd=work)
    for name in ("config", ".gitignore"):
        shutil.copy2(ROOT / ".dvc" / name, work / ".dvc" / name)
    git_commit(work, "my chats")
    run(["dvc", "repro", "tokenize"], cwd=work, timeout=600)
    return work


def _dvc_changed(work) -> set[str]:
    status = json.loads(run(["dvc", "status", "--json", "tokenize"], cwd=work).stdout or "{}")  # and its upstream
    return {k.split(":")[-1] for k, v in status.items() if v != ["always changed"]}


def _snakemake_plans(work) -> dict[str, int]:
    out = run(["snakemake", "-n", LENGTHS], cwd=work).stdout
    if "Nothing to be done" in out:
        return {}
    table = out.split("Job stats:")[1]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m.group(1) != "total"}


def test_the_users_file_is_a_dependency_of_tokenize_in_both_tools(repo):
    dvc = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]
    assert DATA in dvc["tokenize"]["deps"] and "results/source/source.json" in dvc["tokenize"]["deps"]
    identity = json.loads((repo / "results/source/source.json").read_text())
    assert identity["source"] == DATA and identity["bytes"] == (repo / DATA).stat().st_size
    assert _dvc_changed(repo) == set() and _snakemake_plans(repo) == {}


def test_a_touched_file_reruns_nothing_an_appended_one_retokenizes(repo):
    before = np.load(repo / LENGTHS)
    later = (repo / DATA).stat().st_mtime + 60
    os.utime(repo / DATA, (later, later))  # the same bytes, a newer time
    assert _dvc_changed(repo) - {"data/chats.jsonl.dvc"} == set() and _snakemake_plans(repo) == {}
    write_chats(repo / "more.jsonl", n=12, seed=1)
    with open(repo / DATA, "a") as fh:
        fh.write((repo / "more.jsonl").read_text())
    # dvc status hashes the file itself; Snakemake, the identity its parse rewrote
    assert "tokenize" in _dvc_changed(repo)
    assert _snakemake_plans(repo) == {"tokenize": 1}
    run(["dvc", "add", "-q", DATA], cwd=repo)  # as docs/experiments.md says: the new bytes into DVC's cache
    text = run(["dvc", "repro", "tokenize"], cwd=repo, timeout=600).stdout
    assert "Running stage 'tokenize'" in text
    assert len(np.load(repo / LENGTHS)) > len(before)
    assert _dvc_changed(repo) == set() and _snakemake_plans(repo) == {}
    git_commit(repo, "more chats")


def test_a_temp_experiment_finds_the_dvc_added_file(repo):
    """`dvc exp run --temp` runs in a fresh clone: the file git does not hold comes from DVC's cache."""
    with open(repo / DATA, "a") as fh:
        fh.write((repo / "more.jsonl").read_text())
    run(["dvc", "add", "-q", DATA], cwd=repo)
    git_commit(repo, "even more chats")
    out = run(["dvc", "exp", "run", "--temp", "-n", "more", "tokenize"], cwd=repo, timeout=600)
    assert "Running stage 'tokenize'" in out.stdout + out.stderr
    shown = run(["dvc", "exp", "show", "--json"], cwd=repo).stdout
    assert "more" in shown


def test_a_misspelled_strategy_under_dvc_is_named_before_any_gate_file(repo):
    """DVC's foreach makes a stage train@<name> for any name, whose gate file (boundaries/by-strategy/<name>.json)
    does not exist; the source stage, which DVC runs first and which loads the params, refuses the name with
    the list to choose from, before DVC looks for that file."""
    params = repo / "params.yaml"
    text = params.read_text()
    try:
        params.write_text(text.replace("  - sorted\n", "  - sorted\n  - pakced\n", 1))
        out = run(["dvc", "repro"], cwd=repo, timeout=600, check=False)
        said = out.stdout + out.stderr
        assert out.returncode != 0 and "choose from" in said and "pakced" in said, said
        assert "by-strategy/pakced.json" not in said and "Running stage 'stats'" not in said, said
    finally:
        params.write_text(text)


def test_a_temp_experiment_on_an_untracked_file_names_the_dvc_add(repo):
    """A file neither git nor DVC holds is not in the temporary copy: the source stage stops the experiment
    there, naming the `dvc add` that fixes it (not a Python traceback, not a silent run on other data)."""
    write_chats(repo / "data/other.jsonl", n=8, seed=2)
    out = run(
        ["dvc", "exp", "run", "--temp", "-S", "data.source=data/other.jsonl", "tokenize"],
        cwd=repo,
        timeout=600,
        check=False,
    )
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "dvc add data/other.jsonl" in said, said
    assert "Running stage 'tokenize'" not in said, said
