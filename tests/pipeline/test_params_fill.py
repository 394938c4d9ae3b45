"""``lenbatch dvc-yaml`` writes into params.yaml the defaults of the sections and keys it lacks, as text, and
changes nothing a user wrote; ``--check`` fails, naming the command, while one is missing."""

from __future__ import annotations

import shutil

import pytest

from lenbatch_study.core.config import Params, load_params
from lenbatch_study.tools import dvc_yaml
from test_workflow import ROOT


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """params.yaml, configs/ (its settings overlay) and the committed dvc.yaml in a folder of their own."""
    for name in ("params.yaml", "dvc.yaml"):
        shutil.copy2(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _without(text: str, *needles: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not any(n in line for n in needles))


def test_missing_section_and_key_get_their_defaults_and_the_rest_stays_as_written(repo, capsys):
    shipped = (repo / "params.yaml").read_text()
    mine = _without(shipped, "stats:", "histogram_bins:", "  objective:").replace(
        "  seed: 0  #", "  seed: 7  # mine\n  #"
    )
    (repo / "params.yaml").write_text(mine)
    assert dvc_yaml.run(out="dvc.yaml", check=True) == 1
    err = capsys.readouterr().err
    assert "params.yaml lacks stats, boundaries.objective" in err and "`lenbatch dvc-yaml`" in err, err
    assert (repo / "params.yaml").read_text() == mine  # --check writes nothing

    assert dvc_yaml.run(out="dvc.yaml") == 0
    filled = (repo / "params.yaml").read_text()
    # every line the user wrote, comments included, in its order: the defaults are lines added in between
    it = iter(filled.splitlines())
    assert all(line in it for line in mine.splitlines())
    added = sorted(set(filled.splitlines()) - set(mine.splitlines()))
    assert [line.split("#")[0].strip() for line in added] == ["histogram_bins: 64", "objective: greedy", "stats:"]
    objective = filled.index("  objective: greedy  #")
    assert filled.index("boundaries:") < objective < filled.index("batching:")  # in its own section
    params = load_params(repo / "params.yaml")
    assert params.batching.seed == 7  # the user's value, kept
    assert params.stats == Params().stats and params.boundaries == Params().boundaries
    # nothing left to add: the check passes and a second run changes nothing
    assert dvc_yaml.run(out="dvc.yaml", check=True) == 0
    assert dvc_yaml.run(out="dvc.yaml") == 0 and (repo / "params.yaml").read_text() == filled


def test_a_complete_params_yaml_is_left_byte_for_byte(repo):
    before = (repo / "params.yaml").read_bytes()
    assert dvc_yaml.run(out="dvc.yaml") == 0
    assert (repo / "params.yaml").read_bytes() == before


def test_a_section_written_in_one_line_is_refused_naming_the_fix(repo):
    text = _without((repo / "params.yaml").read_text(), "histogram_bins:").replace(
        "stats:  #", "stats: {histogram_bins_typo: 1}  #"
    )
    with pytest.raises(ValueError, match=r"section 'stats' is not written as a block .*rerun `lenbatch dvc-yaml`"):
        dvc_yaml.fill_params(text)
