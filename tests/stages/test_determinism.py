"""Deterministic stages give identical bytes (issue 19.0): stats, boundaries and plans run twice, in two
processes writing two folders, write the same bytes in every file but timings.json, so DVC's content
hashes skip what did not change. (The tokenize stage's twin runs are in test_data_stage.py.)"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]

# One interpreter runs the three stages the way the workflow's rules do (relative paths from the run folder).
SCRIPT = """
import sys
from lenbatch_study.cli import main
P = ["--params", sys.argv[1]]
for args in (["stats", "--lengths", "lengths.npy", "--out", "stats"],
             ["boundaries", "--lengths", "lengths.npy", "--num-buckets", "3", "--sweep-max-buckets", "4",
              "--out", "boundaries"],
             ["plans", "--lengths", "lengths.npy", "--boundaries", "boundaries/boundaries.json", "--epochs", "2",
              "--out", "plans"]):
    assert main([args[0], *P, *args[1:]]) == 0, args
"""


def _sha256_of_files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_stats_boundaries_and_plans_give_identical_bytes_in_two_processes(tmp_path):
    """~6 s CPU per interpreter (sortish imports torch and transformers); the two run side by side."""
    x = np.random.default_rng(0).integers(20, 4000, size=600).astype(np.int32)
    procs = []
    for name in ("a", "b"):
        work = tmp_path / name
        work.mkdir()
        np.save(work / "lengths.npy", x)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", SCRIPT, str(REPO / "params.yaml")],
                cwd=work,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    a, b = (_sha256_of_files(tmp_path / name) for name in ("a", "b"))
    timings = {k for k in a if k.endswith("timings.json")}
    assert timings == {"boundaries/timings.json", "plans/timings.json"}
    for key in timings:  # the machine's seconds live here, and only here
        assert json.loads((tmp_path / "a" / key).read_text())
        a.pop(key), b.pop(key)
    assert {
        "stats/stats.json",
        "stats/histogram.json",
        "stats/histogram.png",
        "boundaries/boundaries.json",
        "boundaries/sweep.json",
        "plans/metrics.json",
    } <= set(a)
    differ = sorted(k for k in a if a[k] != b.get(k))
    assert not differ and set(a) == set(b), f"files whose bytes differ between two runs: {differ}"
    for key in ("boundaries/boundaries.json", "plans/metrics.json"):
        assert "seconds" not in (tmp_path / "a" / key).read_text(), key
