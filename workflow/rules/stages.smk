# The rule of every stage no file included before this one writes (docs/workflow.md, "To add a stage"),
# with the stage's generic command line (lenbatch_study.cli.flags.generic_stage_flags).

def _generic_shell(stage):
    st = registry.STAGES[stage]
    reads = "".join(f"--{i.output.replace('_', '-')} {{input.{i.output}:q}} " for i in st.inputs if not i.trigger_only)
    given = "--params-json {params.cfg} " if st.params else ""
    return f"lenbatch {stage} {given}{reads}--out {{params.out:q}} > {{log:q}} 2>&1"


def _threads(st):
    """The value of the params key ``Stage.threads`` names (tokenize: data.workers), else 1."""
    section, _, key = (st.threads or "").partition(".")
    return config[section][key] if st.threads else 1


for _stage, _st in registry.STAGES.items():
    if workflow.is_rule(_stage):
        continue
    if _st.per_strategy:
        raise WorkflowError(
            f"stage {_stage} has no rule: a per-strategy stage needs its own rule in workflow/rules/*.smk "
            "(as train has)")

    rule:
        name:
            _stage
        input:
            **inputs(_stage),
        output:
            **outputs(_stage),
        params:
            cfg=cfg(_stage),
            out=f"{R}/{_stage}",
        threads: _threads(_st)
        log:
            f"{LOGS}/{_stage}.log",
        benchmark:
            f"{BENCH}/{_stage}.tsv"
        # evaluated again when a job runs, where `rule` is the rule's name and _stage the loop's last value
        shell:
            _generic_shell(locals().get("rule", _stage))
