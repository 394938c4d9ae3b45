"""A new stage is the places docs/workflow.md lists ("To add a stage"), no more (issue 46.4): in a copy of the
workflow (tiny params, its own git repo), a toy stage ``toy`` with a params section of its own
(``toy.min_len``) that reads tokenize's ``lengths.npy`` and writes ``count.json`` (the number of samples at
least ``min_len`` long) is added through exactly those places, ``lenbatch dvc-yaml`` writing ``dvc.yaml`` and
the section's defaults into ``params.yaml``, and run for real under Snakemake and under DVC (its upstream:
source, then tokenize on 60 conversations); a change of its own param reruns it alone. The copy's ``src/``
comes first on PYTHONPATH, so its registry and sections (with the toy) are the ones every tool imports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np

import pytest
import yaml

from lenbatch_study.core.config import deep_merge
from _e2e import git_commit
from test_workflow import ENV, ROOT, copy_workflow, run

pytestmark = pytest.mark.slow

NAME, FILE = "toy", "toy_count"  # the stage and its artifact module (<name>, <file> in the documented list)

ARTIFACT = '''"""The toy stage's output: ``count.json``, the number of samples tokenize wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lenbatch_study.pipeline.artifacts.reading import read_json, require_keys, rerun_hint

WRITER = "toy"
COUNT = "count.json"


def read_count(toy_dir: str | Path) -> dict[str, Any]:
    p = Path(toy_dir) / COUNT
    rerun = rerun_hint(WRITER, f"results/{WRITER}/{COUNT}", p.parent)
    doc = read_json(p, rerun=rerun)
    require_keys(p, doc, ("count",), rerun=rerun)
    return doc
'''

STAGE = '''"""The ``toy`` stage: the number of samples in tokenize's ``lengths.npy``, in ``count.json``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from lenbatch_study.pipeline.artifacts.tokenized import read_lengths
from lenbatch_study.pipeline.artifacts.toy_count import COUNT
from lenbatch_study.pipeline.artifacts.writing import write_json, write_resolved

if TYPE_CHECKING:
    from lenbatch_study.core.config import Params


def run(*, params: Params, out: Path, lengths: Path) -> int:
    count = int((read_lengths(Path(lengths).parent) >= params.toy.min_len).sum())
    write_json(Path(out) / COUNT, {"count": count})
    write_resolved(params, out, sections=("toy",))
    return 0
'''

SECTION = """@dataclass(frozen=True)
class ToyConfig:
    min_len: int = _f(0, "count only the samples at least this long (tokens)", minimum=0)


"""
FIELD = """    toy: ToyConfig = _section(ToyConfig, "toy stage: the number of samples")
"""

COMMAND = """    Command("toy", "the number of samples in lengths.npy", staged=True, stage=Stage(
        params=("toy",), inputs=(Input("tokenize", "lengths"),), outputs={"samples": Output(toy_count.COUNT)})),
"""


def documented_places() -> list[list[str]]:
    """The numbered list under docs/workflow.md's "To add a stage": each place's files (the paths it opens
    with, ``path`` or ``path`` and ``path``), with <name>/<file> filled in."""
    text = (ROOT / "docs/workflow.md").read_text()
    section = text.split("## To add a stage\n", 1)[1].split("\n## ", 1)[0]
    heads = re.findall(r"^\d+\. ((?:`[^`]+`(?: and |, )?)+)", section, re.M)
    assert heads, "docs/workflow.md's 'To add a stage' lists no places (a numbered list of `path`: ...)"
    return [[p.replace("<name>", NAME).replace("<file>", FILE) for p in re.findall(r"`([^`]+)`", h)] for h in heads]


def add_toy(work) -> None:
    """The toy through the documented places, by what a person would write in each."""
    registry = work / "src/lenbatch_study/pipeline/registry.py"
    text = registry.read_text()
    text = text.replace(
        "\n\n\n@dataclass(frozen=True)\nclass Output",
        "\nfrom lenbatch_study.pipeline.artifacts import toy_count\n\n\n@dataclass(frozen=True)\nclass Output",
        1,
    )
    # DAG order: after tokenize, before stats' row (however the formatter breaks that row's lines)
    text = re.sub(r'^(    Command\(\s*"stats",)', lambda m: COMMAND + m.group(1), text, count=1, flags=re.M)
    assert text.count("toy_count") == 2, "registry.py's layout changed: update add_toy"
    registry.write_text(text)
    (work / f"src/lenbatch_study/pipeline/artifacts/{FILE}.py").write_text(ARTIFACT)
    (work / f"src/lenbatch_study/stages/{NAME}.py").write_text(STAGE)
    sections = work / "src/lenbatch_study/core/sections.py"
    text = sections.read_text()
    text = text.replace("\ndef _section(", "\n" + SECTION + "def _section(", 1)
    text = re.sub(r"\n(\n    def section\(self)", lambda m: "\n" + FIELD + m.group(1), text, count=1)
    assert text.count("ToyConfig") == 3, "sections.py's layout changed: update add_toy"
    sections.write_text(text)
    tool(["lenbatch", "dvc-yaml"], work)  # dvc.yaml, and the toy section's defaults into params.yaml


def tool(args, work, timeout=600):
    """``args`` in ``work`` with the copy's ``src/`` first on PYTHONPATH (its registry, its toy)."""
    proc = subprocess.run(
        args, cwd=work, env={**ENV, "PYTHONPATH": str(work / "src")}, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    work = copy_workflow(tmp_path_factory.mktemp("addstage"))
    merged = deep_merge(
        yaml.safe_load((work / "params.yaml").read_text()), yaml.safe_load((work / "configs/tiny.yaml").read_text())
    )
    merged.pop("results_dir")  # the tiny params as *the* params: results/, what dvc.yaml tracks
    (work / "params.yaml").write_text(yaml.safe_dump(merged, sort_keys=False))
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
    git_commit(work, "the workflow without the toy")
    add_toy(work)
    return work


def test_the_toy_touches_exactly_the_documented_places(work):
    changed = run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=work).stdout.splitlines()
    touched = sorted(line[3:] for line in changed)
    places = documented_places()
    assert touched == sorted(p for place in places for p in place), (
        f"adding a stage touched {touched}; docs/workflow.md lists {places}"
    )
    assert len(places) <= 5, places
    # the one command wrote the new section's default, with its help as the comment, and kept the rest
    params = (work / "params.yaml").read_text()
    assert params.endswith(
        "\ntoy:  # toy stage: the number of samples\n  min_len: 0  # count only the samples at least this long (tokens)\n"
    ), params[-300:]
    assert run(["git", "diff", "--numstat", "params.yaml"], cwd=work).stdout.split()[:2] == ["3", "0"]
    dvc = yaml.safe_load((work / "dvc.yaml").read_text())["stages"]
    # what an edit reruns follows with no edit: its own modules rerun it, and so does the reader of its input
    reruns = tool(
        [
            "lenbatch",
            "reruns",
            f"src/lenbatch_study/stages/{NAME}.py",
            f"src/lenbatch_study/pipeline/artifacts/{FILE}.py",
            "lenbatch_study.pipeline.artifacts.tokenized",
        ],
        work,
    ).stdout.splitlines()
    assert reruns[:2] == [
        f"lenbatch_study/stages/{NAME}.py: {NAME}",
        f"lenbatch_study/pipeline/artifacts/{FILE}.py: {NAME}",
    ]
    assert f" {NAME}," in reruns[2], reruns
    assert (
        "results/tokenize/lengths.npy" in dvc[NAME]["deps"]
        and f"src/lenbatch_study/stages/{NAME}.py" in dvc[NAME]["deps"]
    )


def _expected(work) -> dict[str, int]:
    min_len = yaml.safe_load((work / "params.yaml").read_text())[NAME]["min_len"]
    return {"count": int((np.load(work / "results/tokenize/lengths.npy") >= min_len).sum())}


def _changed(work) -> set[str]:
    """The stages ``dvc status`` says would rerun (those DVC always reruns left out)."""
    status = json.loads(tool(["dvc", "status", "--json"], work).stdout or "{}")
    return {k for k, v in status.items() if v != ["always changed"]}


def test_the_toy_runs_under_snakemake_then_under_dvc(work):
    out = work / f"results/{NAME}/count.json"
    # its rule is the generated one (workflow/rules/stages.smk), its command line the generic flags
    plan = tool(["snakemake", "-n", "-p", f"results/{NAME}/count.json"], work).stdout
    assert re.search(
        rf"lenbatch {NAME} --params-json .* --lengths results/tokenize/lengths.npy --out results/{NAME} ", plan
    ), plan
    tool(["snakemake", "--cores", "2", f"results/{NAME}/count.json"], work)
    assert json.loads(out.read_text()) == _expected(work) and _expected(work)["count"] > 0
    shutil.rmtree(work / f"results/{NAME}")
    tool(["dvc", "repro", NAME], work)
    assert json.loads(out.read_text()) == _expected(work)
    lock = yaml.safe_load((work / "dvc.lock").read_text())["stages"]
    assert NAME in lock and any(o["path"] == f"results/{NAME}/count.json" for o in lock[NAME]["outs"])
    status = json.loads(tool(["dvc", "status", "--json", NAME], work).stdout or "{}")  # and its upstream
    assert {k for k, v in status.items() if v != ["always changed"]} == set(), status


def test_a_change_of_the_toy_s_own_param_reruns_the_toy_only(work):
    """Its section is a DVC params dependency of the toy alone: an edit of ``toy.min_len`` in params.yaml
    leaves its upstream as it was, and the rerun counts with the new value."""
    if not (work / "dvc.lock").exists():
        pytest.skip("needs the run of test_the_toy_runs_under_snakemake_then_under_dvc")
    lengths = np.load(work / "results/tokenize/lengths.npy")
    min_len = int(lengths.max())  # counts the longest only: fewer than all, more than none
    params = work / "params.yaml"
    text = params.read_text()
    assert text.count("  min_len: 0  #") == 1
    unrun = _changed(work)  # the stages downstream of tokenize this test never ran
    assert NAME not in unrun and "tokenize" not in unrun, unrun
    params.write_text(text.replace("  min_len: 0  #", f"  min_len: {min_len}  #"))
    changed = _changed(work)
    assert changed == unrun | {NAME}, changed
    before = {s: o for s, o in yaml.safe_load((work / "dvc.lock").read_text())["stages"].items() if s != NAME}
    tool(["dvc", "repro", NAME], work)
    after = yaml.safe_load((work / "dvc.lock").read_text())["stages"]
    assert {s: o for s, o in after.items() if s != NAME} == before
    assert after[NAME]["params"]["params.yaml"][NAME] == {"min_len": min_len}
    got = json.loads((work / f"results/{NAME}/count.json").read_text())
    assert got == _expected(work) and 0 < got["count"] < len(lengths), got
    assert _changed(work) == unrun
