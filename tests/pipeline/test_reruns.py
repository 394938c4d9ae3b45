"""What reruns when a module is edited: for every module under src/lenbatch, the workflow stages whose code
dependencies hold it (:func:`lenbatch.pipeline.deps.stage_code`, the import closure of each stage module),
against a table written by hand here. A change of structure (a new import, a moved function) shows up as
a diff of this table, which a reviewer reads as "editing M now reruns these stages too".

``train`` stands for its five DVC stages (``train-<strategy>``: the same code). The real tools are checked
on a sample of these edits in ``test_workflow_e2e.py`` (``dvc status`` and ``snakemake -n`` after a real
edit); here the derivation alone, in well under a second.

Before this table (commit 3bb53bb, one flat folder): editing ``stepmodel.py`` (the prediction fit) reran
profile, the five trainings and compare; editing ``cli_stages.py`` (help strings) reran every stage.
"""

from __future__ import annotations

from lenbatch.pipeline import deps

ALL = {"tokenize", "stats", "boundaries", "plans", "profile", "train", "quality", "compare"}
PLANNING = {"boundaries", "plans", "train", "quality", "compare"}  # every stage that plans batches
MODEL = {"profile", "train", "quality"}  # every stage that runs the target and the drafter

# module (under src/lenbatch) -> the stages that rerun when it is edited
RERUNS: dict[str, set[str]] = {
    # the public face and the entry point: no stage imports them
    "__init__.py": set(),
    "__main__.py": set(),
    "hf.py": set(),
    "hostmem.py": set(),
    "model.py": set(),
    # analysis: prediction and reports are compare's; the quality numbers are quality's (and compare reads them)
    "analysis/gradquality.py": {"quality", "compare"},
    "analysis/calibration.py": {"compare"},  # the reference-step rescaling of the prediction
    "analysis/provenance.py": {"compare"},  # the machine check of profile vs runs
    "analysis/quality_report.py": {"compare"},  # rendering of the quality result: compare draws it
    "analysis/quality_stats.py": {"quality", "compare"},
    "analysis/report.py": {"compare"},
    "analysis/shapes.py": {"profile", "compare"},  # the grid's shapes and the runs' shape table
    "analysis/stepmodel.py": {"compare"},  # the prediction fit: no measurement reruns
    "analysis/study_replay.py": {"compare"},  # the report's replay of the study's setting
    # batching: the numpy planning library
    "batching/_jit.py": PLANNING,  # the compiled scans (imported lazily by scan.py: still a code dep)
    "batching/anchors.py": {"profile", "train", "quality", "compare"},  # the drafter's anchors (compare: its work)
    "batching/boundaries.py": {"boundaries", "compare"},  # compare replays the study with dp edges
    "batching/epoch.py": PLANNING,
    "batching/layouts.py": ALL,  # the strategy list: the params loader validates train.strategies with it
    "batching/lengths.py": {"stats", "boundaries", "plans", "train", "quality", "compare"},  # checks every lengths read
    "batching/padding.py": PLANNING,
    "batching/scan.py": PLANNING,
    "batching/schedule.py": {"train", "compare"},  # compare rebuilds the trained batches
    "batching/simulate.py": {"plans"},
    "batching/spec.py": PLANNING | {"profile"},
    "batching/strategies.py": PLANNING,
    # the command line: nobody's dependency (help strings rerun nothing)
    "cli/__init__.py": set(),
    "cli/flags.py": set(),
    # core
    "core/config.py": ALL,  # the params every stage reads
    "core/cpu.py": {"profile", "train", "compare"},
    "core/log.py": ALL,
    "core/machine.py": {"profile", "train", "quality", "compare"},  # the fingerprint every measurement records
    # corpus: tokenize's alone
    "corpus/arrow.py": {"tokenize"},  # pre-tokenized input reads Arrow files with it
    "corpus/chat.py": {"tokenize"},
    "corpus/pretokenized.py": {"tokenize"},
    "corpus/sources.py": {"tokenize"},
    "corpus/tokenizing.py": {"tokenize"},
    # loading: the sampler and the Trainer integration are for users' loops, no stage runs them
    "loading/collate.py": MODEL,
    "loading/sampler.py": set(),
    "loading/trainer.py": set(),
    # models
    "models/drafter.py": MODEL,
    "models/fla_cpu.py": MODEL,
    "models/memory.py": {"train"},
    "models/target.py": MODEL,
    "models/varlen.py": MODEL,
    "models/kernels.py": MODEL,
    "models/verify.py": set(),  # verify-packing is a tool, not a stage
    # pipeline: an artifact module is its readers' dependency, never its writer's
    "pipeline/artifacts/bucket_edges.py": {"plans", "train", "quality", "compare"},
    "pipeline/artifacts/length_stats.py": {"compare"},
    "pipeline/artifacts/machine_file.py": set(),  # its file name, for the table: a dependency nobody reads
    "pipeline/artifacts/plan_metrics.py": {"compare"},
    "pipeline/artifacts/profile_grid.py": {"compare"},
    "pipeline/artifacts/quality_result.py": {"compare"},
    "pipeline/artifacts/reading.py": {"stats", "boundaries", "plans", "train", "quality", "compare"},
    "pipeline/artifacts/tokenized.py": {"stats", "boundaries", "plans", "train", "quality", "compare"},
    "pipeline/artifacts/train_runs.py": {"compare"},
    "pipeline/artifacts/writing.py": {"stats", "boundaries", "plans"},
    "pipeline/deps.py": set(),
    "pipeline/dvcplots.py": set(),
    "pipeline/outputs.py": {"train"},  # train takes its own writer lock
    "pipeline/registry.py": set(),  # the stage table: its help strings and declarations are no code
    # runtime: train's, and profile times the same step runner
    "runtime/checkpoint.py": {"train"},
    "runtime/hostmem.py": {"profile", "train"},
    "runtime/lifetime.py": {"profile", "train"},  # the profile's workers die with it too
    "runtime/records.py": {"train"},
    "runtime/reference.py": {"profile", "train"},  # the drift-calibration step
    "runtime/runner.py": {"profile", "train"},
    "runtime/transport.py": {"train"},
    # stages: each its own
    "stages/boundaries.py": {"boundaries"},
    "stages/compare.py": {"compare"},
    "stages/dvc_yaml.py": set(),
    "stages/machine.py": set(),  # lenbatch machine: not a workflow stage (yet)
    "stages/params.py": set(),
    "stages/plan.py": set(),
    "stages/plans.py": {"plans"},
    "stages/plots.py": set(),
    "stages/sync.py": set(),  # lenbatch sync: a tool, no stage of the DAG
    "stages/profile.py": {"profile"},
    "stages/quality.py": {"quality"},
    "stages/stats.py": {"stats"},
    "stages/study_replay.py": set(),  # lenbatch study-replay (plans --study-replay): no workflow stage
    "stages/tokenize.py": {"tokenize"},
    "stages/train.py": {"train"},
    "stages/verify_packing.py": set(),
}


def derived() -> dict[str, set[str]]:
    """module -> stages, from the code (every module, the subpackages' docstring-only __init__.py included)."""
    # the machine stage runs on every dvc repro (always_changed): its code is nobody's dependency
    code = {s: set(deps.stage_code(s)) for s, st in deps.STAGES.items() if not st.always_changed}
    mods = sorted(p.relative_to(deps.SRC).as_posix() for p in deps.SRC.rglob("*.py"))
    return {m: {s for s, files in code.items() if f"src/lenbatch/{m}" in files} for m in mods}


def dvc_stages(stages: set[str], strategies: list[str]) -> set[str]:
    """Table names -> DVC's stage names (``train`` -> ``train-<strategy>``)."""
    return {n for s in stages for n in ([f"train-{x}" for x in strategies] if s == "train" else [s])}


def test_the_table_names_every_module_and_every_stage():
    found = derived()
    inits = {m for m in found if m.endswith("__init__.py") and m != "__init__.py" and m != "cli/__init__.py"}
    assert set(RERUNS) | inits == set(found), (
        f"modules missing from RERUNS: {sorted(set(found) - set(RERUNS) - inits)}; "
        f"in RERUNS but gone: {sorted(set(RERUNS) - set(found))}")
    assert set().union(*RERUNS.values()) == ALL == {s for s, st in deps.STAGES.items() if not st.always_changed}


def test_editing_a_module_reruns_exactly_the_stages_of_the_table():
    found = derived()
    wrong = [f'"{m}": {sorted(found[m])} (table: {sorted(want)})' for m, want in RERUNS.items() if found[m] != want]
    assert not wrong, ("the code's structure changed what an edit reruns (update RERUNS after review):\n"
                       + "\n".join(wrong))
    # subpackage __init__.py hold a docstring only: no stage depends on them
    assert all(not v for m, v in found.items() if m.endswith("/__init__.py"))


def test_the_edits_issue_20_named():
    """The prediction fit and the report rerun compare alone (no training, no profile); a help string
    reruns nothing; the planner reruns what plans batches; the chat format only tokenize."""
    assert RERUNS["analysis/stepmodel.py"] == RERUNS["analysis/report.py"] == {"compare"}
    assert RERUNS["cli/flags.py"] == RERUNS["cli/__init__.py"] == RERUNS["pipeline/registry.py"] == set()
    assert RERUNS["batching/strategies.py"] == {"boundaries", "plans", "train", "quality", "compare"}
    assert RERUNS["corpus/chat.py"] == {"tokenize"}
    assert dvc_stages(RERUNS["batching/strategies.py"], ["sorted", "packed"]) == {
        "boundaries", "plans", "train-sorted", "train-packed", "quality", "compare"}
    # the measuring stages (profile, train) rerun for no reader of their outputs and no rendering
    for m, stages in RERUNS.items():
        if m.startswith(("analysis/", "pipeline/artifacts/")) and m not in (
                "analysis/shapes.py", "pipeline/artifacts/tokenized.py", "pipeline/artifacts/reading.py",
                "pipeline/artifacts/bucket_edges.py"):
            assert not stages & {"profile", "train"}, m
