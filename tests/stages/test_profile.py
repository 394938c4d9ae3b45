"""Profile stage: the grid respects the batch limits, and the real stage times real steps."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from lenbatch_study.core.config import load_params
from lenbatch_study.core import machine
from lenbatch_study.core.cpu import grid_cpu_share
from lenbatch_study.models.anchors import CE_CHUNK_ROWS
from lenbatch_study.pipeline.artifacts import profile_grid
from lenbatch_study.runtime import reference
from lenbatch_study.stages.profile import grid_points, time_point

REPO = Path(__file__).resolve().parents[2]


def _params(tmp_path: Path, **sections) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(sections))
    return path


def test_grid_points_stay_within_budget_batch_size_and_max_len(tmp_path):
    over = _params(
        tmp_path,
        data={"max_len": 1024},
        batching={"token_budget": 4096, "max_batch_size": 16},
        profile={
            "batch_sizes": [1, 4, 16, 64],
            "lengths": [128, 512, 2048],
            "packed_seqs": [1, 4, 16],
            "packed_lengths": [1024],
        },
    )
    params = load_params(REPO / "params.yaml", over)
    pts = grid_points(params)
    for layout, n, m in pts:
        if layout == "padded":
            assert n * m <= 4096 and n <= 16 and m <= 1024
        else:
            assert m <= 4096 and n * 1024 >= m  # the row fits the budget and n parts of <= max_len fill it
    padded = {(n, m) for k, n, m in pts if k == "padded"}
    assert (16, 256) not in padded and (8, 512) in padded  # the budget-filling batch at 512 is added
    assert ("packed", 4, 4096) in pts and ("packed", 1, 4096) not in pts  # budget row added; 1 x 4096 > max_len
    assert len(pts) == len(set(pts))


def test_time_point_repeats_and_caps_long_points(tmp_path):
    from lenbatch_study.stages.profile import make_batch
    from lenbatch_study.runtime.runner import StepRunner

    over = _params(
        tmp_path, data={"max_len": 64}, batching={"token_budget": 128, "max_batch_size": 2}, model={"vocab_size": 1024}
    )
    params = load_params(REPO / "params.yaml", over)
    runner = StepRunner(params, device="cpu")
    batch = make_batch("padded", [64, 64], params, seed=0)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    t, d, tc, dc = time_point(runner, batch, warmup=1, repeats=3, max_seconds=1e9)
    cpu_spent, wall_spent = time.process_time() - cpu0, time.perf_counter() - wall0
    assert runner.steps == 4 and len(t) == 3 and len(d) == 3 and len(tc) == 3 and len(dc) == 3  # warm-up not kept
    # The CPU seconds are this process's, taken around each step: every one is positive (the step computed),
    # and the kept ones add up to at most what the process spent during the whole call (warm-up included),
    # as the wall seconds add up to at most the call's wall time. How large a share of a core the process
    # got is the machine's load, not this code's: no bound on cpu / wall here (a loaded CI gave 21%).
    assert min(tc + dc) > 0 and min(t + d) > 0
    assert sum(tc) + sum(dc) <= cpu_spent + 1e-6, (sum(tc) + sum(dc), cpu_spent)
    assert sum(t) + sum(d) <= wall_spent, (sum(t) + sum(d), wall_spent)
    # ...and at most one CPU second per wall second for each OS thread of the process (OpenMP workers
    # spin-wait after a parallel region: not bounded by torch's intra-op threads)
    os_threads = len(os.listdir("/proc/self/task"))
    for wall, cpu in ((t, tc), (d, dc)):
        assert sum(cpu) <= os_threads * sum(wall) * 1.01 + 0.01, (sum(cpu), sum(wall), os_threads)
    t, d, tc, dc = time_point(runner, batch, warmup=1, repeats=3, max_seconds=1e-9)
    assert runner.steps == 5 and len(t) == 1 and len(d) == 1  # over the cap: one step is the timing


def test_a_grid_batch_draws_each_sequences_anchors_apart_as_a_real_batch_does():
    """A grid point's drafter work is the mean over its timed steps, set beside the median of their seconds;
    that pairing holds only if the work hardly moves from step to step. With one id for every sequence
    all anchors fell at one offset: 16 x 128 tokens trained 16 positions at one step and 240 at another."""
    from lenbatch_study.stages.profile import _drafter_work, make_batch

    params = load_params(REPO / "params.yaml")
    for layout, lengths in (("padded", [128] * 16), ("packed", [64] * 32)):
        batch = make_batch(layout, lengths, params, seed=0)
        assert len(set(batch.indices.tolist())) == len(lengths)
        pos = np.array([_drafter_work(batch, params, steps=[k])[0][0] for k in range(40)])
        assert pos.min() >= 0.6 * pos.max(), (layout, pos.min(), pos.max())


# One process here; the two-process lockstep profile (profile.concurrent, busy timings) is the workflow's
# own, checked in tests/pipeline/test_workflow_e2e.py (test_the_profile_timed_each_role_alone_and_busy...).
@pytest.mark.slow
def test_profile_stage_times_real_steps_on_a_tiny_grid(tmp_path):
    over = _params(
        tmp_path,
        data={"max_len": 128},
        batching={"token_budget": 256, "max_batch_size": 4},
        model={"vocab_size": 4096},
        profile={
            "batch_sizes": [1, 4],
            "lengths": [32, 128],
            "packed_seqs": [1, 4],
            "packed_lengths": [128],
            "repeats": 2,
            "warmup": 1,
            "max_point_seconds": 5.0,
            "concurrent": False,
        },
    )
    out = tmp_path / "profile"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lenbatch_study",
            "profile",
            "--params",
            str(REPO / "params.yaml"),
            str(over),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    grid = json.loads((out / "grid.json").read_text())
    rows = grid["points"]
    params = load_params(REPO / "params.yaml", over)
    # where it was timed, and the reference step (both roles, at the start and the end) compare calibrates by
    assert grid["machine"]["id"] == machine.fingerprint()["id"] and grid["machine"]["threads"] == 1
    ref = grid["reference"]
    assert ref["shape"] == reference.reference_shape(params) == {"layout": "padded", "sequences": 1, "length": 128}
    for role in ("target", "drafter"):
        assert len(ref[role]["start"]) == len(ref[role]["end"]) == reference.REPEATS
        assert min(ref[role]["start"] + ref[role]["end"]) > 0
    assert ref["seconds"] >= sum(sum(ref[r]["start"]) + sum(ref[r]["end"]) for r in ("target", "drafter"))
    assert [(r["layout"], r["sequences"], r["length"]) for r in rows] == grid_points(params)
    assert {r["layout"] for r in rows} == {"padded", "packed"}
    for r in rows:
        assert sum(r["sequence_lengths"]) == (
            r["computed_tokens"] if r["layout"] == "packed" else r["sequences"] * max(r["sequence_lengths"])
        )
        assert len(r["target_seconds_all"]) == 2 and len(r["drafter_seconds_all"]) == 2
        assert r["target_seconds_median"] == pytest.approx(float(np.median(r["target_seconds_all"])))
        assert all(x > 0 for x in r["target_seconds_all"] + r["drafter_seconds_all"])
        assert len(r["target_cpu_seconds_all"]) == 2 and len(r["drafter_cpu_seconds_all"]) == 2
        # timed busy (the other role stepping meanwhile) only in the two-process lockstep profile
        assert not any(f"{role}_busy_seconds_all" in r for role in ("target", "drafter"))
        # the drafter's exact work: at most anchors x (block - 1) trained positions per sequence
        assert 0 < r["positions"] <= r["sequences"] * params.drafter.anchors_per_seq * (params.drafter.block_size - 1)
        assert 0 < r["ctx_tokens"] <= r["sequences"] * max(r["sequence_lengths"])
        # the lm_head chunks: a mean over the timed steps of ceil(p / 128), so within [p / 128, p / 128 + 1)
        assert r["positions"] / CE_CHUNK_ROWS <= r["lm_chunks"] < r["positions"] / CE_CHUNK_ROWS + 1
    # more tokens cost more target time: the largest padded shape is slower than the smallest
    padded = sorted((r for r in rows if r["layout"] == "padded"), key=lambda r: r["computed_tokens"])
    assert padded[-1]["target_seconds_median"] > padded[0]["target_seconds_median"]
    share = grid_cpu_share(rows, threads=params.train.threads)
    # one intra-op thread per process; a little above 1 is other threads of the process (see above). No
    # lower bound on the share: a loaded machine lowers it (wall time grows, CPU time does not).
    assert 0 < share["target"] < 1.5 and 0 < share["drafter"] < 1.5
    # the CPU seconds are the stage process's own: all steps together took at most what the process used
    # in all (CPU time counts work, so unlike wall time this holds on any load) ...
    used = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    recorded = sum(x for r in rows for role in ("target", "drafter") for x in r[f"{role}_cpu_seconds_all"])
    assert 0 < recorded <= used, (recorded, used)
    # ... and they grow with the work: the largest padded shape (16x the tokens) costs more CPU than the smallest
    assert np.median(padded[-1]["target_cpu_seconds_all"]) > np.median(padded[0]["target_cpu_seconds_all"])
    resolved = json.loads((out / "params.json").read_text())
    assert resolved["profile"]["lengths"] == [32, 128] and resolved["model"]["vocab_size"] == 4096
    # compare's readers take the real output
    assert profile_grid.read_grid(out) == rows and profile_grid.read_profile_params(out) == resolved


@pytest.mark.slow
def test_ctrl_c_midway_is_one_line_and_keeps_the_previous_output(tmp_path):
    """A stage interrupted by Ctrl-C (SIGINT to its one process) exits 130 with one line naming the folder
    that keeps its previous output; nothing of the interrupted run is left beside it."""
    over = _params(tmp_path, train={"nproc": 1}, profile={"concurrent": False})
    out = tmp_path / "profile"
    out.mkdir()
    (out / "grid.json").write_text("previous\n")
    (out / "lenbatch-output.json").write_text('{"stage": "profile"}\n')  # a previous output of profile's
    # Ctrl-C as at a terminal's foreground job: SIGINT at its default. A shell without job control starts a
    # background job (`make test &`) with SIGINT ignored, the stage inherits that and rightly keeps running.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lenbatch_study",
            "profile",
            "--params",
            str(REPO / "params.yaml"),
            str(over),
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines = []
    for line in proc.stdout:  # the default grid skips shapes over the budget and says so; then it builds and times
        lines.append(line)
        if "profile grid:" in line:
            break
    proc.send_signal(signal.SIGINT)
    log = "".join(lines) + proc.communicate(timeout=300)[0]
    assert proc.returncode == 130, log[-3000:]
    assert f"lenbatch profile: interrupted; {out} keeps its previous output" in log and "Traceback" not in log
    assert (out / "grid.json").read_text() == "previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profile", "small.yaml"]


def test_profile_skips_repeating_points_that_took_long_enough(tmp_path):
    """max_point_seconds: a point whose warm-up already took that long is timed exactly once."""
    from lenbatch_study.stages.profile import profile

    over = _params(
        tmp_path,
        data={"max_len": 64},
        batching={"token_budget": 128, "max_batch_size": 2},
        model={"vocab_size": 1024},
        train={"nproc": 1},
        profile={
            "batch_sizes": [1, 2],
            "lengths": [64],
            "packed_seqs": [2],
            "packed_lengths": [128],
            "repeats": 3,
            "warmup": 1,
            "max_point_seconds": 1e-6,
        },
    )
    rows = profile(load_params(REPO / "params.yaml", over), device="cpu")["points"]
    assert rows and all(len(r["target_seconds_all"]) == 1 and len(r["drafter_seconds_all"]) == 1 for r in rows)
    assert all("target_busy_seconds_all" not in r for r in rows)  # one process: alone only


@pytest.mark.slow
def test_lockstep_profile_measures_the_features_transport(tmp_path):
    """The two-process profile of a pipelined run (train.nproc 2, profile.concurrent) moves every grid point's
    batch and features from the target role to the drafter role through the training's own links, and
    records per row the bytes on the data group (what shapes.transport_bytes predicts for that shape), every
    timed receive and staging, and the backend; compare's reader and fit take them."""
    from lenbatch_study.analysis import shapes, transport_model
    from lenbatch_study.stages.profile import profile

    over = _params(
        tmp_path,
        data={"max_len": 64},
        batching={"token_budget": 128, "max_batch_size": 2},
        model={"vocab_size": 1024},
        train={"nproc": 2},
        profile={
            "batch_sizes": [1, 2],
            "lengths": [64],
            "packed_seqs": [2],
            "packed_lengths": [128],
            "repeats": 2,
            "warmup": 1,
            "max_point_seconds": 5.0,
            "concurrent": True,
        },
    )
    params = load_params(REPO / "params.yaml", over)
    grid = profile(params, device="cpu")
    rows = grid["points"]
    assert rows and all("target_busy_seconds_all" in r for r in rows)  # the lockstep profile
    m = params.model
    for r in rows:
        assert r["transport_backend"] == "gloo"
        assert len(r["transport_seconds_all"]) == len(r["transport_stage_s_all"]) == 2
        assert all(x > 0 for x in r["transport_seconds_all"]) and all(x >= 0 for x in r["transport_stage_s_all"])
        want = shapes.transport_bytes(
            np.array([r["computed_tokens"]]),
            np.array([r["sequences"]]),
            feature_dim=len(m.target_layers) * m.hidden_size,
            itemsize=shapes.ITEMSIZE[m.dtype],
        )
        assert r["transport_bytes"] == int(want[0])
    # written and read back as compare reads it; the fit gives a positive cost per step
    out = tmp_path / "profile"
    out.mkdir()
    (out / profile_grid.GRID).write_text(json.dumps(grid))
    measured = profile_grid.read_grid_document(out)["transport"]
    assert measured["backend"] == "gloo" and measured["bytes"] == [r["transport_bytes"] for r in rows]
    fits = transport_model.fit_transport(measured)
    assert fits["receive"].points == len(rows)
    assert np.all(fits["receive"].predict(measured["bytes"]) > 0)
    # a grid without them (one process, or older) reads as no transport: compare predicts without it
    for r in rows:
        for k in profile_grid.TRANSPORT_KEYS:
            r.pop(k)
    (out / profile_grid.GRID).write_text(json.dumps(grid))
    assert profile_grid.read_grid_document(out)["transport"] is None
