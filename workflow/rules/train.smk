def _gpus(n):
    """GPUs a job uses: ``n`` when train.device is cuda (set it for GPU runs; auto asks for none)."""
    return n if config["train"]["device"] == "cuda" else 0


# A training of train.nodes > 1 asks for that many nodes, one task each (SLURM --nodes N --ntasks N).
# mpi="srun": the SLURM executor then runs this shell once on the allocation (not under its own srun), and
# the shell starts one torchrun per node with srun, all meeting at the first node's c10d rendezvous. Outside
# SLURM the same N nodes are emulated by one torchrun of N x nproc processes on this machine: the roles come
# from the global rank, so both run the same code (docs/slurm.md "Training across nodes").
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
        # profile puts the target on cuda:0 and, when it times both roles at once (profile.concurrent,
        # nproc > 1), the drafter on cuda:<nproc - 1> as training does: it needs nproc GPUs visible.
        gpu=_gpus(config["train"]["nproc"] if config["profile"]["concurrent"] and config["train"]["nproc"] > 1 else 1),
        nodes=1,
        machine=MACHINE,  # timed: alone on the machine (common.smk)
    log:
        f"{LOGS}/profile.log",
    benchmark:
        f"{BENCH}/profile.tsv"
    shell:
        "lenbatch profile --params params.yaml --params-json {params.cfg} --out {params.out:q} > {log:q} 2>&1"


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
        machine=MACHINE,  # timed: alone on the machine (common.smk)
    log:
        f"{LOGS}/interleave.log",
    benchmark:
        f"{BENCH}/interleave.tsv"
    shell:
        "lenbatch interleave --params params.yaml --params-json {params.cfg} --data {params.data:q} "
        "--boundaries {input.boundaries:q} --out {params.out:q} > {log:q} 2>&1"


rule train:
    # One job per strategy: on each of train.nodes nodes, nproc - 1 target ranks feed 1 drafter rank.
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
        nodes=_NODES,
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
        "out={params.out:q}; work=\"$(dirname \"$out\")/.$(basename \"$out\").partial\"; resume=; "
        "if [ -f \"$work/checkpoint.pt\" ]; then resume=--resume; fi; "
        "prefix=; rdzv=\"--standalone --nnodes 1 --nproc_per_node $(({params.nodes} * {params.nproc}))\"; "
        # under SLURM with several nodes: one torchrun per node at the first node's address (its NodeAddr, which
        # may differ from its name), on a port of this job's own (trainings may share a node)
        "if [ {params.nodes} -gt 1 ] && [ -n \"${{SLURM_JOB_ID:-}}\" ]; then "
        # (the SLURM executor hands the shell SLURM_JOB_ID alone of the job's variables: the nodes come from it)
        "nodelist=$(scontrol show job \"$SLURM_JOB_ID\" | tr ' ' '\\n' | sed -n 's/^NodeList=//p' | head -n 1); "
        "head=$(scontrol show hostnames \"$nodelist\" | head -n 1); "
        "addr=$(scontrol show node \"$head\" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p'); "
        "prefix=\"srun --nodes {params.nodes} --ntasks-per-node 1\"; "
        "rdzv=\"--nnodes {params.nodes} --nproc_per_node {params.nproc} --rdzv-backend c10d --rdzv-endpoint "
        "${{addr:-$head}}:$((29500 + SLURM_JOB_ID % 2000)) --rdzv-id $SLURM_JOB_ID\"; fi; "
        # torchrun's agent ignores SIGUSR1 (it would die of it and take its workers along): a stop signal is the
        # workers', which checkpoint at a step boundary and exit 75 (lenbatch_study.runtime.stopping)
        "rc=0; $prefix sh -c 'trap \"\" USR1; exec \"$@\"' sh torchrun $rdzv -m lenbatch_study train "
        "--params params.yaml --params-json {params.cfg} --strategy {wildcards.strategy:q} "
        "--data {params.data:q} {params.boundaries} --out \"$out\" $resume > {log:q} 2>&1 || rc=$?; "
        # stopped on SIGUSR1 (sbatch --signal=USR1@<secs>, ahead of the time limit) under SLURM: the job requeues
        # itself and, started again, resumes from that checkpoint (docs/slurm.md "Stopping ahead of the time
        # limit"); it waits here to be ended by the requeue, so that Snakemake records no failed attempt
        "if [ $rc -ne 0 ] && [ -n \"${{SLURM_JOB_ID:-}}\" ] && grep -qs SIGUSR1 \"$work/stopped.json\"; then "
        "echo \"train: stopped on SIGUSR1: requeueing SLURM job $SLURM_JOB_ID\" >> {log:q}; "
        "if scontrol requeue \"$SLURM_JOB_ID\" >> {log:q} 2>&1; then sleep 600; fi; fi; exit $rc"
