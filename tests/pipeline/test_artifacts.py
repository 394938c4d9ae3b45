"""One reader per artifact (lenbatch_study.pipeline.artifacts): each accepts what its writer writes, and refuses a
missing, malformed or mismatched file with the one error, naming the file and the rerun.

Real writers for the cheap stages (tokenize on 12 conversations, stats, boundaries, plans: ~7 s, the
module's fixture); the readers of the measuring stages' files (grid.json, a training run, quality.json)
are checked against their real writers in tests/stages/test_profile.py, test_train.py and test_quality.py
(which already run them), and here on copies of such files made wrong one way at a time."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from lenbatch_study.cli import main
from lenbatch_study.pipeline.artifacts import bucket_edges, length_stats, plan_metrics, profile_grid, quality_result
from lenbatch_study.pipeline.artifacts import interleave_timings, tokenized, train_runs
from lenbatch_study.pipeline.artifacts.reading import ArtifactError

from _tiny import ENV

REPO = Path(__file__).resolve().parents[2]
STRATEGIES = ["sorted", "random", "bucketed", "sortish", "packed"]


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """The cheap stages' real outputs: tokenize (12 conversations), stats, boundaries, plans."""
    root = tmp_path_factory.mktemp("artifacts")
    over = root / "tiny.yaml"
    over.write_text(
        yaml.safe_dump(
            {
                "data": {"max_len": 256, "limit": 12, "workers": 1},
                "batching": {"token_budget": 1024, "max_batch_size": 8},
                "boundaries": {"num_buckets": 2, "sweep_max_buckets": 2, "num_candidates": 16},
                "plans": {"epochs": 2},
            }
        )
    )
    params = ["--params", str(REPO / "params.yaml"), str(over)]
    subprocess.run(
        [sys.executable, "-m", "lenbatch_study", "tokenize", *params, "--no-progress", "--out", str(root / "tokenize")],
        check=True,
        env=ENV,
        capture_output=True,
        cwd=root,
    )
    lengths = root / "tokenize" / "lengths.npy"
    assert main(["stats", *params, "--lengths", str(lengths), "--out", str(root / "stats")]) == 0
    assert main(["boundaries", *params, "--lengths", str(lengths), "--out", str(root / "boundaries")]) == 0
    assert (
        main(
            [
                "plans",
                *params,
                "--lengths",
                str(lengths),
                "--boundaries",
                str(root / "boundaries" / "boundaries.json"),
                "--epochs",
                "2",
                "--out",
                str(root / "plans"),
            ]
        )
        == 0
    )
    return root


def refused(call, path: Path, problem: str, rerun: str) -> str:
    """``call()`` raises the one error: the file, the problem, ``rerun: snakemake results/...`` and the command."""
    with pytest.raises(ArtifactError) as err:
        call()
    text = str(err.value)
    assert text.startswith(f"{path} ") and problem in text, text
    assert f"; rerun: snakemake results/{rerun} (or: lenbatch {rerun.split('/')[0]}" in text, text
    return text


def copy(real: Path, tmp_path: Path, stage: str) -> Path:
    return Path(shutil.copytree(real / stage, tmp_path / stage, symlinks=True))


# --------------------------------------------------------------------------- tokenize: lengths.npy, dataset/


def test_the_tokenized_folder_reads_back(real):
    lengths = tokenized.read_lengths(real / "tokenize")
    assert lengths.dtype == np.int64 and 8 <= lengths.size <= 12  # conversations without trained tokens are dropped
    ds = tokenized.read_dataset(real / "tokenize", lengths)
    rows = ds.samples([3, 0])
    assert [len(r["input_ids"]) for r in rows] == [lengths[3], lengths[0]]
    arrays = ds.arrays([3])
    assert arrays[3]["input_ids"].dtype == np.int64 and arrays[3]["loss_mask"].dtype == bool
    assert [m.tolist() for m in ds.loss_masks([3])] == [arrays[3]["loss_mask"].tolist()]
    x, source = tokenized.read_lengths_input(lengths=real / "tokenize" / "lengths.npy")
    assert np.array_equal(x, lengths) and source.endswith("lengths.npy")


def test_the_dataset_reader_needs_no_datasets_package_and_agrees_with_it(real):
    """The reader is pyarrow alone (the GPU check's machine has no ``datasets``): run in a process where
    ``import datasets`` fails, it gives every row exactly as ``datasets.load_from_disk`` does."""
    import datasets

    lengths = tokenized.read_lengths(real / "tokenize")
    ref = datasets.load_from_disk(str(real / "tokenize" / "dataset"))
    order = list(range(len(ref)))[::-1]
    want = [{"input_ids": ref[i]["input_ids"], "loss_mask": [bool(m) for m in ref[i]["loss_mask"]]} for i in order]
    code = (
        "import sys, json, numpy as np; sys.modules['datasets'] = None\n"
        "from lenbatch_study.pipeline.artifacts import tokenized\n"
        f"d = {str(real / 'tokenize')!r}\n"
        "ds = tokenized.read_dataset(d, tokenized.read_lengths(d))\n"
        f"rows = ds.samples({order!r})\n"
        "print(json.dumps([{'input_ids': r['input_ids'], 'loss_mask': [bool(m) for m in r['loss_mask']]} "
        "for r in rows]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == want
    assert len(tokenized.read_dataset(real / "tokenize", lengths)) == len(ref)


def test_lengths_missing_malformed_or_invalid(real, tmp_path):
    d = copy(real, tmp_path, "tokenize")
    path = d / "lengths.npy"
    path.unlink()
    refused(lambda: tokenized.read_lengths(d), path, "does not exist", "tokenize/lengths.npy")
    refused(lambda: tokenized.read_lengths_input(lengths=path), path, "does not exist", "tokenize/lengths.npy")
    path.write_text("not an array")
    refused(lambda: tokenized.read_lengths(d), path, "is not a .npy array", "tokenize/lengths.npy")
    np.save(path, np.array([5, 0, 7]))
    refused(lambda: tokenized.read_lengths(d), path, "holds no valid lengths", "tokenize/lengths.npy")


def test_dataset_missing_lacking_a_column_or_from_another_run(real, tmp_path):
    import datasets

    d = copy(real, tmp_path, "tokenize")
    lengths = tokenized.read_lengths(d)
    ds_path = d / "dataset"
    refused(
        lambda: tokenized.read_dataset(d, lengths[:-1]), ds_path, f"has {lengths.size} rows but", "tokenize/lengths.npy"
    )
    other = lengths.copy()
    other[2] += 1
    refused(
        lambda: tokenized.read_dataset(d, other).samples([2]),
        ds_path,
        f"row 2 has {lengths[2]} tokens",
        "tokenize/lengths.npy",
    )
    refused(lambda: tokenized.read_dataset(d, other).loss_masks([2]), ds_path, "row 2 has", "tokenize/lengths.npy")
    datasets.load_from_disk(str(ds_path)).remove_columns(["loss_mask"]).save_to_disk(str(tmp_path / "ds"))
    shutil.rmtree(ds_path)
    refused(lambda: tokenized.read_dataset(d, lengths), ds_path, "does not exist", "tokenize/lengths.npy")
    shutil.move(tmp_path / "ds", ds_path)
    refused(lambda: tokenized.read_dataset(d, lengths), ds_path, "lacks columns ['loss_mask']", "tokenize/lengths.npy")


# --------------------------------------------------------------------------- boundaries: boundaries.json, sweep.json


def test_boundaries_and_sweep_read_back(real):
    path = real / "boundaries" / "boundaries.json"
    doc = bucket_edges.read_boundaries(path)
    assert bucket_edges.read_edges(path) == tuple(doc["edges"]) and doc["num_buckets"] == 2
    assert [e["num_buckets"] for e in bucket_edges.read_sweep(real / "boundaries" / "sweep.json")] == [1, 2]
    assert bucket_edges.edges_for(path, ["bucketed"]) == tuple(doc["edges"])
    assert bucket_edges.edges_for(real / "nothing.json", ["sorted", "packed"]) is None  # not read at all
    assert bucket_edges.read_edges(None) is None
    with pytest.raises(ValueError, match="strategy 'bucketed' needs bucket edges; pass --boundaries"):
        bucket_edges.edges_for(None, ["sorted", "bucketed"])


@pytest.mark.parametrize(
    "content, problem",
    [
        (None, "does not exist"),
        ("{", "is not valid JSON"),
        ('{"method": "dp"}', "holds no bucket edges"),
        ('{"edges": [0, 50, 50, 100]}', "holds no bucket edges"),
        ('{"edges": [0, 1.5, 9]}', "holds no bucket edges"),
    ],
)
def test_boundaries_refused(tmp_path, content, problem):
    path = tmp_path / "boundaries.json"
    if content is not None:
        path.write_text(content)
    refused(lambda: bucket_edges.read_edges(path), path, problem, "boundaries/boundaries.json")
    refused(lambda: bucket_edges.edges_for(path, ["bucketed"]), path, problem, "boundaries/boundaries.json")


def test_boundaries_for_compare_and_the_sweep_refused(real, tmp_path):
    d = copy(real, tmp_path, "boundaries")
    doc = json.loads((d / "boundaries.json").read_text())
    (d / "boundaries.json").write_text(json.dumps({"edges": doc["edges"]}))  # enough to plan, not for compare
    bucket_edges.read_edges(d / "boundaries.json")
    refused(
        lambda: bucket_edges.read_boundaries(d / "boundaries.json"),
        d / "boundaries.json",
        "lacks 'predicted_efficiency', 'num_buckets'",
        "boundaries/boundaries.json",
    )
    sweep = json.loads((d / "sweep.json").read_text())
    del sweep[1]["length_mixing"]
    (d / "sweep.json").write_text(json.dumps(sweep))
    refused(
        lambda: bucket_edges.read_sweep(d / "sweep.json"),
        d / "sweep.json",
        "lacks 'length_mixing' in entry 1",
        "boundaries/sweep.json",
    )
    (d / "sweep.json").write_text("{}")
    refused(lambda: bucket_edges.read_sweep(d / "sweep.json"), d / "sweep.json", "not a list", "boundaries/sweep.json")


# --------------------------------------------------------------------------- stats, plans


def test_stats_and_plans_read_back_and_refused(real, tmp_path):
    n = tokenized.read_lengths(real / "tokenize").size
    assert length_stats.read_stats(real / "stats")["count"] == n
    assert sum(b["count"] for b in length_stats.read_histogram(real / "stats")) == n
    assert set(plan_metrics.read_plans(real / "plans", STRATEGIES)) == set(STRATEGIES)
    s = copy(real, tmp_path, "stats")
    st = json.loads((s / "stats.json").read_text())
    del st["percentiles"]
    (s / "stats.json").write_text(json.dumps(st))
    refused(lambda: length_stats.read_stats(s), s / "stats.json", "lacks 'percentiles'", "stats/stats.json")
    (s / "histogram.json").write_text("[]")
    refused(
        lambda: length_stats.read_histogram(s), s / "histogram.json", "holds no histogram bins", "stats/histogram.json"
    )
    p = copy(real, tmp_path, "plans")
    refused(
        lambda: plan_metrics.read_plans(p, [*STRATEGIES, "zigzag"]),
        p / "metrics.json",
        "lacks strategies ['zigzag']",
        "plans/metrics.json",
    )
    m = json.loads((p / "metrics.json").read_text())
    del m["packed"]["length_mixing"]
    (p / "metrics.json").write_text(json.dumps(m))
    refused(
        lambda: plan_metrics.read_plans(p, STRATEGIES),
        p / "metrics.json",
        "lacks 'length_mixing' for packed",
        "plans/metrics.json",
    )


# --------------------------------------------------------------------------- profile, train, quality (files as written)

ROW = {
    "layout": "padded",
    "sequences": 1,
    "length": 16,
    "sequence_lengths": [16],
    "target_seconds_median": 0.01,
    "drafter_seconds_median": 0.02,
    "target_seconds_all": [0.01],
    "drafter_seconds_all": [0.02],
}


def test_grid_refused(tmp_path):
    d = tmp_path / "profile"
    d.mkdir()
    refused(lambda: profile_grid.read_grid(d), d / "grid.json", "does not exist", "profile/grid.json")
    (d / "grid.json").write_text("[]")
    refused(lambda: profile_grid.read_grid(d), d / "grid.json", "holds no grid rows", "profile/grid.json")
    (d / "grid.json").write_text(json.dumps([ROW, {k: v for k, v in ROW.items() if k != "sequence_lengths"}]))
    refused(
        lambda: profile_grid.read_grid(d), d / "grid.json", "lacks 'sequence_lengths' in row 1", "profile/grid.json"
    )
    old = {("kind" if k == "layout" else k): v for k, v in ROW.items()}  # rows keyed 'kind' are refused, not read
    (d / "grid.json").write_text(json.dumps({"points": [old]}))
    refused(lambda: profile_grid.read_grid(d), d / "grid.json", "lacks 'layout' in row 0", "profile/grid.json")
    # compare fits every pass's seconds: a grid of medians only (an older one) is refused
    (d / "grid.json").write_text(json.dumps({"points": [{k: v for k, v in ROW.items() if k != "drafter_seconds_all"}]}))
    refused(
        lambda: profile_grid.read_grid(d), d / "grid.json", "lacks 'drafter_seconds_all' in row 0", "profile/grid.json"
    )
    (d / "grid.json").write_text(json.dumps({"points": [ROW]}))  # the mapping form is read too
    assert profile_grid.read_grid(d) == [ROW] and profile_grid.read_profile_params(d) is None
    (d / "params.json").write_text("[1]")
    refused(
        lambda: profile_grid.read_profile_params(d), d / "params.json", "holds no params mapping", "profile/grid.json"
    )


def _run_files(d: Path, *, steps: int = 2, planned: int | None = 2, lines: list[str] | None = None) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "summary.json").write_text(
        json.dumps({"useful_tokens_per_s": 10.0, "steps": steps, "planned_steps": planned, "params": {"train": {}}})
    )
    (d / "steps.jsonl").write_text(
        "\n".join(lines if lines is not None else [json.dumps({"step": i, "useful_tokens": 5}) for i in range(steps)])
        + "\n"
    )


def test_training_run_refused(tmp_path):
    train = tmp_path / "train"
    refused(
        lambda: train_runs.read_run(train, "packed"),
        train / "packed" / "summary.json",
        "does not exist",
        "train/packed/summary.json",
    )
    _run_files(train / "packed")
    assert len(train_runs.read_run(train, "packed")["steps"]) == 2
    _run_files(train / "packed", steps=1, planned=3)
    refused(
        lambda: train_runs.read_run(train, "packed"),
        train / "packed" / "summary.json",
        "records 1 of 3 planned steps",
        "train/packed/summary.json",
    )
    _run_files(train / "packed", lines=['{"step": 0, "useful_tokens": 5}', '{"step": 1, "usef'])
    text = refused(
        lambda: train_runs.read_run(train, "packed"),
        train / "packed" / "steps.jsonl",
        "line 2 is not JSON",
        "train/packed/summary.json",
    )
    assert "lenbatch train --strategy packed" in text
    _run_files(train / "packed", lines=['{"step": 0, "useful_tokens": 5}'])
    refused(
        lambda: train_runs.read_run(train, "packed"),
        train / "packed" / "steps.jsonl",
        "holds 1 steps but summary.json says 2",
        "train/packed/summary.json",
    )
    (train / "packed" / "summary.json").write_text(json.dumps({"steps": 2}))
    refused(
        lambda: train_runs.read_run(train, "packed"),
        train / "packed" / "summary.json",
        "lacks 'useful_tokens_per_s', 'params'",
        "train/packed/summary.json",
    )


@pytest.mark.parametrize(
    "where, value, problem",
    [
        ("summary.json useful_tokens_per_s", -5, "useful_tokens_per_s=-5"),  # was reported as "error -136471%"
        ("summary.json useful_tokens_per_s", 0, "useful_tokens_per_s=0"),
        ("summary.json useful_tokens_per_s", float("nan"), "useful_tokens_per_s=nan"),
        ("summary.json padding_efficiency", 7.5, "padding_efficiency=7.5 (above 1)"),
        ("summary.json drafter_s_mean", float("inf"), "drafter_s_mean=inf"),
        ("summary.json useful_tokens", -1, "useful_tokens=-1"),
        ("steps.jsonl target_s", float("nan"), "line 3 target_s=nan"),
        ("steps.jsonl useful_tokens", -14916, "line 3 useful_tokens=-14916"),
        ("steps.jsonl useful_tokens", 0, "line 3 useful_tokens=0"),
        ("steps.jsonl step", 2.5, "line 3 step=2.5 (not a whole number)"),
    ],
)
def test_a_training_run_with_numbers_no_run_measures_is_refused_naming_the_file(tmp_path, where, value, problem):
    """Issue 48.4: compare trusted the trainings' numbers (a negative throughput became an error of -136471%).
    On a copy of a real run (the committed results/train/sorted), one number made wrong at a time."""
    train = tmp_path / "train"
    shutil.copytree(REPO / "results" / "train" / "sorted", train / "sorted")
    assert train_runs.read_run(train, "sorted")["summary"]["useful_tokens_per_s"] > 0
    name, key = where.split()
    path = train / "sorted" / name
    if name == "summary.json":
        doc = json.loads(path.read_text())
        path.write_text(json.dumps({**doc, key: value}))
    else:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        rows[2][key] = value
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = refused(lambda: train_runs.read_run(train, "sorted"), path, problem, "train/sorted/summary.json")
    assert "no run measures" in text or "no step measures" in text


def test_a_multi_node_run_s_signed_weight_checksums_are_read_and_a_nan_one_refused(tmp_path):
    """The drafters' weight checksums of a multi-node run are signed sums, not measurements: negative ones read
    (the SLURM check's 2-node trainings wrote -430678850101), a NaN one is refused like any number."""
    train = tmp_path / "train"
    shutil.copytree(REPO / "results" / "train" / "sorted", train / "sorted")
    path = train / "sorted" / "summary.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "weights_checksums": [-430678850101, -430678850101]}))
    assert train_runs.read_run(train, "sorted")["summary"]["weights_checksums"][0] < 0
    path.write_text(json.dumps({**doc, "weights_checksums": [float("nan"), 1]}))
    refused(lambda: train_runs.read_run(train, "sorted"), path, "weights_checksums[0]=nan", "train/sorted/summary.json")


@pytest.mark.parametrize(
    "change, problem",
    [
        (
            lambda st: st["packed"]["seconds"].__setitem__(1, float("nan")),
            "packed seconds[1]=nan (not finite seconds > 0)",
        ),
        (lambda st: st["packed"]["seconds"].__setitem__(0, 0.0), "packed seconds[0]=0.0"),
        (lambda st: st["sorted"]["target_seconds"].__setitem__(2, -1.5), "sorted target_seconds[2]=-1.5"),
        (lambda st: st["random"]["drafter_seconds"].__setitem__(0, float("inf")), "random drafter_seconds[0]=inf"),
        (
            lambda st: st["random"]["useful_tokens"].__setitem__(0, -3),
            "random useful_tokens[0]=-3 (not token counts > 0)",
        ),
        (lambda st: st["bucketed"]["steps"].__setitem__(0, -1), "bucketed steps[0]=-1"),
        (
            lambda st: st.pop("random"),
            "lacks strategy random (it holds sorted, bucketed, sortish, packed; "
            "train.strategies lists sorted, random, bucketed, sortish, packed)",
        ),
    ],
)
def test_interleave_timings_with_impossible_numbers_or_a_missing_strategy_are_refused(tmp_path, change, problem):
    """Issue 48.4: NaN, 0, negative or infinite seconds (or negative tokens) in interleave.json put NaN and
    Infinity into compare's metrics and report, exit 0, and a missing strategy lost its interleaved row
    silently. On a copy of the committed results/interleave, one change at a time."""
    d = Path(shutil.copytree(REPO / "results" / "interleave", tmp_path / "interleave"))
    assert list(interleave_timings.read_timings(d)["strategies"]) == STRATEGIES
    doc = json.loads((d / "interleave.json").read_text())
    change(doc["strategies"])
    (d / "interleave.json").write_text(json.dumps(doc))
    refused(lambda: interleave_timings.read_timings(d), d / "interleave.json", problem, "interleave/interleave.json")
    if "lacks strategy" in problem:  # the list asked for wins over the params.json beside it
        assert "random" not in interleave_timings.read_timings(d, strategies=["sorted", "packed"])["strategies"]


def test_quality_result_refused(tmp_path):
    d = tmp_path / "quality"
    d.mkdir()
    refused(
        lambda: quality_result.read_quality(d, STRATEGIES), d / "quality.json", "does not exist", "quality/quality.json"
    )
    doc = {k: {} for k in ("setting", "gradients", "summary", "timing")} | {"runs": [], "strategies": ["sorted"]}
    (d / "quality.json").write_text(json.dumps(doc))
    refused(
        lambda: quality_result.read_quality(d, STRATEGIES),
        d / "quality.json",
        "lacks strategies ['random', 'bucketed', 'sortish', 'packed']",
        "quality/quality.json",
    )
    (d / "quality.json").write_text(json.dumps({k: v for k, v in doc.items() if k != "summary"}))
    refused(
        lambda: quality_result.read_quality(d, ["sorted"]),
        d / "quality.json",
        "lacks 'summary'",
        "quality/quality.json",
    )


def test_a_stage_prints_the_one_error_and_exits_2(real, tmp_path, capsys):
    """Through the CLI the reader's words reach the user unchanged (one line, exit 2)."""
    rc = main(
        [
            "plans",
            "--params",
            str(REPO / "params.yaml"),
            "--lengths",
            str(tmp_path / "lengths.npy"),
            "--out",
            str(tmp_path / "p"),
        ]
    )
    err = capsys.readouterr().err
    assert (
        rc == 2 and f"{tmp_path / 'lengths.npy'} does not exist; rerun: snakemake results/tokenize/lengths.npy" in err
    )
    assert "Traceback" not in err and not (tmp_path / "p").exists()
