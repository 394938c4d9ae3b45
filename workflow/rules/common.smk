# Checks before any rule runs, the results root, and each rule's inputs, outputs and params from the one
# table of stages (src/lenbatch_study/pipeline/registry.py, through pipeline/deps.py, which writes dvc.yaml).
import json
import os
import shlex

from lenbatch.batching.strategy import STRATEGIES as KNOWN_STRATEGIES
from lenbatch_study.core.config import params_from_dict, read_yaml, resolve_settings
from lenbatch_study.models.target_config import checkpoint_files
from lenbatch_study.pipeline import deps, registry

# settings: <name> merges configs/<name>.yaml in (lenbatch_study.core.settings): the rules get resolved values
try:
    _resolved = resolve_settings(config, root=".")
except ValueError as err:
    raise WorkflowError(f"invalid params: {err}")
config.clear()
config.update(_resolved)

# results/ is what DVC tracks and git commits; configs/*.yaml set their own root so they never overwrite it
R = str(config.pop("results_dir", "results")).rstrip("/")

# The config is checked once, here, naming the key and the fix. Each config file is read again with our YAML
# loader, which refuses a key given twice (Snakemake's keeps the last).
try:
    for _configfile in workflow.configfiles:
        read_yaml(_configfile)
    PARAMS = params_from_dict(config, source="the workflow config (params.yaml and any --configfile/--config)")
except ValueError as err:
    raise WorkflowError(f"invalid params: {err}")

# Only in the main process (a cluster job's process parses this file again on its node):
if workflow.is_main_process:
    from lenbatch_study.core.machine import write_if_changed
    from lenbatch_study.corpus.identity import write_if_changed as write_source_if_changed
    from lenbatch_study.corpus.chat import check_tokenizer_spec
    from lenbatch_study.corpus.sources import check_source
    from lenbatch_study.models.target_config import check_pretrained

    # a missing or unreadable input fails in seconds, not when its stage starts
    try:
        check_source(PARAMS.data.source, on_bad_record=PARAMS.data.on_bad_record)
        check_tokenizer_spec(PARAMS.data.tokenizer)
        check_pretrained(PARAMS.model.pretrained)
    except ValueError as err:
        raise WorkflowError(f"invalid input: {err}")
    # a config's own results root (results_dir: results/mine) is kept out of git: only results/ is committed
    if R != "results" and not os.path.exists(f"{R}/.gitignore"):
        os.makedirs(R, exist_ok=True)
        with open(f"{R}/.gitignore", "w") as fh:
            fh.write("# written by the workflow: this config's results are not committed (only results/ is)\n*\n")
    # the always-run stages (registry.Stage.always_changed); on a cluster the machine is the submitting
    # node's, while every run records its own node's and compare refuses a mix
    write_if_changed(registry.output_path("machine", "machine", results=R))
    write_source_if_changed(PARAMS.data.source, registry.output_path("source", "source", results=R))

LOGS = f"{R}/logs" if R != "results" else "logs"
BENCH = f"{LOGS}/benchmarks"
STRATEGIES = list(config["train"]["strategies"])


wildcard_constraints:
    strategy="|".join(KNOWN_STRATEGIES),


# a timed job (profile, train, interleave) asks for all of the resource `machine`, so it runs alone
# (profiles/default/config.yaml caps it; profiles/slurm does not: each job has its own allocation)
MACHINE = 100


def cfg(stage):
    """The params keys ``stage`` reads (the table's; dvc.yaml lists the same), as one shell-quoted JSON
    argument: Snakemake reruns a rule when its params change, so train.warmup_steps never reruns profile."""
    return shlex.quote(json.dumps(deps.stage_payload(stage, config), sort_keys=True))


# under a DVC stage command: one experiment run per workspace (lenbatch_study.pipeline.dvc_guard)
if "DVC_STAGE" in os.environ and workflow.is_main_process:
    from lenbatch_study.pipeline.dvc_guard import hold_workspace

    hold_workspace(what="a DVC stage of the workflow (snakemake)")


def inputs(stage):
    """``stage``'s inputs by output name, its checkpoint files and its ``code``, for ``input: **inputs(stage)``;
    a per-strategy rule's are functions of ``{strategy}`` (bucketed's edges reach only its job)."""
    st = registry.STAGES[stage]
    out = {}
    for i in st.inputs:
        if not registry.STAGES[i.stage].outputs[i.output].declared:
            continue
        if st.per_strategy:
            def one(wc, name=i.output):
                return registry.input_paths(stage, results=R, strategies=STRATEGIES,
                                            strategy=wc.strategy).get(name, [])

            out[i.output] = one
        else:
            paths = registry.input_paths(stage, results=R, strategies=STRATEGIES).get(i.output, [])
            out[i.output] = paths[0] if len(paths) == 1 else paths
    if stage in deps.pretrained_stages():  # model.pretrained's files: a changed checkpoint reruns them
        out["pretrained"] = checkpoint_files(config["model"]["pretrained"])
    if not st.always_changed:  # machine, source: no inputs, only a missing file reruns them
        out["code"] = deps.stage_code(stage)
    return out


def outputs(stage):
    """``stage``'s declared outputs, each update(): Snakemake would otherwise delete them before the job runs,
    losing the previous results the stage's staged swap keeps until it succeeds (docs/reliability.md)."""
    out = {}
    for name, o in registry.STAGES[stage].outputs.items():
        if o.declared:
            path = registry.output_path(stage, name, results=R)
            out[name] = update(directory(path) if o.directory else path)
    return out


def all_outputs():
    """Every declared output of every stage, per strategy of train.strategies: ``rule all``'s input."""
    return [
        registry.output_path(stage, name, results=R, strategy=s)
        for stage, st in registry.STAGES.items()
        for name, o in st.outputs.items()
        if o.declared
        for s in (STRATEGIES if st.per_strategy else [None])
    ]
