def _gpus(n):
    """GPUs a job uses: ``n`` when train.device is cuda (set it for GPU runs; auto asks for none)."""
    return n if config["train"]["device"] == "cuda" else 0


# Multi-node training is not supported: every GPU job runs `torchrun --standalone --nnodes 1` on one
# node (resources nodes=1, SLURM --nodes=1), so train.nproc GPUs must fit one node.


rule profile:
    input:
        **inputs("profile"),
    output:
        **outputs("profile"),
    params:
        cfg=cfg("profile"),
        out=f"{R}/profile",
    threads: config["train"]["nproc"] * config["train"]["threads"]
    resources:
        # profile puts the target on cuda:0 and, when it times both roles at once (profile.concurrent,
        # nproc > 1), the drafter on cuda:<nproc - 1> as training does: it needs nproc GPUs visible.
        gpu=_gpus(config["train"]["nproc"] if config["profile"]["concurrent"] and config["train"]["nproc"] > 1 else 1),
        nodes=1,
    log:
        f"{LOGS}/profile.log",
    benchmark:
        f"{BENCH}/profile.tsv"
    shell:
        "lenbatch profile --params params.yaml --params-json {params.cfg} --out {params.out} > {log} 2>&1"


rule interleave:
    # One process times every strategy's steps in turns (train.strategies, its own warm-up first), so the
    # machine's drift falls on all alike: compare's ratios to sorted and their intervals come from it.
    input:
        **inputs("interleave"),
    output:
        **outputs("interleave"),
    params:
        cfg=cfg("interleave"),
        data=f"{R}/tokenize",
        out=f"{R}/interleave",
    threads: config["train"]["threads"]
    resources:
        gpu=_gpus(1),
        nodes=1,
    log:
        f"{LOGS}/interleave.log",
    benchmark:
        f"{BENCH}/interleave.tsv"
    shell:
        "lenbatch interleave --params params.yaml --params-json {params.cfg} --data {params.data} "
        "--boundaries {input.boundaries} --out {params.out} > {log} 2>&1"


rule train:
    # One torchrun job per strategy: nproc - 1 target ranks feed 1 drafter rank, on one node.
    # Only `bucketed` reads the boundaries, so the other strategies do not rerun when boundaries.* changes.
    # steps.jsonl is written by the job but not declared: Snakemake deletes declared outputs before a job
    # starts, and a resumed training keeps the steps before its checkpoint (DVC tracks steps.jsonl).
    # --resume only after an interrupted run of this job: a fresh run trains in .<strategy>.partial beside
    # its folder and swaps it in when complete, so a checkpoint there is an interrupted run's. One written
    # with other params or code is set aside by the stage (named in the log), which then starts afresh.
    input:
        **inputs("train"),
    output:
        **outputs("train"),
    params:
        cfg=cfg("train"),
        nproc=config["train"]["nproc"],
        data=f"{R}/tokenize",
        out=lambda wc: f"{R}/train/{wc.strategy}",
        boundaries=lambda wc, input: f"--boundaries {input.boundaries}" if input.boundaries else "",
    threads: config["train"]["nproc"] * config["train"]["threads"]
    resources:
        gpu=_gpus(config["train"]["nproc"]),
        nodes=1,
    log:
        f"{LOGS}/train/{{strategy}}.log",
    benchmark:
        f"{BENCH}/train/{{strategy}}.tsv"
    shell:
        "out={params.out}; resume=; "
        "if [ -f $(dirname $out)/.$(basename $out).partial/checkpoint.pt ]; then resume=--resume; fi; "
        "torchrun --standalone --nnodes 1 --nproc_per_node {params.nproc} -m lenbatch_study train "
        "--params params.yaml --params-json {params.cfg} --strategy {wildcards.strategy} "
        "--data {params.data} {params.boundaries} --out $out $resume > {log} 2>&1"
