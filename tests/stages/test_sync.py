"""`lenbatch sync`'s reading of `dvc status` and dvc.yaml, and the plots template `.dvc/config` names (issue 19).
The real runs (a fresh clone, a checkout) are in tests/pipeline/test_workflow_e2e.py (its end). (<1 s)"""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest
import yaml

from lenbatch_study.pipeline.dvcplots import TEMPLATE, write_template
from lenbatch_study.tools.sync import changed_stages, stage_outputs

REPO = Path(__file__).resolve().parents[2]


def test_the_stages_dvc_names_become_the_outputs_snakemake_omits():
    status = {"tokenize": [{"changed outs": {"results/tokenize/dataset": "not in cache"}}],
              "dvc.yaml:train@sorted": [{"changed deps": {"results/tokenize/dataset": "deleted"}}]}
    assert changed_stages(status) == ["tokenize", "train@sorted"]
    dvc_yaml = yaml.safe_load((REPO / "dvc.yaml").read_text())
    omit = stage_outputs(dvc_yaml, changed_stages(status))
    assert {"results/tokenize/dataset", "results/tokenize/lengths.npy", "results/train/sorted/summary.json",
            "results/train/sorted/steps.jsonl"} <= set(omit)
    assert not any(p.startswith("results/train/random") for p in omit)
    assert "results/stats/histogram.json" in stage_outputs(dvc_yaml, ["stats"])  # plots count as outputs
    with pytest.raises(ValueError, match=r"stages \['nope'\] that dvc.yaml does not define"):
        stage_outputs(dvc_yaml, ["nope"])


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
