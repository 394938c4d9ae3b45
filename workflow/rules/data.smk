rule tokenize:
    input:
        code=code("data", "sources", "chat"),
    output:
        dataset=directory("results/tokenize/dataset"),
        lengths="results/tokenize/lengths.npy",
        stats="results/tokenize/stats.json",
    params:
        cfg=cfg("data"),
    threads: config["data"]["workers"]
    log:
        f"{LOGS}/tokenize.log",
    benchmark:
        f"{BENCH}/tokenize.tsv"
    shell:
        "lenbatch tokenize --params params.yaml --params-json {params.cfg} --out results/tokenize > {log} 2>&1"


rule stats:
    input:
        lengths=rules.tokenize.output.lengths,
        code=code("stats"),
    output:
        stats="results/stats/stats.json",
        histogram="results/stats/histogram.json",
        plot="results/stats/histogram.png",
    params:
        cfg=cfg("stats"),
    log:
        f"{LOGS}/stats.log",
    benchmark:
        f"{BENCH}/stats.tsv"
    shell:
        "lenbatch stats --params params.yaml --params-json {params.cfg} --lengths {input.lengths} "
        "--out results/stats > {log} 2>&1"
