rule compare:
    input:
        stats=up(rules.stats.output.stats),
        dataset=up(rules.tokenize.output.dataset),
        lengths=up(rules.tokenize.output.lengths),
        sweep=up(rules.boundaries.output.sweep),
        boundaries=up(rules.boundaries.output.boundaries),
        plans=up(rules.plans.output.metrics),
        grid=up(rules.profile.output.grid),
        train=up(expand(f"{R}/train/{{strategy}}/summary.json", strategy=STRATEGIES)),
        quality=up(rules.quality.output.quality_json),
        code=code("compare"),
    output:
        **{name.replace(".", "_"): f"{R}/compare/{name}" for name in deps.COMPARE_OUTS},
    params:
        cfg=cfg("compare"),
        r=R,
    log:
        f"{LOGS}/compare.log",
    benchmark:
        f"{BENCH}/compare.tsv"
    shell:
        "lenbatch compare --params params.yaml --params-json {params.cfg} --stats {params.r}/stats "
        "--boundaries {params.r}/boundaries --plans {params.r}/plans --profile {params.r}/profile "
        "--train {params.r}/train --data {params.r}/tokenize --quality {params.r}/quality --out {params.r}/compare > {log} 2>&1"
