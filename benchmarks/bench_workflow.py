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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
# one key of each kind, each changed to its params.yaml value + 1 (a fixed value can equal the shipped one,
# and then the dry run shows nothing to rerun for a change that never happened)
CHANGED_KEYS = ("train.useful_tokens", "boundaries.num_buckets", "profile.repeats", "data.max_len")


def change(cwd: Path, key: str) -> dict:
    """``key`` at its value in ``cwd``'s params.yaml plus one, as a config override."""
    section, name = key.split(".")
    value = yaml.safe_load((cwd / "params.yaml").read_text())[section][name]
    assert isinstance(value, int), f"{key} is {value!r}: only an integer key is changed by + 1"
    return {section: {name: value + 1}}


def snakemake(cwd: Path, *args: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(["snakemake", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"snakemake {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return time.perf_counter() - t0, proc.stdout + proc.stderr


def pending(cwd: Path, *args: str) -> str:
    """The jobs Snakemake plans, per rule, from its ``--summary`` table (a public, tab-separated format:
    output_file, date, rule, log-file(s), status, plan; one row per output, so a job is a rule and its logs)."""
    _, out = snakemake(cwd, "--summary", *args)
    rows = [line.split("\t") for line in out.splitlines() if line.count("\t") >= 5]
    header = rows[0] if rows and rows[0][0] == "output_file" else None
    if header is None:
        sys.exit(f"snakemake --summary printed no table:\n{out}")
    col = {name: i for i, name in enumerate(header)}
    jobs: dict[str, set[str]] = {}
    for row in rows[1:]:
        if row[col["plan"]] != "no update" and row[col["rule"]] != "all":
            jobs.setdefault(row[col["rule"]], set()).add(row[col["log-file(s)"]])
    return ", ".join(f"{rule} x{len(logs)}" for rule, logs in sorted(jobs.items())) or "(nothing)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=ROOT, help="checkout to run in")
    parser.add_argument("--no-full", action="store_true", help="skip the full run (already done in --dir)")
    args = parser.parse_args()
    if not args.no_full:
        seconds, _ = snakemake(args.dir, "--cores", "all")
        print(f"whole default run (snakemake --cores all): {seconds:.1f} s ({seconds / 60:.1f} min)")
    planned = pending(args.dir)
    seconds, _ = snakemake(args.dir, "--cores", "all")
    print(f"second run, nothing changed: {seconds:.2f} s, ran: {planned}")
    with tempfile.TemporaryDirectory() as tmp:
        for key in CHANGED_KEYS:
            path = Path(tmp) / "change.yaml"
            path.write_text(yaml.safe_dump(change(args.dir, key)))
            print(f"after changing {key}: would rerun {pending(args.dir, '--configfile', str(path))}")


if __name__ == "__main__":
    main()
