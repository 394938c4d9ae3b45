"""``lenbatch sync``: tell Snakemake what DVC verified, so ``snakemake -n`` and ``dvc status`` agree.

DVC decides by content: ``dvc.lock`` (in git) holds the md5 of every stage's deps and outputs, so a
fresh clone, or a ``git checkout`` followed by ``dvc checkout``, knows which results belong to which
code and params. Snakemake decides by its own records in ``.snakemake/metadata`` (not in git): the
params, shell command and sha256 of every input (files up to 1 MB) of the job that made each
output; an input newer than an output reruns the job only if its checksum differs from the
recorded one. A fresh clone has no records, so the checkout's file times decide (every ``src/``
file is newer than ``results/``: git writes in path order) and Snakemake plans stages DVC
calls up to date; after a checkout the records are those of another commit's params and code.

This command runs ``dvc status``, then ``snakemake --touch`` for every job except those of the
stages DVC names as changed and everything downstream of them (``--omit-from`` their outputs):
touch marks a job's outputs up to date and records them (params, code, input checksums) without
running anything. That is truthful because DVC has just checked that those outputs belong to the
current deps and params, byte for byte. Stages DVC names stay unrecorded, so ``snakemake -n`` plans
them and what follows them, as ``dvc repro`` would when their outputs change. ``make run`` runs
it after ``dvc repro``; run it after ``dvc checkout`` (or ``dvc exp apply``) too.

It never records a job Snakemake marks incomplete (an interrupted run): touch then stops with
Snakemake's error, and the fix is to finish the run (``snakemake --cores all`` or ``dvc repro``).

Cost: one ``dvc status`` (hashes changed files; the tokenized dataset once after it is rewritten)
and one Snakemake DAG build; nothing is run or rewritten (outputs' times are touched).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


ALWAYS_CHANGED = "always changed"


def changed_stages(status: dict[str, Any]) -> list[str]:
    """Stage names in ``dvc status --json`` output (keys may carry ``dvc.yaml:``), in DVC's order; a stage
    DVC names only because it is ``always_changed`` (the machine fingerprint: its command leaves the file
    as it is unless the machine changed) is not changed."""
    return [name.split(":")[-1] for name, what in status.items() if what != [ALWAYS_CHANGED]]


def resolve_stage(dvc_yaml: dict[str, Any], name: str) -> dict[str, Any] | None:
    """Stage ``name`` of a parsed ``dvc.yaml``: a plain stage as written, ``<stage>@<key>`` of a ``foreach``
    stage its ``do:`` body with ``${item}`` replaced by ``key`` (the form ``lenbatch dvc-yaml`` writes:
    ``${item}`` in paths only); None when not defined. Cost: one walk of the body."""
    defined = dvc_yaml.get("stages", {})
    if name in defined and "do" not in defined[name]:
        return defined[name]
    base, at, key = name.partition("@")
    if not at or "do" not in defined.get(base, {}):
        return None

    def sub(x: Any) -> Any:
        if isinstance(x, str):
            return x.replace("${item}", key)
        if isinstance(x, list):
            return [sub(v) for v in x]
        if isinstance(x, dict):
            return {sub(k): sub(v) for k, v in x.items()}
        return x

    return sub(defined[base]["do"])


def stage_outputs(dvc_yaml: dict[str, Any], stages: list[str]) -> list[str]:
    """Every output path (``outs``, ``metrics``, ``plots``) of ``stages`` (``train@sorted`` for a foreach
    stage's) in a parsed ``dvc.yaml``."""
    resolved = {s: resolve_stage(dvc_yaml, s) for s in stages}
    unknown = [s for s, st in resolved.items() if st is None]
    if unknown:  # e.g. another dvc.yaml: say so rather than record it
        raise ValueError(f"dvc status names stages {unknown} that dvc.yaml does not define; sync handles the "
                         "stages of ./dvc.yaml only (run `lenbatch dvc-yaml` if it is stale)")
    paths = []
    for name in stages:
        for kind in ("outs", "metrics", "plots"):
            for out in resolved[name].get(kind, []):
                paths.append(next(iter(out)) if isinstance(out, dict) else str(out))
    return paths


def run(*, dry_run: bool = False) -> int:
    """``lenbatch sync``: record in Snakemake's metadata every job whose stage DVC verified up to date
    (see the module doc); ``dry_run``: say what would be recorded. Returns 0, or the failing tool's code."""
    import yaml

    root = Path.cwd()
    for name in ("dvc.yaml", "Snakefile"):
        if not (root / name).is_file():
            raise ValueError(f"{root / name} does not exist: run lenbatch sync in the workflow's folder "
                             "(the repo root)")
    status = subprocess.run(["dvc", "status", "--json"], capture_output=True, text=True)
    if status.returncode != 0:
        print(f"lenbatch sync: `dvc status` failed ({status.returncode}):\n{status.stdout}{status.stderr}",
              file=sys.stderr)
        return status.returncode
    stale = changed_stages(json.loads(status.stdout or "{}"))
    omit = stage_outputs(yaml.safe_load((root / "dvc.yaml").read_text()), stale)
    # Snakemake's own defaults, not the workflow profile: its rerun-incomplete would let touch declare an
    # interrupted job's outputs complete; without it Snakemake refuses incomplete outputs.
    cmd = ["snakemake", "--touch", "--workflow-profile", "none", "--cores", "1", *(["-n"] if dry_run else [])]
    if omit:
        cmd += ["--omit-from", *omit]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    if proc.returncode != 0:
        # Snakemake's own message says why; its wording is not ours to parse, so the usual cause is named always
        print(f"lenbatch sync: {' '.join(cmd)} failed ({proc.returncode}):\n{text}\nlenbatch sync: where Snakemake "
              "names incomplete outputs (an interrupted run), finish that run first (snakemake --cores all, or "
              "dvc repro), then sync", file=sys.stderr)
        return proc.returncode
    verb = "would record" if dry_run else "recorded"
    print(f"lenbatch sync: DVC names {len(stale)} stage(s) as changed{': ' + ', '.join(stale) if stale else ''}; "
          f"{verb} every other Snakemake job as up to date (snakemake --touch).", file=sys.stderr)
    if stale:
        print("lenbatch sync: snakemake -n plans those stages and everything downstream of them; dvc repro reruns "
              "those and, where their outputs change, what follows.", file=sys.stderr)
    return 0
