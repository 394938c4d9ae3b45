# machine and source: common.smk rewrites their files as the workflow is parsed, only when changed; these
# rules (no inputs, so a checkout's file times never rerun them) run only when the file is missing.
rule machine:
    input:
        **inputs("machine"),
    output:
        **outputs("machine"),
    params:
        cfg=cfg("machine"),
        out=f"{R}/machine",
    log:
        f"{LOGS}/machine.log",
    benchmark:
        f"{BENCH}/machine.tsv"
    shell:
        "lenbatch machine --out {params.out:q} > {log:q} 2>&1"


rule source:
    input:
        **inputs("source"),
    output:
        **outputs("source"),
    params:
        cfg=cfg("source"),
        out=f"{R}/source",
    log:
        f"{LOGS}/source.log",
    benchmark:
        f"{BENCH}/source.tsv"
    shell:
        "lenbatch source --params-json {params.cfg} --out {params.out:q} > {log:q} 2>&1"


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
        "lenbatch tokenize --params-json {params.cfg} --out {params.out:q} > {log:q} 2>&1"


# stats: generated (workflow/rules/stages.smk), its command line the generic one
