# lenbatch: one DAG from raw chat data to the report.
#   snakemake --cores all                      # the embedded default (profiles/default is picked up)
#   snakemake --workflow-profile profiles/slurm --configfile configs/qwen3.6-27b-8gpu.yaml
# Rules are thin: inputs, outputs, params, log, benchmark; every stage is `lenbatch <stage>`.
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "params.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/plan.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/quality.smk"
include: "workflow/rules/compare.smk"


rule all:
    default_target: True
    input:
        "results/compare/metrics.json",
        "results/compare/report.md",
