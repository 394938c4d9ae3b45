"""Start a training's processes: one torchrun on this machine, or under SLURM one torchrun per node.

``lenbatch train`` is the one command the train rule (and a person) runs. With more than one process it is the
launcher: it finds the nodes (:func:`discover`), builds the rendezvous (:func:`rendezvous`) and the command
(:func:`command`), starts it (:func:`launch`), hands stop signals on so that the workers stop at a step
boundary (:mod:`lenbatch_study.runtime.stopping`), and, when SIGUSR1 stopped the run under SLURM, requeues
the job (:func:`requeue_if_stopped`). The workers get what the launcher read and checked, as it is: the
request (the checked params, strategy, folders, whether to resume) is written once beside the run
(:func:`hand_over`, a pickle: no worker re-reads a params file or re-runs a check) and each worker runs
``torchrun ... -m lenbatch_study train --launched FILE`` and loads it (:func:`take_over`). Before, the
launcher's argv went on unchanged and every worker parsed params.yaml and the workflow's JSON again.

- **Nodes.** ``train.nodes > 1`` inside a SLURM job (``SLURM_JOB_ID``): the job's node list
  (``SLURM_JOB_NODELIST``, else ``scontrol show job``: Snakemake's SLURM executor hands the job's shell
  ``SLURM_JOB_ID`` alone of the job's variables), expanded by ``scontrol show hostnames``; ``srun --nodes N
  --ntasks-per-node 1`` starts one torchrun on each, and c10d gives each its node rank. Elsewhere the N
  nodes are emulated by one torchrun of N x ``train.nproc`` processes on this machine: the roles come from
  the global rank, so both run the same code (docs/slurm.md "Training across nodes").
- **Rendezvous.** c10d at the first node's address (its ``NodeAddr``, which may differ from its name), on a
  port of this job's own (:func:`rendezvous_port`: trainings may share a node), run id the job id.
- **Signals.** torchrun's agent would die of SIGUSR1 (its default action) and take its workers with it: each
  agent starts with it ignored (:func:`agent_main`, an ignored disposition survives ``exec``); the workers
  install their own handler. SLURM signals every process of a job step, so the launcher ignores SIGUSR1 too.
  SIGTERM is handed to the workers, not to the agent (where every process got it the agent would get a
  second one, and a second SIGTERM during its shutdown kills it mid-checkpoint). The agent runs in a process
  group of its own, so a Ctrl-C (SIGINT to the launcher's group: a terminal's, or ``kill -INT -- -<pgid>`` of
  the group snakemake runs its jobs in) reaches it exactly once: from the launcher.
- **Requeue.** A run stopped by SIGUSR1 (``sbatch --signal=USR1@<secs>``, ahead of the time limit) inside a
  SLURM job asks ``scontrol requeue``; started again, the rule resumes from the checkpoint (docs/slurm.md
  "Stopping ahead of the time limit"). The launcher then waits to be ended by the requeue, so Snakemake
  records no failed attempt.

This module imports only the standard library: :func:`agent_main` runs once per node before torchrun.
"""

from __future__ import annotations

import os
import pickle
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, TextIO

RDZV_PORT_BASE = 29500  # torchrun's default port, shifted by the job id so trainings sharing a node differ
RDZV_PORT_SPAN = 2000
REQUEUE_WAIT_S = 600.0  # the longest a requeued job's launcher waits to be ended by SLURM
AGENT_MODULE = "lenbatch_study.runtime.launch"  # `python -m` it: this module's agent_main (not __name__: __main__ then)

Scontrol = Callable[[Sequence[str]], str]  # scontrol's arguments -> its standard output


def run_scontrol(args: Sequence[str]) -> str:
    """``scontrol <args>``'s output (one short RPC to slurmctld; raises ``OSError``/``CalledProcessError``)."""
    return subprocess.run(["scontrol", *args], check=True, capture_output=True, text=True, timeout=60).stdout


@dataclass(frozen=True)
class Cluster:
    """The nodes of the SLURM job a training spans: ``hosts`` in SLURM's order (the first runs the
    rendezvous) and ``head_addr``, the address the others reach it at."""

    job_id: str
    hosts: tuple[str, ...]
    head_addr: str


def scontrol_field(text: str, key: str) -> Optional[str]:
    """The value of ``key=`` in ``scontrol show`` output (space- and line-separated ``Key=Value``), None if
    absent or empty. O(len(text))."""
    for token in text.split():
        if token.startswith(key + "="):
            return token[len(key) + 1 :] or None
    return None


def discover(
    nodes: int, env: Mapping[str, str] = os.environ, *, scontrol: Scontrol = run_scontrol
) -> Optional[Cluster]:
    """The SLURM nodes a training of ``train.nodes`` = ``nodes`` runs on; None when it runs on this machine
    (one node, or no SLURM job: the nodes are then emulated). Costs up to three ``scontrol`` calls.

    Raises ``ValueError`` naming the fix when the job holds fewer nodes than ``nodes``."""
    job_id = env.get("SLURM_JOB_ID", "")
    if nodes <= 1 or not job_id:
        return None
    nodelist = env.get("SLURM_JOB_NODELIST") or scontrol_field(scontrol(["show", "job", job_id]), "NodeList")
    if not nodelist:
        raise ValueError(
            f"train.nodes={nodes}: SLURM job {job_id} has no node list (scontrol show job {job_id}); "
            "run the training inside the job's allocation"
        )
    hosts = tuple(scontrol(["show", "hostnames", nodelist]).split())
    if len(hosts) < nodes:
        raise ValueError(
            f"train.nodes={nodes} but SLURM job {job_id} holds {len(hosts)} node(s) ({nodelist}); ask "
            f"for {nodes} nodes (sbatch --nodes {nodes}) or set train.nodes: {len(hosts)}"
        )
    try:
        addr = scontrol_field(scontrol(["show", "node", hosts[0]]), "NodeAddr")
    except (OSError, subprocess.SubprocessError):  # a node SLURM cannot describe is reached by its name
        addr = None
    return Cluster(job_id=job_id, hosts=hosts, head_addr=addr or hosts[0])


def rendezvous_port(job_id: str) -> int:
    """The c10d port of SLURM job ``job_id``: one of its own in [29500, 31500), so that trainings of other jobs
    on the same node do not meet."""
    return RDZV_PORT_BASE + int(job_id) % RDZV_PORT_SPAN


def rendezvous(nproc: int, nodes: int, cluster: Optional[Cluster]) -> list[str]:
    """torchrun's rendezvous flags: per node ``nproc`` processes meeting at the first node's c10d endpoint
    (``cluster``), else one standalone torchrun of ``nodes x nproc`` processes (the nodes emulated)."""
    if cluster is None:
        return ["--standalone", "--nnodes", "1", "--nproc_per_node", str(nodes * nproc)]
    return [
        "--nnodes",
        str(nodes),
        "--nproc_per_node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{cluster.head_addr}:{rendezvous_port(cluster.job_id)}",
        "--rdzv-id",
        cluster.job_id,
    ]


def hand_over(request: Mapping[str, Any], out: Path) -> Path:
    """Write the launcher's checked ``request`` (``lenbatch_study.stages.train.train``'s keyword arguments)
    once, beside the run's ``out`` (on the shared file system the workers of every node read ``out`` on), for
    :func:`take_over`; whole or not at all (a rename). O(size of the params)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.parent / f".{out.name}.launch.pickle"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(pickle.dumps(dict(request)))
    tmp.replace(path)
    return path


def take_over(path: str | Path) -> dict[str, Any]:
    """The request :func:`hand_over` wrote: the launcher's checked objects, not parsed or checked again
    (written by this same code a moment before: a pickle, not a format for anyone else)."""
    request = pickle.loads(Path(path).read_bytes())
    assert isinstance(request, dict) and "params" in request, f"{path} holds no training request"
    return request


def command(
    stage_argv: Sequence[str], *, nproc: int, nodes: int, cluster: Optional[Cluster], python: str = sys.executable
) -> list[str]:
    """The command that starts the training: an agent (:func:`agent_main`, torchrun with SIGUSR1 ignored) on
    this machine, or ``srun`` starting one per node of ``cluster``; its workers run ``python -m lenbatch_study
    <stage_argv>`` (``train --launched FILE``: :func:`run_training`)."""
    prefix = [] if cluster is None else ["srun", "--nodes", str(nodes), "--ntasks-per-node", "1"]
    return [
        *prefix,
        python,
        "-m",
        AGENT_MODULE,
        *rendezvous(nproc, nodes, cluster),
        "-m",
        "lenbatch_study",
        *stage_argv,
    ]


def agent_main(torchrun_args: Sequence[str]) -> None:
    """Become torchrun's agent (``python -m torch.distributed.run <torchrun_args>``) with SIGUSR1 ignored."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", *torchrun_args])


def launch(cmd: Sequence[str], *, srun: bool, log: Callable[[str], None]) -> int:
    """Run ``cmd`` (:func:`command`) to its end, handing stop signals on (module docstring); its exit code.
    While it runs this process ignores SIGUSR1, hands SIGTERM to the workers (with ``srun`` it leaves SIGTERM
    to SLURM, which signals every process of the job) and SIGINT to the agent (to ``srun`` as SIGTERM,
    which srun forwards: one SIGINT to srun only prints its tasks' state). Costs one ``/proc`` scan per SIGTERM."""
    from lenbatch_study.runtime.lifetime import children, parent_death_signal

    log("starting " + shlex.join(cmd))

    def start() -> None:
        parent_death_signal()  # the agent dies with the launcher, and its workers with it
        os.setpgid(0, 0)  # a SIGINT to the launcher's group reaches the agent once, from the launcher
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C is the agent's: it hands it on to the workers

    proc: Optional[subprocess.Popen[bytes]] = None

    def hand_on_terminate(*_: Any) -> None:
        if proc is not None and not srun:
            for worker in children(proc.pid):
                os.kill(worker, signal.SIGTERM)

    def hand_on_interrupt(*_: Any) -> None:
        if proc is not None:
            os.kill(proc.pid, signal.SIGTERM if srun else signal.SIGINT)

    previous = {
        signal.SIGUSR1: signal.signal(signal.SIGUSR1, signal.SIG_IGN),
        signal.SIGTERM: signal.signal(signal.SIGTERM, hand_on_terminate),
        signal.SIGINT: signal.signal(signal.SIGINT, hand_on_interrupt),
    }
    try:
        proc = subprocess.Popen(list(cmd), preexec_fn=start)
        return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def requeue_if_stopped(
    rc: int,
    marker: Optional[Mapping[str, Any]],
    env: Mapping[str, str] = os.environ,
    *,
    err: TextIO = sys.stderr,
    wait_s: float = REQUEUE_WAIT_S,
) -> int:
    """After a run that ended with ``rc`` and wrote the stop ``marker`` (``{"signal", "step"}``, None when it
    did not stop on a signal): inside a SLURM job and stopped on SIGUSR1, ``scontrol requeue`` the job and wait
    up to ``wait_s`` to be ended by it (a requeue sends SIGTERM, here at its default action). Returns ``rc``
    (when the requeue fails, or the wait ends)."""
    job_id = env.get("SLURM_JOB_ID", "")
    if rc == 0 or not job_id or not marker or marker.get("signal") != "SIGUSR1":
        return rc
    print(f"train: stopped on SIGUSR1: requeueing SLURM job {job_id}", file=err, flush=True)
    done = subprocess.run(["scontrol", "requeue", job_id], stdout=err, stderr=err, check=False)
    if done.returncode == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        time.sleep(wait_s)
    return rc


def run_training(
    request: Mapping[str, Any],
    *,
    nproc: int,
    nodes: int,
    out: Path,
    stopped: Callable[[Path], Optional[Mapping[str, Any]]],
    stopped_exit: int,
    requeue: bool,
    log: Callable[[str], None],
    env: Mapping[str, str] = os.environ,
) -> int:
    """Launch ``train.nodes`` x ``train.nproc`` processes running ``lenbatch train --launched FILE`` (FILE:
    ``request`` handed over, :func:`hand_over`; removed when they end), wait for them, requeue the SLURM job
    when SIGUSR1 stopped them and ``requeue`` (only a run that resumes when started again,
    ``--resume-if-interrupted``, may be requeued); the exit code, ``stopped_exit`` when the workers stopped on
    a signal (``stopped(out)``: their marker; torchrun reports their exit as its own 1)."""
    cluster = discover(nodes, env)
    if cluster is None and nodes > 1:
        log(
            f"train.nodes={nodes}: emulating {nodes} nodes of {nproc} processes on this machine with one torchrun "
            f"of {nodes * nproc} processes"
        )
    handed = hand_over(request, out)
    try:
        rc = launch(
            command(["train", "--launched", str(handed)], nproc=nproc, nodes=nodes, cluster=cluster),
            srun=cluster is not None,
            log=log,
        )
    finally:
        handed.unlink(missing_ok=True)
    marker = stopped(out) if rc != 0 else None
    if marker:
        rc = stopped_exit
    return requeue_if_stopped(rc, marker, env) if requeue else rc


__all__ = [
    "Cluster",
    "REQUEUE_WAIT_S",
    "agent_main",
    "command",
    "discover",
    "hand_over",
    "launch",
    "rendezvous",
    "rendezvous_port",
    "requeue_if_stopped",
    "run_training",
    "scontrol_field",
    "take_over",
]


if __name__ == "__main__":
    agent_main(sys.argv[1:])
