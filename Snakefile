# lenbatch: one DAG from raw chat data to the report (docs/workflow.md). Rules take their inputs, outputs
# and params from the stage table (pipeline/registry.py, via workflow/rules/common.smk), as dvc.yaml does.
from snakemake.utils import min_version

min_version("9.0")


configfile: "params.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/quality.smk"
include: "workflow/rules/compare.smk"
# last: the generated rules of the stages no file above writes a rule for
include: "workflow/rules/stages.smk"


# every declared output: deleting any of them makes `snakemake --cores all` rebuild it
rule all:
    default_target: True
    input:
        all_outputs(),

