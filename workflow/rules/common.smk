# Shared helpers: params validation (before any rule runs), the results root, and each rule's inputs,
# outputs, code inputs and params, all read from the one table of stages
# (src/lenbatch_study/pipeline/registry.py, through src/lenbatch_study/pipeline/deps.py, which also writes dvc.yaml).
import json
import os
import shlex

from lenbatch.batching.strategy import STRATEGIES as KNOWN_STRATEGIES
from lenbatch_study.core.config import params_from_dict, read_yaml, resolve_settings
from lenbatch_study.pipeline import deps, registry
from lenbatch_study.runtime.interrupt import install as install_sigint_forwarding

# settings: <name> in params.yaml (or -S settings=<name> under DVC): configs/<name>.yaml merged in by the one
# params loader (lenbatch_study.core.settings), so each rule's params below are the resolved values.
try:
    _resolved = resolve_settings(config, root=".")
except ValueError as err:
    raise WorkflowError(f"invalid params: {err}")
config.clear()
config.update(_resolved)

# Where this config's results go. params.yaml leaves it at results/ (what DVC tracks and git commits);
# configs/*.yaml set their own (results/tiny, results/qwen3.6-27b-8gpu) so they never overwrite it.
R = str(config.pop("results_dir", "results")).rstrip("/")

# Refuse a bad params file before anything runs: our loader names the key and the fix,
# the JSON schema (generated from the same dataclasses) is Snakemake's own check. Snakemake's YAML loader
# keeps the last of a key given twice; the stages refuse it, so every config file is read again here with
# theirs (params.yaml and each --configfile), and a key given twice stops the run as it stops a stage.
try:
    for _configfile in workflow.configfiles:
        read_yaml(_configfile)
    PARAMS = params_from_dict(config, source="the workflow config (params.yaml and any --configfile/--config)")
except ValueError as err:
    raise WorkflowError(f"invalid params: {err}")
validate(config, "../schemas/params.schema.yaml")

# ... and a missing or unreadable input (data source, tokenizer or checkpoint folder) too, in seconds:
# otherwise it fails only when its stage starts, after the stages before it ran. Only in the main
# process: a cluster job's process parses this file again on its node.
if workflow.is_main_process:
    from lenbatch_study.pipeline.preflight import check_inputs

    try:
        check_inputs(PARAMS)
    except ValueError as err:
        raise WorkflowError(f"invalid input: {err}")

# A config's own results root (results_dir: a user's results/mine, with its tokenized dataset) is kept out of
# git: only the default's results/ is committed (its large files ignored by the repo's .gitignore).
if workflow.is_main_process and R != "results":
    os.makedirs(R, exist_ok=True)
    if not os.path.exists(f"{R}/.gitignore"):
        with open(f"{R}/.gitignore", "w") as fh:
            fh.write("# written by the workflow: this config's results are not committed (only results/ is)\n*\n")

# The machine the measuring stages run on (profile, train, quality depend on its fingerprint): rewritten
# here, only when it changed (same machine: same bytes, same file time, nothing reruns; another machine or
# another torch: a newer file, so they rerun). Only in the main process: a cluster job's process parses
# this file again on its node. On a cluster this is the submitting node's fingerprint; every run records
# its own node's, and compare refuses a mix.
if workflow.is_main_process:
    from lenbatch_study.core.machine import write_if_changed

    write_if_changed(registry.output_path("machine", "machine", results=R))

# The data source by content (lenbatch_study.corpus.identity): tokenize's input, rewritten only when the
# source's bytes changed, so appended records retokenize and a touched file does not. After the preflight
# above, so a missing source is reported there.
if workflow.is_main_process:
    from lenbatch_study.corpus.identity import write_if_changed as write_source_if_changed

    write_source_if_changed(PARAMS.data.source, registry.output_path("source", "source", results=R))

LOGS = f"{R}/logs" if R != "results" else "logs"
BENCH = f"{LOGS}/benchmarks"
STRATEGIES = deps.strategies(config)


wildcard_constraints:
    strategy="|".join(KNOWN_STRATEGIES),


# Timed jobs (profile, the trainings, interleave) never share the machine: the default profile caps the
# resource `machine` at MACHINE and gives every job 1 of it (default-resources), and a timed job asks for all
# of it, so while one runs no other job starts, and it starts only when the others have ended (whatever
# --cores allows). Under DVC each stage is its own Snakemake run: alone already. On a cluster each job has
# its own allocation (profiles/slurm sets no cap).
MACHINE = 100


def cfg(stage):
    """The params ``stage`` reads (the table's params keys), as one shell-quoted JSON argument.

    Snakemake reruns a rule when its params change, so a rule gets exactly the keys its code
    reads: editing train.warmup_steps reruns train and compare, not profile. dvc.yaml lists the
    same keys (lenbatch dvc-yaml), so `dvc status` names the same stages.
    """
    return shlex.quote(json.dumps(deps.stage_payload(stage, config), sort_keys=True))


# Under a DVC stage command (dvc repro, dvc exp run; DVC sets DVC_STAGE for every stage command it runs):
# while it runs, DVC itself refuses a second `dvc exp run` in this workspace before that one writes its -S
# values into params.yaml (lenbatch_study.pipeline.dvc_guard)
if "DVC_STAGE" in os.environ and workflow.is_main_process:
    from lenbatch_study.pipeline.dvc_guard import hold_workspace

    hold_workspace(what="a DVC stage of the workflow (snakemake)")


def code(stage):
    """Source files ``stage`` runs: the import closure of its stage module (deps.stage_code)."""
    return deps.stage_code(stage)


def _declared(stage, name):
    return registry.STAGES[stage].outputs[name].declared


def inputs(stage):
    """``stage``'s inputs (the table's), named after the outputs they are, plus ``code``: a mapping for
    ``input: **inputs(stage)``. A per-strategy rule gets a function of its ``{strategy}`` wildcard per
    input (bucketed's edges reach only its job); an input that is no Snakemake output (train's
    steps.jsonl) is left to DVC."""
    st = registry.STAGES[stage]
    out = {}
    for i in st.inputs:
        if not _declared(i.stage, i.output):
            continue
        if st.per_strategy:
            def one(wc, name=i.output):
                return registry.input_paths(stage, results=R, strategies=STRATEGIES,
                                            strategy=wc.strategy).get(name, [])

            out[i.output] = one
        else:
            paths = registry.input_paths(stage, results=R, strategies=STRATEGIES).get(i.output, [])
            out[i.output] = paths[0] if len(paths) == 1 else paths
    if stage in deps.pretrained_stages():
        out["pretrained"] = pretrained()
    if not st.always_changed:  # machine, source: no inputs, only a missing file reruns them
        out["code"] = code(stage)
    return out


def pretrained():
    """The target checkpoint's files (model.pretrained; none when null): inputs of the rules that load it
    (deps.pretrained_stages()), so a changed checkpoint reruns them. dvc.yaml lists the same files."""
    return deps.pretrained_files(config["model"]["pretrained"])


def outputs(stage):
    """``stage``'s declared outputs (the table's), for ``output: **outputs(stage)``; a per-strategy
    stage's under ``{strategy}``.

    Every output is update(): Snakemake otherwise deletes a job's outputs before running it and again
    when it fails, so a failing or interrupted job would lose the previous complete results. The stage
    itself writes a staging folder and swaps it in only on success (lenbatch_study.pipeline.outputs),
    so the previous output stays whole until then; Snakemake keeps a backup copy of update() outputs
    and puts it back if the job fails (same bytes: the stage never touched them). What Snakemake
    records for a restored output, and what a user does about it: docs/reliability.md."""
    out = {}
    for name, o in registry.STAGES[stage].outputs.items():
        if o.declared:
            path = registry.output_path(stage, name, results=R)
            out[name] = update(directory(path) if o.directory else path)
    return out


def all_outputs():
    """Every declared output of every stage (per strategy of train.strategies): ``rule all``'s input, so
    deleting any of them (or a whole results/train/<strategy>/) makes `snakemake --cores all` rebuild it."""
    out = []
    for stage, st in registry.STAGES.items():
        for name, o in st.outputs.items():
            if o.declared:
                if st.per_strategy:
                    out += [registry.output_path(stage, name, results=R, strategy=s) for s in STRATEGIES]
                else:
                    out.append(registry.output_path(stage, name, results=R))
    return out


# Ctrl-C: each process of the running jobs gets the interrupt once, and snakemake goes on only when they
# have all stopped (the next run resumes the training): lenbatch_study.runtime.interrupt says why and how.
install_sigint_forwarding()
