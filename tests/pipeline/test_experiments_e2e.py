"""A user's experiment on a user's data, for real: a small JSONL of chats in OpenAI ``messages`` format
(written here), the tiny setting with three strategies in params.yaml, then `dvc exp run -S
'train.strategies=[sorted,packed]'` from nothing. DVC trains exactly the two listed strategies (the
trainings are a foreach over the param), compare's report, metrics and plots cover those two, and
afterwards `dvc status` and `snakemake -n` agree that nothing is left to do. The plots page that
`lenbatch plots` writes from it is rendered in a real headless Chromium (tests/pipeline/_browser.py).

All in one file (one experiment, built once per xdist worker; a few minutes on 2 cores)."""

from __future__ import annotations

import csv
import io
import json
import random
import re
import shutil

import pytest
import yaml

from lenbatch_study.analysis.report import MAX_METRIC_NUMBERS
from lenbatch_study.core.config import deep_merge
from _e2e import git_commit
from test_workflow import ROOT, copy_workflow, run

pytestmark = pytest.mark.slow

LISTED = ["sorted", "bucketed", "packed"]  # params.yaml's list before the experiment
TRAINED = ["sorted", "packed"]  # what the experiment asks for


def write_chats(path, n: int = 64, seed: int = 0) -> None:
    """``n`` chats in OpenAI ``messages`` format (system, then 1-3 user/assistant exchanges), lengths spread
    over two orders of magnitude so the strategies pad differently."""
    rng = random.Random(seed)
    words = "batch token length padding bucket sorted packed drafter target model row budget".split()
    with open(path, "w") as fh:
        for i in range(n):
            turns = [{"role": "system", "content": "You are a helpful assistant."}]
            for _ in range(rng.randint(1, 3)):
                turns.append({"role": "user", "content": " ".join(rng.choices(words, k=rng.randint(3, 40)))})
                turns.append(
                    {
                        "role": "assistant",
                        "content": " ".join(rng.choices(words, k=int(rng.lognormvariate(3.5, 1.0)) + 2)),
                    }
                )
            fh.write(json.dumps({"id": f"chat-{i}", "messages": turns}) + "\n")


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """The user's repo after `dvc exp run -n two -S train.strategies=[sorted,packed]`: (repo, its output)."""
    work = copy_workflow(tmp_path_factory.mktemp("exp"))
    (work / "data").mkdir()
    write_chats(work / "data" / "chats.jsonl")
    merged = deep_merge(
        yaml.safe_load((work / "params.yaml").read_text()), yaml.safe_load((work / "configs/tiny.yaml").read_text())
    )
    merged.pop("results_dir")
    merged["data"].update(source="data/chats.jsonl", limit=None)
    merged["train"]["strategies"] = LISTED
    merged["quality"].update(train_tokens=5000, heldout_tokens=2000)  # fits the ~13k tokens of the chats
    (work / "params.yaml").write_text(yaml.safe_dump(merged, sort_keys=False))
    shutil.copy2(ROOT / ".gitignore", work / ".gitignore")
    for args in (
        ["git", "init", "-q"],
        ["git", "config", "user.email", "ci@lenbatch"],
        ["git", "config", "user.name", "lenbatch ci"],
        ["dvc", "init", "-q"],
    ):
        run(args, cwd=work)
    for name in ("config", ".gitignore"):
        shutil.copy2(ROOT / ".dvc" / name, work / ".dvc" / name)
    git_commit(work, "my chats, three strategies")
    out = run(
        ["dvc", "exp", "run", "-n", "two", "-S", f"train.strategies=[{','.join(TRAINED)}]"], cwd=work, timeout=1800
    )
    return work, out.stdout + out.stderr


def test_the_experiment_trained_exactly_the_two_listed_strategies(experiment):
    work, text = experiment
    ran = re.findall(r"Running stage '([\w@-]+)'", text)
    assert sorted(s for s in ran if s.startswith("train")) == sorted(f"train@{s}" for s in TRAINED), text
    assert sorted(p.name for p in (work / "results/train").iterdir()) == sorted(TRAINED)
    for s in TRAINED:
        assert json.loads((work / f"results/train/{s}/summary.json").read_text())["useful_tokens_per_s"] > 0
    assert yaml.safe_load((work / "params.yaml").read_text())["train"]["strategies"] == TRAINED
    stats = json.loads((work / "results/tokenize/stats.json").read_text())
    assert "data/chats.jsonl" in json.dumps(stats)  # the user's file, not the shipped corpus


def test_report_metrics_and_plots_cover_the_two(experiment):
    work, _ = experiment
    compare = work / "results/compare"
    metrics = json.loads((compare / "metrics.json").read_text())
    assert {k.split(".")[0] for k in metrics if k.endswith(".measured_tok_s")} == set(TRAINED), metrics
    assert not [k for k in metrics if k.split(".")[0] in ("random", "sortish", "bucketed")], metrics
    numbers = [v for v in metrics.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    assert len(numbers) <= MAX_METRIC_NUMBERS, metrics
    # the verdict always; a recommended strategy (or a tie of trained ones) only when the ratios in turns settle it
    assert metrics["verdict"] in ("use", "tie", "not settled"), metrics
    if metrics["verdict"] == "use":
        assert metrics["recommended.strategy"] in TRAINED, metrics
    elif metrics["verdict"] == "tie":
        assert set(metrics["recommended.tie"].split(", ")) <= set(TRAINED), metrics
    else:
        assert not [k for k in metrics if k.startswith("recommended.")], metrics
    throughput = json.loads((compare / "throughput.json").read_text())
    assert sorted(r["strategy"] for r in throughput) == sorted(TRAINED)
    frontier = json.loads((compare / "frontier.json").read_text())
    assert {r["name"] for r in frontier if r["kind"] == "strategy"} == set(TRAINED)
    report = (compare / "report.md").read_text()
    every = report.split("## Every strategy", 1)[1].split("\n\n")[1]  # that section's table
    named = [ln.split("|")[1].strip() for ln in every.splitlines()[2:]]
    assert named == TRAINED, every


def test_both_tools_agree_after_the_experiment(experiment):
    work, _ = experiment
    status = json.loads(run(["dvc", "status", "--json"], cwd=work).stdout or "{}")
    assert {k: v for k, v in status.items() if v != ["always changed"]} == {}, status
    assert "Nothing to be done" in run(["snakemake", "-n"], cwd=work).stdout


def test_exp_show_lists_the_changed_param_within_a_readable_table(experiment):
    """`dvc exp show --only-changed`: the param the user changed is among the first columns' few, the
    metrics declared to DVC are the headline (at most 40 numbers: test_compare counts them per strategy)."""
    work, _ = experiment
    # the commit before the experiment holds no results, so every dependency's hash shows as changed here;
    # dropped, the table is the experiment's metrics and the param it changed
    drop = ["--drop", r"^(results|src|configs)/"]
    shown = run(["dvc", "exp", "show", "--only-changed", *drop, "--csv"], cwd=work).stdout
    columns = next(csv.reader(io.StringIO(shown)))
    print("\n" + run(["dvc", "exp", "show", "--only-changed", *drop, "--md"], cwd=work).stdout)
    metrics = json.loads((work / "results/compare/metrics.json").read_text())
    # the numbers and the strategy's name
    assert set(metrics) <= set(columns) and len(metrics) <= MAX_METRIC_NUMBERS + 1, columns
    assert "train.strategies" in columns and len(columns) <= len(metrics) + 6, columns


def test_every_interactive_plot_draws_its_marks_in_a_real_browser(experiment, tmp_path):
    """`lenbatch plots` (dvc plots diff, Vega inlined) rendered by headless Chromium: throughput is one bar per
    trained strategy on a categorical axis, the frontier unconnected points (the strategies and every K of
    the sweep) with a label per strategy, the histogram a bar per bin and a rule per inner bucket edge."""
    from _browser import dump_dom, marks_per_plot, screenshot

    work, _ = experiment
    run(["lenbatch", "plots", "--out", str(tmp_path / "plots")], cwd=work)
    page = tmp_path / "plots" / "index.html"
    marks = marks_per_plot(dump_dom(page))
    bins = json.loads((work / "results/stats/histogram.json").read_text())
    edges = json.loads((work / "results/boundaries/boundaries.json").read_text())["edges"]
    sweep = json.loads((work / "results/boundaries/sweep.json").read_text())
    assert marks["results_compare_throughput_json"] == {"rect": len(TRAINED)}, marks
    assert marks["results_compare_frontier_json"] == {"symbol": len(TRAINED) + len(sweep), "text": len(TRAINED)}, marks
    assert marks["results_compare_histogram_json"] == {"rect": len(bins), "rule": len(edges) - 2}, marks
    screenshot(page, tmp_path / "plots.png")
    assert (tmp_path / "plots.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
