"""A flag that overrides a params setting is described by the setting's own declaration (one text, one type)."""

import re
import subprocess
import sys

import pytest

from lenbatch_study.cli import flags, params_args
from lenbatch_study.core.schema import json_schema

OVERRIDES = {
    "stats": ("stats.histogram_bins",),
    "boundaries": flags.BOUNDARIES_FLAGS + params_args.BATCHING_FLAGS[:2],
    "plans": ("plans.epochs",) + params_args.BATCHING_FLAGS,
    "plan": params_args.BATCHING_FLAGS,
    "tokenize": flags.DATA_FLAGS,
}


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.mark.parametrize("command", sorted(OVERRIDES))
def test_every_override_flag_carries_its_settings_help_and_names_the_setting(command):
    out = subprocess.run(
        [sys.executable, "-m", "lenbatch_study", command, "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "400", "PATH": ""},
    ).stdout
    schema = json_schema()["properties"]
    for name in OVERRIDES[command]:
        section, key = name.split(".")
        described = _flat(schema[section]["properties"][key]["description"])
        assert f"{described} (overrides {name}" in _flat(out), (name, out)


def test_an_override_flag_takes_the_settings_type_and_choices():
    import argparse

    parser = argparse.ArgumentParser()
    params_args.add_override(parser, "data.overflow")
    params_args.add_override(parser, "batching.token_budget")
    args = parser.parse_args(["--overflow", "drop", "--token-budget", "4096"])
    assert params_args.overrides_of(args, "data.overflow", "batching.token_budget", "data.limit") == {
        "data": {"overflow": "drop"},
        "batching": {"token_budget": 4096},
    }
    with pytest.raises(SystemExit):
        parser.parse_args(["--overflow", "wrap"])  # not one of the setting's choices


def test_a_bad_flag_value_is_blamed_on_the_flag_not_the_params_file(tmp_path):
    from lenbatch_study.core.config import load_params

    params = "params.yaml"
    with pytest.raises(
        ValueError,
        match=r"batching\.token_budget given on the command line \(--token-budget\) "
        r"is -3 but must be >= 1",
    ):
        load_params(params, overrides={"batching": {"token_budget": -3}})
    (tmp_path / "bad.yaml").write_text("batching:\n  token_budget: -3\n")
    with pytest.raises(ValueError, match=r"batching\.token_budget in params\.yaml \+ .*bad\.yaml is -3"):
        load_params(params, tmp_path / "bad.yaml")  # from a file: the files are named


def test_train_s_edge_refuses_a_missing_strategy_or_a_bad_step_limit_naming_the_fix(tmp_path, capsys):
    """The request is checked once, by lenbatch train before anything starts (its workers get it as it is)."""
    from lenbatch_study.cli import main

    assert main(["train", "--out", str(tmp_path / "x")]) == 2
    assert "--strategy and --out are required; e.g. lenbatch train --strategy sorted" in capsys.readouterr().err
    assert main(["train", "--strategy", "sorted", "--out", str(tmp_path / "x"), "--max-steps", "0"]) == 2
    assert "--max-steps must be >= 1, got 0" in capsys.readouterr().err
    assert main(["train", "--strategy", "sorted", "--out", str(tmp_path / "x"), "--useful-tokens", "0"]) == 2
    assert "train.useful_tokens given on the command line (--useful-tokens) is 0" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_stage_without_flags_of_its_own_gets_them_from_the_table():
    """The generic flags (a new stage's, until it writes its own): one required --<input> per file it reads,
    named after that output, and --out; per-strategy inputs are refused with the fix named."""
    import argparse

    import pytest

    parser = argparse.ArgumentParser()
    flags.generic_stage_flags("plans")(parser)
    args = parser.parse_args(["--lengths", "l.npy", "--boundaries", "b.json", "--out", "o"])
    assert (args.lengths, args.boundaries, args.out) == ("l.npy", "b.json", "o") and callable(args.func)
    with pytest.raises(SystemExit):
        parser.parse_args(["--lengths", "l.npy", "--out", "o"])  # --boundaries is required
    with pytest.raises(ValueError, match="_compare_flags"):
        flags.generic_stage_flags("compare")  # reads train's per-strategy summaries
