"""Two `dvc exp run`s in one workspace (issue 48.8): what docs/experiments.md says happens, happens.

DVC writes the second run's `-S` values into params.yaml before it finds the first run holding the stage it
needs; neither run's code is ours until then, so the workflow cannot refuse it first (docs/experiments.md,
"One `dvc exp run` per workspace at a time"). Real DVC on a one-stage repository: the first run's stage waits
for a file the test writes, so the second run meets it mid-stage whatever the machine's speed."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import yaml

from test_workflow import ENV, ROOT

DVC_YAML = """stages:
  s:
    cmd: touch started && while [ ! -f go ]; do sleep 0.05; done && cp params.yaml out.yaml
    params:
    - a.x
    outs:
    - out.yaml:
        cache: false
"""


def _git(work: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=work, env=ENV, check=True, capture_output=True)


def test_a_second_dvc_exp_run_in_one_workspace_fails_as_the_docs_say_and_git_checkout_restores_params(tmp_path):
    work = tmp_path / "ws"
    work.mkdir()
    _git(work, "init", "-q")
    _git(work, "config", "user.email", "t@t")
    _git(work, "config", "user.name", "t")
    subprocess.run(["dvc", "init", "-q"], cwd=work, env=ENV, check=True)
    (work / "params.yaml").write_text("a:\n  x: 1\n")
    (work / "dvc.yaml").write_text(DVC_YAML)
    _git(work, "add", "-A")
    _git(work, "commit", "-qm", "init")
    first = subprocess.Popen(["dvc", "exp", "run", "-S", "a.x=2"], cwd=work, env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (work / "started").exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (work / "started").exists(), first.communicate()[0]
        second = subprocess.run(["dvc", "exp", "run", "-S", "a.x=3"], cwd=work, env=ENV, capture_output=True,
                                text=True, timeout=120)
    finally:
        (work / "go").touch()
        log = first.communicate(timeout=120)[0]
    # as docs/experiments.md says: the second fails (the stage is busy), the first fails after it, and the
    # workspace holds the refused run's values
    assert second.returncode != 0 and "is busy" in second.stdout + second.stderr, second.stdout + second.stderr
    assert first.returncode != 0, log
    assert yaml.safe_load((work / "params.yaml").read_text()) == {"a": {"x": 3}}
    # the way back the docs give: params.yaml as committed, then one run at a time
    _git(work, "checkout", "--", "params.yaml")
    assert yaml.safe_load((work / "params.yaml").read_text()) == {"a": {"x": 1}}


def test_the_docs_describe_concurrent_experiment_runs():
    text = (ROOT / "docs" / "experiments.md").read_text()
    assert "One `dvc exp run` per workspace at a time" in text and "dvc queue start" in text
    assert "git checkout -- params.yaml" in text
