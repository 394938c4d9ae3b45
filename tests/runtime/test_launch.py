"""The launcher of a training (lenbatch_study.runtime.launch): the SLURM nodes it finds, the rendezvous and the
command it builds (pure, fast), torchrun's agent started with SIGUSR1 ignored (a real torchrun), and the train
rule's command run for real: stopped by a signal, then run again, it resumes from the checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lenbatch_study.runtime import launch
from lenbatch_study.runtime.launch import Cluster, command, discover, rendezvous, rendezvous_port, scontrol_field
from lenbatch_study.runtime.resume import partial_dir
from lenbatch_study.runtime.stopping import STOPPED_EXIT

from _runs import tiny_tokenized
from _tiny import ENV, TINY_STOPPABLE_RUN

SHOW_JOB = (
    "JobId=4242 JobName=train\n   UserId=u(1000) GroupId=u(1000)\n   NumNodes=2 NumCPUs=4\n"
    "   NodeList=node[1-2]\n   BatchHost=node1\n"
)
SHOW_NODE = "NodeName=node1 Arch=x86_64 CoresPerSocket=1\n   NodeAddr=10.0.0.7 NodeHostName=node1 Version=23.11\n"


@pytest.fixture
def scontrol(tmp_path):
    """scontrol as the launcher calls it: ``show hostnames`` is the real one (it expands a node list from a
    minimal slurm.conf, no controller needed); ``show job`` and ``show node`` need a running cluster
    (tests/slurm/ has one), so they answer recorded output. Records every call."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\n")
    calls = []

    def run(args):
        calls.append(list(args))
        if args[:2] == ["show", "hostnames"]:
            return subprocess.run(
                ["scontrol", *args],
                check=True,
                capture_output=True,
                text=True,
                env={**os.environ, "SLURM_CONF": str(conf)},
            ).stdout
        return {"job": SHOW_JOB, "node": SHOW_NODE}[args[1]]

    run.calls = calls
    return run


needs_scontrol = pytest.mark.skipif(
    subprocess.run(["sh", "-c", "command -v scontrol"], capture_output=True).returncode != 0,
    reason="scontrol (the slurm-client package) is not installed",
)


def test_scontrol_fields_are_read_from_its_key_value_output():
    assert scontrol_field(SHOW_JOB, "NodeList") == "node[1-2]"
    assert scontrol_field(SHOW_NODE, "NodeAddr") == "10.0.0.7"
    assert scontrol_field("NodeList= NumNodes=2", "NodeList") is None and scontrol_field(SHOW_JOB, "Nope") is None


def test_outside_slurm_or_on_one_node_nothing_is_discovered(scontrol):
    assert discover(2, {}, scontrol=scontrol) is None
    assert discover(1, {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[1-2]"}, scontrol=scontrol) is None
    assert scontrol.calls == []


@needs_scontrol
def test_the_nodes_come_from_the_job_s_node_list_and_the_head_s_address(scontrol):
    # Snakemake's SLURM executor hands the job's shell SLURM_JOB_ID alone: the node list comes from the job
    cluster = discover(2, {"SLURM_JOB_ID": "4242"}, scontrol=scontrol)
    assert cluster == Cluster(job_id="4242", hosts=("node1", "node2"), head_addr="10.0.0.7")
    assert scontrol.calls == [["show", "job", "4242"], ["show", "hostnames", "node[1-2]"], ["show", "node", "node1"]]
    # inside the allocation SLURM_JOB_NODELIST saves the job lookup
    scontrol.calls.clear()
    cluster = discover(2, {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[07-08]"}, scontrol=scontrol)
    assert cluster.hosts == ("gpu07", "gpu08") and scontrol.calls[0] == ["show", "hostnames", "gpu[07-08]"]


@needs_scontrol
def test_a_head_slurm_cannot_describe_is_reached_by_its_name(scontrol):
    def no_node(args):
        if args[1] == "node":
            raise subprocess.CalledProcessError(1, ["scontrol", *args])
        return scontrol(args)

    assert discover(2, {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]"}, scontrol=no_node).head_addr == "node1"


@needs_scontrol
def test_a_job_with_fewer_nodes_than_train_nodes_is_refused_with_the_fix(scontrol):
    with pytest.raises(ValueError, match=r"train.nodes=3 but SLURM job 4242 holds 2 node\(s\).*sbatch --nodes 3"):
        discover(3, {"SLURM_JOB_ID": "4242"}, scontrol=scontrol)


def test_the_rendezvous_is_standalone_here_and_c10d_at_the_head_under_slurm():
    assert rendezvous(2, 2, None) == ["--standalone", "--nnodes", "1", "--nproc_per_node", "4"]
    cluster = Cluster(job_id="4242", hosts=("node1", "node2"), head_addr="10.0.0.7")
    assert rendezvous(3, 2, cluster) == [
        "--nnodes",
        "2",
        "--nproc_per_node",
        "3",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "10.0.0.7:29742",
        "--rdzv-id",
        "4242",
    ]
    # a port of the job's own, in one range: jobs sharing a node do not meet
    assert rendezvous_port("4242") == 29742 and rendezvous_port("2000") == 29500 and rendezvous_port("1999") == 31499


def test_the_workers_command_names_the_handed_over_request_and_no_params():
    argv = ["train", "--launched", "/runs/.x.launch.pickle"]
    here = command(argv, nproc=2, nodes=1, cluster=None, python="/py")
    assert here == [
        "/py",
        "-m",
        "lenbatch_study.runtime.launch",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc_per_node",
        "2",
        "-m",
        "lenbatch_study",
        *argv,
    ]
    cluster = Cluster(job_id="9", hosts=("a", "b"), head_addr="a")
    slurm = command(argv, nproc=2, nodes=2, cluster=cluster, python="/py")
    assert slurm[:5] == ["srun", "--nodes", "2", "--ntasks-per-node", "1"] and slurm[-len(argv) :] == argv
    assert slurm[5:8] == ["/py", "-m", "lenbatch_study.runtime.launch"] and "a:29509" in slurm


def test_the_request_is_handed_over_as_the_checked_object_not_reparsed(tmp_path, monkeypatch):
    """What the launcher checked reaches the workers as it is: take_over rebuilds the same frozen Params without
    running a check again (a check that now fails would be a re-parse)."""
    from lenbatch_study.core import sections
    from lenbatch_study.core.config import load_params

    params = load_params("params.yaml", overrides={"train": {"useful_tokens": 1234}})
    request = {
        "params": params,
        "strategy": "random",
        "data": "d",
        "out": tmp_path / "train" / "random",
        "boundaries": None,
        "max_steps": 3,
        "resume": False,
    }
    path = launch.hand_over(request, tmp_path / "train" / "random")
    assert path.parent == tmp_path / "train" and path.name == ".random.launch.pickle"

    def refuse(self):
        raise AssertionError("a section was checked again")

    monkeypatch.setattr(sections.TrainConfig, "__post_init__", refuse)
    got = launch.take_over(path)
    assert got == request and got["params"].train.useful_tokens == 1234


def test_only_a_run_stopped_by_sigusr1_inside_a_slurm_job_is_requeued(capsys):
    job = {"SLURM_JOB_ID": "4242"}
    usr1 = {"signal": "SIGUSR1", "step": 3}
    # no scontrol is called in any of these (it would print the requeue line first)
    assert launch.requeue_if_stopped(0, None, job) == 0
    assert launch.requeue_if_stopped(75, usr1, {}) == 75
    assert launch.requeue_if_stopped(75, {"signal": "SIGTERM", "step": 3}, job) == 75
    assert launch.requeue_if_stopped(1, None, job) == 1
    assert capsys.readouterr().err == ""


WORKER = """import os, sys
ignored = int(open(f"/proc/{os.getppid()}/status").read().split("SigIgn:")[1].split()[0], 16)
print("agent ignores SIGUSR1:", bool(ignored >> (10 - 1) & 1), flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_torchrun_s_agent_starts_with_sigusr1_ignored(tmp_path):
    """SIGUSR1 at its default action would end the agent and with it the workers; its workers read its
    ignored-signal mask from /proc (the agent is their parent)."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    cmd = command([], nproc=1, nodes=1, cluster=None)[:-2] + [str(script)]  # a script in place of the stage
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "agent ignores SIGUSR1: True" in proc.stdout


# the train rule's command for real on a tiny training
TINY = TINY_STOPPABLE_RUN


def _rows(folder: Path) -> int:
    path = folder / "steps.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.slow
def test_the_rule_s_command_stops_on_sigterm_and_resumes_when_run_again(tmp_path):
    """`lenbatch train ... --resume-if-interrupted` (what the train rule runs): the launcher starts torchrun
    with its own arguments, hands a SIGTERM to the workers (they checkpoint at a step and it exits 75); the
    same command run again resumes from that checkpoint and completes the run."""
    params, data = tiny_tokenized(tmp_path, TINY)
    out = tmp_path / "train" / "random"
    argv = [
        sys.executable,
        "-m",
        "lenbatch_study",
        "train",
        "--params",
        "params.yaml",
        str(params),
        "--params-json",
        json.dumps({"train": {"nproc": 2}}),
        "--strategy",
        "random",
        "--data",
        str(data),
        "--out",
        str(out),
        "--resume-if-interrupted",
    ]
    handed = out.parent / ".random.launch.pickle"
    proc = subprocess.Popen(
        argv, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and _rows(partial_dir(out)) < 2:
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it was signalled"
        os.kill(proc.pid, signal.SIGTERM)  # the launcher alone: it hands the signal to the workers
        log = proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == STOPPED_EXIT, log[-3000:]
    # the workers ran the request the launcher checked and handed over (no params on their command line),
    # and the hand-over is gone with them
    assert (
        f"lenbatch_study.runtime.launch --standalone --nnodes 1 --nproc_per_node 2 -m lenbatch_study train "
        f"--launched {handed}"
    ) in log
    assert "stopped on SIGTERM at step" in log and not handed.exists(), log[-3000:]
    stopped = json.loads((partial_dir(out) / "stopped.json").read_text())
    assert (partial_dir(out) / "checkpoint.pt").exists() and not (out / "summary.json").exists()

    again = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] == stopped["step"] and summary["sessions"] == 2
    assert not partial_dir(out).exists()
