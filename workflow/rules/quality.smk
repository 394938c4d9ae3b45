rule quality:
    input:
        **inputs("quality"),
    output:
        **outputs("quality"),
    params:
        cfg=cfg("quality"),
        r=R,
    threads: config["quality"]["threads"]
    resources:
        gpu=_gpus(1),
        nodes=1,
    log:
        f"{LOGS}/quality.log",
    benchmark:
        f"{BENCH}/quality.tsv"
    shell:
        "lenbatch quality --params-json {params.cfg} --data {params.r:q}/tokenize "
        "--boundaries {input.boundaries:q} --out {params.r:q}/quality > {log:q} 2>&1"
