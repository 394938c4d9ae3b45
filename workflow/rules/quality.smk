rule quality:
    # One process: held-out loss over seeds and gradient quality of every strategy, in the quality
    # stage's own learnable setting (params.quality). It reads no training run, so train.* keys
    # other than the strategy list never rerun it; compare combines it with the runs' throughput.
    input:
        dataset=rules.tokenize.output.dataset,
        lengths=rules.tokenize.output.lengths,
        # only bucketed reads the edges: without it in train.strategies, K never reruns this stage
        boundaries=rules.boundaries.output.boundaries if "bucketed" in config["train"]["strategies"] else [],
        code=code("quality", "quality_report", "gradquality", "collate", "drafter", "model", "packing",
                  "strategies", "padding"),
    output:
        result="results/quality/quality.json",
        metrics="results/quality/metrics.json",
        curves="results/quality/curves.json",
        gradients="results/quality/gradients.json",
        plot="results/quality/quality.png",
    params:
        # the stage has its own lr and anchors: drafter.lr / anchors_per_seq (the train stage's) never rerun it
        cfg=cfg("quality", "model", "drafter", "batching", "train.strategies", "train.device", "data.max_len",
                exclude=("drafter.lr", "drafter.anchors_per_seq")),
        boundaries=lambda wc, input: f"--boundaries {input.boundaries}" if input.boundaries else "",
    threads: config["quality"]["threads"]
    resources:
        gpu=1 if config["train"]["device"] == "cuda" else 0,
    log:
        f"{LOGS}/quality.log",
    benchmark:
        f"{BENCH}/quality.tsv"
    shell:
        "lenbatch quality --params params.yaml --params-json {params.cfg} --data results/tokenize "
        "{params.boundaries} --out results/quality > {log} 2>&1"
