"""The whole DAG for real, on configs/tiny.yaml merged into params.yaml: Snakemake runs every stage
(real tokenizer, real data, real torchrun), a second run does nothing, one training key reruns only
train and compare, DVC runs an experiment through Snakemake and diffs its metrics without either
tool going stale, and an interrupted run resumes without redoing finished outputs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from lenbatch.config import deep_merge
from test_workflow import ENV, ROOT, copy_workflow, job_counts, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    work = copy_workflow(tmp_path_factory.mktemp("e2e"))
    merged = deep_merge(yaml.safe_load((work / "params.yaml").read_text()),
                        yaml.safe_load((work / "configs/tiny.yaml").read_text()))
    (work / "params.yaml").write_text(yaml.safe_dump(merged, sort_keys=False))
    run(["snakemake", "--cores", "2"], cwd=work, timeout=900)
    return work


def test_every_stage_wrote_its_outputs(finished):
    strategies = yaml.safe_load((finished / "params.yaml").read_text())["train"]["strategies"]
    for path in ("results/tokenize/lengths.npy", "results/stats/stats.json", "results/boundaries/sweep.json",
                 "results/plans/metrics.json", "results/profile/grid.json", "results/compare/report.md"):
        assert (finished / path).stat().st_size > 0, path
    for strategy in strategies:
        summary = json.loads((finished / f"results/train/{strategy}/summary.json").read_text())
        assert summary["useful_tokens_per_s"] > 0
    metrics = json.loads((finished / "results/compare/metrics.json").read_text())
    for strategy in strategies:
        assert any(key.startswith(strategy) for key in metrics), f"{strategy} missing from compare metrics"
    report = (finished / "results/compare/report.md").read_text()
    assert all(s in report for s in strategies)
    # every rule logged and benchmarked itself
    assert (finished / "logs/tokenize.log").exists() and (finished / "logs/benchmarks/train/packed.tsv").exists()


def test_second_run_does_nothing(finished):
    out = run(["snakemake", "-n"], cwd=finished).stdout
    assert "Nothing to be done" in out


def test_one_training_key_reruns_train_and_compare_only(finished, tmp_path):
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump({"train": {"useful_tokens": 6500}}))
    out = run(["snakemake", "-n", "--configfile", str(changed)], cwd=finished).stdout
    counts = job_counts(out)
    assert counts.pop("train") == 5 and counts.pop("compare") == 1
    assert set(counts) <= {"all", "total"}, counts


def test_one_boundary_key_spares_the_other_strategies(finished, tmp_path):
    changed = tmp_path / "k.yaml"
    changed.write_text(yaml.safe_dump({"boundaries": {"num_buckets": 2}}))
    out = run(["snakemake", "-n", "--configfile", str(changed)], cwd=finished).stdout
    counts = job_counts(out)
    assert counts.get("boundaries") == 1 and counts.get("train") == 1 and "tokenize" not in counts
    assert "strategy=bucketed" in out and "strategy=sorted" not in out


def test_dvc_experiment_runs_through_snakemake_and_diffs_metrics(finished):
    """dvc repro records the finished run without rerunning it; dvc exp run -S K reruns the bucketed
    branch (through Snakemake), dvc metrics diff shows the change, and neither tool is left stale."""
    shutil.copy2(ROOT / ".gitignore", finished / ".gitignore")
    for args in (["git", "init", "-q"], ["git", "config", "user.email", "ci@lenbatch"],
                 ["git", "config", "user.name", "lenbatch ci"], ["dvc", "init", "-q"],
                 ["git", "add", "-A"], ["git", "commit", "-qm", "finished tiny run"]):
        run(args, cwd=finished)
    summary = finished / "results/train/sorted/summary.json"
    before = summary.stat().st_mtime_ns
    run(["dvc", "repro"], cwd=finished, timeout=600)
    assert summary.stat().st_mtime_ns == before, "dvc repro reran a finished stage"
    run(["git", "add", "-A"], cwd=finished)
    run(["git", "commit", "-qm", "dvc.lock"], cwd=finished)
    run(["dvc", "exp", "run", "-S", "boundaries.num_buckets=2"], cwd=finished, timeout=900)
    diff = json.loads(run(["dvc", "metrics", "diff", "--json"], cwd=finished).stdout)
    assert diff["results/boundaries/boundaries.json"]["num_buckets"] == {"old": 3, "new": 2, "diff": -1}
    changed = diff["results/compare/metrics.json"]
    assert any(k.startswith("bucketed.") for k in changed), changed
    assert summary.stat().st_mtime_ns == before, "the experiment retrained a strategy that ignores K"
    assert "up to date" in run(["dvc", "status"], cwd=finished).stdout
    assert "Nothing to be done" in run(["snakemake", "-n"], cwd=finished).stdout
    run(["git", "checkout", "-q", "--", "."], cwd=finished)  # back to K = 3 for the next test
    run(["snakemake", "--cores", "2"], cwd=finished, timeout=900)


def test_interrupted_run_resumes_without_redoing_finished_outputs(finished, tmp_path):
    # Invalidate training (a new key value), start the rerun, kill it mid-way, then resume.
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump({"train": {"useful_tokens": 6200}}))
    args = ["snakemake", "--cores", "2", "--configfile", str(changed)]
    lengths = finished / "results/tokenize/lengths.npy"
    before = lengths.stat().st_mtime_ns
    proc = subprocess.Popen(args, cwd=finished, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and not list((finished / ".snakemake/incomplete").glob("*")):
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, or SLURM's stop signal, mid-job
    proc.wait(timeout=120)
    assert proc.returncode != 0, "the run finished before it could be interrupted"
    out = run([*args, "--rerun-incomplete"], cwd=finished, timeout=900)
    assert out.returncode == 0
    assert lengths.stat().st_mtime_ns == before, "a finished output was redone"
    assert "Nothing to be done" in run(["snakemake", "-n", "--configfile", str(changed)], cwd=finished).stdout
