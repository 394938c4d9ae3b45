"""The workflow as users meet it: real Snakemake dry-runs, params refused before any rule, DVC on a fresh clone."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
STAGES = ["tokenize", "stats", "boundaries", "plans", "profile", "train", "quality", "compare"]


def run(args, cwd=ROOT, timeout=300, check=True):
    proc = subprocess.run(args, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def job_counts(dry_run_output: str) -> dict[str, int]:
    """Parse Snakemake's 'Job stats' table of a dry-run."""
    table = dry_run_output.split("Job stats:")[1]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


def copy_workflow(dest: Path) -> Path:
    """A working copy of the workflow files in ``dest`` (results and logs left behind)."""
    for name in ("Snakefile", "params.yaml", "dvc.yaml"):
        shutil.copy2(ROOT / name, dest / name)
    for name in ("workflow", "profiles", "configs", "src"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return copy_workflow(tmp_path_factory.mktemp("wf"))


@pytest.mark.parametrize(
    "extra",
    [[], ["--workflow-profile", "profiles/slurm"], ["--workflow-profile", "profiles/slurm", "--configfile",
                                                    "configs/qwen3.6-27b-8gpu.yaml"],
     ["--configfile", "configs/qwen3.6-27b-8gpu.yaml"]],
    ids=["default", "slurm", "slurm-27b-8gpu", "default-27b-8gpu"],
)
def test_dry_run_plans_every_stage_and_strategy(work, extra):
    out = run(["snakemake", "-n", *extra], cwd=work).stdout
    counts = job_counts(out)
    for stage in STAGES:
        assert counts.get(stage, 0) >= 1, f"{stage} missing from the DAG: {counts}"
    assert counts["train"] == 5
    if "configs/qwen3.6-27b-8gpu.yaml" in extra:
        assert "--nproc_per_node 8" in out and '"token_budget": 49152' in out
    else:
        assert "--nproc_per_node 2" in out and '"token_budget": 16384' in out
    if "profiles/slurm" in extra:
        assert "slurm_partition=gpu" in out
        if "configs/qwen3.6-27b-8gpu.yaml" in extra:
            assert re.search(r"rule train:(.|\n)*?resources:.*gpu=8", out)


def test_every_rule_has_log_and_benchmark():
    text = "".join(p.read_text() for p in (ROOT / "workflow/rules").glob("*.smk"))
    rules = re.findall(r"^rule (\w+):", text, re.M)
    assert set(STAGES) <= set(rules)
    for block in re.split(r"^rule ", text, flags=re.M)[1:]:
        name = block.split(":")[0]
        assert "\n    log:" in block, f"rule {name} has no log:"
        assert "\n    benchmark:" in block, f"rule {name} has no benchmark:"
        assert "\n    params:" in block, f"rule {name} takes no params:"


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"boundaries": {"num_bucket": 8}}, ["boundaries.num_bucket", "num_buckets"]),
        ({"batching": {"token_budget": "lots"}}, ["batching.token_budget", "integer"]),
        ({"train": {"strategies": ["sorted", "zigzag"]}}, ["train.strategies", "zigzag"]),
    ],
)
def test_bad_params_are_refused_before_any_rule_runs(work, tmp_path, bad, words):
    override = tmp_path / "bad.yaml"
    override.write_text(yaml.safe_dump(bad))
    proc = run(["snakemake", "-n", "--configfile", str(override)], cwd=work, check=False)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    for word in words:
        assert word in text
    assert "rule tokenize" not in text


def test_dvc_status_and_dry_repro_on_a_fresh_clone(tmp_path):
    """DVC reads the pipeline on a fresh clone: every stage is known, and a dry repro names them."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(ROOT), str(clone)])
    status = run(["dvc", "status"], cwd=clone)
    assert "ERROR" not in status.stdout + status.stderr
    dry = run(["dvc", "repro", "--dry"], cwd=clone).stdout
    for stage in ["tokenize", "stats", "boundaries", "plans", "profile", "train@sorted", "train@packed", "quality",
                  "compare"]:
        assert f"'{stage}'" in dry, f"stage {stage} missing from dvc repro --dry:\n{dry}"
    assert "snakemake --cores all" in dry
