rule compare:
    input:
        stats=rules.stats.output.stats,
        dataset=rules.tokenize.output.dataset,
        sweep=rules.boundaries.output.sweep,
        boundaries=rules.boundaries.output.boundaries,
        plans=rules.plans.output.metrics,
        grid=rules.profile.output.grid,
        train=expand("results/train/{strategy}/summary.json", strategy=config["train"]["strategies"]),
        quality=rules.quality.output.result,
        code=code("compare", "stepmodel", "quality_report", "gradquality"),
    output:
        metrics="results/compare/metrics.json",
        report="results/compare/report.md",
    params:
        cfg=cfg("model", "drafter", "batching", "train", "plans", "boundaries", "compare", "data.max_len"),
    log:
        f"{LOGS}/compare.log",
    benchmark:
        f"{BENCH}/compare.tsv"
    shell:
        "lenbatch compare --params params.yaml --params-json {params.cfg} --stats results/stats "
        "--boundaries results/boundaries --plans results/plans --profile results/profile --train results/train "
        "--data results/tokenize --quality results/quality --out results/compare > {log} 2>&1"
