"""What reruns when a module is edited: for every module under src/ (library and study), the workflow stages whose code
dependencies hold it (:func:`lenbatch_study.pipeline.deps.stage_code`, the import closure of each stage module),
against a table written by hand here. A change of structure (a new import, a moved function) shows up as
a diff of this table, which a reviewer reads as "editing M now reruns these stages too".

``train`` stands for its DVC stages (``train@<strategy>``, one per listed strategy: the same code). The
real tools are checked on a sample of these edits in ``test_workflow_e2e.py`` (``dvc status`` and
``snakemake -n`` after a real edit); here the derivation alone, in well under a second.

Before this table (commit 3bb53bb, one flat folder): editing ``stepmodel.py`` (the prediction fit) reran
profile, the five trainings and compare; editing ``cli_stages.py`` (help strings) reran every stage.
"""

from __future__ import annotations

from lenbatch_study.pipeline import deps

ALL = {"tokenize", "stats", "boundaries", "plans", "profile", "train", "quality", "interleave", "compare"}
PLANNING = {"boundaries", "plans", "train", "quality", "interleave", "compare"}  # every stage that plans batches
MODEL = {"profile", "train", "quality", "interleave"}  # every stage that runs the target and the drafter

# module (under src/: the library lenbatch/ and the study lenbatch_study/) -> the stages that rerun when it is edited
RERUNS: dict[str, set[str]] = {
    # the public faces and the entry point: no stage imports them
    "lenbatch_study/__init__.py": set(),
    "lenbatch/__init__.py": set(),
    "lenbatch_study/__main__.py": set(),
    "lenbatch/hf.py": set(),
    "lenbatch/loss.py": set(),
    "lenbatch/packcheck.py": set(),
    # analysis: prediction and reports are compare's; the quality numbers are quality's (and compare reads them)
    "lenbatch_study/analysis/gradquality.py": {"quality"},  # gradient quality: measured by quality alone
    "lenbatch_study/analysis/interleaved.py": {"compare"},  # the interleaved measurement's ratios: compare's
    "lenbatch_study/analysis/calibration.py": {"compare"},  # the reference-step rescaling of the prediction
    "lenbatch_study/analysis/compare_inputs.py": {"compare"},  # the runs and the profile fits compare reads
    "lenbatch_study/analysis/compare_judge.py": {"compare"},  # the diagnosis and the answer
    "lenbatch_study/analysis/step_prediction.py": {"compare"},  # a plan's steps predicted
    "lenbatch_study/analysis/provenance.py": {"compare"},  # the machine check of profile vs runs
    "lenbatch_study/analysis/quality_report.py": {"compare"},  # rendering of the quality result: compare draws it
    "lenbatch_study/analysis/quality_stats.py": {"quality", "compare"},
    "lenbatch_study/analysis/report.py": {"compare"},
    "lenbatch_study/analysis/report_details.py": {"compare"},
    "lenbatch_study/analysis/report_metrics.py": {"compare"},  # metrics.json and diagnostics.json
    "lenbatch_study/analysis/report_plots.py": {"compare"},  # the plots and their DVC plot data
    "lenbatch_study/analysis/settled.py": {"compare"},
    "lenbatch_study/analysis/verdict.py": {"compare"},
    "lenbatch_study/analysis/shapes.py": {"profile", "compare"},  # the grid's shapes and the runs' shape table
    "lenbatch_study/analysis/stepmodel.py": {"compare"},  # the prediction fit: no measurement reruns
    "lenbatch_study/analysis/step_timeline.py": {"compare"},  # the pipelined run's step ends, in the prediction
    "lenbatch_study/analysis/transport_model.py": {"compare"},  # the features' transport in the prediction
    "lenbatch_study/analysis/study_replay.py": {"compare"},  # the report's replay of the study's setting
    # batching: the numpy planning library
    "lenbatch/batching/_jit.py": PLANNING,  # the compiled scans (imported lazily by scan.py: still a code dep)
    "lenbatch_study/models/anchors.py": {"profile", "train", "quality", "interleave", "compare"},  # the drafter's anchors (compare: its work)
    "lenbatch/batching/boundaries.py": {"boundaries", "compare"},  # compare replays the study with dp edges
    "lenbatch/batching/bucket_cost.py": {"boundaries", "compare"},
    "lenbatch/batching/epoch.py": PLANNING,
    "lenbatch/batching/strategy.py": ALL,  # the strategy list: the params loader validates train.strategies with it
    "lenbatch/batching/lengths.py": ALL - {"profile"},  # checks every lengths read (tokenize: its reader's module)
    "lenbatch/batching/padding.py": PLANNING,
    "lenbatch/batching/scan.py": PLANNING,
    "lenbatch/batching/state.py": {"train", "interleave", "compare"},  # the sampler state the schedule writes
    "lenbatch/batching/simulate.py": {"plans"},
    "lenbatch/batching/spec.py": PLANNING | {"profile"},
    "lenbatch/batching/strategies.py": PLANNING,
    "lenbatch/batching/cost.py": PLANNING,  # the cost budget's limits: the planner imports them
    # the command line: nobody's dependency (help strings rerun nothing)
    "lenbatch_study/cli/__init__.py": set(),
    "lenbatch_study/cli/flags.py": set(),
    "lenbatch_study/cli/params_args.py": set(),  # the params edge of the command line
    # core
    "lenbatch_study/core/config.py": ALL,
    "lenbatch_study/core/sections.py": ALL,  # the params sections every stage gets
    "lenbatch_study/core/settings.py": ALL,  # the settings overlay: merged by the params loader every stage runs
    "lenbatch_study/core/intervals.py": {"quality", "interleave", "compare"},  # t intervals: seeds, and the rounds' stop rule
    "lenbatch_study/core/schema.py": set(),  # the params schema: generated by a tool, read by no stage  # the params every stage reads
    "lenbatch_study/core/batchspec.py": PLANNING - {"quality"} | {"profile"},  # params.batching -> BatchSpec
    "lenbatch_study/core/objective.py": {"boundaries", "compare"},  # the study's objective (compare: the replay)
    "lenbatch_study/core/cpu.py": {"profile", "train", "compare"},
    "lenbatch/log.py": set(),  # the library's NullHandler: no stage imports it (the study logs through core/log.py)
    "lenbatch_study/core/log.py": ALL,  # the study's console
    "lenbatch_study/core/machine.py": {"profile", "train", "quality", "interleave", "compare"},  # the fingerprint every measurement records
    # corpus: tokenize's alone
    "lenbatch/loading/arrow.py": {"tokenize"},  # pre-tokenized input reads Arrow files with it
    "lenbatch_study/corpus/chat.py": {"tokenize"},
    "lenbatch_study/corpus/identity.py": set(),  # the source's identity: the always-run source stage's, by content
    "lenbatch_study/corpus/pretokenized.py": {"tokenize"},
    "lenbatch_study/corpus/sources.py": {"tokenize"},
    "lenbatch_study/corpus/tokenizing.py": {"tokenize"},
    # loading: the sampler and the Trainer integration are for users' loops, no stage runs them
    "lenbatch/loading/collate.py": MODEL,
    "lenbatch/loading/sampler.py": set(),
    "lenbatch/loading/overflow.py": set(),  # over-long samples in users' loops: no stage runs them
    "lenbatch/batching/overflow.py": set(),
    # streams, the strategy comparison and its command: for users' loops and the README; no stage runs them
    "lenbatch/batching/stream.py": set(),
    "lenbatch/loading/streaming.py": set(),
    "lenbatch/batching/compare.py": set(),
    "lenbatch/__main__.py": set(),
    # models
    "lenbatch_study/models/drafter.py": MODEL,
    "lenbatch_study/models/fla_cpu.py": MODEL,
    "lenbatch_study/models/memory.py": {"train", "interleave"},  # the GPU memory check before loading
    "lenbatch_study/models/quality_drafter.py": {"quality"},  # the quality experiment's objective and inputs
    "lenbatch_study/models/target.py": MODEL,
    "lenbatch_study/models/target_config.py": MODEL,  # the target's shapes from a checkpoint's config.json
    "lenbatch_study/models/varlen.py": MODEL,
    "lenbatch_study/models/kernels.py": MODEL,
    "lenbatch_study/models/verify.py": set(),  # verify-packing is a tool, not a stage
    # pipeline: an artifact module (its files' names and reader) is the dependency of the stage that writes
    # the files and of those that read them
    "lenbatch_study/pipeline/artifacts/bucket_edges.py": {"boundaries", "plans", "train", "quality", "interleave",
                                                          "compare"},
    "lenbatch_study/pipeline/artifacts/compare_report.py": {"compare"},
    "lenbatch_study/pipeline/artifacts/length_stats.py": {"stats", "compare"},
    "lenbatch_study/pipeline/artifacts/source_file.py": set(),  # as machine_file: a dependency nobody reads
    "lenbatch_study/pipeline/artifacts/machine_file.py": set(),  # its file name, for the table: a dependency nobody reads
    "lenbatch_study/pipeline/artifacts/plan_metrics.py": {"plans", "compare"},
    "lenbatch_study/pipeline/artifacts/profile_grid.py": {"profile", "compare"},
    "lenbatch_study/pipeline/artifacts/interleave_timings.py": {"interleave", "compare"},
    "lenbatch_study/pipeline/artifacts/quality_result.py": {"quality", "compare"},
    "lenbatch_study/pipeline/artifacts/reading.py": ALL,  # the one wording of every reader
    "lenbatch_study/pipeline/artifacts/tokenized.py": ALL - {"profile"},
    "lenbatch_study/pipeline/artifacts/train_runs.py": {"train", "compare"},
    "lenbatch_study/pipeline/artifacts/writing.py": ALL,  # every output folder's params.json
    "lenbatch_study/pipeline/deps.py": set(),
    "lenbatch_study/pipeline/dvcplots.py": set(),
    "lenbatch_study/pipeline/outputs.py": {"train"},  # train takes its own writer lock
    "lenbatch_study/pipeline/preflight.py": set(),  # the workflow's input check at parse time: no stage's code
    "lenbatch_study/pipeline/registry.py": set(),  # the stage table: its help strings and declarations are no code
    # runtime: train's, and profile times the same step runner
    "lenbatch_study/runtime/checkpoint.py": {"train"},
    "lenbatch_study/runtime/hostmem.py": {"profile", "train", "interleave"},  # glibc malloc settings of the runner
    "lenbatch_study/runtime/planned.py": {"compare"},  # the runs' planned steps compare replays
    "lenbatch_study/runtime/grid_batches.py": {"profile"},  # the grid's shapes and their synthetic batches
    "lenbatch_study/runtime/profile_transport.py": {"profile"},  # the lockstep profile's transport measurement
    "lenbatch_study/runtime/schedule.py": {"train", "interleave", "compare"},  # compare rebuilds the trained batches
    "lenbatch_study/runtime/synthetic.py": {"profile", "train"},  # the grid's and the reference step's tokens
    "lenbatch_study/runtime/interleave.py": {"interleave"},  # the interleaved measurement's schedule of turns
    "lenbatch_study/runtime/lifetime.py": {"profile", "train"},  # the profile's workers die with it too
    "lenbatch_study/runtime/interrupt.py": set(),  # the Snakefile's Ctrl-C handler, no stage's import
    "lenbatch_study/runtime/launch.py": set(),  # lenbatch train's launcher: the CLI's import, no stage's
    "lenbatch_study/pipeline/dvc_guard.py": set(),  # the Snakefile's hold on a DVC workspace, no stage's import
    "lenbatch_study/runtime/records.py": {"train"},
    "lenbatch_study/runtime/ranks.py": {"train"},  # the loops of a training's roles: the train stage's alone
    "lenbatch_study/runtime/reference.py": {"profile", "train"},  # the drift-calibration step
    "lenbatch_study/runtime/resume.py": {"train"},  # the checkpoint a resume continues
    "lenbatch_study/runtime/runner.py": {"profile", "train", "interleave"},
    "lenbatch_study/runtime/stopping.py": {"train"},  # the stop a signal asks for
    "lenbatch_study/runtime/early_stop.py": {"train"},  # a SIGUSR1 held while lenbatch train starts
    "lenbatch_study/runtime/transport.py": {"profile", "train"},  # the profile measures the training's transport
    # the commands beside the stages: no stage of the DAG
    "lenbatch_study/tools/readme.py": set(),
    # stages: each its own
    "lenbatch_study/stages/boundaries.py": {"boundaries"},
    "lenbatch_study/stages/compare.py": {"compare"},
    "lenbatch_study/tools/dvc_yaml.py": set(),
    "lenbatch_study/stages/source.py": set(),  # always run by DVC: its output's bytes are tokenize's dependency
    "lenbatch_study/stages/machine.py": set(),  # lenbatch machine: not a workflow stage (yet)
    "lenbatch_study/tools/params.py": set(),
    "lenbatch_study/tools/plan.py": set(),
    "lenbatch_study/stages/plans.py": {"plans"},
    "lenbatch_study/tools/plots.py": set(),
    "lenbatch_study/stages/profile.py": {"profile"},
    "lenbatch_study/stages/interleave.py": {"interleave"},
    "lenbatch_study/stages/quality.py": {"quality"},
    "lenbatch_study/stages/stats.py": {"stats"},
    "lenbatch_study/tools/study_replay.py": set(),  # lenbatch study-replay (plans --study-replay): no workflow stage
    "lenbatch_study/stages/tokenize.py": {"tokenize"},
    "lenbatch_study/stages/train.py": {"train"},
    "lenbatch_study/tools/verify_packing.py": set(),
    "lenbatch_study/corpus/seed_profile.py": ALL - {"profile"},  # tokenize: its reader's module draws it
}


def derived() -> dict[str, set[str]]:
    """module -> stages, from the code (every module, the subpackages' docstring-only __init__.py included)."""
    # the machine stage runs on every dvc repro (always_changed): its code is nobody's dependency
    code = {s: set(deps.stage_code(s)) for s, st in deps.STAGES.items() if not st.always_changed}
    mods = sorted(p.relative_to(deps.SRC_ROOT).as_posix() for package in deps.PACKAGES
                  for p in (deps.SRC_ROOT / package).rglob("*.py"))
    return {m: {s for s, files in code.items() if f"src/{m}" in files} for m in mods}


def dvc_stages(stages: set[str], strategies: list[str]) -> set[str]:
    """Table names -> DVC's stage names (``train`` -> ``train@<strategy>``)."""
    return {n for s in stages for n in ([f"train@{x}" for x in strategies] if s == "train" else [s])}


def test_the_table_names_every_module_and_every_stage():
    found = derived()
    inits = {m for m in found if m.endswith("__init__.py") and m.count("/") >= 2 and m != "lenbatch_study/cli/__init__.py"}
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
    assert RERUNS["lenbatch_study/analysis/stepmodel.py"] == RERUNS["lenbatch_study/analysis/report.py"] == {"compare"}
    assert RERUNS["lenbatch_study/cli/flags.py"] == RERUNS["lenbatch_study/cli/__init__.py"] == RERUNS["lenbatch_study/pipeline/registry.py"] == set()
    assert RERUNS["lenbatch/batching/strategies.py"] == {"boundaries", "plans", "train", "quality", "interleave",
                                                         "compare"}
    assert RERUNS["lenbatch_study/corpus/chat.py"] == {"tokenize"}
    assert dvc_stages(RERUNS["lenbatch/batching/strategies.py"], ["sorted", "packed"]) == {
        "boundaries", "plans", "train@sorted", "train@packed", "quality", "interleave", "compare"}
    # the measuring stages (profile, train, interleave) rerun for no prediction and no rendering
    for m, stages in RERUNS.items():
        if m.startswith("lenbatch_study/analysis/") and m != "lenbatch_study/analysis/shapes.py":
            assert not stages & {"profile", "train", "interleave"}, m
