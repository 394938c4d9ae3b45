rule tokenize:
    input:
        **inputs("tokenize"),
    output:
        **outputs("tokenize"),
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
        **inputs("stats"),
    output:
        **outputs("stats"),
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
