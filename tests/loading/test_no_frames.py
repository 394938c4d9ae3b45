"""The library reads no call frames: what it knows of its caller is what the caller passes (DESIGN.md "The
library in other people's loops"). Frame inspection breaks under other interpreters, wrappers and
refactors of the loops it guesses at, so its return must fail here."""

from __future__ import annotations

import ast
from pathlib import Path

import lenbatch

FRAME_NAMES = {"_getframe", "f_locals", "f_back", "f_globals", "currentframe", "getouterframes", "getframeinfo"}


def _frame_uses(path: Path) -> list[str]:
    hits = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        name = node.attr if isinstance(node, ast.Attribute) else node.name if isinstance(node, ast.alias) else None
        if name is not None and name.rsplit(".", 1)[-1] in FRAME_NAMES:
            hits.append(f"{path.name}:{node.lineno}: {name}")
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "stack"
            and isinstance(node.value, ast.Name)
            and node.value.id == "inspect"
        ):
            hits.append(f"{path.name}:{node.lineno}: inspect.stack")
    return hits


def test_the_library_inspects_no_call_frames():
    root = Path(lenbatch.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert len(files) > 20  # the whole package, not an empty glob
    hits = [h for f in files for h in _frame_uses(f)]
    assert hits == [], hits


def test_the_check_sees_a_frame_read(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import sys\nfrom inspect import currentframe\nx = sys._getframe(1).f_globals\n"
        "import inspect\ny = inspect.stack()\nz = np.stack([1])\n"
    )
    assert sorted(h.split(": ")[1] for h in _frame_uses(bad)) == [
        "_getframe",
        "currentframe",
        "f_globals",
        "inspect.stack",
    ]
