def _gpus(n):
    """GPUs a job uses: ``n`` when train.device is cuda (set it for GPU runs; auto asks for none)."""
    return n if config["train"]["device"] == "cuda" else 0


# train.nodes > 1: that many nodes, one task each; mpi="srun" has the SLURM executor run the command once on
# the allocation, and `lenbatch train` starts one torchrun per node (docs/slurm.md, "Training across nodes")
_NODES = config["train"]["nodes"]
_MULTI_NODE = {"tasks": _NODES, "mpi": "srun"} if _NODES > 1 else {}


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
        # both roles timed at once (profile.concurrent, nproc > 1) put the drafter on cuda:<nproc - 1>
        gpu=_gpus(config["train"]["nproc"] if config["profile"]["concurrent"] and config["train"]["nproc"] > 1 else 1),
        nodes=1,
        machine=MACHINE,  # timed: alone on the machine (common.smk)
    log:
        f"{LOGS}/profile.log",
    benchmark:
        f"{BENCH}/profile.tsv"
    shell:
        "lenbatch profile --params-json {params.cfg} --out {params.out:q} > {log:q} 2>&1"


rule interleave:
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
        machine=MACHINE,  # timed: alone on the machine (common.smk)
    log:
        f"{LOGS}/interleave.log",
    benchmark:
        f"{BENCH}/interleave.tsv"
    shell:
        "lenbatch interleave --params-json {params.cfg} --data {params.data:q} "
        "--boundaries {input.boundaries:q} --out {params.out:q} > {log:q} 2>&1"


rule train:
    # --resume-if-interrupted: the interrupted run's checkpoint in .<strategy>.partial (docs/reliability.md)
    input:
        **inputs("train"),
    output:
        **outputs("train"),
    params:
        cfg=cfg("train"),
        data=f"{R}/tokenize",
        out=lambda wc: f"{R}/train/{wc.strategy}",
        boundaries=lambda wc, input: f"--boundaries {shlex.quote(str(input.boundaries))}" if input.boundaries else "",
    threads: _NODES * config["train"]["nproc"] * config["train"]["threads"]  # a SLURM job: cpus_per_task per node
    resources:
        gpu=_gpus(config["train"]["nproc"]),
        nodes=_NODES,
        machine=MACHINE,  # timed: alone on the machine (common.smk)
        **_MULTI_NODE,
    log:
        f"{LOGS}/train/{{strategy}}.log",
    benchmark:
        f"{BENCH}/train/{{strategy}}.tsv"
    shell:
        "lenbatch train --params-json {params.cfg} --strategy {wildcards.strategy:q} "
        "--data {params.data:q} {params.boundaries} --out {params.out:q} --resume-if-interrupted > {log:q} 2>&1"
