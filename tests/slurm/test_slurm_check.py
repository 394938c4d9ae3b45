"""The SLURM path for real: `tools/slurm_check.py` (`make slurm-check`) starts a 2-node SLURM cluster with
accounting on this machine (tools/slurm_cluster.py), runs the tiny workflow on it with profiles/slurm, every
rule a SLURM job, requeues the packed training while it runs (`scontrol requeue`, as preemption does),
signals the bucketed one with SIGUSR1 (`scancel --signal=USR1`, as `sbatch --signal=USR1@<secs>` does ahead of
the time limit), runs the config locally too, and stops the cluster. Here: every rule ran as a SLURM job that `sacct`
reports COMPLETED, the requeued training came back on the same job id and resumed from its checkpoint, the
signalled one stopped at a step, requeued its own job and resumed from that step,
the SLURM run (the requeued training included) trained exactly the planned batches with the local run's
losses, and no daemon of the cluster outlives the check.

Needs root (the daemons, /etc/slurm) and the packages or apt-get to install them (`make test-deps`
installs them where it can); skipped, with the reason, elsewhere."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))
import slurm_cluster  # noqa: E402
from _runs import check_pipelined_run, planned_hashes  # noqa: E402
from lenbatch_study.pipeline import registry  # noqa: E402

BIN = Path(sys.executable).parent
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
# the rules a run submits: every stage of the table but those the Snakefile writes as it is parsed
RULES = [s for s, st in registry.STAGES.items() if not st.always_changed]


def why_not() -> str | None:
    if os.geteuid() != 0:
        return "the SLURM check needs root (it starts SLURM's daemons and writes /etc/slurm/slurm.conf)"
    missing = [b for b in slurm_cluster.BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if missing and shutil.which("apt-get") is None:
        return f"the SLURM check needs {', '.join(missing)} (Debian's slurm-wlm, munge, mariadb) or apt-get"
    for tool in ("unshare", "nsenter", "ip"):
        if shutil.which(tool) is None:
            return f"the SLURM check needs {tool} (its private network namespace)"
    return None


@pytest.fixture(scope="module")
def check(tmp_path_factory):
    """The check run once in a copy of the workflow (its results stay out of the repository's)."""
    reason = why_not()
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("slurm")
    for name in ("Snakefile", "params.yaml"):
        shutil.copy2(ROOT / name, work / name)
    for name in ("workflow", "profiles", "configs", "src", "tools"):
        shutil.copytree(ROOT / name, work / name, ignore=shutil.ignore_patterns("__pycache__"))
    cluster_dir = work / "cluster"
    out = work / "results/slurm-check"
    try:
        proc = subprocess.run(
            [
                sys.executable,
                str(work / "tools/slurm_check.py"),
                "--out",
                str(out),
                "--cluster-dir",
                str(cluster_dir),
                "--timeout",
                "720",
            ],
            cwd=work,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        # the check stops its cluster itself; this covers the check being killed by the timeout above
        subprocess.run(
            [sys.executable, str(work / "tools/slurm_cluster.py"), "--dir", str(cluster_dir), "down"],
            capture_output=True,
            timeout=120,
        )
    assert (out / "summary.json").exists(), f"no summary ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    summary = json.loads((out / "summary.json").read_text())
    return {"work": work, "out": out, "summary": summary, "proc": proc}


@pytest.mark.slow
def test_every_rule_ran_as_a_slurm_job_that_sacct_reports_completed(check):
    summary, proc = check["summary"], check["proc"]
    assert summary["slurm_run"]["returncode"] == 0, (check["out"] / "snakemake-slurm.log").read_text()[-5000:]
    jobs = summary["jobs"]
    assert jobs and all(j["state"] == "COMPLETED" for j in jobs), jobs
    assert all(j["job_id"].isdigit() and j["elapsed"] and j["nnodes"] >= 1 for j in jobs), jobs
    assert {j["rule"] for j in jobs} == set(RULES), jobs
    assert sorted(j["wildcards"] for j in jobs if j["rule"] == "train") == sorted(summary["strategies"])
    assert sum(1 for j in jobs if j["rule"] != "train") == len(RULES) - 1  # each other rule exactly once
    # the jobs ran on the cluster's nodes (n1, n2, or both: n[1-2]); every training across both
    assert all(j["nodes"] in ("n1", "n2", "n[1-2]") for j in jobs), jobs
    assert all((j["nnodes"], j["nodes"]) == (2, "n[1-2]") for j in jobs if j["rule"] == "train"), jobs
    assert summary["ok"] and not summary["problems"] and proc.returncode == 0, (summary["problems"], proc.stderr)
    # the check's own table, one line per job, is what `make slurm-check` prints
    for j in jobs:
        assert f"{j['job_id']:>6} {j['rule']:10}" in proc.stdout


@pytest.mark.slow
def test_a_training_requeued_while_it_runs_comes_back_and_resumes_from_its_checkpoint(check):
    requeue = check["summary"]["requeue"]
    assert requeue["problems"] == [], requeue
    assert requeue["requeued_after_steps"] >= 2
    # sacct --duplicates: the stopped attempt, then the one that ran to the end, on the same job id
    assert [a["State"] for a in requeue["attempts"]] == ["REQUEUED", "COMPLETED"]
    assert {a["JobID"] for a in requeue["attempts"]} == {requeue["job_id"]}
    train = json.loads((check["out"] / "slurm/train" / requeue["strategy"] / "summary.json").read_text())
    # it resumed at a checkpoint of the stopped attempt (checkpoint_every 1; it may have stepped on while
    # SLURM stopped it), not from scratch, and trained steps after it
    assert 1 <= train["resumed_from_step"] < train["steps"]
    # exactness after the resume is the next test's (the requeued strategy is one of those compared)
    assert requeue["strategy"] in check["summary"]["strategies"]


@pytest.mark.slow
def test_a_training_signalled_while_it_runs_stops_at_a_step_requeues_itself_and_resumes_there(check):
    signalled = check["summary"]["signal"]
    assert signalled["problems"] == [], signalled
    assert signalled["strategy"] != check["summary"]["requeue"]["strategy"]
    # it stopped on the signal at a step boundary at or after the steps logged when signalled, before its end
    stop = signalled["stopped"]
    train = json.loads((check["out"] / "slurm/train" / signalled["strategy"] / "summary.json").read_text())
    assert stop["signal"] == "SIGUSR1" and signalled["signalled_after_steps"] <= stop["step"] < train["steps"]
    # the train rule requeued its own job: the stopped attempt, then the one that ran to the end, one job id
    assert [a["State"] for a in signalled["attempts"]] == ["REQUEUED", "COMPLETED"]
    assert {a["JobID"] for a in signalled["attempts"]} == {signalled["job_id"]}
    assert train["resumed_from_step"] == signalled["resumed_from_step"] == stop["step"]
    assert signalled["hashes_equal"] and signalled["losses_equal"]


@pytest.mark.slow
def test_the_slurm_run_trained_exactly_the_planned_batches_with_the_local_losses(check):
    """Read from the two runs' files (not from the summary's verdict): edges and plan metrics equal, each
    SLURM training passes every check of a pipelined run (its batches are the plan's, in order), and has
    the local run's batch hashes and losses."""
    from lenbatch_study.core.config import load_params

    slurm, local = check["out"] / "slurm", check["out"] / "local"
    assert check["summary"]["local_run"]["returncode"] == 0
    edges = json.loads((slurm / "boundaries/boundaries.json").read_text())["edges"]
    assert edges == json.loads((local / "boundaries/boundaries.json").read_text())["edges"]
    assert json.loads((slurm / "plans/metrics.json").read_text()) == json.loads(
        (local / "plans/metrics.json").read_text()
    )
    lengths = np.load(slurm / "tokenize/lengths.npy")
    assert np.array_equal(lengths, np.load(local / "tokenize/lengths.npy"))
    for strategy in check["summary"]["strategies"]:
        params = load_params(slurm / "train" / strategy / "params.json")
        steps = [json.loads(x) for x in (slurm / "train" / strategy / "steps.jsonl").read_text().splitlines()]
        summary = json.loads((slurm / "train" / strategy / "summary.json").read_text())
        planned = planned_hashes(lengths, params, strategy, edges, steps)
        nodes = params.train.nodes
        assert nodes == 2 and summary["nodes"] == nodes, (strategy, summary.get("nodes"))  # configs/slurm-check.yaml
        if summary.get("resumed_from_step") is None:
            # the warm-up counts in cluster steps: one step of each node's drafter
            check_pipelined_run(
                steps,
                summary,
                strategy=strategy,
                token_budget=params.batching.token_budget,
                useful_tokens=params.train.useful_tokens,
                planned=planned,
                warmup_steps=params.train.warmup_steps * nodes,
                target_ranks=nodes * (params.train.nproc - 1),
            )
            # throughput per node and in total: the nodes' measured tokens add up to the run's
            per_node = summary["per_node"]
            assert len(per_node) == nodes and all(n["useful_tokens_per_s"] > 0 for n in per_node), per_node
        else:
            # the requeued and the signalled training: its summary's throughput and CPU shares cover the steps
            # after the resume only, so check_pipelined_run's sums over all steps do not apply; what the resume
            # must keep does: every step once, in order, the planned batches, stopping at train.useful_tokens
            assert strategy in (check["summary"]["requeue"]["strategy"], check["summary"]["signal"]["strategy"])
            useful = np.cumsum([s["useful_tokens"] for s in steps])
            assert useful[-1] >= params.train.useful_tokens > useful[-2]
            assert [s["step"] for s in steps] == list(range(len(steps))) and summary["steps"] == len(steps)
            assert [s["batch_hash"] for s in steps] == planned
        ref = [json.loads(x) for x in (local / "train" / strategy / "steps.jsonl").read_text().splitlines()]
        assert [s["batch_hash"] for s in steps] == [s["batch_hash"] for s in ref], strategy
        for a, b in zip(steps, ref, strict=True):
            assert math.isclose(a["loss"], b["loss"], rel_tol=1e-5), (strategy, a["step"], a["loss"], b["loss"])
        compared = check["summary"]["comparison"]["train"][strategy]
        assert compared["hashes_equal"] and compared["batch_hashes"]["slurm"] == [s["batch_hash"] for s in steps]


@pytest.mark.slow
def test_no_daemon_of_the_cluster_outlives_the_check(check):
    daemons = check["summary"]["daemons"]
    assert {"netns", "munged", "mariadb", "slurmdbd", "slurmctld", "slurmd-n1", "slurmd-n2"} <= set(daemons)
    assert not [name for name, entry in daemons.items() if slurm_cluster.alive(entry)]
    for name in ("slurm.conf", "slurmdbd.conf"):
        path = slurm_cluster.ETC / name
        assert not (path.exists() and slurm_cluster.MARK in path.read_text()), path
    assert not (check["work"] / "cluster/pids.json").exists()
    # nor any process the daemons started (slurmctld's slurmscriptd, a job's slurmstepd)
    assert check["summary"].get("netns") and not slurm_cluster.processes_in(check["summary"]["netns"])


# A daemon whose main thread has ended shows its pid as a zombie while its other threads still shut down:
# `down` took that for stopped, and `make slurm-check` returned while slurmctld still ran (issue 46, item 8).
_MAIN_THREAD_EXITS = """
import ctypes, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=False).start()
ctypes.CDLL(None).pthread_exit(None)
"""


def test_a_process_whose_main_thread_ended_but_another_runs_is_alive_until_every_thread_exits():
    proc = subprocess.Popen([sys.executable, "-c", _MAIN_THREAD_EXITS])
    try:
        entry = {"pid": proc.pid, "start": slurm_cluster.start_time(proc.pid)}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with open(f"/proc/{proc.pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.05)
        else:
            pytest.fail("the main thread did not exit")
        assert slurm_cluster.alive(entry), "a zombie main thread with a running thread was taken for stopped"
        slurm_cluster.stop(entry, "test process", grace=1, kill_wait=10)  # SIGTERM ends it
        assert not slurm_cluster.alive(entry)
        assert not slurm_cluster._threads_running(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_stop_names_the_pid_of_a_process_that_outlives_its_sigkill(monkeypatch):
    """The bounded wait: a process still running after SIGKILL and kill_wait seconds is one error naming it."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        entry = {"pid": proc.pid, "start": slurm_cluster.start_time(proc.pid)}
        monkeypatch.setattr(slurm_cluster.os, "kill", lambda pid, sig: None)  # signals that never arrive
        with pytest.raises(
            slurm_cluster.StillRunning, match=rf"test daemon \(pid {proc.pid}\) still runs 0 s after SIGKILL"
        ):
            slurm_cluster.stop(entry, "test daemon", grace=0.2, kill_wait=0.2)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_down_returns_only_once_every_process_of_the_cluster_has_exited(tmp_path):
    """`up`, then `down`, in one process as tools/slurm_check.py runs them: when `down` returns, every daemon
    it recorded has left the process table (exited and collected: `ps` and `pgrep slurmctld` find none) and
    no process runs in the cluster's network namespace (slurmctld's slurmscriptd, a job's slurmstepd).
    About 15 s."""
    reason = why_not()
    if reason:
        pytest.skip(reason)
    cluster = slurm_cluster.Cluster(tmp_path / "cluster")
    try:
        cluster.up()
        daemons, ns = cluster.pids(), cluster.netns()
        assert set(slurm_cluster.DAEMONS) <= set(daemons) and ns
        assert all(slurm_cluster.alive(e) for e in daemons.values())
        cluster.down()
        left = {name: e["pid"] for name, e in daemons.items() if slurm_cluster.start_time(e["pid"]) == e["start"]}
        assert not left, f"still in the process table after `down` returned: {left}"
        assert not slurm_cluster.processes_in(ns), "processes left in the cluster's namespace"
    finally:
        cluster.down(quiet=True)
