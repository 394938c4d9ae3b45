"""The plots template `.dvc/config` names (issue 19): DVC's own `dvc plots show/diff` render offline with it.
The real render in a fresh clone is in tests/pipeline/test_workflow_e2e.py (its end). (<1 s)"""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest

from lenbatch_study.tools.plots import TEMPLATE, write_template

REPO = Path(__file__).resolve().parents[2]


def test_dvc_config_points_plots_at_the_template_lenbatch_writes(tmp_path):
    config = configparser.ConfigParser()
    config.read(REPO / ".dvc" / "config")
    assert config["plots"]["html_template"] == TEMPLATE  # relative to .dvc/, as DVC reads it
    assert f"/{TEMPLATE}" in (REPO / ".dvc" / ".gitignore").read_text().split()  # written, not committed
    with pytest.raises(ValueError, match="has no .dvc/ folder"):
        write_template(tmp_path)
    (tmp_path / ".dvc").mkdir()
    page = write_template(tmp_path).read_text()
    assert "{plot_divs}" in page and "<script src=" not in page and page.count("<script") == 4
