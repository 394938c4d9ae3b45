"""The train stage end to end: real tokenized data, real torchrun (2 processes, gloo), every strategy,
single process == pipeline, resume after a stop mid-epoch, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from lenbatch_study.cli import main
from lenbatch_study.analysis import shapes
from lenbatch_study.core import machine
from lenbatch_study.core.config import load_params
from lenbatch_study.runtime.schedule import build_schedule
from lenbatch_study.pipeline.artifacts import train_runs
from lenbatch_study.runtime import reference
from lenbatch_study.runtime.lifetime import children
from lenbatch_study.stages.train import partial_dir

from _procs import running
from _runs import check_pipelined_run, planned_hashes, tiny_tokenized
from _tiny import ENV, TINY_DATA, TINY_MODEL

pytestmark = pytest.mark.slow

# A tiny target and drafter; the real Qwen3.6 vocabulary (the ids come from the real tokenizer).
TINY = {
    "data": TINY_DATA,
    "model": TINY_MODEL,
    "drafter": {"num_layers": 1, "num_heads": 2, "anchors_per_seq": 1},
    "batching": {"token_budget": 2048, "max_batch_size": 8},
    "train": {"nproc": 2, "useful_tokens": 7000, "warmup_steps": 1, "queue_size": 2, "threads": 1, "device": "cpu"},
}


TINY_PATH: list = []  # the module's params file (written by the setup fixture)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    params, data = tiny_tokenized(root, TINY)
    TINY_PATH[:] = [params]
    lengths = np.load(data / "lengths.npy")
    inner = np.quantile(lengths, [0.25, 0.5, 0.75]).astype(int)
    edges = sorted({int(lengths.min()), *inner.tolist(), int(lengths.max()) + 1})
    (root / "boundaries.json").write_text(json.dumps({"method": "test quantiles", "edges": edges}))
    return {"root": root, "params": params, "data": data, "lengths": lengths, "runs": {}}


def _train_args(setup, strategy, out, *extra):
    return [
        "train",
        "--params",
        "params.yaml",
        str(setup["params"]),
        "--strategy",
        strategy,
        "--data",
        str(setup["data"]),
        "--boundaries",
        str(setup["root"] / "boundaries.json"),
        "--out",
        str(out),
        *extra,
    ]


def _torchrun(setup, strategy, out, *extra):
    """A 2-process torchrun of the stage, in a temp folder of its own: it must leave nothing there (issue 48.6:
    torchrun's agent left a torchelastic_* tree in $TMPDIR per training)."""
    tmp = setup["root"] / "tmpdir"
    tmp.mkdir(exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "lenbatch_study",
        *_train_args(setup, strategy, out, *extra),
    ]
    proc = subprocess.run(cmd, env={**ENV, "TMPDIR": str(tmp)}, capture_output=True, text=True, timeout=300)
    assert not list(tmp.glob("torchelastic_*")), (list(tmp.iterdir()), proc.stderr[-2000:])
    return proc


def _steps(out):
    return [json.loads(line) for line in (Path(out) / "steps.jsonl").read_text().splitlines()]


def _run(setup, strategy):
    """One 2-process run per strategy, shared by the tests below."""
    if strategy not in setup["runs"]:
        out = setup["root"] / f"run_{strategy}"
        proc = _torchrun(setup, strategy, out)
        assert proc.returncode == 0, proc.stderr[-3000:]
        setup["runs"][strategy] = out
    return setup["runs"][strategy]


def _planned_hashes(setup, strategy, steps):
    edges = json.loads((setup["root"] / "boundaries.json").read_text())["edges"]
    return planned_hashes(setup["lengths"], load_params("params.yaml", str(setup["params"])), strategy, edges, steps)


# sorted and random: the runs the tests below share (no extra torchrun). The workflow's own torchrun runs
# of all five strategies get the same checks in tests/pipeline/test_workflow_e2e.py
# (test_every_training_ran_pipelined_and_trained_exactly_its_planned_batches), packed's layout included.
@pytest.mark.parametrize("strategy", ["sorted", "random"])
def test_two_process_torchrun_run(setup, strategy):
    out = _run(setup, strategy)
    steps = _steps(out)
    summary = json.loads((out / "summary.json").read_text())
    check_pipelined_run(
        steps,
        summary,
        strategy=strategy,
        token_budget=TINY["batching"]["token_budget"],
        useful_tokens=TINY["train"]["useful_tokens"],
        warmup_steps=1,
        planned=_planned_hashes(setup, strategy, steps),
    )
    assert summary["params"]["drafter"]["anchors_per_seq"] == 1
    # the features' transport of every step (wire + copy onto the drafter's device, its wait excluded): at most
    # the drafter's whole wait for the batch, and the bytes shapes.transport_bytes predicts for its shape
    params = load_params("params.yaml", str(setup["params"]))
    fdim = len(params.model.target_layers) * params.model.hidden_size
    for r in steps:
        assert 0 < r["transport_s"] <= r["queue_wait_s"] + 1e-6, r
        assert r["transport_bytes"] == int(
            shapes.transport_bytes(
                np.array([r["computed_tokens"]]),
                np.array([r["sequences"]]),
                feature_dim=fdim,
                itemsize=shapes.ITEMSIZE[params.model.dtype],
            )[0]
        )
    assert summary["transport_s_mean"] > 0 and summary["transport_bytes_mean"] > 0
    assert (out / "checkpoint.pt").exists() and (out / "params.json").exists()
    # compare's reader takes the real run (it reads results/train/<strategy>/)
    (setup["root"] / "by_strategy").mkdir(exist_ok=True)
    (setup["root"] / "by_strategy" / strategy).symlink_to(out)
    assert train_runs.read_run(setup["root"] / "by_strategy", strategy) == {"summary": summary, "steps": steps}
    # where it ran, and the reference step: target rank 0's and the drafter rank's, before and after the steps
    assert summary["machine"]["id"] == machine.fingerprint()["id"] and summary["machine"]["threads"] == 1
    _check_reference(summary["reference"])


def _check_reference(ref):
    params = load_params("params.yaml", str(TINY_PATH[0]))
    assert ref["shape"] == reference.reference_shape(params)
    for role in ("target", "drafter"):
        assert len(ref[role]["start"]) == len(ref[role]["end"]) == reference.REPEATS
        assert min(ref[role]["start"] + ref[role]["end"]) > 0 and len(ref[role]["end_cpu"]) == reference.REPEATS
    assert ref["seconds"] >= sum(sum(ref[r]["start"]) + sum(ref[r]["end"]) for r in ("target", "drafter"))


def test_single_process_trains_the_same_batches_and_losses_as_the_pipeline(setup):
    ref = _steps(_run(setup, "sorted"))
    out = setup["root"] / "single_sorted"
    rc = main(_train_args(setup, "sorted", out, "--params-json", '{"train": {"nproc": 1}}'))
    assert rc == 0
    single = _steps(out)
    _check_reference(json.loads((out / "summary.json").read_text())["reference"])  # one process times both
    assert [s["batch_hash"] for s in single] == [s["batch_hash"] for s in ref]
    assert np.allclose([s["loss"] for s in single], [s["loss"] for s in ref], atol=1e-6, rtol=0)
    assert all(s["queue_wait_s"] == 0 for s in single)


def test_resume_after_a_stop_mid_epoch_replays_the_same_batches_and_losses(setup):
    ref = _steps(_run(setup, "random"))
    out = setup["root"] / "resumed_random"
    first = _torchrun(setup, "random", out, "--max-steps", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    assert len(_steps(out)) == 2 and ref[2]["epoch"] == 0  # stopped inside epoch 0
    # a killed run may have logged steps past its checkpoint: they are dropped on resume
    with (out / "steps.jsonl").open("a") as fh:
        fh.write(json.dumps({**ref[2], "loss": 99.0}) + "\n")
    second = _torchrun(setup, "random", out, "--resume")
    assert second.returncode == 0, second.stderr[-3000:]
    resumed = _steps(out)
    assert [s["batch_hash"] for s in resumed] == [s["batch_hash"] for s in ref]
    assert np.abs(np.array([s["loss"] for s in resumed]) - [s["loss"] for s in ref]).max() < 1e-6
    assert json.loads((out / "summary.json").read_text())["resumed_from_step"] == 2


def test_resume_after_a_real_kill_mid_run(setup):
    """SIGKILL a single-process run after a few periodic checkpoints; --resume finishes it like an uninterrupted run."""
    cfg = '{"train": {"nproc": 1, "checkpoint_every": 2, "useful_tokens": 20000}}'
    ref_out = setup["root"] / "kill_ref"
    ref = subprocess.run(
        [sys.executable, "-m", "lenbatch_study", *_train_args(setup, "packed", ref_out, "--params-json", cfg)],
        env=ENV,
        capture_output=True,
    )
    assert ref.returncode == 0, ref.stderr[-2000:]
    ref_steps = _steps(ref_out)
    assert len(ref_steps) >= 8
    out = setup["root"] / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lenbatch_study", *_train_args(setup, "packed", out, "--params-json", cfg)],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    log = partial_dir(out) / "steps.jsonl"  # a fresh run trains there until it is complete
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if log.exists() and len(log.read_text().splitlines()) >= 5:
                break
            time.sleep(0.01)
        proc.kill()  # SIGKILL: no cleanup, no final checkpoint
    finally:
        proc.wait()
    done = len(log.read_text().splitlines())
    assert proc.returncode != 0 and 5 <= done < len(ref_steps), "the run must die mid-way"
    assert not (out / "summary.json").exists()  # nothing half-done in OUT
    rc = main(_train_args(setup, "packed", out, "--resume", "--params-json", cfg))
    assert rc == 0 and not partial_dir(out).exists()
    resumed = _steps(out)
    summary = json.loads((out / "summary.json").read_text())
    start = summary["resumed_from_step"]
    assert start % 2 == 0 and 4 <= start <= done  # the last periodic checkpoint before the kill
    assert [s["batch_hash"] for s in resumed] == [s["batch_hash"] for s in ref_steps]
    assert np.abs(np.array([s["loss"] for s in resumed]) - [s["loss"] for s in ref_steps]).max() < 1e-6


def _set_aside(out):
    return sorted(out.parent.glob(f"{out.name}.set-aside-*.pt"))


def _complete_fresh_summary(out):
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] is None and summary["useful_tokens_per_s"] is not None
    assert summary["reference"] and len(_steps(out)) == summary["steps"]
    return summary


def test_resume_sets_aside_a_checkpoint_from_other_params_and_starts_afresh(setup, capsys, caplog):
    """The workflow passes --resume after an interrupted run; with other params the resume used to be refused
    on every rerun (a trap whose way out, deleting checkpoint.pt, no message named). Now the checkpoint is
    renamed beside OUT, the log names it, and the run trains afresh to a complete summary."""
    out = setup["root"] / "other_params"
    assert main(_train_args(setup, "sorted", out, "--max-steps", "3", "--params-json", _cfg())) == 0
    ck = (out / "checkpoint.pt").read_bytes()
    capsys.readouterr()
    caplog.clear()
    rc = main(
        _train_args(
            setup, "sorted", out, "--resume", "--params-json", json.dumps({"train": SINGLE, "drafter": {"gamma": 3.0}})
        )
    )
    err = _warned(capsys, caplog)
    aside = _set_aside(out)
    assert rc == 0 and len(aside) == 1 and aside[0].read_bytes() == ck
    assert "drafter.gamma" in err and str(aside[0]) in err and "training afresh" in err
    assert _complete_fresh_summary(out)["steps"] > 3


def test_a_resume_in_another_shape_is_refused_at_the_start_and_keeps_the_checkpoint(setup, capsys):
    """Issue 48.3: a resume across train.nproc 2 -> 1 (the same plan: nproc 1 plans as 2) trained every remaining
    step, then died with KeyError 'stage_s' (exit 1, no summary), and the next --resume set the finished
    checkpoint aside and trained from scratch. One run's throughput cannot mix a pipeline's steps with one
    process's: the resume is refused before anything trains, naming the setting and both ways out."""
    import shutil

    from lenbatch_study.runtime.checkpoint import RunShapeError
    from lenbatch_study.stages.train import train

    out = setup["root"] / "shape_2_to_1"
    first = _torchrun(setup, "sorted", out, "--max-steps", "3")  # train.nproc 2 (TINY)
    assert first.returncode == 0, first.stderr[-3000:]
    before = _files(out)
    capsys.readouterr()
    rc = main(_train_args(setup, "sorted", out, "--resume", "--params-json", _cfg()))  # train.nproc 1
    err = _err(capsys)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert (
        f"checkpoint {out / 'checkpoint.pt'} was trained with train.nproc=2, train.nodes=1 but this run has "
        "train.nproc=1, train.nodes=1"
    ) in err
    assert "resume with train.nproc: 2 and train.nodes: 1, or to train afresh rerun without --resume" in err
    assert _files(out) == before and not _set_aside(out) and not partial_dir(out).exists()
    # the stage itself refuses it too (a torchrun started by hand skips the CLI's early look), never sets it aside
    params = load_params("params.yaml", str(setup["params"]), _cfg())
    with pytest.raises(RunShapeError, match="train.nproc=2, train.nodes=1 but this run has train.nproc=1"):
        train(
            params=params,
            strategy="sorted",
            data=setup["data"],
            out=out,
            resume=True,
            boundaries=str(setup["root"] / "boundaries.json"),
        )
    assert _files(out) == before and not _set_aside(out)
    # 1 -> 2 with an interrupted run's checkpoint in the partial folder: refused before torchrun starts, and the
    # way out under the workflow (which passes --resume when that folder holds a checkpoint) is named
    other = setup["root"] / "shape_1_to_2"
    assert main(_train_args(setup, "sorted", other, "--max-steps", "3", "--params-json", _cfg())) == 0
    shutil.copytree(other, partial_dir(other))
    kept = _files(partial_dir(other))
    capsys.readouterr()
    rc = main(_train_args(setup, "sorted", other, "--resume"))  # train.nproc 2: would start torchrun
    err = _err(capsys)
    assert rc == 2 and "was trained with train.nproc=1, train.nodes=1 but this run has train.nproc=2" in err, err
    assert f"remove {partial_dir(other)} (the interrupted run's folder; {other} is not touched)" in err
    assert "torch.distributed.run" not in err and _files(partial_dir(other)) == kept
    assert main(_train_args(setup, "sorted", other, "--resume", "--params-json", _cfg(useful_tokens=20000))) == 0
    assert json.loads((other / "summary.json").read_text())["resumed_from_step"] == 3  # the right shape resumes


def test_schedule_continues_into_the_next_epoch(setup):
    params = load_params("params.yaml", str(setup["params"]))
    lengths = setup["lengths"]
    total = int(lengths.sum())
    sched = build_schedule(
        lengths, strategy="random", params=params, edges=None, target_ranks=2, useful_tokens=total + 1
    )
    epochs = [s.epoch for s in sched]
    assert epochs[0] == 0 and epochs[-1] == 1
    first = [i for s in sched if s.epoch == 0 for i in s.indices.tolist()]
    assert sorted(first) == list(range(len(lengths)))  # epoch 0 trains every sample once, over both ranks
    assert [s.rank for s in sched[:4]] == [0, 1, 0, 1]


def test_bad_input_is_refused_with_the_fix(setup, capsys, monkeypatch):
    out = setup["root"] / "bad"
    assert main(_train_args(setup, "shuffled", out)) == 2
    assert "unknown strategy" in capsys.readouterr().err
    args = _train_args(setup, "bucketed", out)
    i = args.index("--boundaries")
    assert main(args[:i] + args[i + 2 :] + ["--params-json", '{"train": {"nproc": 1}}']) == 2
    assert "--boundaries" in capsys.readouterr().err
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert main(_train_args(setup, "sorted", out)) == 2
    assert "--nproc_per_node 2" in capsys.readouterr().err
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert (
        main(
            _train_args(
                setup, "sorted", setup["root"] / "nothing_here", "--resume", "--params-json", '{"train": {"nproc": 1}}'
            )
        )
        == 2
    )
    assert "no checkpoint" in capsys.readouterr().err


# --------------------------------------------------------------------------- issue 11: resume and run ownership

SINGLE = {"nproc": 1, "checkpoint_every": 2, "useful_tokens": 20000}


def _cfg(**train):
    return json.dumps({"train": {**SINGLE, **train}})


def _files(out, names=("checkpoint.pt", "steps.jsonl", "summary.json", "params.json")):
    return {n: (out / n).read_bytes() for n in names if (out / n).exists()}


def _err(capsys):
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    return err


def _warned(capsys, caplog):
    """What the run said (stderr and its log records), read once: a later call sees only what came after."""
    text = _err(capsys) + "\n" + caplog.text
    caplog.clear()
    return text


def test_resume_with_a_smaller_target_never_rewrites_the_checkpoint_as_an_earlier_step(setup, capsys, caplog):
    """Issue 11.1: it used to exit 0 and rewrite checkpoint.pt as an earlier step than its weights. Now the
    checkpoint past the planned steps is set aside and the smaller run trains afresh."""
    out = setup["root"] / "shrink"
    assert main(_train_args(setup, "sorted", out, "--params-json", _cfg())) == 0
    n = len(_steps(out))
    before = _files(out)
    # resuming a run that is already complete: exit 0 and nothing rewritten (its summary keeps its measurement)
    assert main(_train_args(setup, "sorted", out, "--resume", "--params-json", _cfg())) == 0
    assert _files(out) == before
    capsys.readouterr()
    caplog.clear()
    assert main(_train_args(setup, "sorted", out, "--resume", "--params-json", _cfg(), "--max-steps", str(n - 1))) == 0
    err = _warned(capsys, caplog)
    assert f"is at step {n} but this run plans only" in err and len(_set_aside(out)) == 1
    assert _set_aside(out)[0].read_bytes() == before["checkpoint.pt"]
    assert _complete_fresh_summary(out)["steps"] == n - 1


def test_a_resume_killed_before_its_summary_trains_afresh_instead_of_a_summary_without_throughput(
    setup, capsys, caplog
):
    """A kill between the final checkpoint and summary.json: --resume used to exit 0 with
    useful_tokens_per_s null and no reference step, which compare refuses."""
    out = setup["root"] / "no_summary"
    assert main(_train_args(setup, "random", out, "--max-steps", "4", "--params-json", _cfg())) == 0
    (out / "summary.json").unlink()
    capsys.readouterr()
    caplog.clear()
    assert main(_train_args(setup, "random", out, "--max-steps", "4", "--resume", "--params-json", _cfg())) == 0
    assert "summary.json is missing" in _warned(capsys, caplog) and len(_set_aside(out)) == 1
    assert _complete_fresh_summary(out)["steps"] == 4


def _start_and_kill(setup, strategy, out, cfg, *, rows, capsys):
    """Start a fresh run in a subprocess, act on it after it logged ``rows`` steps, then SIGKILL it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "lenbatch_study", *_train_args(setup, strategy, out, "--params-json", cfg)],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    log = partial_dir(out) / "steps.jsonl"  # a fresh run trains there until it is complete
    seen = {}
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            n = len(log.read_text().splitlines()) if log.exists() else 0
            if n >= rows:
                # a second writer of the same directory is refused while the first runs
                seen["second_rc"] = main(_train_args(setup, strategy, out, "--params-json", cfg))
                seen["second_err"] = _err(capsys)
                break
            time.sleep(0.01)
        proc.kill()
    finally:
        proc.wait()
    assert proc.returncode != 0 and seen, "the run must be killed mid-way"
    return seen


@pytest.mark.parametrize("older", ["stopped early", "finished"])
def test_a_killed_fresh_run_leaves_the_previous_complete_output_and_never_mixes_with_it(setup, capsys, older):
    """Issue 11.2 (older run stopped at step 12, a fresh run killed at ~4 resumed from 12: steps 4-11 missing),
    11.8 (older run finished: a resume 'finished' with 4 of N steps), 11.3 (two writers of one directory). A
    fresh run trains in .<OUT>.partial: killed, it leaves OUT byte for byte (it used to delete the previous
    output first), and a later --resume of OUT continues the older run with its own log."""
    out = setup["root"] / f"owned_{older.replace(' ', '_')}"
    extra = ["--max-steps", "12"] if older == "stopped early" else []
    assert main(_train_args(setup, "packed", out, "--params-json", _cfg(useful_tokens=30000), *extra)) == 0
    assert len(_steps(out)) >= 12 and (out / "summary.json").exists()
    before = _files(out)
    seen = _start_and_kill(setup, "packed", out, _cfg(useful_tokens=30000, checkpoint_every=0), rows=4, capsys=capsys)
    assert seen["second_rc"] == 2 and "is being written by another run (lenbatch train, pid" in seen["second_err"]
    assert _files(out) == before and (partial_dir(out) / "steps.jsonl").exists()
    rc = main(_train_args(setup, "packed", out, "--resume", "--params-json", _cfg(useful_tokens=30000)))
    assert rc == 0 and not partial_dir(out).exists()
    steps = _steps(out)
    assert [s["step"] for s in steps] == list(range(len(steps))) and len(steps) >= 12


def test_resume_sets_aside_a_checkpoint_that_does_not_belong_to_the_log(setup, capsys, caplog):
    """Issue 11.2: resume checks that the checkpoint belongs to the run whose log it continues; one that does
    not is set aside (never resumed under that log) and the run trains afresh."""
    a, b = setup["root"] / "belong_a", setup["root"] / "belong_b"
    for out in (a, b):
        assert main(_train_args(setup, "random", out, "--max-steps", "4", "--params-json", _cfg())) == 0
    (a / "checkpoint.pt").write_bytes((b / "checkpoint.pt").read_bytes())  # same params, another run
    capsys.readouterr()
    caplog.clear()
    assert main(_train_args(setup, "random", a, "--max-steps", "6", "--resume", "--params-json", _cfg())) == 0
    err = _warned(capsys, caplog)
    assert "steps.jsonl does not belong to the checkpoint beside it" in err and len(_set_aside(a)) == 1
    assert _complete_fresh_summary(a)["steps"] == 6


def test_a_corrupt_checkpoint_or_a_plan_mismatch_is_one_line_with_the_fix(setup, capsys, caplog):
    """Issue 11.7: these used to be tracebacks (UnpicklingError / AssertionError)."""
    import torch

    out = setup["root"] / "corrupt"
    assert main(_train_args(setup, "random", out, "--max-steps", "3", "--params-json", _cfg())) == 0
    good = (out / "checkpoint.pt").read_bytes()
    (out / "checkpoint.pt").write_bytes(good[: len(good) // 2])  # cut short
    capsys.readouterr()
    caplog.clear()
    # set aside, named, and trained afresh (a refusal here would fail every rerun of the workflow's job)
    assert main(_train_args(setup, "random", out, "--max-steps", "4", "--resume", "--params-json", _cfg())) == 0
    err = _warned(capsys, caplog)
    assert "checkpoint.pt cannot be read" in err and "training afresh" in err and len(_set_aside(out)) == 1
    out = setup["root"] / "corrupt_plan"
    assert main(_train_args(setup, "random", out, "--max-steps", "3", "--params-json", _cfg())) == 0
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    state["samplers"][0]["position"] += 1  # a sampler state that no longer matches the plan
    torch.save(state, out / "checkpoint.pt")
    capsys.readouterr()
    caplog.clear()
    assert main(_train_args(setup, "random", out, "--max-steps", "4", "--resume", "--params-json", _cfg())) == 0
    err = _warned(capsys, caplog)
    assert "sampler state (rank 0) does not give the planned batch of step 3" in err and len(_set_aside(out)) == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_killing_the_torchrun_launcher_stops_its_workers(setup):
    """Issue 11.9: SIGKILL of torchrun used to leave both workers training (and writing OUT)."""
    out = setup["root"] / "orphans"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "lenbatch_study",
        *_train_args(setup, "random", out, "--useful-tokens", "10000000"),
    ]
    launcher = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers = []
    try:
        deadline = time.monotonic() + 180
        log = partial_dir(out) / "steps.jsonl"  # a fresh run trains beside OUT until it is complete
        while time.monotonic() < deadline and launcher.poll() is None:
            if log.exists() and len(log.read_text().splitlines()) >= 2:
                break
            time.sleep(0.05)
        assert log.exists() and len(log.read_text().splitlines()) >= 2, "the run never logged two steps"
        workers = children(launcher.pid)
        assert len(workers) == 2, workers
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(running(w) for w in workers):
            time.sleep(0.1)
        assert not any(running(w) for w in workers), "workers kept training after their launcher was killed"
    finally:
        launcher.kill()
        for w in workers:
            if running(w):
                os.kill(w, 9)


def test_the_progress_line_says_pending_before_a_loss_and_marks_a_scaled_rate():
    from lenbatch_study.runtime.schedule import ScheduledStep
    from lenbatch_study.stages.train import progress_line

    step = ScheduledStep(step=2, epoch=0, rank=0, local=1, indices=np.arange(2), useful=128)
    # a pipelined run's target rank 0 before the drafter's first loss came back: no "nan" shown
    line = progress_line(step, 3, float("nan"), 256, 2.0, target_ranks=2)
    assert line == "step 3/3 (epoch 0): loss pending, 256 useful tokens on target rank 0 of 2, 2.0 s, ~256 useful tok/s"
    one = progress_line(step, 3, 12.44859, 384, 2.0)
    assert one == "step 3/3 (epoch 0): loss 12.4486, 384 useful tokens, 2.0 s, 192 useful tok/s"


def test_periodic_checkpoints_stay_off_the_measured_clock(setup, monkeypatch):
    """Checkpoints every 2 steps, inside the measured window, each made 3 s slower (the real checkpoint,
    then a sleep): each row after one records its seconds as checkpoint_s, its gap on the clock "t" is
    shorter than that (with the write on the clock it would be longer: the pause plus a step), and the
    summary counts them apart from the measured wall time."""
    from lenbatch_study.runtime import ranks

    slow_s = 3.0
    real = ranks.save_checkpoint

    def slow_checkpoint(*args, **kwargs):
        real(*args, **kwargs)
        time.sleep(slow_s)

    monkeypatch.setattr(ranks, "save_checkpoint", slow_checkpoint)  # the periodic ones: the rank loops'
    out = setup["root"] / "ck_clock"
    assert main(_train_args(setup, "packed", out, "--params-json", _cfg(useful_tokens=12000, warmup_steps=1))) == 0
    rows = _steps(out)
    summary = json.loads((out / "summary.json").read_text())
    after = [i for i in range(1, len(rows)) if rows[i - 1]["step"] % 2 == 1]  # a checkpoint after steps 1, 3, ...
    assert len(after) >= 2, len(rows)
    for i, r in enumerate(rows):
        if i in after:
            assert r["checkpoint_s"] >= slow_s
            assert r["t"] - rows[i - 1]["t"] < r["checkpoint_s"], (i, r["t"], rows[i - 1]["t"], r["checkpoint_s"])
        else:
            assert r["checkpoint_s"] == 0.0
    measured = rows[summary["warmup_steps_excluded"] :]
    assert summary["checkpoints_measured"] == sum(r["checkpoint_s"] > 0 for r in measured) >= 2
    assert summary["checkpoint_s_measured"] == pytest.approx(sum(r["checkpoint_s"] for r in measured))
    assert summary["measured_wall_s"] == pytest.approx(rows[-1]["t"] - rows[summary["warmup_steps_excluded"] - 1]["t"])
