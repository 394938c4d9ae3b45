rule quality:
    # One process: held-out loss over seeds and gradient quality of every strategy, in the quality
    # stage's own learnable setting (params.quality). It reads no training run, so train.* keys
    # other than the strategy list and device never rerun it; compare combines it with the runs' throughput.
    input:
        # the edges whatever train.strategies holds (only bucketed plans with them): DVC's one quality stage
        # cannot drop them when -S leaves bucketed out, so this rule keeps them too and the tools agree
        **inputs("quality"),
    output:
        **outputs("quality"),
    params:
        cfg=cfg("quality"),
        r=R,
        boundaries=lambda wc, input: f"--boundaries {shlex.quote(str(input.boundaries))}" if input.boundaries else "",
    threads: config["quality"]["threads"]
    resources:
        gpu=1 if config["train"]["device"] == "cuda" else 0,
        nodes=1,
    log:
        f"{LOGS}/quality.log",
    benchmark:
        f"{BENCH}/quality.tsv"
    shell:
        "lenbatch quality --params-json {params.cfg} --data {params.r:q}/tokenize "
        "{params.boundaries} --out {params.r:q}/quality > {log:q} 2>&1"
