"""Two `dvc exp run`s in one workspace (issue 48.8): both failed (exit 255) and left params.yaml at the refused
run's values, because DVC writes a run's -S values before it meets the stage another run holds. While a DVC
stage command of the workflow runs it holds DVC's own experiments lock on `workspace`
(lenbatch_study.pipeline.dvc_guard), so DVC refuses the second run before it touches anything.

Real DVC. The first run's stage waits for a file the test writes, so the second run meets it mid-stage
whatever the machine's speed."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import yaml

from test_workflow import ENV, copy_workflow

# the stage of the first run: holds the workspace as the workflow's stage commands do, then waits for "go"
STAGE = """import os, shutil, time
from lenbatch_study.pipeline.dvc_guard import hold_workspace
assert hold_workspace()
open("started", "w").close()
while not os.path.exists("go"):
    time.sleep(0.05)
shutil.copy("params.yaml", "out.yaml")
"""
DVC_YAML = """stages:
  s:
    cmd: python stage.py
    params:
    - a.x
    outs:
    - out.yaml:
        cache: false
"""


def _repo(work: Path) -> None:
    for args in (
        ["git", "init", "-q"],
        ["git", "config", "user.email", "t@t"],
        ["git", "config", "user.name", "t"],
        ["dvc", "init", "-q"],
    ):
        subprocess.run(args, cwd=work, env=ENV, check=True, capture_output=True)


def test_a_second_dvc_exp_run_in_one_workspace_is_refused_up_front_and_the_first_completes(tmp_path):
    work = tmp_path / "ws"
    work.mkdir()
    _repo(work)
    (work / "params.yaml").write_text("a:\n  x: 1\n")
    (work / "dvc.yaml").write_text(DVC_YAML)
    (work / "stage.py").write_text(STAGE)
    subprocess.run(["git", "add", "-A"], cwd=work, env=ENV, check=True)
    subprocess.run(["git", "commit", "-qm", "init"], cwd=work, env=ENV, check=True)
    first = subprocess.Popen(
        ["dvc", "exp", "run", "-S", "a.x=2"],
        cwd=work,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (work / "started").exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (work / "started").exists(), first.communicate()[0]
        second = subprocess.run(
            ["dvc", "exp", "run", "-S", "a.x=3"], cwd=work, env=ENV, capture_output=True, text=True, timeout=120
        )
        during = yaml.safe_load((work / "params.yaml").read_text())
    finally:
        (work / "go").touch()
        log = first.communicate(timeout=120)[0]
    said = second.stdout + second.stderr
    assert second.returncode != 0 and "'workspace' is busy" in said, said
    assert "one experiment run at a time here" in said and "dvc exp run --queue" in said, said
    assert during == {"a": {"x": 2}}  # the second run never wrote its a.x=3 (it did, before)
    assert first.returncode == 0, log  # the first is undisturbed (it failed too, before)
    assert yaml.safe_load((work / "out.yaml").read_text()) == {"a": {"x": 2}}
    assert json.loads((work / ".dvc" / "tmp" / "exps" / "rwlock").read_text()).get("read", {}) == {}  # released


def test_a_dvc_stage_command_of_the_workflow_holds_the_workspace_while_it_runs(tmp_path):
    """The wiring: the workflow parsed under a DVC stage command (DVC sets DVC_STAGE for each) takes the lock and
    releases it as it exits; a plain `snakemake` takes none."""
    work = copy_workflow(tmp_path)
    _repo(work)
    lock = work / ".dvc" / "tmp" / "exps" / "rwlock"
    proc = subprocess.run(
        ["snakemake", "-n", "--configfile", "configs/tiny.yaml"],
        cwd=work,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not lock.exists()
    proc = subprocess.run(
        ["snakemake", "-n", "--configfile", "configs/tiny.yaml"],
        cwd=work,
        env={**ENV, "DVC_STAGE": "tokenize"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert lock.exists() and json.loads(lock.read_text()).get("read", {}) == {}  # taken, then released at exit
