#!/usr/bin/env python3
"""`make slurm-check`: the tiny workflow on a real 2-node SLURM cluster, checked against a local run.

1. starts the local cluster (tools/slurm_cluster.py: 2 slurmd, slurmctld, slurmdbd + MariaDB, munged, in a
   private network namespace);
2. runs `snakemake --workflow-profile profiles/slurm --configfile configs/tiny.yaml configs/slurm-check.yaml`
   inside it, so that every rule is a SLURM job (sbatch, tracked with sacct), with the overrides below;
   meanwhile it requeues the packed training once it has checkpointed a few steps (`scontrol requeue`,
   what preemption with PreemptMode=REQUEUE does), so that the job starts again and resumes; and it sends
   SIGUSR1 to the bucketed training's job steps once it has logged a step (`scancel --signal=USR1`, what
   `sbatch --signal=USR1@<secs>` does ahead of the time limit): the training checkpoints at a step boundary
   and stops, the train rule requeues its job, and the job starts again and resumes from that step;
3. runs the same config locally meanwhile (`--cores`, results under results/slurm-check/local) for the
   stages whose results must not depend on where they ran: tokenize, stats, boundaries, plans, train;
4. writes <out>/summary.json: every SLURM job as `sacct` reported it (job id, rule, wildcards, nodes, state,
   elapsed), the requeued job's attempts, and the comparison: edges, plan metrics, each training's batch
   hashes (also against the plan, recomputed here) and losses (to float tolerance), the requeued and the
   signalled ones' too (the signalled one's step at the signal, step stopped at and attempts under "signal");
5. stops the cluster, whatever happened; exits 1 on any mismatch or failed job.

The SLURM profile is for real GPU clusters (partition gpu, tens of CPUs and GBs per job); the local cluster
has one partition `debug` and nodes of this machine's few CPUs. The overrides (SLURM_OVERRIDES) change only
resources and how often the executor polls sacct: the rules, their commands and the executor are the profile's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import slurm_cluster  # noqa: E402

CONFIGS = ["configs/tiny.yaml", "configs/slurm-check.yaml"]
RULES = ["tokenize", "stats", "boundaries", "plans", "profile", "train", "quality", "interleave", "compare"]
# What the local cluster needs instead of profiles/slurm's GPU-cluster values: its partition, and
# requests that fit a node of this machine (its CPUs, half its memory). cpus_per_task of train and
# profile is their threads (train.nproc * train.threads). The executor polls sacct first after 40 s,
# then every 10 s more (right for a busy real cluster); the check's jobs take seconds.
SLURM_OVERRIDES = [
    "--default-resources",
    "runtime=30",
    "mem_mb=1000",
    "cpus_per_task=1",
    f"slurm_partition={slurm_cluster.PARTITION}",
    "--set-resources",
    "train:runtime=30",
    "train:mem_mb=2000",
    "train:cpus_per_task=2",
    "profile:runtime=30",
    "profile:cpus_per_task=2",
    "tokenize:cpus_per_task=1",
    "--slurm-init-seconds-before-status-checks",
    "2",
    "--latency-wait",
    "10",
]
LOSS_RTOL = 1e-5  # same code, same machine: the losses agree far closer; threads could reorder sums


def snakemake(args: list[str], *, timeout: int, log: Path, prefix: list[str] | None = None) -> subprocess.Popen:
    """Snakemake started under `timeout -k`: when its job status queries fail it can wait forever, deaf to
    SIGTERM."""
    cmd = [*(prefix or []), "timeout", "-k", "30", str(timeout), sys.executable, "-m", "snakemake", *args]
    with open(log, "w") as fh:
        fh.write(" ".join(cmd) + "\n")
        fh.flush()
        return subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)


def sacct_jobs(cluster: slurm_cluster.Cluster) -> list[dict]:
    """Every job of the cluster's accounting (the cluster is fresh: only this check's), batch and steps
    folded: one row per job."""
    fields = ["JobID", "JobName", "Comment", "NodeList", "NNodes", "State", "Elapsed", "ExitCode"]
    out = cluster.run("sacct", "-a", "-X", "-P", "-n", "-S", "2000-01-01", "-o", ",".join(fields)).stdout
    jobs = []
    for line in out.splitlines():
        row = dict(zip(fields, line.split("|")))
        # the executor names jobs by run id and puts "rule_<name>[_wildcards_<values>]" in the comment
        comment = row["Comment"]
        rule, _, wildcards = comment.removeprefix("rule_").partition("_wildcards_")
        jobs.append(
            {
                "job_id": row["JobID"],
                "rule": rule if comment.startswith("rule_") else None,
                "wildcards": wildcards or None,
                "name": row["JobName"],
                "nodes": row["NodeList"],
                "nnodes": int(row["NNodes"] or 0),
                "state": row["State"],
                "elapsed": row["Elapsed"],
                "exit_code": row["ExitCode"],
            }
        )
    return jobs


def check_config() -> dict:
    """The check's own settings (configs/slurm-check.yaml: strategies, train.nodes)."""
    import yaml  # the venv's (Snakemake needs it)

    return yaml.safe_load((ROOT / CONFIGS[1]).read_text())


def read_steps(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def planned_hashes(results: Path, strategy: str, steps: list[dict]) -> list[int]:
    """crc32 of the batches the target ranks of every node were planned to send (each rank's plan recomputed
    from the run's lengths, edges and params), in the order the drafters take them (round robin over the
    ranks), over the epochs the steps span, cut to the number of steps."""
    import numpy as np

    import lenbatch as lb
    from lenbatch_study.core.config import load_params

    params = load_params(results / "train" / strategy / "params.json")
    lengths = np.load(results / "tokenize" / "lengths.npy")
    edges = json.loads((results / "boundaries" / "boundaries.json").read_text())["edges"]
    b = params.batching
    targets = max(1, params.train.nproc - 1) * params.train.nodes
    hashes: list[int] = []
    for epoch in sorted({s["epoch"] for s in steps}):
        plans = [
            lb.plan_epoch(
                lengths,
                strategy=strategy,
                epoch=epoch,
                seed=b.seed,
                token_budget=b.token_budget,
                max_batch_size=b.max_batch_size,
                edges=edges if strategy == "bucketed" else None,
                rank=r,
                world_size=targets,
            )
            for r in range(targets)
        ]
        for k in range(max(len(p) for p in plans)):
            hashes += [zlib.crc32(np.asarray(p[k], dtype=np.int64).tobytes()) for p in plans if k < len(p)]
    return hashes[: len(steps)]


def compare(slurm: Path, local: Path, strategies: list[str]) -> dict:
    """The results that must not depend on where they ran, side by side; ``mismatches`` names each difference."""
    mismatches: list[str] = []
    out: dict = {"mismatches": mismatches}
    e_s = json.loads((slurm / "boundaries/boundaries.json").read_text())["edges"]
    e_l = json.loads((local / "boundaries/boundaries.json").read_text())["edges"]
    out["edges"] = {"slurm": e_s, "local": e_l, "equal": e_s == e_l}
    if e_s != e_l:
        mismatches.append(f"boundaries edges differ: {e_s} vs {e_l}")
    p_s = json.loads((slurm / "plans/metrics.json").read_text())
    p_l = json.loads((local / "plans/metrics.json").read_text())
    out["plans"] = {"equal": p_s == p_l, "strategies": sorted(p_s)}
    if p_s != p_l:
        mismatches.append(
            "plans/metrics.json differs: "
            + ", ".join(k for k in sorted(set(p_s) | set(p_l)) if p_s.get(k) != p_l.get(k))
        )
    out["train"] = {}
    for s in strategies:
        steps_s = read_steps(slurm / "train" / s / "steps.jsonl")
        steps_l = read_steps(local / "train" / s / "steps.jsonl")
        h_s = [x["batch_hash"] for x in steps_s]
        h_l = [x["batch_hash"] for x in steps_l]
        planned = planned_hashes(slurm, s, steps_s)
        l_s = [x["loss"] for x in steps_s]
        l_l = [x["loss"] for x in steps_l]
        worst = max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(l_s, l_l)), default=0.0)
        losses_ok = len(l_s) == len(l_l) and all(math.isclose(a, b, rel_tol=LOSS_RTOL) for a, b in zip(l_s, l_l))
        run = json.loads((slurm / "train" / s / "summary.json").read_text())
        out["train"][s] = {
            "steps": {"slurm": len(steps_s), "local": len(steps_l)},
            "nodes": run.get("nodes", 1),
            "useful_tokens_per_s": run["useful_tokens_per_s"],
            "per_node": run.get("per_node"),
            "batch_hashes": {"slurm": h_s, "local": h_l, "planned": planned},
            "hashes_equal": h_s == h_l == planned,
            "losses": {"slurm": l_s, "local": l_l},
            "loss_max_rel_diff": worst,
            "losses_equal": losses_ok,
        }
        if not h_s == h_l == planned:
            mismatches.append(f"train {s}: batch hashes slurm {h_s} local {h_l} planned {planned}")
        if not losses_ok:
            mismatches.append(f"train {s}: losses differ beyond rel {LOSS_RTOL}: slurm {l_s} local {l_l}")
    return out


REQUEUE_STRATEGY = "packed"  # the training requeued while it runs
REQUEUE_AFTER_STEPS = 2  # steps it has logged (and checkpointed: train.checkpoint_every 1) when requeued


def requeue_while_running(cluster: slurm_cluster.Cluster, run_dir: Path, done: threading.Event, result: dict) -> None:
    """Requeue the ``REQUEUE_STRATEGY`` training once it has checkpointed ``REQUEUE_AFTER_STEPS`` steps, as
    SLURM does on preemption with PreemptMode=REQUEUE: the job is stopped and starts its batch script again
    on the same job id, and the train rule resumes from the checkpoint. Its results are then compared with
    the uninterrupted local run's like every other training."""
    from lenbatch_study.stages.train import partial_dir

    comment = f"rule_train_wildcards_{REQUEUE_STRATEGY}"
    work = partial_dir(run_dir)  # a training in progress writes here; run_dir gets it whole at the end
    steps = work / "steps.jsonl"
    running: list[str] = []
    while not done.is_set():
        # the job id first, once: then only the log is polled, so that the requeue follows the checkpointed
        # steps at once (a squeue per poll took seconds on a loaded machine, and the run had ended meanwhile)
        if not running:
            queue = cluster.run("squeue", "-h", "-o", "%i|%k|%T", check=False).stdout.split()
            running = [q.split("|")[0] for q in queue if q.split("|")[1:] == [comment, "RUNNING"]]
        n = len(steps.read_text().splitlines()) if steps.exists() else 0
        if running and n >= REQUEUE_AFTER_STEPS and (work / "checkpoint.pt").exists():
            cluster.run("scontrol", "requeue", running[0])
            result.update(job_id=running[0], requeued_after_steps=n)
            return
        time.sleep(0.05 if running else 0.3)


def requeue_problems(cluster: slurm_cluster.Cluster, run_dir: Path, result: dict) -> list[str]:
    """What sacct and the resumed run show of the requeue (into ``result``), and what is wrong with it."""
    if "job_id" not in result:
        return [
            f"the {REQUEUE_STRATEGY} training was never requeued (it ended before it had "
            f"{REQUEUE_AFTER_STEPS} checkpointed steps: raise train.useful_tokens in {CONFIGS[1]})"
        ]
    result["attempts"] = attempts(cluster, result["job_id"])
    states = [a["State"] for a in result["attempts"]]
    problems = []
    if len(states) != 2 or states != ["REQUEUED", "COMPLETED"]:
        problems.append(f"sacct shows job {result['job_id']}'s attempts as {states}, not REQUEUED then COMPLETED")
    summary = run_dir / "summary.json"
    result["resumed_from_step"] = json.loads(summary.read_text()).get("resumed_from_step") if summary.exists() else None
    if not result["resumed_from_step"]:
        problems.append(
            f"the requeued training did not resume from its checkpoint (resumed_from_step "
            f"{result['resumed_from_step']!r} in {summary})"
        )
    return problems


SIGNAL_STRATEGY = "bucketed"  # the training signalled while it runs
SIGNAL_AFTER_STEPS = 1  # steps it has logged when it gets SIGUSR1


def signal_while_running(cluster: slurm_cluster.Cluster, run_dir: Path, done: threading.Event, result: dict) -> None:
    """Send SIGUSR1 to the ``SIGNAL_STRATEGY`` training's job steps once it has logged ``SIGNAL_AFTER_STEPS``
    steps, as ``sbatch --signal=USR1@<secs>`` does ahead of the time limit. ``scancel --signal`` without
    ``--full`` signals the job steps only (the srun of torchrun), not the batch step, where the job's own
    Snakemake runs and would die of SIGUSR1. Then record the stop the training wrote (its marker, read before
    the requeued job resumes and removes it)."""
    from lenbatch_study.pipeline.artifacts.train_runs import STOPPED
    from lenbatch_study.runtime.stopping import read_marker
    from lenbatch_study.stages.train import partial_dir

    comment = f"rule_train_wildcards_{SIGNAL_STRATEGY}"
    work = partial_dir(run_dir)
    steps = work / "steps.jsonl"
    running: list[str] = []
    while not done.is_set():
        if "job_id" not in result:
            if not running:  # the job id first, so that the signal follows the first logged step at once
                queue = cluster.run("squeue", "-h", "-o", "%i|%k|%T", check=False).stdout.split()
                running = [q.split("|")[0] for q in queue if q.split("|")[1:] == [comment, "RUNNING"]]
            n = len(steps.read_text().splitlines()) if steps.exists() else 0
            # a logged step: the workers handle the signal by now (before, they inherit torchrun's SIG_IGN)
            if running and n >= SIGNAL_AFTER_STEPS:
                cluster.run("scancel", "--signal=USR1", running[0])
                result.update(job_id=running[0], signalled_after_steps=n, signalled_at=time.monotonic())
        else:
            stop = read_marker(work / STOPPED)
            if stop is not None:
                result.update(stopped=stop, stopped_after_s=round(time.monotonic() - result.pop("signalled_at"), 1))
                return
        time.sleep(0.05)


def attempts(cluster: slurm_cluster.Cluster, job_id: str) -> list[dict]:
    """Every attempt of ``job_id`` (sacct -D: a requeued job's earlier runs too), oldest first."""
    fields = ["JobID", "State", "NodeList", "Elapsed", "Start"]
    rows = cluster.run("sacct", "-D", "-X", "-P", "-n", "-j", job_id, "-o", ",".join(fields)).stdout
    return [dict(zip(fields, r.split("|"))) for r in rows.splitlines()]


def signal_problems(cluster: slurm_cluster.Cluster, run_dir: Path, result: dict) -> list[str]:
    """What sacct and the resumed run show of the signalled training (into ``result``), and what is wrong."""
    if "job_id" not in result:
        return [
            f"the {SIGNAL_STRATEGY} training was never signalled (it ended before it had logged "
            f"{SIGNAL_AFTER_STEPS} steps: raise train.useful_tokens in {CONFIGS[1]})"
        ]
    result.pop("signalled_at", None)
    problems = []
    stop = result.get("stopped")
    if stop is None or stop.get("signal") != "SIGUSR1":
        problems.append(f"the {SIGNAL_STRATEGY} training did not stop on SIGUSR1 (its stop marker: {stop!r})")
    result["attempts"] = attempts(cluster, result["job_id"])
    states = [a["State"] for a in result["attempts"]]
    if states != ["REQUEUED", "COMPLETED"]:
        problems.append(
            f"sacct shows job {result['job_id']}'s attempts as {states}, not REQUEUED then COMPLETED "
            "(the train rule requeues a job whose training stopped on SIGUSR1)"
        )
    summary = run_dir / "summary.json"
    result["resumed_from_step"] = json.loads(summary.read_text()).get("resumed_from_step") if summary.exists() else None
    if stop is not None and result["resumed_from_step"] != stop.get("step"):
        problems.append(
            f"the signalled training stopped at step {stop.get('step')} but resumed from step "
            f"{result['resumed_from_step']!r} ({summary})"
        )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "results/slurm-check",
        help="where the two runs and summary.json go (default results/slurm-check)",
    )
    parser.add_argument("--timeout", type=int, default=900, help="seconds each Snakemake run may take")
    parser.add_argument(
        "--no-requeue", action="store_true", help=f"do not requeue the {REQUEUE_STRATEGY} training while it runs"
    )
    parser.add_argument(
        "--no-signal", action="store_true", help=f"do not signal the {SIGNAL_STRATEGY} training while it runs"
    )
    parser.add_argument(
        "--cluster-dir",
        type=Path,
        default=slurm_cluster.DEFAULT_DIR,
        help="the cluster's state folder (tools/slurm_cluster.py --dir)",
    )
    args = parser.parse_args(argv)
    out = args.out.resolve()
    rel = os.path.relpath(out, ROOT)
    if rel.startswith(".."):
        parser.error(f"--out {out} must be inside the repository {ROOT} (the workflow's results_dir is relative)")
    slurm_dir, local_dir = out / "slurm", out / "local"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)

    strategies = check_config()["train"]["strategies"]
    configs = ["--configfile", *CONFIGS]
    cluster = slurm_cluster.Cluster(args.cluster_dir)
    summary: dict = {"config": CONFIGS, "overrides": SLURM_OVERRIDES, "strategies": strategies, "jobs": []}
    t0 = time.monotonic()
    # The local run goes side by side with the SLURM one: that one mostly waits (each job's Snakemake
    # starting, the executor's sacct polls), and their outputs are apart.
    targets = [
        f"{rel}/local/plans/metrics.json",
        f"{rel}/local/stats/stats.json",
        *(f"{rel}/local/train/{s}/summary.json" for s in strategies),
    ]
    local = snakemake(
        [*targets, "--cores", str(os.cpu_count() or 1), *configs, "--config", f"results_dir={rel}/local"],
        timeout=args.timeout,
        log=out / "snakemake-local.log",
    )
    local_end: list[float] = []
    waiter = threading.Thread(target=lambda: (local.wait(), local_end.append(time.monotonic())), daemon=True)
    waiter.start()
    rc = None
    try:
        cluster.up()
        summary["cluster_up_s"] = round(time.monotonic() - t0, 1)
        summary["daemons"] = cluster.pids()  # pid and start time of each: a test checks none outlives the check
        summary["netns"] = cluster.netns()  # and that no process is left in the cluster's network namespace
        t1 = time.monotonic()
        run = snakemake(
            [
                "--workflow-profile",
                "profiles/slurm",
                *configs,
                "--config",
                f"results_dir={rel}/slurm",
                *SLURM_OVERRIDES,
            ],
            timeout=args.timeout,
            log=out / "snakemake-slurm.log",
            prefix=cluster.ns(),
        )
        done, requeue = threading.Event(), {"strategy": REQUEUE_STRATEGY}
        if not args.no_requeue:
            watcher = threading.Thread(
                target=requeue_while_running,
                daemon=True,
                args=(cluster, slurm_dir / "train" / REQUEUE_STRATEGY, done, requeue),
            )
            watcher.start()
        signalled = {"strategy": SIGNAL_STRATEGY, "signal": "SIGUSR1"}
        if not args.no_signal:
            threading.Thread(
                target=signal_while_running,
                daemon=True,
                args=(cluster, slurm_dir / "train" / SIGNAL_STRATEGY, done, signalled),
            ).start()
        rc = run.wait()
        done.set()
        summary["slurm_run"] = {
            "returncode": rc,
            "seconds": round(time.monotonic() - t1, 1),
            "log": str(out / "snakemake-slurm.log"),
        }
        # sacct after the run: the executor has seen every job end, so its records are complete
        summary["jobs"] = sacct_jobs(cluster)
        if not args.no_requeue:
            requeue["problems"] = requeue_problems(cluster, slurm_dir / "train" / REQUEUE_STRATEGY, requeue)
            summary["requeue"] = requeue
        if not args.no_signal:
            signalled["problems"] = signal_problems(cluster, slurm_dir / "train" / SIGNAL_STRATEGY, signalled)
            summary["signal"] = signalled
    finally:
        t2 = time.monotonic()
        try:
            cluster.down()  # returns once every process it started has exited, or names the ones still running
        finally:
            summary["cluster_down_s"] = round(time.monotonic() - t2, 1)
            rc_local = local.wait()
            waiter.join()
    summary["local_run"] = {
        "returncode": rc_local,
        "seconds": round(local_end[0] - t0, 1),
        "log": str(out / "snakemake-local.log"),
    }
    problems = []
    if rc != 0:
        problems.append(f"the SLURM run failed (exit {rc}): see {out / 'snakemake-slurm.log'}")
    if rc_local != 0:
        problems.append(f"the local run failed (exit {rc_local}): see {out / 'snakemake-local.log'}")
    jobs = summary["jobs"]
    if not args.no_requeue:
        problems += [f"requeue: {p}" for p in summary.get("requeue", {}).get("problems", ["did not run"])]
    if not args.no_signal:
        problems += [f"signal: {p}" for p in summary.get("signal", {}).get("problems", ["did not run"])]
    for j in jobs:
        if j["state"] != "COMPLETED":
            problems.append(f"SLURM job {j['job_id']} ({j['rule']}) ended {j['state']}")
    missing = [r for r in RULES if not any(j["rule"] == r for j in jobs)]
    if missing:
        problems.append(f"rules that ran as no SLURM job: {', '.join(missing)}")
    trained = sorted(j["wildcards"] for j in jobs if j["rule"] == "train")
    if trained != sorted(strategies):
        problems.append(f"SLURM train jobs {trained}, expected one per strategy {sorted(strategies)}")
    nodes = check_config()["train"]["nodes"]
    for j in jobs:
        if j["rule"] == "train" and j["nnodes"] != nodes:
            problems.append(
                f"SLURM train job {j['job_id']} ({j['wildcards']}) ran on {j['nnodes']} node(s), "
                f"expected train.nodes={nodes}"
            )
    if rc == 0 and rc_local == 0:
        summary["comparison"] = compare(slurm_dir, local_dir, strategies)
        problems += summary["comparison"]["mismatches"]
        if "signal" in summary and SIGNAL_STRATEGY in summary["comparison"]["train"]:
            trained = summary["comparison"]["train"][SIGNAL_STRATEGY]
            summary["signal"].update(hashes_equal=trained["hashes_equal"], losses_equal=trained["losses_equal"])
    summary["problems"] = problems
    summary["ok"] = not problems
    summary["seconds"] = round(time.monotonic() - t0, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{'JobID':>6} {'rule':10} {'wildcards':10} {'nodes':8} {'state':10} elapsed")
    for j in jobs:
        print(
            f"{j['job_id']:>6} {str(j['rule']):10} {str(j['wildcards'] or ''):10} {j['nodes']:8} "
            f"{j['state']:10} {j['elapsed']}"
        )
    for p in problems:
        print(f"slurm-check: {p}", file=sys.stderr)
    print(f"slurm-check: {'ok' if not problems else 'FAILED'} in {summary['seconds']:.0f} s; {out / 'summary.json'}")
    return 0 if not problems else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except slurm_cluster.StillRunning as err:  # the cluster could not be stopped: one line naming the pids
        print(f"slurm-check: {err}", file=sys.stderr)
        sys.exit(1)
