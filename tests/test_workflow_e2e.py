"""The whole DAG for real, on configs/tiny.yaml: Snakemake runs every stage (real tokenizer, real data,
real torchrun), a second run does nothing, one training key reruns only train and compare, an
interrupted run resumes with --rerun-incomplete without redoing finished outputs, and DVC agrees."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from test_workflow import ENV, copy_workflow, job_counts, run

pytestmark = pytest.mark.slow
TINY = ["--configfile", "configs/tiny.yaml"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    work = copy_workflow(tmp_path_factory.mktemp("e2e"))
    run(["snakemake", "--cores", "2", *TINY], cwd=work, timeout=900)
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
    out = run(["snakemake", "-n", *TINY], cwd=finished).stdout
    assert "Nothing to be done" in out


def test_one_training_key_reruns_train_and_compare_only(finished, tmp_path):
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump({"train": {"useful_tokens": 6500}}))
    out = run(["snakemake", "-n", *TINY, str(changed)], cwd=finished).stdout
    counts = job_counts(out)
    assert counts.pop("train") == 5 and counts.pop("compare") == 1
    assert set(counts) <= {"all", "total"}, counts


def test_one_boundary_key_spares_the_other_strategies(finished, tmp_path):
    changed = tmp_path / "k.yaml"
    changed.write_text(yaml.safe_dump({"boundaries": {"num_buckets": 2}}))
    out = run(["snakemake", "-n", *TINY, str(changed)], cwd=finished).stdout
    counts = job_counts(out)
    assert counts.get("boundaries") == 1 and counts.get("train") == 1 and "tokenize" not in counts
    assert "strategy=bucketed" in out and "strategy=sorted" not in out


def test_interrupted_run_resumes_without_redoing_finished_outputs(finished, tmp_path):
    # Invalidate training (a new key value), start the rerun, kill it mid-way, then resume.
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump({"train": {"useful_tokens": 6200}}))
    args = ["snakemake", "--cores", "2", *TINY, str(changed)]
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
    assert "Nothing to be done" in run(["snakemake", "-n", *TINY, str(changed)], cwd=finished).stdout
