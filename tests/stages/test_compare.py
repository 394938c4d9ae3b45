"""Compare stage end to end on small real inputs.

stats, boundaries and plans are the real stages run on a small length sample; the
profile grid and the training runs are built here from a known step-time law, so the
stage's prediction can be checked exactly against the "measured" runs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from lenbatch.batching.strategy import layout_of
from lenbatch_study.analysis import shapes as shp
from lenbatch_study.analysis import stepmodel as sm
from lenbatch_study.cli import main
from lenbatch_study.analysis.step_prediction import ACK_EVERY
from lenbatch_study.stages.compare import compare
from lenbatch_study.core.config import load_params
from lenbatch_study.analysis.report import (
    MAX_METRIC_NUMBERS,
    REPLAY_PART,
    REPORT_MAX_BYTES,
    busy_machine,
    unsteady_machine,
    write_outputs,
)
from lenbatch_study.core import machine

REPO = Path(__file__).resolve().parents[2]
STRATEGIES = ("sorted", "random", "bucketed", "sortish", "packed")
MACHINE = machine.fingerprint(threads=1)  # this machine: the fixture's profile and runs were "measured" here


def _reference(target: float, drafter: float, *, drift: float = 0.0) -> dict:
    """A reference-step record (lenbatch_study.runtime.reference) whose start/end medians average to these seconds;
    ``drift``: end / start - 1."""

    def pts(x: float) -> dict:
        s, e = 2 * x / (2 + drift), 2 * x * (1 + drift) / (2 + drift)
        return {
            "start": [s * 0.99, s, s * 1.02],
            "end": [e * 1.01, e, e * 0.98],
            "start_cpu": [s] * 3,
            "end_cpu": [e] * 3,
        }

    return {
        "shape": {"layout": "padded", "sequences": 8, "length": 512},
        "warmup": 1,
        "repeats": 3,
        "seconds": 2.0,
        "target": pts(target),
        "drafter": pts(drafter),
    }


PROFILE_REFERENCE = _reference(0.2, 0.25)


def _grid_file(rows: list[dict], *, machine_fp: dict | None = MACHINE, reference: dict = PROFILE_REFERENCE) -> dict:
    """grid.json as the profile stage writes it: the machine, the reference step and the points."""
    return {"machine": machine_fp, "reference": reference, "points": rows}


# a known law for the synthetic timings (seconds): per step, per token, per length^2, per sequence
TARGET = {"const": 0.004, "computed_tokens": 2e-6, "sum_len_sq": 2e-10, "sequences": 2e-4}
DRAFTER = {"const": 0.006, "ctx_tokens": 1e-6, "positions": 1.5e-5}


def _cli(*args: str, cwd: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "lenbatch_study", *args], cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _law(cols: dict, law: dict) -> np.ndarray:
    return sm.design_matrix(cols, tuple(law)) @ np.array(list(law.values()))


def _grid(params, *, busy: float | None = None, cpu_share: float | None = None) -> list[dict]:
    """Grid rows timed by the law; ``busy``: also busy timings (the law x busy); ``cpu_share``:
    CPU seconds = that share of the wall seconds."""
    rows = []
    budget = params.batching.token_budget
    shapes = [("padded", n, m) for n in (1, 2, 4, 8, 16) for m in (16, 64, 128, 256, 512, 1024) if n * m <= budget]
    shapes += [("packed", k, L) for k in (2, 4, 16) for L in (256, 1024, budget)]
    from lenbatch_study.runtime.synthetic import synthetic_sequences

    dr = params.drafter
    for i, (layout, n, m) in enumerate(shapes):
        ls = np.asarray(shp.grid_shape(layout, n, m, max_len=params.data.max_len))
        masks = [x["loss_mask"] for x in synthetic_sequences(ls, vocab_size=1000, seed=i)]
        work = shp.drafter_work(
            ls, masks, [-1] * n, anchors_per_seq=dr.anchors_per_seq, block_size=dr.block_size, seed=0, epoch=0, step=i
        )
        cols = shp.batch_columns(
            ls, [np.arange(ls.size)], layout=layout, drafter=(np.array([work[0]], float), np.array([work[1]], float))
        )
        t, d = float(_law(cols, TARGET)[0]), float(_law(cols, DRAFTER)[0])
        rows.append(
            {
                "layout": layout,
                "sequences": n,
                "length": m,
                "sequence_lengths": ls.tolist(),
                "computed_tokens": float(cols["computed_tokens"][0]),
                "sum_len_sq": float(cols["sum_len_sq"][0]),
                "ctx_tokens": float(cols["ctx_tokens"][0]),
                "positions": float(cols["positions"][0]),
                "target_seconds_median": t,
                "target_seconds_all": [t],
                "drafter_seconds_median": d,
                "drafter_seconds_all": [d],
                "seconds_median": t + d,
                "seconds_all": [t + d],
            }
        )
        if busy is not None:
            rows[-1].update(
                {
                    "target_busy_seconds_median": busy * t,
                    "target_busy_seconds_all": [busy * t],
                    "drafter_busy_seconds_median": busy * d,
                    "drafter_busy_seconds_all": [busy * d],
                }
            )
        if cpu_share is not None:
            rows[-1].update({"target_cpu_seconds_all": [cpu_share * t], "drafter_cpu_seconds_all": [cpu_share * d]})
    return rows


def _fake_run(
    lengths,
    params,
    strategy,
    edges,
    out: Path,
    data: Path,
    *,
    busy: float | None = None,
    slower: tuple[float, float] = (1.0, 1.0),
    drift: float = 0.0,
    machine_fp: dict | None = MACHINE,
) -> None:
    """A training run's outputs for the planned batches, timed by the known law through the pipeline
    (``busy``: a step costs the law x busy while the other role works, blended by the overlap;
    ``slower``: the machine's (target, drafter) speed against the profile's: every step and the run's
    reference step take that much longer; ``drift``: the reference's end / start - 1)."""
    from lenbatch_study.stages.compare import LossMasks, planned_batches, step_columns

    steps = planned_batches(lengths, params, strategy, edges, useful_tokens=params.train.useful_tokens, target_ranks=1)
    cols = step_columns(lengths, steps, layout=layout_of(strategy), params=params, masks=LossMasks(data))
    t_s, d_s = slower[0] * _law(cols, TARGET), slower[1] * _law(cols, DRAFTER)
    if busy is None:
        ends = sm.pipeline_ends(t_s, d_s, queue_size=params.train.queue_size, ack_every=ACK_EVERY)
    else:
        tl = sm.blended_pipeline(
            t_s, busy * t_s, d_s, busy * d_s, queue_size=params.train.queue_size, ack_every=ACK_EVERY
        )
        ends, t_s, d_s = tl["end"], tl["target_s"], tl["drafter_s"]
    tput = sm.throughput(cols["useful_tokens"], ends, warmup_steps=params.train.warmup_steps)
    out.mkdir(parents=True)
    with (out / "steps.jsonl").open("w") as fh:
        for i, (epoch, b) in enumerate(steps):
            fh.write(
                json.dumps(
                    {
                        "rank": 1,
                        "step": i,
                        "epoch": epoch,
                        "sequences": int(b.size),
                        "target_s": float(t_s[i]),
                        "drafter_s": float(d_s[i]),
                        "target_cpu_s": float(t_s[i]),
                        "drafter_cpu_s": float(d_s[i]),
                        "useful_tokens": int(cols["useful_tokens"][i]),
                        "computed_tokens": int(cols["computed_tokens"][i]),
                        "loss": 5.0 - 1e-5 * i,
                    }
                )
                + "\n"
            )
    summary = {
        "useful_tokens_per_s": tput,
        "steps": len(steps),
        "planned_steps": len(steps),
        "padding_efficiency": float(cols["useful_tokens"].sum() / cols["computed_tokens"].sum()),
        "loss_curve": [[i, 5.0 - 1e-5 * i] for i in range(len(steps))],
        "final_loss": 5.0,
        "params": params.to_dict(),
        "machine": machine_fp,
        "reference": _reference(0.2 * slower[0], 0.25 * slower[1], drift=drift),
    }
    (out / "summary.json").write_text(json.dumps(summary))


@pytest.fixture(scope="module")
def stage_inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmp")
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(5.3, 0.8, size=600), 16, 1024).astype(np.int32)
    data = root / "data"
    data.mkdir()
    np.save(data / "lengths.npy", lengths)
    # a real Arrow dataset with chat-like loss masks: the drafter's anchors depend on them
    import datasets

    from lenbatch_study.runtime.synthetic import synthetic_sequences

    seqs = synthetic_sequences(lengths, vocab_size=1000, seed=0)
    datasets.Dataset.from_dict(
        {
            "input_ids": [s["input_ids"].tolist() for s in seqs],
            "loss_mask": [s["loss_mask"].tolist() for s in seqs],
            "length": lengths.tolist(),
        }
    ).save_to_disk(str(data / "dataset"))
    override = {
        "data": {"max_len": 1024},
        "batching": {"token_budget": 2048, "max_batch_size": 16},
        "boundaries": {"sweep_max_buckets": 6, "num_candidates": 40},
        "train": {"useful_tokens": 60_000, "warmup_steps": 2},
    }
    (root / "small.yaml").write_text(yaml.safe_dump(override))
    params_args = ["--params", str(REPO / "params.yaml"), str(root / "small.yaml")]
    params = load_params(REPO / "params.yaml", root / "small.yaml")
    L = str(data / "lengths.npy")
    _cli("stats", *params_args, "--lengths", L, "--out", str(root / "stats"), cwd=root)
    _cli("boundaries", *params_args, "--lengths", L, "--out", str(root / "boundaries"), cwd=root)
    _cli(
        "plans",
        *params_args,
        "--lengths",
        L,
        "--boundaries",
        str(root / "boundaries" / "boundaries.json"),
        "--out",
        str(root / "plans"),
        cwd=root,
    )
    (root / "profile").mkdir()
    (root / "profile" / "grid.json").write_text(json.dumps(_grid_file(_grid(params))))
    edges = json.loads((root / "boundaries" / "boundaries.json").read_text())["edges"]
    for s in STRATEGIES:
        _fake_run(lengths.astype(np.int64), params, s, tuple(edges), root / "train" / s, data)
    return root, params


def _run(root: Path, params, train: str = "train"):
    return compare(
        params=params,
        stats_dir=root / "stats",
        boundaries_dir=root / "boundaries",
        plans_dir=root / "plans",
        profile_dir=root / "profile",
        train_dir=root / train,
        data_dir=root / "data",
    )


def test_compare_predicts_runs_timed_by_the_grid_law_and_writes_everything(stage_inputs):
    root, params = stage_inputs
    result = _run(root, params)
    for s in STRATEGIES:
        # the grid follows the same law as the runs, so the prediction must match the measurement
        assert abs(result.rows[s].prediction_error) < 0.01, (s, result.rows[s].prediction_error)
        # the steps were timed by the law, so each role's step ratio is 1 and the replay is exact
        assert result.rows[s].target_step_ratio == pytest.approx(1.0, abs=0.01)
        assert result.rows[s].drafter_step_ratio == pytest.approx(1.0, abs=0.01)
        assert abs(result.rows[s].pipeline_error) < 1e-9
    assert result.fits["target"]["best"].holdout_error < 0.01
    out = root / "compare"
    metrics = write_outputs(result, out, params=params)
    on_disk = json.loads((out / "metrics.json").read_text())
    assert json.loads((out / "diagnostics.json").read_text()) == json.loads(json.dumps(metrics))
    # metrics.json (DVC's metrics, `dvc exp show`'s columns) holds the headline only: per strategy measured
    # tok/s, padding efficiency (+ held-out loss with the quality stage), but sorted (1 by definition) the
    # measured and predicted ratio to sorted, and the verdict; at most 40 numbers with the interleaved
    # ratios (test_interleaved_ratios_... counts them). The rest are diagnostics. Without ratios measured in
    # turns the answer is not settled, so nothing is recommended.
    per_strategy = 2 + (1 if result.quality else 0)
    assert len(on_disk) == per_strategy * len(STRATEGIES) + 2 * (len(STRATEGIES) - 1) + 1
    numbers = [v for v in on_disk.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    assert len(numbers) == len(on_disk) - 1 <= MAX_METRIC_NUMBERS  # all but the verdict
    assert on_disk["verdict"] == "not settled" and not any(k.startswith("recommended.") for k in on_disk)
    assert on_disk == {k: v for k, v in json.loads(json.dumps(metrics)).items() if k in on_disk}
    assert not any(
        "cpu_share" in k
        or k.startswith(("fit.", "machine.", "bucketed_k"))
        or "calibrated" in k
        or k.endswith((".lo", ".hi", ".length_mixing", ".predicted_tok_s"))
        for k in on_disk
    )
    diagnostics = json.loads((out / "diagnostics.json").read_text())
    assert diagnostics["machine.id"] == MACHINE["id"]
    report = (out / "report.md").read_text()
    for s in STRATEGIES:
        ratios = ("ratio_to_sorted_measured", "ratio_to_sorted_predicted")
        for key in ("measured_efficiency", "measured_tok_s", *(ratios if s != "sorted" else ())):
            assert on_disk[f"{s}.{key}"] is not None, f"{s}.{key}"
        for key in (
            "predicted_tok_s",
            "prediction_error",
            "composition_repeat",
            "length_mixing",
            *(ratios if s == "sorted" else ()),
        ):
            assert diagnostics[f"{s}.{key}"] is not None and f"{s}.{key}" not in on_disk, f"{s}.{key}"
            assert diagnostics[f"{s}.{key}"] is not None, f"{s}.{key}"
        assert f"| {s} |" in report
    assert diagnostics["sorted.ratio_to_sorted_measured"] == pytest.approx(1.0)
    answer = report.split("## Answer", 1)[1].split("\n## ", 1)[0].strip()
    assert answer.startswith("**Not settled: no ratios were measured in turns**") and "**Use" not in answer
    # the rerun names the config that put this run's results outside results/ (else it would rerun the default)
    assert (
        f"snakemake --cores all --configfile <your config, results_dir: {root.as_posix()}> --forcerun interleave"
        in answer
        and len(report.encode()) <= REPORT_MAX_BYTES
    )
    assert "K = 6" in (out / "details.md").read_text()
    for name in ("histogram.png", "throughput.png", "frontier.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name
    frontier = json.loads((out / "frontier.json").read_text())
    assert {p["name"] for p in frontier} >= set(STRATEGIES)
    assert sum(p["kind"] == "sweep" for p in frontier) == 6
    assert any(p["pareto_mixing"] for p in frontier)
    # the padding-only ladder level is exactly the ratio of padding efficiencies
    lad = result.ladder["random"]
    rows = result.rows
    assert lad["padding"] < lad["measured"] or lad["padding"] > lad["measured"]  # a real gap exists
    assert lad["pipelined"] == pytest.approx(rows["random"].ratio_to_sorted_predicted)


def test_missing_training_result_names_the_rerun(stage_inputs, tmp_path):
    root, params = stage_inputs
    import shutil

    shutil.copytree(root / "train", tmp_path / "train")
    (tmp_path / "train" / "packed" / "summary.json").unlink()
    for name in ("stats", "boundaries", "plans", "profile"):
        (tmp_path / name).symlink_to(root / name)
    (tmp_path / "data").symlink_to(root / "data")
    with pytest.raises(ValueError, match=r"rerun: snakemake results/train/packed/summary.json"):
        _run(tmp_path, params)


def test_run_measured_with_other_params_is_refused(stage_inputs):
    root, params = stage_inputs
    import dataclasses

    other = dataclasses.replace(params, drafter=dataclasses.replace(params.drafter, lr=1e-3))
    with pytest.raises(ValueError, match=r"drafter.lr.*rerun: snakemake results/train/sorted/summary.json"):
        _run(root, other)


def test_grid_too_small_to_fit_names_the_rerun(stage_inputs, tmp_path):
    root, params = stage_inputs
    for name in ("stats", "boundaries", "plans", "train"):
        (tmp_path / name).symlink_to(root / name)
    (tmp_path / "data").symlink_to(root / "data")
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "grid.json").write_text(json.dumps(_grid_file(_grid(params)[:4])))
    with pytest.raises(ValueError, match=r"rerun: snakemake results/profile/grid.json"):
        _run(tmp_path, params)


def _variant(root: Path, tmp_path: Path, grid: list[dict]) -> Path:
    """The stage inputs with another profile grid (the rest linked)."""
    for name in ("stats", "boundaries", "plans", "data"):
        (tmp_path / name).symlink_to(root / name)
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "grid.json").write_text(json.dumps(grid if isinstance(grid, dict) else _grid_file(grid)))
    return tmp_path


def test_compare_blends_alone_and_busy_step_times_by_the_runs_overlap(stage_inputs, tmp_path):
    """Steps cost 1.6x while the other role works: the runs, timed that way through the pipeline,
    are predicted from a grid timed alone and busy; neither time alone would predict them."""
    root, params = stage_inputs
    busy = 1.6
    _variant(root, tmp_path, _grid(params, busy=busy))
    lengths = np.load(root / "data" / "lengths.npy").astype(np.int64)
    edges = tuple(json.loads((root / "boundaries" / "boundaries.json").read_text())["edges"])
    for s in STRATEGIES:
        _fake_run(lengths, params, s, edges, tmp_path / "train" / s, root / "data", busy=busy)
    import dataclasses

    def with_mode(mode: str):
        return dataclasses.replace(params, compare=dataclasses.replace(params.compare, contention=mode))

    result = _run(tmp_path, with_mode("blend"))
    assert {"target_busy", "drafter_busy"} <= set(result.fits)
    for s in STRATEGIES:
        r = result.rows[s]
        assert abs(r.prediction_error) < 0.01, (s, r.prediction_error)
        assert r.target_step_ratio == pytest.approx(1.0, abs=0.01)
    # the same runs predicted from busy times only (every step slowed: too slow) or alone times only
    # (no step slowed: too fast); the roles overlap most of the time here, so busy is the nearer
    busy_only, alone_only = _run(tmp_path, with_mode("busy")), _run(tmp_path, with_mode("alone"))
    for s in STRATEGIES:
        busy_err, alone_err = busy_only.rows[s].prediction_error, alone_only.rows[s].prediction_error
        assert busy_err < -0.005 and alone_err > 0.1 and alone_err > -busy_err, (s, busy_err, alone_err)
    # a grid without busy timings (one-process profile) is predicted from its alone times, whatever the mode
    (tmp_path / "profile" / "grid.json").write_text(json.dumps(_grid_file(_grid(params))))
    plain = _run(tmp_path, with_mode("busy"))
    assert "target_busy" not in plain.fits
    assert [plain.rows[s].predicted_tok_s for s in STRATEGIES] == pytest.approx(
        [alone_only.rows[s].predicted_tok_s for s in STRATEGIES], rel=1e-9
    )


def test_report_tells_a_busy_machine_from_model_error(stage_inputs, tmp_path):
    root, params = stage_inputs
    (tmp_path / "busy").mkdir()
    _variant(root, tmp_path / "busy", _grid(params, cpu_share=0.5))
    (tmp_path / "busy" / "train").symlink_to(root / "train")
    result = _run(tmp_path / "busy", params)
    assert result.profile_cpu_share["target"] == pytest.approx(0.5)
    low = busy_machine(result)
    assert low[:2] == ["profile target 50.0%", "profile drafter 50.0%"]
    # and every run, which got all of its cores, ran under another load than the profile
    assert len(low) == 2 + 2 * len(STRATEGIES) and "sorted run target 100.0% (profile 50.0%)" in low
    # with two threads per process a half share may be the step's own parallelism: only the mismatch counts
    assert busy_machine(dataclasses.replace(result, threads=2)) == low[2:]
    metrics = write_outputs(result, tmp_path / "busy" / "compare", params=params)
    assert metrics["profile.target_cpu_share"] == pytest.approx(0.5)
    assert metrics["sorted.target_cpu_share"] == pytest.approx(1.0)  # the runs got their cores
    busy_details = (tmp_path / "busy" / "compare" / "details.md").read_text()
    assert "**The machine was busy**" in busy_details
    # reported, never a veto: the answer is decided on the ratios measured in turns, which share the load alike
    answer = (tmp_path / "busy" / "compare" / "report.md").read_text().split("## Answer", 1)[1].split("\n## ", 1)[0]
    assert "machine was busy" not in answer and "Not settled: the machine" not in answer
    (tmp_path / "quiet").mkdir()
    _variant(root, tmp_path / "quiet", _grid(params, cpu_share=1.0))
    (tmp_path / "quiet" / "train").symlink_to(root / "train")
    quiet = _run(tmp_path / "quiet", params)
    assert busy_machine(quiet) == []
    write_outputs(quiet, tmp_path / "quiet" / "compare", params=params)
    assert "The machine was quiet" in (tmp_path / "quiet" / "compare" / "details.md").read_text()
    # full CPU shares, but a run's reference step 30% slower at its end than at its start: not quiet
    assert unsteady_machine(quiet) == []
    rows = dict(quiet.rows)
    rows["bucketed"] = dataclasses.replace(rows["bucketed"], target_reference_drift=0.30)
    moved = dataclasses.replace(quiet, rows=rows, profile_reference_drift={"target": -0.15, "drafter": 0.02})
    assert unsteady_machine(moved) == ["profile target -15.0%", "bucketed run target +30.0%"]
    write_outputs(moved, tmp_path / "quiet" / "moved", params=params)
    text = (tmp_path / "quiet" / "moved" / "details.md").read_text()
    assert "speed changed during the measurements" in text and "bucketed run target +30.0%" in text
    assert "The machine was quiet" not in text and "| bucketed |" in text and "+30.0%, " in text
    assert "unsteady" not in (tmp_path / "quiet" / "moved" / "report.md").read_text()


def _runs_variant(root: Path, tmp_path: Path, params, **run_kwargs) -> Path:
    """The stage inputs (profile included) with runs made by ``_fake_run(**run_kwargs)``."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name in ("stats", "boundaries", "plans", "data", "profile"):
        (tmp_path / name).symlink_to(root / name)
    lengths = np.load(root / "data" / "lengths.npy").astype(np.int64)
    edges = tuple(json.loads((root / "boundaries" / "boundaries.json").read_text())["edges"])
    for s in STRATEGIES:
        _fake_run(lengths, params, s, edges, tmp_path / "train" / s, root / "data", **run_kwargs)
    return tmp_path


def test_the_start_end_calibration_is_retired_from_report_and_metrics(stage_inputs, tmp_path):
    """Runs on a machine 8% slower for the target and 3% for the drafter than while profiling, their reference
    step 4% slower at the end than at the start: the raw prediction is too fast by about that much, the run's
    reference drift is reported (details.md), and no calibrated prediction reaches the report or the metrics (a
    drift within minutes is not linear in time; the ratios measured in turns replaced it)."""
    root, params = stage_inputs
    _runs_variant(root, tmp_path, params, slower=(1.08, 1.03), drift=0.04)
    result = _run(tmp_path, params)
    for s in STRATEGIES:
        r = result.rows[s]
        assert r.target_reference_drift == pytest.approx(0.04, rel=1e-6)
        assert r.target_step_ratio == pytest.approx(1.08, abs=0.01)  # the steps were slower by as much
        assert r.prediction_error > 0.025, (s, r.prediction_error)  # raw: predicts the profile's speed
    out = tmp_path / "compare"
    metrics = write_outputs(result, out, params=params)
    assert not any("calibrated" in k or "reference_ratio" in k for k in metrics)
    assert metrics["sorted.target_reference_drift"] == pytest.approx(0.04, rel=1e-4)
    report, details = (out / "report.md").read_text(), (out / "details.md").read_text()
    assert not any(w in report + details for w in ("calibrated", "Drift calibration")) and "+4.0%, +4.0%" in details
    assert f"measured on one machine: {machine.describe(MACHINE)}" in details


def test_a_run_from_another_machine_is_refused_naming_what_to_rerun(stage_inputs, tmp_path):
    root, params = stage_inputs
    other = json.loads(json.dumps(MACHINE))
    other["versions"]["torch"] = "2.11.0"  # only a library version differs: another machine all the same
    other["id"] = machine.machine_id(other)
    assert other["id"] != MACHINE["id"]
    _runs_variant(root, tmp_path, params)
    summary = json.loads((tmp_path / "train" / "random" / "summary.json").read_text())
    (tmp_path / "train" / "random" / "summary.json").write_text(json.dumps({**summary, "machine": other}))
    with pytest.raises(ValueError) as err:
        _run(tmp_path, params)
    msg = str(err.value)
    assert (
        f"the run of random on machine {other['id']} (versions.torch: '{MACHINE['versions']['torch']}' -> "
        "'2.11.0')" in msg
    )
    # this machine measured the profile and the other runs: rerun only random, here
    assert f"this machine is {MACHINE['id']}" in msg
    assert msg.endswith(
        "snakemake --cores all --forcerun results/train/random/summary.json (DVC: dvc repro "
        "--force --single-item train@random, then dvc repro)"
    )


def test_a_profile_from_another_machine_or_results_without_a_fingerprint_are_refused(stage_inputs, tmp_path):
    root, params = stage_inputs
    rows = _grid(params)
    other = {**MACHINE, "cpu": {**MACHINE["cpu"], "model": "another CPU"}}
    other["id"] = machine.machine_id(other)
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
    _variant(root, tmp_path / "a", _grid_file(rows, machine_fp=other))
    (tmp_path / "a" / "train").symlink_to(root / "train")
    with pytest.raises(
        ValueError,
        match=r"profile grid on machine .*cpu.model: 'another CPU' -> .*rerun here "
        r"what was measured elsewhere: snakemake --cores all --forcerun profile",
    ):
        _run(tmp_path / "a", params)
    # a grid.json of an older lenbatch (a bare list: no machine, no reference) is refused, not guessed
    _variant(root, tmp_path / "b", {"points": rows})
    (tmp_path / "b" / "profile" / "grid.json").write_text(json.dumps(rows))
    (tmp_path / "b" / "train").symlink_to(root / "train")
    with pytest.raises(ValueError, match=r"the profile grid record no machine fingerprint.*forcerun profile"):
        _run(tmp_path / "b", params)
    # runs of an older lenbatch: no fingerprint
    _runs_variant(root, tmp_path / "c", params, machine_fp=None)
    with pytest.raises(
        ValueError,
        match=r"the runs of sorted, random, bucketed, sortish, packed record no machine "
        r"fingerprint.*dvc repro --force --single-item train@sorted train@random",
    ):
        _run(tmp_path / "c", params)


def test_a_run_without_a_reference_step_is_refused(stage_inputs, tmp_path):
    root, params = stage_inputs
    _runs_variant(root, tmp_path, params)
    path = tmp_path / "train" / "packed" / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "reference": None}))
    with pytest.raises(
        ValueError,
        match=r"the run of packed records no reference step.*forcerun "
        r"results/train/packed/summary.json",
    ):
        _run(tmp_path, params)


def test_the_report_carries_the_study_replay(stage_inputs, tmp_path):
    """The section is rendered from the replay's numbers (a 20,000-length seed profile here: ~1 s)."""
    from lenbatch_study.analysis import study_replay as sr

    root, params = stage_inputs
    result = dataclasses.replace(_run(root, params), study_replay=sr.replay(samples=20_000))
    write_outputs(result, tmp_path, params=params)
    report = (tmp_path / "details.md").read_text()
    rows = {r["name"]: r for r in result.study_replay["rows"]}
    assert "## The study's own table, replayed" in report
    b = rows["bucketed (study edges)"]
    assert f"| bucketed (study edges) | {b['steps_per_rank']:,} | {100 * b['padding_efficiency']:.1f}% |" in report
    # the study's setting is its own part, after everything about this run's data; the answer never cites it
    part = report.index(f"# {REPLAY_PART}")
    assert report.index("## The trainings") < report.index("## Plots") < part < report.index("## The study's own table")
    yours = report[:part]
    assert not any(phrase in yours for phrase in ("The study predicted", "902,087", "study edges", "seed profile"))
    # the answer's page never cites the study; its K on this data is labelled as the replayed study's, not a choice
    answer_page = (tmp_path / "report.md").read_text()
    assert not any(p in answer_page for p in ("902,087", "study edges", "The study's choice"))
    assert "K = 6 (the K of the study this project replays, not a choice for your data)" in yours


def test_a_training_s_missed_prediction_is_reported_not_a_veto(stage_inputs, tmp_path):
    """Two trainings' predictions missed by 39% and 59% (a drifting machine between runs): details.md shows the
    errors; the answer, decided on the ratios measured in turns, does not change."""
    root, params = stage_inputs
    _interleave_file(root, params, tmp_path / "interleave", drift=[1.0, 0.7, 1.4, 1.1])
    result = compare(
        params=params,
        stats_dir=root / "stats",
        boundaries_dir=root / "boundaries",
        plans_dir=root / "plans",
        profile_dir=root / "profile",
        train_dir=root / "train",
        data_dir=root / "data",
        interleave_dir=tmp_path / "interleave",
    )
    rows = dict(result.rows)
    for s, err in (("packed", -0.59), ("random", 0.39)):
        rows[s] = dataclasses.replace(rows[s], prediction_error=err)
    write_outputs(dataclasses.replace(result, rows=rows), tmp_path / "out", params=params)
    write_outputs(result, tmp_path / "plain", params=params)
    answer = (tmp_path / "out" / "report.md").read_text().split("## Answer")[1].split("\n## ")[0].strip()
    assert answer == (tmp_path / "plain" / "report.md").read_text().split("## Answer")[1].split("\n## ")[0].strip()
    assert answer.startswith("**Use `")
    assert "| packed |" in (details := (tmp_path / "out" / "details.md").read_text()) and "-59.0%" in details


def test_an_impossible_padding_efficiency_is_refused_naming_the_file(stage_inputs, tmp_path):
    """7.5 used to be reported as 750%: an efficiency is useful / computed tokens, in (0, 1]."""
    root, params = stage_inputs
    for name in ("stats", "boundaries", "profile", "train", "data"):
        (tmp_path / name).symlink_to(root / name)
    (tmp_path / "plans").mkdir()
    doc = json.loads((root / "plans" / "metrics.json").read_text())
    doc["sorted"]["padding_efficiency"] = 7.5
    (tmp_path / "plans" / "metrics.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"plans metrics.json \(sorted\) padding_efficiency is 7.5.*\(0, 1\]"):
        _run(tmp_path, params)


def _interleave_file(
    root: Path,
    params,
    out: Path,
    *,
    drift: list[float],
    drafter_law: dict = DRAFTER,
    slower: dict[tuple[str, str], float] | None = None,
) -> None:
    """An interleave stage output timed by the known law: each strategy's segment (four steps of its training
    plan, chosen as the stage chooses them) takes the law's target + drafter seconds times round k's ``drift[k]``, the same for every strategy;
    ``slower[(strategy, role)]`` multiplies that role's seconds of that strategy."""
    from lenbatch_study.stages.compare import LossMasks, planned_batches, step_columns
    from lenbatch_study.stages.interleave import mean_lengths, segment_steps

    lengths = np.load(root / "data" / "lengths.npy").astype(np.int64)
    edges = tuple(json.loads((root / "boundaries" / "boundaries.json").read_text())["edges"])
    doc = {"machine": MACHINE, "rounds": len(drift), "strategies": {}}
    for s in STRATEGIES:
        plan = planned_batches(lengths, params, s, edges, useful_tokens=params.train.useful_tokens, target_ranks=1)
        cols = step_columns(lengths, plan, layout=layout_of(s), params=params, masks=LossMasks(root / "data"))
        steps = segment_steps(
            len(plan), skip=params.train.warmup_steps, count=4, key=mean_lengths(lengths, [b for _, b in plan])
        )
        role = {
            r: float(sum(_law(cols, law)[i] for i in steps)) * (slower or {}).get((s, r), 1.0)
            for r, law in (("target", TARGET), ("drafter", drafter_law))
        }
        useful = [int(cols["useful_tokens"][i]) for i in steps]
        doc["strategies"][s] = {
            "steps": steps,
            "epochs": [plan[i][0] for i in steps],
            "step_useful_tokens": useful,
            "seconds": [(role["target"] + role["drafter"]) * f for f in drift],
            "useful_tokens": [sum(useful)] * len(drift),
            **{f"{r}_seconds": [x * f for f in drift] for r, x in role.items()},
        }
    out.mkdir(parents=True)
    (out / "interleave.json").write_text(json.dumps(doc))
    (out / "params.json").write_text(json.dumps(params.to_dict()))


def test_interleaved_ratios_cancel_a_drift_common_to_a_round_and_fill_the_metrics_key(stage_inputs, tmp_path):
    """Segments timed by the grid's law, every round slowed alike by -30%..+40%: the measured ratios equal the
    predicted ones exactly, with zero-width intervals; metrics.json gets each strategy's interleaved ratio,
    its 95% interval as two numbers (DVC shows no list) and the predicted ratio (sorted's are 1 by definition)
    within 40 numbers, diagnostics the same and more, the report the table."""
    root, params = stage_inputs
    _interleave_file(root, params, tmp_path / "interleave", drift=[1.0, 0.7, 1.4, 1.1])
    result = compare(
        params=params,
        stats_dir=root / "stats",
        boundaries_dir=root / "boundaries",
        plans_dir=root / "plans",
        profile_dir=root / "profile",
        train_dir=root / "train",
        data_dir=root / "data",
        interleave_dir=tmp_path / "interleave",
    )
    for s, r in result.interleaved.items():
        assert r["ratio_to_sorted"] == pytest.approx(r["predicted_ratio"], rel=1e-6), s
        assert r["ci95"] == pytest.approx([r["ratio_to_sorted"]] * 2, rel=1e-9) and r["rounds"] == 4
        assert r["interval_ok"] and r["prediction_ok"]
    assert result.interleaved["sorted"]["ratio_to_sorted"] == 1.0
    assert result.interleaved["random"]["ratio_to_sorted"] != pytest.approx(1.0, abs=0.01)  # a real ratio
    # how far the timed steps stand for each run: the law's ratio over them against its ratio over the whole run
    for s, r in result.interleaved.items():
        assert r["steps_gap"] == pytest.approx(r["predicted_ratio"] / r["run_predicted_ratio"] - 1, abs=1e-12), s
    assert result.interleaved["sorted"]["run_predicted_ratio"] == 1.0
    # each row names the profile's pass speeds (what the report gives beside a miss): the grid's own
    grid = json.loads((root / "profile" / "grid.json").read_text())["points"]
    for role in ("target", "drafter"):
        _, factors = sm.pass_corrected_seconds([p[f"{role}_seconds_all"] for p in grid])
        assert result.interleaved["packed"]["profile_pass_factors"][role] == pytest.approx(list(factors))
    # and the fitted features its steps reach past the grid by more than 5%: here packed's drafter context
    # tensor (sequences x the step's largest anchor), larger than any grid row's
    beyond = {s: r["beyond_grid"] for s, r in result.interleaved.items() if r["beyond_grid"]}
    assert set(beyond) == {"packed"} and set(beyond["packed"]) == {"drafter ctx_tokens"}, beyond
    assert beyond["packed"]["drafter ctx_tokens"] > 1.05
    out = tmp_path / "compare"
    write_outputs(result, out, params=params)
    metrics = json.loads((out / "metrics.json").read_text())
    others = [s for s in STRATEGIES if s != "sorted"]
    assert {k for k in metrics if ".interleaved." in k} == {
        f"{s}.interleaved.{k}" for s in others for k in ("ratio_to_sorted", "ci95.low", "ci95.high", "predicted_ratio")
    }
    numbers = [v for v in metrics.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    # + held-out loss with quality: exactly the cap
    assert len(numbers) == len(metrics) - 2 and len(numbers) + len(STRATEGIES) == MAX_METRIC_NUMBERS
    # the verdict and the strategy it names are the two words: exact ratios, zero-width intervals, one on top
    top = max(others, key=lambda s: result.interleaved[s]["ratio_to_sorted"])
    assert metrics["verdict"] == "use" and metrics["recommended.strategy"] == top
    diagnostics = json.loads((out / "diagnostics.json").read_text())
    assert metrics == {k: v for k, v in diagnostics.items() if k in metrics}
    for s in others:
        lo, hi = metrics[f"{s}.interleaved.ci95.low"], metrics[f"{s}.interleaved.ci95.high"]
        assert lo == pytest.approx(metrics[f"{s}.interleaved.ratio_to_sorted"], abs=2e-6) == hi
        assert f"{s}.interleaved.ci95" not in diagnostics  # one spelling: DVC would not show a list
    report = (out / "details.md").read_text()
    assert "## Ratios measured in turns" in report and "Every interval is within ±2%" in report
    main = (out / "report.md").read_text()
    r = result.interleaved["packed"]
    assert f"| packed | 100.0% | {r['ratio_to_sorted']:.3f} [" in main or "| packed | " in main
    assert main.split("## Answer")[1].strip().startswith(f"**Use `{top}`**")
    assert "Beyond the profile grid (`packed`: drafter ctx_tokens " in report
    r = result.interleaved["packed"]
    assert f"| packed | {r['ratio_to_sorted']:.3f} | [" in report
    # on the CPU clock: predicted from the grid's CPU seconds, which this grid lacks: refused, naming the rerun
    doc = json.loads((tmp_path / "interleave" / "interleave.json").read_text())
    (tmp_path / "interleave" / "interleave.json").write_text(json.dumps({**doc, "clock": "cpu"}))
    with pytest.raises(ValueError, match="records no CPU seconds.*rerun: snakemake --cores all --forcerun profile"):
        compare(
            params=params,
            stats_dir=root / "stats",
            boundaries_dir=root / "boundaries",
            plans_dir=root / "plans",
            profile_dir=root / "profile",
            train_dir=root / "train",
            data_dir=root / "data",
            interleave_dir=tmp_path / "interleave",
        )
    # from another machine than the profile's: refused, naming both reruns
    doc["machine"] = {**MACHINE, "id": "elsewhere"}
    (tmp_path / "interleave" / "interleave.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="ran on machine elsewhere.*rerun both on one machine"):
        compare(
            params=params,
            stats_dir=root / "stats",
            boundaries_dir=root / "boundaries",
            plans_dir=root / "plans",
            profile_dir=root / "profile",
            train_dir=root / "train",
            data_dir=root / "data",
            interleave_dir=tmp_path / "interleave",
        )


def test_a_missed_interleaved_ratio_names_the_role_it_comes_from(stage_inputs, tmp_path):
    """sortish's target steps 25% slower than the law, everything else by the law, every round drifting alike:
    its per-role factors against sorted are 1.25 (target) and 1 (drafter), every other strategy's 1; sorted's
    own measured / predicted seconds are the median drift; the predicted ratio misses by exactly the target's
    share x 25%; the report names sortish's target and prints the per-role table; diagnostics.json keeps the
    factors, metrics.json does not."""
    root, params = stage_inputs
    drift = [1.0, 0.7, 1.4, 1.1]
    _interleave_file(root, params, tmp_path / "interleave", drift=drift, slower={("sortish", "target"): 1.25})
    result = compare(
        params=params,
        stats_dir=root / "stats",
        boundaries_dir=root / "boundaries",
        plans_dir=root / "plans",
        profile_dir=root / "profile",
        train_dir=root / "train",
        data_dir=root / "data",
        interleave_dir=tmp_path / "interleave",
    )
    table = result.interleaved
    for s, r in table.items():
        f = r["role_factors"]
        want = 1.25 if s == "sortish" else 1.0
        assert f["target"]["vs_sorted"] == pytest.approx(want, rel=1e-9), s
        assert f["drafter"]["vs_sorted"] == pytest.approx(1.0, rel=1e-9), s
        assert f["target"]["share"] + f["drafter"]["share"] == pytest.approx(1.0) and 0 < f["drafter"]["share"] < 1
    for role in ("target", "drafter"):
        assert table["sorted"]["role_factors"][role]["measured_over_predicted"] == pytest.approx(np.mean(drift))
    share = table["sortish"]["role_factors"]["target"]["share"]
    assert table["sortish"]["prediction_error"] == pytest.approx(0.25 * share, rel=1e-6)

    def weighted(s):  # the identity the report states: the share-weighted factors give predicted / measured
        return sum(f["share"] * f["measured_over_predicted"] for f in table[s]["role_factors"].values())

    for s, r in table.items():
        assert weighted(s) / weighted("sorted") == pytest.approx(1 + r["prediction_error"], rel=1e-9), s
    assert not table["sortish"]["prediction_ok"] and table["random"]["prediction_ok"]
    out = tmp_path / "compare"
    write_outputs(result, out, params=params)
    report = (out / "details.md").read_text()
    assert "Where the misses come from: `sortish`'s target step took 1.25x of its predicted seconds" in report
    # a prediction outside its (zero-width) interval by more than 3%, on a strategy the measurement already
    # separates from the top: named beside the answer, not a veto (tests/analysis/test_verdict.py holds the veto
    # for a strategy in contention)
    answer = (out / "report.md").read_text().split("## Answer")[1].split("\n## ")[0].strip()
    top = max((s for s in table if s != "sorted"), key=lambda s: table[s]["ratio_to_sorted"])
    assert top != "sortish" and answer.startswith(f"**Use `{top}`**")
    assert "The step model missed `sortish`'s ratio (predicted" in answer
    assert json.loads((out / "metrics.json").read_text())["recommended.strategy"] == top
    m = np.mean(drift)  # every role's measured / predicted, but sortish's target
    f = table["sortish"]["role_factors"]
    assert f["target"]["measured_over_predicted"] == pytest.approx(1.25 * m)
    t = f["target"]["measured_over_predicted"]
    assert f"| sortish | {t:.3f} | 1.250 | {m:.3f} | 1.000 | {f['drafter']['share']:.0%} |" in report
    assert f"| sorted | {m:.3f} | 1.000 | {m:.3f} | 1.000 | " in report
    diagnostics = json.loads((out / "diagnostics.json").read_text())
    assert diagnostics["sortish.interleaved.target_vs_sorted"] == pytest.approx(1.25)
    assert diagnostics["sortish.interleaved.drafter_measured_over_predicted"] == pytest.approx(np.mean(drift))
    assert diagnostics["sorted.interleaved.target_measured_over_predicted"] == pytest.approx(np.mean(drift))
    assert "sorted.interleaved.ratio_to_sorted" not in diagnostics
    assert not [k for k in json.loads((out / "metrics.json").read_text()) if "vs_sorted" in k]


def test_interleaved_ratios_on_the_cpu_clock_are_predicted_from_the_grids_cpu_seconds(stage_inputs, tmp_path):
    """A measurement on the CPU clock is predicted by step models fitted on the grid's CPU seconds: a grid whose
    wall seconds are the law but whose CPU seconds are the law with a 4x dearer drafter predicts the CPU-clock
    segments (timed by that second law) exactly, where the wall fits would not."""
    root, params = stage_inputs
    (tmp_path / "in").mkdir()
    var = _variant(root, tmp_path / "in", _grid(params, cpu_share=1.0))
    (var / "train").symlink_to(root / "train")
    doc = json.loads((var / "profile" / "grid.json").read_text())
    for r in doc["points"]:
        r["drafter_cpu_seconds_all"] = [4 * x for x in r["drafter_cpu_seconds_all"]]
    (var / "profile" / "grid.json").write_text(json.dumps(doc))
    _interleave_file(
        root, params, tmp_path / "interleave", drift=[1.0, 1.3, 0.8], drafter_law={k: 4 * v for k, v in DRAFTER.items()}
    )
    timings = json.loads((tmp_path / "interleave" / "interleave.json").read_text())
    (tmp_path / "interleave" / "interleave.json").write_text(json.dumps({**timings, "clock": "cpu"}))

    def table():
        return compare(
            params=params,
            stats_dir=var / "stats",
            boundaries_dir=var / "boundaries",
            plans_dir=var / "plans",
            profile_dir=var / "profile",
            train_dir=var / "train",
            data_dir=var / "data",
            interleave_dir=tmp_path / "interleave",
        ).interleaved

    got = table()
    for s, r in got.items():
        assert r["predicted_ratio"] == pytest.approx(r["ratio_to_sorted"], rel=1e-4), s
    (tmp_path / "interleave" / "interleave.json").write_text(json.dumps({**timings, "clock": "wall"}))
    wall = table()
    assert max(abs(r["prediction_error"]) for r in wall.values()) > 1e-3  # the wall fits predict another ratio


def _compare_cli(root: Path, inputs: Path, out: Path) -> list[str]:
    """``lenbatch compare`` on ``inputs`` (a folder holding stats/ boundaries/ plans/ profile/ train/ data/),
    without quality."""
    return [
        "compare",
        "--params",
        str(REPO / "params.yaml"),
        str(root / "small.yaml"),
        *[
            a
            for name in ("stats", "boundaries", "plans", "profile", "train", "data")
            for a in (f"--{name}", str(inputs / name))
        ],
        "--quality",
        "",
        "--out",
        str(out),
    ]


def _previous_output(out: Path) -> dict[str, bytes]:
    """A previous compare output in ``out`` (what a failed run must leave byte for byte)."""
    out.mkdir()
    (out / "params.json").write_text("{}\n")
    (out / "report.md").write_text("the previous report\n")
    (out / "lenbatch-output.json").write_text('{"stage": "compare"}\n')  # a stage's output, so compare may replace it
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if "lenbatch compare: error: " in line]
    assert "Traceback" not in err and len(lines) == 1, err[-3000:]
    return lines[0]


def test_nan_profile_times_are_one_line_naming_the_grid_cells(stage_inputs, tmp_path, capsys):
    """A NaN step time reached the step-model fit, where numpy's least squares failed with "SVD did not
    converge", naming neither the file nor the cells."""
    root, params = stage_inputs
    rows = _grid(params)
    rows[3]["target_seconds_median"] = float("nan")  # json writes NaN and Infinity, and reads them back
    rows[5]["drafter_seconds_median"] = float("inf")
    rows[6]["target_seconds_all"] = [rows[6]["target_seconds_all"][0], float("nan")]  # one pass's time
    (tmp_path / "in").mkdir()
    inputs = _variant(root, tmp_path / "in", rows)
    (inputs / "train").symlink_to(root / "train")
    out = tmp_path / "compare"
    before = _previous_output(out)
    capsys.readouterr()
    assert main(_compare_cli(root, inputs, out)) == 2
    err = _one_error_line(capsys)
    grid = inputs / "profile" / "grid.json"
    n3, n5 = len(rows[3]["sequence_lengths"]), len(rows[5]["sequence_lengths"])
    assert f"{grid} holds step times that are not finite positive seconds: row 3 (padded, {n3} x" in err
    assert "target_seconds_median=nan" in err and f"row 5 (padded, {n5} x" in err
    assert "drafter_seconds_median=inf" in err and "rerun: snakemake results/profile/grid.json" in err
    assert "row 6 (padded" in err and "target_seconds_all[1]=nan" in err and "more" not in err
    assert {p.name: p.read_bytes() for p in sorted(out.iterdir())} == before


def test_a_by_hand_compare_says_what_it_leaves_out(stage_inputs, tmp_path):
    """``lenbatch compare`` without --quality and --interleave folders (the default leaves the interleaved
    ratios out) writes its outputs and says which parts it left out, naming each flag."""
    root, params = stage_inputs
    (tmp_path / "in").mkdir()
    inputs = _variant(root, tmp_path / "in", _grid(params))
    (inputs / "train").symlink_to(root / "train")
    out = tmp_path / "compare"
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # the stage's own logger: no propagation
    logging.getLogger("compare").addHandler(handler)
    try:
        assert main(_compare_cli(root, inputs, out)) == 0
    finally:
        logging.getLogger("compare").removeHandler(handler)
    logged = "\n".join(said)
    assert "no --quality folder given: the report and metrics leave out the held-out loss" in logged
    assert "no --interleave folder given: the report and metrics leave out the ratios in turns" in logged
    assert "## Ratios measured in turns" not in (out / "details.md").read_text()


def test_a_torn_summary_is_one_line_naming_the_file(stage_inputs, tmp_path, capsys):
    root, params = stage_inputs
    inputs = tmp_path / "in"
    inputs.mkdir()
    shutil.copytree(root / "train", inputs / "train")
    for name in ("stats", "boundaries", "plans", "profile", "data"):
        (inputs / name).symlink_to(root / name)
    summary = inputs / "train" / "packed" / "summary.json"
    text = summary.read_text()
    summary.write_text(text[: len(text) // 2])  # a copy or a write cut short
    out = tmp_path / "compare"
    before = _previous_output(out)
    capsys.readouterr()
    assert main(_compare_cli(root, inputs, out)) == 2
    err = _one_error_line(capsys)
    assert f"{summary} is not valid JSON" in err and "rerun: snakemake results/train/packed/summary.json" in err
    assert {p.name: p.read_bytes() for p in sorted(out.iterdir())} == before


def test_a_tie_is_named_with_what_separates_it_and_a_wide_overlap_settles_nothing(stage_inputs, tmp_path):
    """Ratios in turns where sortish and packed overlap within +-2%: the answer names the tie, their composition
    repeat and length mixing; metrics.json records the tie, not a strategy. The same overlap with a 3% interval
    after the measurement's rounds: not settled, naming the rounds and the setting that adds more."""
    from lenbatch_study.stages.compare import recommend

    root, params = stage_inputs
    _interleave_file(root, params, tmp_path / "interleave", drift=[1.0, 0.7, 1.4, 1.1])
    result = compare(
        params=params,
        stats_dir=root / "stats",
        boundaries_dir=root / "boundaries",
        plans_dir=root / "plans",
        profile_dir=root / "profile",
        train_dir=root / "train",
        data_dir=root / "data",
        interleave_dir=tmp_path / "interleave",
    )

    def with_table(half: float):
        table = {s: dict(r) for s, r in result.interleaved.items()}
        for s, ratio in (("sortish", 1.10), ("packed", 1.09)):
            table[s].update(
                ratio_to_sorted=ratio,
                ci95=[ratio * (1 - half), ratio * (1 + half)],
                half_width=half,
                predicted_ratio=ratio,
                prediction_error=0.0,
                interval_ok=half <= 0.02,
            )
        rec = recommend(result.rows, result.sweep, table, params=params)
        return dataclasses.replace(result, interleaved=table, recommendation=rec)

    write_outputs(with_table(0.015), tmp_path / "tie", params=params)
    answer = (tmp_path / "tie" / "report.md").read_text().split("## Answer")[1].split("\n## ")[0].strip()
    assert answer.startswith("**Tie: `sortish` and `packed`** for this data and model.")
    rows = result.rows
    assert (
        f"composition repeat `sortish` {rows['sortish'].composition_repeat:.3f}, `packed` "
        f"{rows['packed'].composition_repeat:.3f}"
    ) in answer
    metrics = json.loads((tmp_path / "tie" / "metrics.json").read_text())
    assert metrics["verdict"] == "tie" and metrics["recommended.tie"] == "sortish, packed"
    assert "recommended.strategy" not in metrics
    write_outputs(with_table(0.03), tmp_path / "wide", params=params)
    answer = (tmp_path / "wide" / "report.md").read_text().split("## Answer")[1].split("\n## ")[0].strip()
    assert answer.startswith("**Not settled**: `sortish` 1.100 [1.067, 1.133], `packed` 1.090 [1.057, 1.123] overlap")
    assert "after 4 rounds (`interleave.max_rounds`)" in answer and "dvc exp run -S interleave.max_rounds=8" in answer
    metrics = json.loads((tmp_path / "wide" / "metrics.json").read_text())
    assert metrics["verdict"] == "not settled" and not [k for k in metrics if k.startswith("recommended.")]
