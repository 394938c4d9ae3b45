"""Workflow benchmarks: the whole default run, a no-op rerun, and what one key reruns.

    python benchmarks/bench_workflow.py [--dir CHECKOUT] [--no-full]

Runs in CHECKOUT (default: this repository): 1. ``snakemake --cores all`` timed (skip with
--no-full when the default run already finished there), 2. the same again with nothing
changed (target: nothing runs, under 10 s), 3. dry-runs after changing one key of each
kind, listing the rules Snakemake would rerun (target for a training key: train and
compare only).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHANGES = {
    "train.useful_tokens": {"train": {"useful_tokens": 410_000}},
    "boundaries.num_buckets": {"boundaries": {"num_buckets": 8}},
    "profile.repeats": {"profile": {"repeats": 5}},
    "data.max_len": {"data": {"max_len": 2048}},
}


def snakemake(cwd: Path, *args: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(["snakemake", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"snakemake {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return time.perf_counter() - t0, proc.stdout + proc.stderr


def rerun_rules(out: str) -> str:
    if "Nothing to be done" in out:
        return "(nothing)"
    table = out.split("Job stats:")[1]
    counts = re.findall(r"^(\w+)\s+(\d+)$", table, re.M)
    return ", ".join(f"{name} x{n}" for name, n in counts if name not in ("all", "total"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=ROOT, help="checkout to run in")
    parser.add_argument("--no-full", action="store_true", help="skip the full run (already done in --dir)")
    args = parser.parse_args()
    if not args.no_full:
        seconds, _ = snakemake(args.dir, "--cores", "all")
        print(f"whole default run (snakemake --cores all): {seconds:.1f} s ({seconds / 60:.1f} min)")
    seconds, out = snakemake(args.dir, "--cores", "all")
    print(f"second run, nothing changed: {seconds:.2f} s, ran: {rerun_rules(out)}")
    with tempfile.TemporaryDirectory() as tmp:
        for key, change in CHANGES.items():
            path = Path(tmp) / "change.yaml"
            path.write_text(yaml.safe_dump(change))
            _, out = snakemake(args.dir, "-n", "--configfile", str(path))
            print(f"after changing {key}: would rerun {rerun_rules(out)}")


if __name__ == "__main__":
    main()
