# The rule of every stage of the table that no file included before this one writes (so a new stage needs
# no rule): its shell line is the stage's generic command line (lenbatch_study.cli.flags.generic_stage_flags).
# A stage whose rule needs more (train's per-strategy jobs and resources, quality's optional edges, compare's
# folders) writes its own. Included last, so `workflow.is_rule` sees every hand-written rule.

def _generic_shell(stage):
    st = registry.STAGES[stage]
    reads = "".join(f"--{i.output.replace('_', '-')} {{input.{i.output}:q}} " for i in st.inputs if not i.trigger_only)
    given = "--params-json {params.cfg} " if st.params else ""
    return f"lenbatch {stage} {given}{reads}--out {{params.out:q}} > {{log:q}} 2>&1"


def _threads(st):
    """The value of the params key the table names for the rule's threads (tokenize: data.workers), else 1."""
    if st.threads is None:
        return 1
    section, key = st.threads.split(".")
    return config[section][key]


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
        # Snakemake evaluates this line twice: as the rule is defined (its recorded command: _stage is this
        # rule's) and again when a job runs, inside a function whose argument `rule` is the rule's name (by then
        # _stage is the loop's last value, so it cannot be read there)
        shell:
            _generic_shell(locals().get("rule", _stage))
