"""The README's "Which strategy" table is what tools/which_strategy.py writes from the committed lengths and
params.yaml (compare_strategies), and the writer touches only the lines between its markers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _writer():
    spec = importlib.util.spec_from_file_location("which_strategy", ROOT / "tools" / "which_strategy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_committed_table_is_the_writers():
    w = _writer()
    text = (ROOT / "README.md").read_text()
    assert w.render(text, w.table()) == text
    assert "| `bucketed` |" in text.split(w.BEGIN)[1].split(w.END)[0]


def test_the_writer_changes_only_its_section_and_refuses_a_readme_without_markers():
    w = _writer()
    text = f"# R\n\nbefore\n{w.BEGIN}\nold\n{w.END}\nafter\n"
    assert w.render(text, "new") == f"# R\n\nbefore\n{w.BEGIN}\nnew\n{w.END}\nafter\n"
    with pytest.raises(ValueError, match="marker lines"):
        w.render("# no markers\n", "new")
