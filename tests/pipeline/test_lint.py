"""The linter's and the formatter's verdict on the tree (pyproject.toml's [tool.ruff]): no undefined name,
unused import or other pyflakes/pycodestyle error in the package, the tests, the benchmarks and the tools,
and every file as ``ruff format`` writes it (``make format`` rewrites them). It found an
undefined name on a real path (the coordinate sweep's top edge, tests/batching/test_boundaries.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def ruff(*args: str, cwd: Path = REPO, command: str = "check") -> subprocess.CompletedProcess:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert exe, "ruff is missing from this environment: make install (study's [dev] extra) puts it in the venv"
    return subprocess.run([exe, command, "--no-cache", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_tree_passes_the_linter():
    done = ruff("src", "tests", "benchmarks", "tools")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_the_linter_fails_on_an_undefined_name(tmp_path):
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    (tmp_path / "bad.py").write_text("def top(values):\n    return x.max()\n")
    done = ruff("bad.py", cwd=tmp_path)
    assert done.returncode == 1 and "F821" in done.stdout, done.stdout


def test_the_tree_is_formatted():
    done = ruff("--check", "src", "tests", "benchmarks", "tools", command="format")
    assert done.returncode == 0, "run `make format`:\n" + done.stdout[-4000:] + done.stderr[-2000:]


def test_the_format_check_fails_on_an_unformatted_file(tmp_path):
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    (tmp_path / "ugly.py").write_text("x = {  'a':1 }\n")
    done = ruff("--check", "ugly.py", cwd=tmp_path, command="format")
    assert done.returncode == 1 and "ugly.py" in done.stdout, done.stdout
