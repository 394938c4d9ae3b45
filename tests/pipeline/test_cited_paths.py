"""Every path and test the docs and docstrings cite exists: a moved file or a renamed test leaves no
pointer behind that sends a reader nowhere.

What counts as a citation: a repository path under one of the top-level folders (``src/...``,
``tests/...``, ``docs/...``, ``benchmarks/...``, ``tools/...``, ``workflow/...``, ``configs/...``,
``profiles/...``, ``study/...``) in any tracked Markdown, Python or Snakemake file, optionally followed by
``::test_name`` (a name ending in ``_`` or ``*`` names a family of tests by prefix). A path resolves from
the repository root or, as the docs write them (``stages/train.py``, ``tools/readme.py``), from inside one
of the two packages. ``results/...`` is left out (what a run writes, also under a user's ``results_dir``).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOP = ("src", "tests", "docs", "benchmarks", "tools", "workflow", "configs", "profiles", "study")
CITED = re.compile(r"(?<![\w./$-])((?:" + "|".join(TOP) + r")/[\w./-]*\w)(?:::(\w+\*?))?(?![\\\w])")
PLACES = (REPO, REPO / "src" / "lenbatch_study", REPO / "src" / "lenbatch")
# cited on purpose though not in this repository, each with why
ELSEWHERE = {
    "configs/mine.yaml": "a user's own config, the docs' example of one",
    "tests/trainer/test_trainer_utils.py": "transformers' test suite (its group_by_length tests)",
    "benchmarks/out": "bench_tokenize.py's output folder, made when it runs",
    "benchmarks/out/tokenize": "bench_tokenize.py's output folder, made when it runs",
}


def tracked() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "*.md", "*.py", "*.smk", "Snakefile"], cwd=REPO, text=True, capture_output=True, check=True
    ).stdout.split()
    return [REPO / f for f in out]


def broken(text: str) -> list[str]:
    """Each citation in ``text`` that names nothing (module doc)."""
    bad = []
    for m in CITED.finditer(text):
        path, test = m.group(1), m.group(2)
        if path in ELSEWHERE:
            continue
        where = next((base / path for base in PLACES if (base / path).exists()), None)
        if where is None:
            bad.append(path)
        elif test:
            prefix = test.rstrip("*")
            pattern = rf"def {re.escape(prefix)}\w*\(" if test.endswith(("_", "*")) else rf"def {test}\("
            if where.suffix != ".py" or not re.search(pattern, where.read_text(encoding="utf-8")):
                bad.append(f"{path}::{test}")
    return bad


def test_every_cited_path_and_test_exists():
    files = tracked()
    assert len(files) > 100, "the scan found too few files to mean anything"
    bad = [f"{f.relative_to(REPO)}: {c}" for f in files for c in broken(f.read_text(encoding="utf-8"))]
    assert bad == []


def test_the_checker_finds_a_moved_file_and_a_renamed_test():
    here = "tests/pipeline/test_cited_paths.py"
    gone = "/".join(("tests", "nowhere", "test_gone.py"))  # built, so that this file cites nothing broken itself
    text = (
        f"see `{gone}` and {here}::test_{'renamed'}, but {here}::test_every_cited_ and stages/train.py exist; "
        "a pattern such as src/lenbatch/batching/spec\\.py is no citation"
    )
    assert broken(text) == [gone, f"{here}::test_renamed"]
