"""What reruns when a module is edited, derived: ``lenbatch reruns`` (:func:`lenbatch_study.tools.reruns.reruns`,
the import closure of each stage module) is the one home of that fact; no table of it is kept by hand. Here, the
rules the derivation must follow (a change of structure that breaks one fails a test naming the module), in
well under a second; the real tools are checked on a sample of edits in ``test_workflow_e2e.py`` (``dvc status``
and ``snakemake -n`` after a real edit).

``train`` stands for its DVC stages (``train@<strategy>``, one per listed strategy: the same code).

Before the derivation was the rule (commit 3bb53bb, one flat folder): editing ``stepmodel.py`` (the prediction fit)
reran profile, the five trainings and compare; editing ``cli_stages.py`` (help strings) reran every stage.
"""

from __future__ import annotations

import ast
import subprocess
import sys

from lenbatch_study.pipeline import deps, registry
from lenbatch_study.tools.reruns import reruns

# the stages an edit can rerun: every stage but the always-run ones (their outputs' bytes decide, not their code)
CODED = [s for s, st in registry.STAGES.items() if not st.always_changed]


def dvc_stages(stages: list[str], strategies: list[str]) -> set[str]:
    """Stage names -> DVC's stage names (a per-strategy stage ``train`` -> ``train@<strategy>``)."""
    return {n for s in stages for n in ([f"{s}@{x}" for x in strategies] if registry.STAGES[s].per_strategy else [s])}


def test_every_module_is_derived_and_every_stage_reached():
    found = reruns()
    on_disk = {
        p.relative_to(deps.SRC_ROOT).as_posix() for pkg in deps.PACKAGES for p in (deps.SRC_ROOT / pkg).rglob("*.py")
    }
    assert set(found) == on_disk
    assert {s for stages in found.values() for s in stages} == set(CODED)
    # subpackage __init__.py hold a docstring only: no stage depends on them
    assert [m for m, v in found.items() if m.endswith("/__init__.py") and v] == []


def test_the_edits_issue_20_named():
    """The prediction fit and the report rerun compare alone (no training, no profile); a help string or the
    stage table reruns nothing; the planner reruns what plans batches; the chat format only tokenize."""
    found = reruns()
    assert found["lenbatch_study/analysis/stepmodel.py"] == found["lenbatch_study/analysis/report.py"] == ["compare"]
    for m in (
        "lenbatch_study/cli/flags.py",
        "lenbatch_study/cli/__init__.py",
        "lenbatch_study/cli/params_args.py",
        "lenbatch_study/pipeline/registry.py",
        "lenbatch_study/tools/reruns.py",
        "lenbatch/__init__.py",
    ):
        assert found[m] == [], f"{m} reruns {found[m]}: no stage may import it"
    assert found["lenbatch/batching/strategies.py"] == [
        "boundaries",
        "plans",
        "train",
        "quality",
        "interleave",
        "compare",
    ]
    assert found["lenbatch_study/corpus/chat.py"] == ["tokenize"]
    assert dvc_stages(found["lenbatch/batching/strategies.py"], ["sorted", "packed"]) == {
        "boundaries",
        "plans",
        "train@sorted",
        "train@packed",
        "quality",
        "interleave",
        "compare",
    }


def test_no_prediction_or_rendering_reruns_a_measurement():
    """The measuring stages (profile, train, interleave) rerun for no module of analysis/ (prediction, reports)
    but the grid's shapes, which profile measures."""
    wrong = {
        m: stages
        for m, stages in reruns().items()
        if m.startswith("lenbatch_study/analysis/")
        and m != "lenbatch_study/analysis/shapes.py"
        and set(stages) & {"profile", "train", "interleave"}
    }
    assert not wrong, wrong


def test_an_artifact_module_reruns_its_writer_and_its_readers():
    """Each file's owner module (pipeline/artifacts/<m>.py, its ``WRITER``) is a dependency of the stage that
    writes it and of the stages the table says read that stage's outputs, and of no other (DESIGN.md,
    "Artifacts"): module boundaries follow meaning, nothing is shaped to spare a rerun."""
    found = reruns()
    checked = 0
    for path in sorted((deps.SRC / "pipeline" / "artifacts").glob("*.py")):
        tree = ast.parse(path.read_text())
        writer = next(
            (
                n.value.value
                for n in tree.body
                if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "WRITER" for t in n.targets)
            ),
            None,
        )
        if writer is None:  # the shared wording (reading.py), writer (writing.py), the package
            continue
        readers = {
            s for s, st in registry.STAGES.items() if any(i.stage == writer and not i.trigger_only for i in st.inputs)
        }
        want = ({writer} & set(CODED)) | readers
        module = f"lenbatch_study/pipeline/artifacts/{path.name}"
        assert set(found[module]) == want, f"{module}: reruns {found[module]}, its writer and readers: {sorted(want)}"
        checked += 1
    assert checked >= 10


def test_lenbatch_reruns_prints_the_derivation_and_names_a_bad_module():
    cmd = [sys.executable, "-m", "lenbatch_study", "reruns"]
    out = subprocess.run(
        [*cmd, "src/lenbatch_study/analysis/stepmodel.py", "lenbatch_study.cli.flags"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.splitlines() == ["lenbatch_study/analysis/stepmodel.py: compare", "lenbatch_study/cli/flags.py: nothing"]
    bad = subprocess.run([*cmd, "lenbatch_study/nope.py"], capture_output=True, text=True)
    assert bad.returncode == 2 and "lenbatch_study/nope.py" in bad.stderr and "stepmodel.py" in bad.stderr
