"""Compare stage end to end on small real inputs.

stats, boundaries and plans are the real stages run on a small length sample; the
profile grid and the training runs are built here from a known step-time law, so the
stage's prediction can be checked exactly against the "measured" runs.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from lenbatch.analysis import shapes as shp
from lenbatch.analysis import stepmodel as sm
from lenbatch.stages.compare import ACK_EVERY, compare
from lenbatch.core.config import load_params
from lenbatch.analysis.report import busy_machine, write_outputs

REPO = Path(__file__).resolve().parents[2]
STRATEGIES = ("sorted", "random", "bucketed", "sortish", "packed")
# a known law for the synthetic timings (seconds): per step, per token, per length^2, per sequence
TARGET = {"const": 0.004, "computed_tokens": 2e-6, "sum_len_sq": 2e-10, "sequences": 2e-4}
DRAFTER = {"const": 0.006, "ctx_tokens": 1e-6, "positions": 1.5e-5}


def _cli(*args: str, cwd: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "lenbatch", *args], cwd=cwd, capture_output=True, text=True)
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
    from lenbatch.loading.collate import synthetic_sequences

    dr = params.drafter
    for i, (kind, n, m) in enumerate(shapes):
        ls = np.asarray(shp.grid_shape(kind, n, m, max_len=params.data.max_len))
        masks = [x["loss_mask"] for x in synthetic_sequences(ls, vocab_size=1000, seed=i)]
        work = shp.drafter_work(ls, masks, [-1] * n, anchors_per_seq=dr.anchors_per_seq, block_size=dr.block_size,
                               seed=0, epoch=0, step=i)
        cols = shp.batch_columns(ls, [np.arange(ls.size)], kind=kind,
                                drafter=(np.array([work[0]], float), np.array([work[1]], float)))
        t, d = float(_law(cols, TARGET)[0]), float(_law(cols, DRAFTER)[0])
        rows.append({"kind": kind, "sequences": n, "length": m, "sequence_lengths": ls.tolist(),
                     "computed_tokens": float(cols["computed_tokens"][0]),
                     "sum_len_sq": float(cols["sum_len_sq"][0]), "ctx_tokens": float(cols["ctx_tokens"][0]),
                     "positions": float(cols["positions"][0]), "target_seconds_median": t,
                     "target_seconds_all": [t], "drafter_seconds_median": d, "drafter_seconds_all": [d],
                     "seconds_median": t + d, "seconds_all": [t + d]})
        if busy is not None:
            rows[-1].update({"target_busy_seconds_median": busy * t, "target_busy_seconds_all": [busy * t],
                             "drafter_busy_seconds_median": busy * d, "drafter_busy_seconds_all": [busy * d]})
        if cpu_share is not None:
            rows[-1].update({"target_cpu_seconds_all": [cpu_share * t], "drafter_cpu_seconds_all": [cpu_share * d]})
    return rows


def _fake_run(lengths, params, strategy, edges, out: Path, data: Path, *, busy: float | None = None) -> None:
    """A training run's outputs for the planned batches, timed by the known law through the pipeline
    (``busy``: a step costs the law x busy while the other role works, blended by the overlap)."""
    from lenbatch.stages.compare import LossMasks, planned_batches, step_columns, step_kind

    steps = planned_batches(lengths, params, strategy, edges, useful_tokens=params.train.useful_tokens,
                            target_ranks=1)
    cols = step_columns(lengths, steps, kind=step_kind(strategy), params=params, masks=LossMasks(data))
    t_s, d_s = _law(cols, TARGET), _law(cols, DRAFTER)
    if busy is None:
        ends = sm.pipeline_ends(t_s, d_s, queue_size=params.train.queue_size, ack_every=ACK_EVERY)
    else:
        tl = sm.blended_pipeline(t_s, busy * t_s, d_s, busy * d_s, queue_size=params.train.queue_size,
                                 ack_every=ACK_EVERY)
        ends, t_s, d_s = tl["end"], tl["target_s"], tl["drafter_s"]
    tput = sm.throughput(cols["useful_tokens"], ends, warmup_steps=params.train.warmup_steps)
    out.mkdir(parents=True)
    with (out / "steps.jsonl").open("w") as fh:
        for i, (epoch, b) in enumerate(steps):
            fh.write(json.dumps({"rank": 1, "step": i, "epoch": epoch, "sequences": int(b.size),
                                 "target_s": float(t_s[i]), "drafter_s": float(d_s[i]),
                                 "target_cpu_s": float(t_s[i]), "drafter_cpu_s": float(d_s[i]),
                                 "useful_tokens": int(cols["useful_tokens"][i]),
                                 "computed_tokens": int(cols["computed_tokens"][i]), "loss": 5.0 - 1e-5 * i}) + "\n")
    summary = {"useful_tokens_per_s": tput, "steps": len(steps), "planned_steps": len(steps),
               "padding_efficiency": float(cols["useful_tokens"].sum() / cols["computed_tokens"].sum()),
               "loss_curve": [[i, 5.0 - 1e-5 * i] for i in range(len(steps))],
               "final_loss": 5.0, "params": params.to_dict()}
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

    from lenbatch.loading.collate import synthetic_sequences

    seqs = synthetic_sequences(lengths, vocab_size=1000, seed=0)
    datasets.Dataset.from_dict({"input_ids": [s["input_ids"].tolist() for s in seqs],
                                "loss_mask": [s["loss_mask"].tolist() for s in seqs],
                                "length": lengths.tolist()}).save_to_disk(str(data / "dataset"))
    override = {"data": {"max_len": 1024}, "batching": {"token_budget": 2048, "max_batch_size": 16},
                "boundaries": {"sweep_max_buckets": 6, "num_candidates": 40},
                "train": {"useful_tokens": 60_000, "warmup_steps": 2}}
    (root / "small.yaml").write_text(yaml.safe_dump(override))
    params_args = ["--params", str(REPO / "params.yaml"), str(root / "small.yaml")]
    params = load_params(REPO / "params.yaml", root / "small.yaml")
    L = str(data / "lengths.npy")
    _cli("stats", *params_args, "--lengths", L, "--out", str(root / "stats"), cwd=root)
    _cli("boundaries", *params_args, "--lengths", L, "--out", str(root / "boundaries"), cwd=root)
    _cli("plans", *params_args, "--lengths", L, "--boundaries", str(root / "boundaries" / "boundaries.json"),
         "--out", str(root / "plans"), cwd=root)
    (root / "profile").mkdir()
    (root / "profile" / "grid.json").write_text(json.dumps(_grid(params)))
    edges = json.loads((root / "boundaries" / "boundaries.json").read_text())["edges"]
    for s in STRATEGIES:
        _fake_run(lengths.astype(np.int64), params, s, tuple(edges), root / "train" / s, data)
    return root, params


def _run(root: Path, params, train: str = "train"):
    return compare(params=params, stats_dir=root / "stats", boundaries_dir=root / "boundaries",
                   plans_dir=root / "plans", profile_dir=root / "profile", train_dir=root / train,
                   data_dir=root / "data")


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
    # metrics.json holds only what users compare: 6 per strategy (+3 held-out loss numbers with the quality
    # stage) and the recommendation
    per_strategy = 6 + (3 if result.quality else 0)
    assert len(on_disk) == per_strategy * len(STRATEGIES) + 3
    assert on_disk == {k: v for k, v in json.loads(json.dumps(metrics)).items() if k in on_disk}
    assert not any("cpu_share" in k or k.startswith("fit.") for k in on_disk)
    diagnostics = json.loads((out / "diagnostics.json").read_text())
    report = (out / "report.md").read_text()
    for s in STRATEGIES:
        for key in ("measured_efficiency", "measured_tok_s", "predicted_tok_s", "prediction_error",
                    "composition_repeat", "length_mixing"):
            assert on_disk[f"{s}.{key}"] is not None, f"{s}.{key}"
        assert diagnostics[f"{s}.ratio_to_sorted_measured"] is not None
        assert f"| {s} |" in report
    assert diagnostics["sorted.ratio_to_sorted_measured"] == pytest.approx(1.0)
    assert "**Use `" in report and "K = 6" in report
    assert on_disk["recommended.strategy"] in STRATEGIES and on_disk["recommended.strategy"] != "sorted"
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
    (tmp_path / "profile" / "grid.json").write_text(json.dumps(_grid(params)[:4]))
    with pytest.raises(ValueError, match=r"rerun: snakemake results/profile/grid.json"):
        _run(tmp_path, params)


def _variant(root: Path, tmp_path: Path, grid: list[dict]) -> Path:
    """The stage inputs with another profile grid (the rest linked)."""
    for name in ("stats", "boundaries", "plans", "data"):
        (tmp_path / name).symlink_to(root / name)
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "grid.json").write_text(json.dumps(grid))
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
    (tmp_path / "profile" / "grid.json").write_text(json.dumps(_grid(params)))
    plain = _run(tmp_path, with_mode("busy"))
    assert "target_busy" not in plain.fits
    assert [plain.rows[s].predicted_tok_s for s in STRATEGIES] == pytest.approx(
        [alone_only.rows[s].predicted_tok_s for s in STRATEGIES], rel=1e-9)


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
    assert "**The machine was busy**" in (tmp_path / "busy" / "compare" / "report.md").read_text()
    (tmp_path / "quiet").mkdir()
    _variant(root, tmp_path / "quiet", _grid(params, cpu_share=1.0))
    (tmp_path / "quiet" / "train").symlink_to(root / "train")
    quiet = _run(tmp_path / "quiet", params)
    assert busy_machine(quiet) == []
    write_outputs(quiet, tmp_path / "quiet" / "compare", params=params)
    assert "The machine was quiet" in (tmp_path / "quiet" / "compare" / "report.md").read_text()
