"""DESIGN.md is kept current: its layer table is the import rule tests/pipeline/test_layout.py enforces, and
its artifact table names every file a stage hands another (from the stage table), its writer and reader
functions that exist (who reads it is the stage table's alone: `lenbatch reruns` prints it). Parsing only, well under a second."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from lenbatch_study.pipeline import registry
from test_layout import LIBRARY_LAYERS, STUDY_LAYERS

DESIGN = Path(__file__).resolve().parents[2] / "DESIGN.md"


def _table(heading: str) -> list[list[str]]:
    """Rows (cells) of the first markdown table after ``heading``."""
    text = DESIGN.read_text()
    part = text[text.index(heading) :]
    rows = []
    for line in part.splitlines()[1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    return rows[2:]  # header and rule


def test_the_layer_table_is_the_import_rule():
    for heading, layers in (
        ("### lenbatch (the library)", LIBRARY_LAYERS),
        ("### lenbatch_study (the study)", STUDY_LAYERS),
    ):
        rows = _table(heading)
        doc = {r[0]: set() if r[1] == "—" else {x.strip() for x in r[1].split(",")} for r in rows}
        assert doc == layers, heading


def test_the_artifact_table_names_every_handed_file_its_writer_and_reader():
    rows = _table("## Artifacts: who writes, who reads, the reader")
    doc = {r[0].strip("`"): (r[1], r[2]) for r in rows}
    want: dict[str, str] = {}
    for st in registry.STAGES.values():
        for i in st.inputs:
            o = registry.STAGES[i.stage].outputs[i.output]
            want[registry.output_path(i.stage, i.output, strategy="<strategy>") + ("/" if o.directory else "")] = (
                i.stage
            )
    assert {p: w for p, (w, _) in doc.items()} == want
    for path, (_, readers) in doc.items():
        names = re.findall(r"`(\w+)\.(\w+)`", readers)
        assert names, path
        for module, func in names:
            assert hasattr(importlib.import_module(f"lenbatch_study.pipeline.artifacts.{module}"), func), (path, func)
