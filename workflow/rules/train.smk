def _uses_cuda():
    return config["train"]["device"] == "cuda"


rule profile:
    input:
        code=code("profile", "train", "collate", "drafter", "model", "packing"),
    output:
        grid="results/profile/grid.json",
    params:
        cfg=cfg("model", "drafter", "batching", "profile", "train", "data.max_len", exclude=("train.strategies", "train.useful_tokens")),
    threads: config["train"]["nproc"] * config["train"]["threads"]
    resources:
        gpu=1 if config["train"]["device"] == "cuda" else 0,
    log:
        f"{LOGS}/profile.log",
    benchmark:
        f"{BENCH}/profile.tsv"
    shell:
        "lenbatch profile --params params.yaml --params-json {params.cfg} --out results/profile > {log} 2>&1"


rule train:
    # One torchrun job per strategy: nproc - 1 target ranks feed 1 drafter rank.
    # Only `bucketed` reads the boundaries, so the other strategies do not rerun
    # when boundaries.* changes.
    input:
        dataset=rules.tokenize.output.dataset,
        lengths=rules.tokenize.output.lengths,
        boundaries=lambda wc: rules.boundaries.output.boundaries if wc.strategy == "bucketed" else [],
        code=code("train", "collate", "drafter", "model", "packing", "sampler", "strategies", "padding"),
    output:
        summary="results/train/{strategy}/summary.json",
        steps="results/train/{strategy}/steps.jsonl",
    params:
        cfg=cfg("model", "drafter", "batching", "train", "data.max_len", exclude=("train.strategies",)),
        nproc=config["train"]["nproc"],
        boundaries=lambda wc, input: f"--boundaries {input.boundaries}" if input.boundaries else "",
    threads: config["train"]["nproc"] * config["train"]["threads"]
    resources:
        gpu=config["train"]["nproc"] if config["train"]["device"] == "cuda" else 0,
    log:
        f"{LOGS}/train/{{strategy}}.log",
    benchmark:
        f"{BENCH}/train/{{strategy}}.tsv"
    shell:
        "torchrun --standalone --nproc_per_node {params.nproc} -m lenbatch train "
        "--params params.yaml --params-json {params.cfg} --strategy {wildcards.strategy} "
        "--data results/tokenize {params.boundaries} --out results/train/{wildcards.strategy} > {log} 2>&1"
