# lenbatch: one DAG from raw chat data to the report.
#   snakemake --cores all                      # the embedded default (profiles/default is picked up)
#   snakemake --workflow-profile profiles/slurm --configfile configs/qwen3.6-27b-8gpu.yaml
#   (configs/*.yaml set results_dir: their results go to results/<name>/, never over results/)
# `make run` runs `dvc repro`, whose stages each run one rule here; rules take inputs, outputs and params
# from the stage table (pipeline/registry.py, via workflow/rules/common.smk), as dvc.yaml does.
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "params.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/quality.smk"
include: "workflow/rules/compare.smk"
# last: the rules of the stages no file above writes a rule for (machine, source, tokenize, stats,
# boundaries, plans), from the table
include: "workflow/rules/stages.smk"


# Every file users look at (every declared output of every stage, from the one table), so deleting
# any of them (or a whole results/train/<strategy>/) makes `snakemake --cores all` rebuild it.
rule all:
    default_target: True
    input:
        all_outputs(),

