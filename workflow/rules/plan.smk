rule boundaries:
    input:
        **inputs("boundaries"),
    output:
        **outputs("boundaries"),
    params:
        cfg=cfg("boundaries"),
        out=f"{R}/boundaries",
    log:
        f"{LOGS}/boundaries.log",
    benchmark:
        f"{BENCH}/boundaries.tsv"
    shell:
        "lenbatch boundaries --params-json {params.cfg} --lengths {input.lengths:q} "
        "--out {params.out:q} > {log:q} 2>&1"


rule plans:
    input:
        **inputs("plans"),
    output:
        **outputs("plans"),
    params:
        cfg=cfg("plans"),
        out=f"{R}/plans",
    log:
        f"{LOGS}/plans.log",
    benchmark:
        f"{BENCH}/plans.tsv"
    shell:
        "lenbatch plans --params-json {params.cfg} --lengths {input.lengths:q} "
        "--boundaries {input.boundaries:q} --out {params.out:q} > {log:q} 2>&1"
