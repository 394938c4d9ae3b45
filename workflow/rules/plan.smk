rule boundaries:
    input:
        lengths=rules.tokenize.output.lengths,
        code=code("boundaries", "padding", "strategies", "stats"),
    output:
        boundaries="results/boundaries/boundaries.json",
        sweep="results/boundaries/sweep.json",
    params:
        cfg=cfg("boundaries", "batching", "plans", "data.max_len"),
    log:
        f"{LOGS}/boundaries.log",
    benchmark:
        f"{BENCH}/boundaries.tsv"
    shell:
        "lenbatch boundaries --params params.yaml --params-json {params.cfg} --lengths {input.lengths} "
        "--out results/boundaries > {log} 2>&1"


rule plans:
    input:
        lengths=rules.tokenize.output.lengths,
        boundaries=rules.boundaries.output.boundaries,
        code=code("plans", "strategies", "padding"),
    output:
        metrics="results/plans/metrics.json",
    params:
        cfg=cfg("batching", "plans", "data.max_len"),
    log:
        f"{LOGS}/plans.log",
    benchmark:
        f"{BENCH}/plans.tsv"
    shell:
        "lenbatch plans --params params.yaml --params-json {params.cfg} --lengths {input.lengths} "
        "--boundaries {input.boundaries} --out results/plans > {log} 2>&1"
