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
        "lenbatch compare --params params.yaml --params-json {params.cfg} --stats {params.r}/stats "
        "--boundaries {params.r}/boundaries --plans {params.r}/plans --profile {params.r}/profile "
        "--train {params.r}/train --data {params.r}/tokenize --quality {params.r}/quality --interleave {params.r}/interleave --out {params.r}/compare > {log} 2>&1"
