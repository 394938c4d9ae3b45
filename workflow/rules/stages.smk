# The rule of every stage of the table (src/lenbatch_study/pipeline/registry.py) that has no rule of its own
# in the files included before this one: generated here, in a loop, so a new stage is a row of the table and
# its module, not a rule too. Its shell line is the stage's generic command line (lenbatch_study.cli.flags:
# generic_stage_flags): --params-json with the stage's keys, one --<input> per file it reads, --out.
# Why not every stage: tokenize's threads, train's per-strategy jobs and resources, quality's optional edges
# and compare's folders are the rule's own; a stage that needs any of that writes its rule as those do.
# Included last (the Snakefile), so `workflow.is_rule` sees every hand-written rule.


def _generic_shell(stage):
    reads = [i for i in registry.STAGES[stage].inputs if not i.trigger_only]
    flags = "".join(f"--{i.output.replace('_', '-')} {{input.{i.output}:q}} " for i in reads)
    return f"lenbatch {stage} --params-json {{params.cfg}} {flags}--out {{params.out:q}} > {{log:q}} 2>&1"


for _stage, _st in registry.STAGES.items():
    if workflow.is_rule(_stage):
        continue
    if _st.per_strategy or _st.always_changed:
        raise WorkflowError(
            f"stage {_stage} has no rule: a per-strategy or always-run stage needs its own rule in "
            "workflow/rules/*.smk (as train, machine and source have)")

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
        log:
            f"{LOGS}/{_stage}.log",
        benchmark:
            f"{BENCH}/{_stage}.tsv"
        # Snakemake evaluates this line twice: as the rule is defined (its recorded command: _stage is this
        # rule's) and again when a job runs, inside a function whose argument `rule` is the rule's name (by then
        # _stage is the loop's last value, so it cannot be read there)
        shell:
            _generic_shell(locals().get("rule", _stage))
