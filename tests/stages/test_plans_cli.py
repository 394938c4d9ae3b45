"""The boundaries, plan and plans stage CLIs write exactly the output contract (common.md)."""

import json

import numpy as np
import pytest

from lenbatch_study.cli import main

STRATEGY_KEYS = {
    "padding_efficiency",
    "budget_fill",
    "steps",
    "useful_tokens",
    "computed_tokens",
    "composition_repeat",
    "length_mixing",
}


@pytest.fixture(scope="module")
def lengths(tmp_path_factory):
    d = tmp_path_factory.mktemp("lens")
    x = np.random.default_rng(0).integers(20, 4000, size=800).astype(np.int32)
    np.save(d / "lengths.npy", x)
    return d / "lengths.npy", x


def test_boundaries_plan_plans_chain(lengths, tmp_path):
    path, x = lengths
    b = tmp_path / "boundaries"
    assert (
        main(
            [
                "boundaries",
                "--params",
                "params.yaml",
                "--lengths",
                str(path),
                "--num-buckets",
                "4",
                "--sweep-max-buckets",
                "5",
                "--out",
                str(b),
            ]
        )
        == 0
    )
    doc = json.loads((b / "boundaries.json").read_text())
    assert doc["method"] == "dp" and doc["num_buckets"] == 4 and len(doc["edges"]) == 5
    assert doc["edges"][0] <= x.min() and doc["edges"][-1] > x.max()
    assert abs(doc["predicted_efficiency"] - doc["simulated_efficiency"]) < 0.02
    assert "seconds" not in doc and json.loads((b / "timings.json").read_text())["seconds"]["optimize"] > 0
    assert sum(r["count"] for r in doc["buckets"]) == x.size
    sweep = json.loads((b / "sweep.json").read_text())
    assert [r["num_buckets"] for r in sweep] == [1, 2, 3, 4, 5]
    for r in sweep:
        assert {
            "num_buckets",
            "edges",
            "predicted_efficiency",
            "simulated_efficiency",
            "composition_repeat",
            "length_mixing",
        } <= set(r)
    assert json.loads((b / "params.json").read_text())["boundaries"]["num_buckets"] == 4

    p = tmp_path / "plan"
    assert (
        main(
            [
                "plan",
                "--params",
                "params.yaml",
                "--lengths",
                str(path),
                "--strategy",
                "bucketed",
                "--boundaries",
                str(b / "boundaries.json"),
                "--world-size",
                "2",
                "--rank",
                "1",
                "--out",
                str(p),
            ]
        )
        == 0
    )
    plan = json.loads((p / "plan.json").read_text())
    assert plan["steps"] == len(plan["batches"]) and plan["edges"] == doc["edges"]

    m = tmp_path / "plans"
    assert (
        main(
            [
                "plans",
                "--params",
                "params.yaml",
                "--lengths",
                str(path),
                "--boundaries",
                str(b / "boundaries.json"),
                "--epochs",
                "2",
                "--out",
                str(m),
            ]
        )
        == 0
    )
    metrics = json.loads((m / "metrics.json").read_text())
    assert set(metrics) == {"sorted", "random", "bucketed", "sortish", "packed"}
    timings = json.loads((m / "timings.json").read_text())["plan_seconds"]
    for s, row in metrics.items():
        assert STRATEGY_KEYS <= set(row), s
        assert "plan_seconds" not in row and timings[s] > 0  # a timing is not the plan's: timings.json
        assert row["useful_tokens"] == x.sum()
    assert metrics["sorted"]["composition_repeat"] == 1.0
    assert metrics["packed"]["padding_efficiency"] == 1.0
    assert (
        metrics["sorted"]["padding_efficiency"]
        > metrics["bucketed"]["padding_efficiency"]
        > metrics["random"]["padding_efficiency"]
    )
    assert metrics["bucketed"]["padding_efficiency"] == pytest.approx(doc["simulated_efficiency"], abs=0.02)


def test_seed_profile_boundaries_without_sweep(tmp_path):
    assert (
        main(
            [
                "boundaries",
                "--params",
                "params.yaml",
                "--seed-profile",
                "--seed-profile-size",
                "20000",
                "--method",
                "coordinate",
                "--objective",
                "study",
                "--token-budget",
                "49152",
                "--sweep-max-buckets",
                "0",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    doc = json.loads((tmp_path / "boundaries.json").read_text())
    assert doc["objective"] == "study" and doc["token_budget"] == 49152 and doc["history"]
    assert json.loads((tmp_path / "sweep.json").read_text()) == []


def test_bad_input_is_one_line_exit_2(lengths, tmp_path, capsys):
    path, _ = lengths
    rc = main(
        ["plan", "--params", "params.yaml", "--lengths", str(path), "--strategy", "bucketed", "--out", str(tmp_path)]
    )
    assert rc == 2 and "needs bucket edges; pass --boundaries" in capsys.readouterr().err
    rc = main(
        ["plans", "--params", "params.yaml", "--lengths", str(path), "--token-budget", "1000", "--out", str(tmp_path)]
    )
    assert rc == 2 and "token_budget" in capsys.readouterr().err
    rc = main(
        ["boundaries", "--params", "params.yaml", "--lengths", str(tmp_path / "missing.npy"), "--out", str(tmp_path)]
    )
    assert rc == 2 and "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("stage", ["stats", "boundaries", "plan", "plans"])
def test_every_flag_has_help(stage, capsys):
    import argparse

    from lenbatch_study.cli import FLAGS

    parser = argparse.ArgumentParser()
    FLAGS[stage](parser)
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert action.help, f"{stage} {action.option_strings} has no help"
    numeric = [a for a in parser._actions if a.type is int]
    assert all(any(u in a.help for u in ("tokens", "count", "seed", "rank", "epoch")) for a in numeric), stage


def test_plans_of_bucketed_without_boundaries_fail(lengths, tmp_path, capsys):
    """Issue 11.9: it used to exit 0 with {} in metrics.json."""
    path, _ = lengths
    rc = main(
        [
            "plans",
            "--params",
            "params.yaml",
            "--lengths",
            str(path),
            "--strategies",
            "bucketed",
            "--epochs",
            "2",
            "--out",
            str(tmp_path / "m"),
        ]
    )
    assert rc == 2 and "strategy 'bucketed' needs bucket edges; pass --boundaries" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()
    # all strategies by default: bucketed is skipped (logged) when no edges are given, as before
    assert (
        main(
            ["plans", "--params", "params.yaml", "--lengths", str(path), "--epochs", "2", "--out", str(tmp_path / "m")]
        )
        == 0
    )
    assert set(json.loads((tmp_path / "m" / "metrics.json").read_text())) == {"sorted", "random", "sortish", "packed"}
