rule tokenize:
    input:
        code=code("tokenize"),
    output:
        dataset=directory(f"{R}/tokenize/dataset"),
        lengths=f"{R}/tokenize/lengths.npy",
        stats=f"{R}/tokenize/stats.json",
    params:
        cfg=cfg("tokenize"),
        out=f"{R}/tokenize",
    threads: config["data"]["workers"]
    log:
        f"{LOGS}/tokenize.log",
    benchmark:
        f"{BENCH}/tokenize.tsv"
    shell:
        "lenbatch tokenize --params params.yaml --params-json {params.cfg} --out {params.out} > {log} 2>&1"


rule stats:
    input:
        lengths=up(rules.tokenize.output.lengths),
        code=code("stats"),
    output:
        stats=f"{R}/stats/stats.json",
        histogram=f"{R}/stats/histogram.json",
        plot=f"{R}/stats/histogram.png",
    params:
        cfg=cfg("stats"),
        out=f"{R}/stats",
    log:
        f"{LOGS}/stats.log",
    benchmark:
        f"{BENCH}/stats.tsv"
    shell:
        "lenbatch stats --params params.yaml --params-json {params.cfg} --lengths {input.lengths} "
        "--out {params.out} > {log} 2>&1"
