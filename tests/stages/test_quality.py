"""The quality stage end to end on tiny real data: every strategy, seeds, held-out loss intervals, gradient
quality, outputs on disk, the compare section, and refused input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from lenbatch_study.analysis import quality_report as qr
from lenbatch_study.cli import main
from lenbatch_study.pipeline.artifacts import quality_result
from lenbatch_study.pipeline.artifacts.reading import ArtifactError
from lenbatch_study.stages.quality import split_samples

from _runs import tiny_tokenized
from _tiny import TINY_DATA, TINY_MODEL

pytestmark = pytest.mark.slow

STRATEGIES = ["sorted", "random", "bucketed", "sortish", "packed"]
TINY = {
    "data": TINY_DATA,
    "model": TINY_MODEL,
    "drafter": {"num_layers": 1, "num_heads": 2},
    "batching": {"token_budget": 2048, "max_batch_size": 8},
    "train": {"strategies": STRATEGIES},
    "quality": {
        "train_tokens": 8000,
        "heldout_tokens": 2500,
        "epochs": 3,
        "seeds": 2,
        "draft_vocab": 128,
        "anchors_per_seq": 4,
        "lr": 0.01,
        "eval_points": 3,
        "min_drop_nats": 0.5,
    },
}


@pytest.fixture(scope="module")
def stage(tmp_path_factory, one_thread):
    root = tmp_path_factory.mktemp("quality")
    params, data = tiny_tokenized(root, TINY)
    lengths = np.load(data / "lengths.npy")
    inner = np.quantile(lengths, [0.25, 0.5, 0.75]).astype(int)
    edges = sorted({int(lengths.min()), *inner.tolist(), int(lengths.max()) + 1})
    (root / "boundaries.json").write_text(json.dumps({"edges": edges}))
    out = root / "quality"
    rc = main(
        [
            "quality",
            "--params",
            "params.yaml",
            str(params),
            "--data",
            str(data),
            "--boundaries",
            str(root / "boundaries.json"),
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    return {
        "root": root,
        "params": params,
        "data": data,
        "out": out,
        "lengths": lengths,
        "result": json.loads((out / "quality.json").read_text()),
    }


def test_every_output_is_written_and_sane(stage):
    out, result = stage["out"], stage["result"]
    # data only: the report section and the plot are compare's (analysis.quality_report)
    assert sorted(p.name for p in out.iterdir()) == [
        "curves.json",
        "gradients.json",
        "metrics.json",
        "params.json",
        "quality.json",
    ]
    for name in ("quality.json", "metrics.json", "curves.json", "gradients.json", "params.json"):
        assert (out / name).stat().st_size > 0, name
    assert quality_result.read_quality(out, STRATEGIES) == result  # compare's reader takes the real output
    png = qr.write_plot(result, stage["root"] / "quality.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    # the machine its timings were taken on (lenbatch_study.core.machine), with the stage's own threads
    from lenbatch_study.core.machine import fingerprint

    assert (
        result["machine"]["id"] == fingerprint()["id"] and result["machine"]["threads"] == result["timing"]["threads"]
    )
    assert result["strategies"] == STRATEGIES
    runs = result["runs"]
    assert len(runs) == 2 * len(STRATEGIES)
    # equal useful tokens: every run trained exactly epochs x the training subset
    tokens = {r["useful_tokens"] for r in runs}
    assert tokens == {3 * result["setting"]["train_tokens"]}
    uniform = result["setting"]["uniform_loss"]
    assert uniform == pytest.approx(math.log(result["setting"]["classes"]))
    assert 0 < result["setting"]["unigram_loss"] < uniform  # token frequencies beat uniform
    for r in runs:
        assert len(r["curve_loss"]) == 4 and r["curve_tokens"][0] == 0 and r["curve_tokens"][-1] == r["useful_tokens"]
        assert abs(r["curve_loss"][0] - uniform) < 1.0, r  # a fresh head is near uniform
        assert r["final_heldout_loss"] < r["curve_loss"][0] - 0.3, r  # and it learned
    # seed k starts every strategy from the same weights: identical initial held-out loss
    for k in (0, 1):
        assert len({round(r["curve_loss"][0], 9) for r in runs if r["seed"] == k}) == 1
    metrics = json.loads((out / "metrics.json").read_text())
    for s in STRATEGIES:
        lo, mean, hi = (metrics[f"{s}.heldout_loss.{k}"] for k in ("lo", "mean", "hi"))
        assert lo < mean < hi
        finals = [r["final_heldout_loss"] for r in runs if r["strategy"] == s]
        assert mean == pytest.approx(np.mean(finals), abs=1e-6)
        for ck in ("init", "trained"):
            assert -1 <= metrics[f"{s}.grad_{ck}.cosine_mean"] <= 1
            assert metrics[f"{s}.grad_{ck}.noise_scale"] > 0
            assert metrics[f"{s}.grad_{ck}.variance_per_token"] > 0
        if s != "sorted":
            assert isinstance(metrics[f"{s}.heldout_loss_vs_sorted.beyond_noise"], bool)
    assert len(json.loads((out / "gradients.json").read_text())) == 2 * len(STRATEGIES)
    assert len(json.loads((out / "curves.json").read_text())) == 4 * len(runs)
    report = qr.section(result, tok_s=None)
    assert all(f"| {s} |" in report for s in STRATEGIES) and "seed noise" in report
    t = result["timing"]
    assert 0 < t["features_s"] < t["total_s"] and t["total_cpu_s"] > 0


def test_compare_section_converts_tokens_to_seconds(stage):
    result = stage["result"]
    tok_s = {s: 1000.0 * (i + 1) for i, s in enumerate(STRATEGIES)}  # packed fastest
    ps = qr.per_second(result, tok_s)
    assert ps["seconds"] == pytest.approx(result["setting"]["useful_tokens_per_run"] / 5000.0)
    # the fastest strategy has trained all its tokens by then: its loss is its final loss
    assert ps["loss"]["packed"]["mean"] == pytest.approx(result["summary"]["final"]["packed"]["mean"])
    assert ps["tokens"]["sorted"] == pytest.approx(result["setting"]["useful_tokens_per_run"] / 5)
    text = qr.section(result, tok_s=tok_s)
    assert "per second of training" in text and "| packed | 5,000 |" in text
    assert "held-out loss" in qr.answer_sentence(result, "packed")
    assert "[" in qr.loss_cell(result, "random") and qr.loss_cell(None, "random") == "n/a"
    metrics = qr.flat_metrics(result, tok_s)
    assert metrics["packed.heldout_loss_per_second.mean"] == pytest.approx(ps["loss"]["packed"]["mean"], abs=1e-6)


def test_split_is_fixed_disjoint_and_sized():
    lengths = np.random.default_rng(0).integers(50, 500, size=400)
    tr, ho = split_samples(lengths, train_tokens=20_000, heldout_tokens=5_000, seed=0)
    tr2, ho2 = split_samples(lengths, train_tokens=20_000, heldout_tokens=5_000, seed=0)
    assert np.array_equal(tr, tr2) and np.array_equal(ho, ho2)
    assert not set(tr.tolist()) & set(ho.tolist())
    assert 20_000 <= lengths[tr].sum() < 20_500 and 5_000 <= lengths[ho].sum() < 5_500
    with pytest.raises(ValueError, match="quality.train_tokens"):
        split_samples(lengths, train_tokens=10**7, heldout_tokens=5_000, seed=0)


def test_missing_inputs_are_refused_with_the_fix(stage, tmp_path, capsys):
    rc = main(
        [
            "quality",
            "--params",
            "params.yaml",
            str(stage["params"]),
            "--data",
            str(tmp_path),
            "--boundaries",
            str(stage["root"] / "boundaries.json"),
            "--out",
            str(tmp_path / "q"),
        ]
    )
    assert rc == 2 and "lenbatch tokenize" in capsys.readouterr().err
    rc = main(
        [
            "quality",
            "--params",
            "params.yaml",
            str(stage["params"]),
            "--data",
            str(stage["data"]),
            "--out",
            str(tmp_path / "q"),
        ]
    )
    assert rc == 2 and "--boundaries" in capsys.readouterr().err
    with pytest.raises(ArtifactError, match="rerun: snakemake results/quality/quality.json"):
        quality_result.read_quality(tmp_path, STRATEGIES)


def test_no_quality_conclusion_unless_the_runs_learned(stage):
    """Below the learned criterion the losses say nothing about composition: the answer and the section say what
    to change instead, and no loss is compared (no interval, no seed-noise verdict, no per-second table)."""
    import copy

    result = copy.deepcopy(stage["result"])
    result["summary"]["learned"] = False
    tok_s = {s: 1000.0 * (i + 1) for i, s in enumerate(STRATEGIES)}
    sentence = qr.answer_sentence(result, "packed")
    assert "not met" in sentence and "`quality.epochs`" in sentence and "seed noise" not in sentence
    text = qr.section(result, tok_s=tok_s)
    assert "**not met**" in text and qr.TO_LEARN in text
    assert "seed noise" not in text and "per second of training" not in text and "difference from sorted" not in text
    assert qr.loss_cell(result, "packed") == "not learned"
    # met: the comparison is back
    assert stage["result"]["summary"]["learned"] and "seed noise" in qr.answer_sentence(stage["result"], "packed")
    assert "seed noise" in qr.summary_sentence(stage["result"]) and "not met" in qr.summary_sentence(result)
