"""A training that gets a stop signal (SLURM's ``--signal=USR1@<secs>`` ahead of the time limit, SIGTERM on
preemption or requeue) checkpoints at a step boundary, exits with STOPPED_EXIT and one log line and no summary,
and ``--resume`` then trains exactly the batches and losses of an uninterrupted run: one process, one
torchrun of 2 processes, and 2 nodes emulated by one torchrun of 4. The signal goes to every process of the
run, as SLURM delivers it to every process of a job step (``lenbatch train``, the train rule's command, keeps
torchrun's agent alive through SIGUSR1: lenbatch_study.runtime.launch)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from lenbatch_study.core.config import load_params
from lenbatch_study.runtime.lifetime import children
from lenbatch_study.runtime.stopping import STOPPED_EXIT
from lenbatch_study.stages.train import partial_dir

from _runs import planned_hashes, tiny_tokenized
from _tiny import ENV, TINY_STOPPABLE_RUN

pytestmark = pytest.mark.slow

TINY = TINY_STOPPABLE_RUN
RUN_TIMEOUT = 300
SIGNAL_AFTER_ROWS = 2  # steps.jsonl rows the run has written when it is signalled


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("signal")
    params, data = tiny_tokenized(root, TINY, timeout=RUN_TIMEOUT)
    return {"root": root, "params": params, "data": data, "lengths": np.load(data / "lengths.npy"), "runs": {}}


def _args(setup, out, shape, *extra):
    nproc, nodes = shape
    override = json.dumps({"train": {"nproc": nproc, "nodes": nodes}})
    return [
        sys.executable,
        "-m",
        "lenbatch_study",
        "train",
        "--params",
        "params.yaml",
        str(setup["params"]),
        "--params-json",
        override,
        "--strategy",
        "random",
        "--data",
        str(setup["data"]),
        "--out",
        str(out),
        *extra,
    ]


def _rows(folder: Path) -> list[dict]:
    path = folder / "steps.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _uninterrupted(setup, shape) -> list[dict]:
    """The rows of an uninterrupted run of ``shape`` (nproc, nodes); one process plans as one target rank."""
    key = (2, shape[1])
    if key not in setup["runs"]:
        out = setup["root"] / f"whole_{key[0]}x{key[1]}"
        proc = subprocess.run(_args(setup, out, key), env=ENV, capture_output=True, text=True, timeout=RUN_TIMEOUT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        setup["runs"][key] = _rows(out)
    return setup["runs"][key]


def _tree(pid: int) -> list[int]:
    """``pid`` and every process below it (torchrun starts each worker in a session of its own)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children(p)
    return found


def _signal_tree(pid: int, sig: int) -> None:
    for p in _tree(pid):
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def _signalled(setup, out, shape, sig, *, alone: bool = False) -> tuple[int, str, int]:
    """Start the run, send ``sig`` to each of its processes (as SLURM signals every process of a job step)
    once it has logged SIGNAL_AFTER_ROWS steps; returns (exit code, its log, the rows logged when signalled).
    SIGINT goes to the run's process group, as Ctrl-C at a terminal sends it (torchrun's workers have
    sessions of their own: it does not reach them); with ``alone``, ``sig`` goes to the ``lenbatch train`` process
    alone (``kill -<sig> <pid>``)."""
    proc = subprocess.Popen(
        _args(setup, out, shape),
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    seen = 0
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while time.monotonic() < deadline and proc.poll() is None:
            seen = len(_rows(partial_dir(out)))
            if seen >= SIGNAL_AFTER_ROWS:
                if alone:
                    os.kill(proc.pid, sig)
                else:
                    os.killpg(proc.pid, sig) if sig == signal.SIGINT else _signal_tree(proc.pid, sig)
                break
            time.sleep(0.05)
        log = proc.communicate(timeout=RUN_TIMEOUT)[0]
    finally:
        if proc.poll() is None:
            _signal_tree(proc.pid, signal.SIGKILL)
    assert seen >= SIGNAL_AFTER_ROWS, f"the run ended before it was signalled:\n{log[-3000:]}"
    return proc.returncode, log, seen


@pytest.mark.parametrize(
    "shape, sig",
    [
        ((1, 1), signal.SIGTERM),
        ((1, 1), signal.SIGINT),
        ((2, 1), signal.SIGUSR1),
        ((2, 1), signal.SIGTERM),
        ((2, 1), signal.SIGINT),
        ((2, 2), signal.SIGUSR1),
    ],
    ids=[
        "one-process-TERM",
        "one-process-ctrl-c",
        "torchrun-USR1",
        "torchrun-TERM",
        "torchrun-ctrl-c",
        "two-nodes-USR1",
    ],
)
def test_a_signalled_run_checkpoints_stops_and_resumes_exactly(setup, shape, sig):
    whole = _uninterrupted(setup, shape)
    out = setup["root"] / f"run_{shape[0]}x{shape[1]}_{sig.name}"
    rc, log, seen = _signalled(setup, out, shape, sig)
    work = partial_dir(out)
    rows = _rows(work)
    name = signal.Signals(sig).name  # Ctrl-C under torchrun: the agent hands the workers the SIGINT it got
    assert rc == STOPPED_EXIT, log[-3000:]
    # one line, from the rank that wrote the checkpoint, at the step the rows end at
    lines = [line for line in log.splitlines() if f"stopped on {name} at step" in line]
    assert len(lines) == 1, log[-3000:]
    assert f"stopped on {name} at step {len(rows)}, checkpoint written" in lines[0] and "--resume" in lines[0]
    assert seen <= len(rows) < len(whole)
    assert json.loads((work / "stopped.json").read_text()) == {"signal": name, "step": len(rows)}
    assert "lenbatch_study/" not in log, log[-3000:]  # no traceback through the study's code
    if shape != (1, 1) and sig == signal.SIGUSR1:
        # torchrun's agent ignored it and reports each worker's exit: every rank stopped with the code, none was
        # killed (on SIGTERM the agent hands it to the workers, waits for them and exits on the signal itself)
        codes = re.findall(r"^\s*exitcode\s*:\s*(-?\d+)", log, re.M)
        assert codes == [str(STOPPED_EXIT)] * (shape[0] * shape[1]), log[-3000:]
    assert (
        (work / "checkpoint.pt").exists()
        and not (work / "summary.json").exists()
        and not out.joinpath("summary.json").exists()
    )
    # the rows before the stop are the uninterrupted run's
    assert [r["batch_hash"] for r in rows] == [r["batch_hash"] for r in whole[: len(rows)]]

    proc = subprocess.run(
        _args(setup, out, shape, "--resume"), env=ENV, capture_output=True, text=True, timeout=RUN_TIMEOUT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] == len(rows) and summary["sessions"] == 2
    done = _rows(out)
    params = load_params("params.yaml", str(setup["params"]))
    # one process plans as one target rank, as 2 processes do
    plan_of = SimpleNamespace(batching=params.batching, train=SimpleNamespace(nproc=2, nodes=shape[1]))
    hashes = [r["batch_hash"] for r in done]
    assert hashes == [r["batch_hash"] for r in whole] == planned_hashes(setup["lengths"], plan_of, "random", None, done)
    assert np.abs(np.array([r["loss"] for r in done]) - [r["loss"] for r in whole]).max() < 1e-6
    assert not (out / "stopped.json").exists() and not work.exists()


def test_sigint_to_the_lenbatch_train_process_alone_stops_its_torchrun_at_a_step_boundary(setup):
    """Issue 48.7: `kill -INT <pid>` of a `lenbatch train` that started torchrun (train.nproc 2) was ignored: the
    training ran to its end, exit 0. Now it hands the interrupt to torchrun's agent (no terminal sent it there
    too), which hands it to the workers: they stop at a step boundary with a checkpoint, as under Snakemake."""
    whole = _uninterrupted(setup, (2, 1))
    out = setup["root"] / "run_2x1_SIGINT_alone"
    rc, log, seen = _signalled(setup, out, (2, 1), signal.SIGINT, alone=True)
    rows = _rows(partial_dir(out))
    assert rc == STOPPED_EXIT, log[-3000:]
    assert f"stopped on SIGINT at step {len(rows)}, checkpoint written" in log and seen <= len(rows) < len(whole)
    assert json.loads((partial_dir(out) / "stopped.json").read_text()) == {"signal": "SIGINT", "step": len(rows)}
    assert (partial_dir(out) / "checkpoint.pt").exists() and not (out / "summary.json").exists()


# SIGUSR1 delivered while the process imports torch (deterministic: from the import itself, not a timer)
EARLY_USR1 = """import builtins, os, signal, sys
real = builtins.__import__
def hook(name, *args, **kwargs):
    if name == "torch" and not getattr(hook, "sent", False):
        hook.sent = True
        os.kill(os.getpid(), signal.SIGUSR1)
    return real(name, *args, **kwargs)
builtins.__import__ = hook
from lenbatch_study.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_sigusr1_while_lenbatch_train_starts_stops_it_at_its_first_step_boundary(setup):
    """Issue 48.7: a SIGUSR1 in the first second (SLURM's --signal may come early) killed `lenbatch train` with
    138, nothing saved, although docs/slurm.md said an early signal was ignored. `lenbatch train` now holds it
    from its first line (before importing torch) and stops at its first step boundary with a checkpoint."""
    out = setup["root"] / "early_USR1"
    proc = subprocess.run(
        [sys.executable, "-c", EARLY_USR1, *_args(setup, out, (1, 1))[3:]],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    rows = _rows(partial_dir(out))
    assert proc.returncode == STOPPED_EXIT, (proc.returncode, proc.stderr[-3000:])
    assert "stopped on SIGUSR1 at step 1, checkpoint written" in proc.stderr and len(rows) == 1
    assert json.loads((partial_dir(out) / "stopped.json").read_text()) == {"signal": "SIGUSR1", "step": 1}
