rule compare:
    input:
        **inputs("compare"),
    output:
        **outputs("compare"),
    params:
        cfg=cfg("compare"),
        r=R,
    log:
        f"{LOGS}/compare.log",
    benchmark:
        f"{BENCH}/compare.tsv"
    shell:
        "lenbatch compare --params-json {params.cfg} --stats {params.r:q}/stats "
        "--boundaries {params.r:q}/boundaries --plans {params.r:q}/plans --profile {params.r:q}/profile "
        "--train {params.r:q}/train --data {params.r:q}/tokenize --quality {params.r:q}/quality --interleave {params.r:q}/interleave --out {params.r:q}/compare > {log:q} 2>&1"
