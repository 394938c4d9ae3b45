"""params.yaml, the override files and the generated schema (`lenbatch params --schema`) agree, and bad params are
refused clearly."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from lenbatch_study.core.batchspec import batch_spec
from lenbatch_study.core.config import (
    Params,
    SECTIONS,
    deep_merge,
    load_params,
    params_from_dict,
)
from lenbatch_study.core.schema import json_schema

ROOT = Path(__file__).resolve().parents[2]
OVERRIDES = sorted((ROOT / "configs").glob("*.yaml"))


def _raw() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def test_shipped_params_equal_the_dataclass_defaults():
    # The library's defaults and the workflow's default are one CPU setting.
    assert load_params(ROOT / "params.yaml") == Params()


@pytest.mark.parametrize("override", OVERRIDES, ids=lambda p: p.name)
def test_every_override_file_is_valid_on_top_of_params(override):
    params = load_params(ROOT / "params.yaml", override)
    raw_override = yaml.safe_load(override.read_text()) or {}  # default.yaml: empty
    # results_dir: the workflow's results root for this config (not a stage's params; common.smk pops it)
    assert str(raw_override.pop("results_dir", "results")).startswith("results")
    for section, values in raw_override.items():
        for key, value in values.items():
            got = getattr(params.section(section), key)
            assert (list(got) if isinstance(got, tuple) else got) == value, f"{section}.{key} not applied"
    jsonschema.validate(deep_merge(_raw(), raw_override), json_schema())


@pytest.mark.parametrize("override", OVERRIDES, ids=lambda p: p.name)
def test_settings_names_an_overlay_the_loader_merges_as_a_configfile_would(override, tmp_path):
    """settings: <name> in params.yaml (dvc exp run -S settings=<name>) gives the params of `--configfile
    configs/<name>.yaml`; a key the user set away from its shipped value wins over the overlay."""
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({**raw, "settings": override.stem}))
    assert load_params(tmp_path / "params.yaml") == load_params(ROOT / "params.yaml", override)
    if override.stem == "tiny":
        mine = deep_merge(raw, {"settings": "tiny", "data": {"limit": 100}, "train": {"useful_tokens": 6001}})
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(mine))
        params = load_params(tmp_path / "params.yaml")
        assert params.data.limit == 100 and params.train.useful_tokens == 6001  # the user's, not tiny's 60, 6000
        assert params.data.max_len == 1024 and params.model.hidden_size == 32  # tiny's
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({**raw, "settings": "tiyn"}))
    with pytest.raises(ValueError, match=r"settings: 'tiyn' names no file .*choose from \[.*'tiny'"):
        load_params(tmp_path / "params.yaml")


def test_params_is_declared_beside_its_sections_and_the_schema_is_printed_for_editors():
    """A new section is one file's edit (core/sections.py); core.config hands on the same class, and
    `lenbatch params --schema` prints the schema generated from it (no committed copy to keep equal)."""
    from lenbatch_study.core import sections

    assert Params is sections.Params and set(sections.SECTION_HELP) == set(SECTIONS)
    out = subprocess.run(
        [sys.executable, "-m", "lenbatch_study", "params", "--schema"], capture_output=True, text=True, check=True
    ).stdout
    assert yaml.safe_load(out) == json_schema() and set(json_schema()["properties"]) == {*SECTIONS, "settings"}


def test_every_key_in_params_yaml_has_a_comment():
    for line in (ROOT / "params.yaml").read_text().splitlines():
        if re.match(r"^\s+\w+:", line):
            assert "#" in line, f"params.yaml line without a comment (unit): {line!r}"


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda r: r["boundaries"].update(num_bucket=8), ["boundaries.num_bucket", "num_buckets"]),
        (lambda r: r["batching"].update(token_budget="16k"), ["batching.token_budget", "integer"]),
        (lambda r: r.pop("train"), ["missing section", "train", "`lenbatch dvc-yaml`"]),
        (lambda r: r["data"].update(overflow="cut"), ["data.overflow", "truncate"]),
        (lambda r: r["model"].update(target_layers=[9]), ["model.target_layers", "0..3"]),
        (lambda r: r["train"].update(strategies=["sorted", "bogus"]), ["train.strategies", "bogus"]),
        (lambda r: r["data"].update(max_len=100000), ["data.max_len", "token_budget"]),
        (lambda r: r.update(extra={}), ["unknown section", "extra"]),
    ],
)
def test_bad_params_are_refused_naming_the_key_and_the_fix(mutate, words):
    raw = _raw()
    mutate(raw)
    with pytest.raises(ValueError) as err:
        params_from_dict(raw)
    for word in words:
        assert word in str(err.value)


def test_schema_rejects_what_the_loader_rejects():
    """The schema editors get from `lenbatch params --schema` refuses what the one check refuses."""
    schema = json_schema()
    jsonschema.validate(_raw(), schema)
    for mutate in (
        lambda r: r["boundaries"].update(num_bucket=8),
        lambda r: r["batching"].update(token_budget="16k"),
        lambda r: r.pop("train"),
        lambda r: r["boundaries"].update(method="kmeans"),
        lambda r: r["batching"].update(max_batch_size=0),
    ):
        raw = _raw()
        mutate(raw)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(raw, schema)


def test_inline_json_merges_on_top_and_flags_override_last():
    params = load_params(
        ROOT / "params.yaml", json.dumps({"boundaries": {"num_buckets": 8}}), overrides={"batching": {"seed": 3}}
    )
    assert params.boundaries.num_buckets == 8 and params.batching.seed == 3
    assert params.data == Params().data


def test_the_workflow_form_alone_reads_no_file_and_checks_only_the_stage_s_keys(tmp_path, monkeypatch):
    """--params-json alone (every rule's shell line): the stage's keys, resolved by Snakemake, are all that is
    read; a rule joining two sections is checked where the mapping holds both keys."""
    monkeypatch.chdir(tmp_path)  # no params.yaml here: reading one would fail
    tiny = {"batching": {"token_budget": 2048, "max_batch_size": 16}, "boundaries": {"num_buckets": 3}}
    params = load_params(json.dumps(tiny))
    assert params.batching.token_budget == 2048 and params.boundaries.num_buckets == 3
    assert params.data == Params().data  # left out: the shipped values (= params.yaml's), never read by it
    with pytest.raises(
        ValueError,
        match=r"data\.max_len \(4096\) exceeds batching\.token_budget \(2048\).*lower "
        "max_len",
    ):
        load_params(json.dumps({**tiny, "data": {"max_len": 4096}}))
    with pytest.raises(ValueError, match=r"boundaries\.num_bucket in --params-json.*known keys"):
        load_params(json.dumps({"boundaries": {"num_bucket": 3}}))
    with pytest.raises(ValueError, match=r"batching\.token_budget given on the command line \(--token-budget\)"):
        load_params(json.dumps(tiny), overrides={"batching": {"token_budget": 0}})


def test_a_stage_run_by_the_workflow_form_reads_no_params_file(tmp_path):
    """`lenbatch stats --params-json ...` in a folder without params.yaml: the rule's keys reach the stage alone."""
    out = tmp_path / "stats"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lenbatch_study",
            "stats",
            "--params-json",
            json.dumps({"stats": {"histogram_bins": 7}, "batching": {"seed": 0}}),
            "--seed-profile",
            "--seed-profile-size",
            "500",
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((out / "params.json").read_text()) == {"stats": {"histogram_bins": 7}}
    assert not (tmp_path / "params.yaml").exists()


def test_params_cli_reports_a_bad_file(tmp_path):
    raw = _raw()
    raw["stats"]["bins"] = 3
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    proc = subprocess.run(
        [sys.executable, "-m", "lenbatch_study", "params", "--params", str(bad)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "stats.bins" in proc.stderr and "histogram_bins" in proc.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "lenbatch_study", "params", "--params", str(ROOT / "params.yaml")],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr


def test_frozen_and_sections_complete():
    params = Params()
    with pytest.raises(Exception):
        params.batching.token_budget = 1  # type: ignore[misc]
    assert set(params.to_dict()) == set(SECTIONS)


def _dup_key(text: str) -> str:
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("num_buckets:"))
    return text.replace(line, line + "\n" + line.replace("6", "9", 1), 1)


@pytest.mark.parametrize(
    "edit, words",
    [
        (_dup_key, ["'num_buckets' is given twice", "keep one"]),
        (lambda t: t + "\nstats:\n  histogram_bins: 8\n", ["'stats' is given twice"]),
        (
            lambda t: t.replace("holdout_fraction: 0.25", "holdout_fraction: 1.5"),
            ["compare.holdout_fraction", "<= 0.9"],
        ),
        (lambda t: re.sub(r"\n  lr: [^ ]+", "\n  lr: .nan", t), ["drafter.lr", "finite"]),
        (lambda t: re.sub(r"\n  gamma: [^ ]+", "\n  gamma: .inf", t), ["drafter.gamma", "finite"]),
        (
            lambda t: re.sub(r"\n  holdout_fraction: [^\n]+", "", t),
            ["missing key", "compare.holdout_fraction", "`lenbatch dvc-yaml`"],
        ),
        (lambda t: t.replace("compare:", "compare: [", 1), ["not valid YAML at line", "fix the syntax"]),
    ],
    ids=["duplicate key", "duplicate section", "range", "nan", "inf", "missing key", "yaml syntax"],
)
def test_one_loader_refuses_duplicates_missing_keys_ranges_and_non_finite_numbers(tmp_path, capsys, edit, words):
    """Issue 11.6: every entry point (stage CLIs through load_params, the workflow through params_from_dict)
    refuses these with the key named; they used to take the last value, a code default or pass."""
    text = (ROOT / "params.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(edit(text))
    assert bad.read_text() != text
    with pytest.raises(ValueError) as err:
        load_params(bad)
    for word in words:
        assert word in str(err.value)
    from lenbatch_study.cli import main

    assert main(["params", "--params", str(bad)]) == 2  # a stage run directly: one line, exit 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and words[0] in lines[0]


def test_inline_params_refuse_a_key_given_twice():
    with pytest.raises(ValueError, match=r"inline params give key\(s\) \['num_buckets'\] twice"):
        load_params(ROOT / "params.yaml", '{"boundaries": {"num_buckets": 8, "num_buckets": 9}}')


def test_the_workflow_config_check_refuses_ranges_and_non_finite_numbers():
    for section, key, value in (
        ("compare", "holdout_fraction", 1.5),
        ("drafter", "lr", float("nan")),
        ("profile", "max_point_seconds", float("inf")),
    ):
        raw = _raw()
        raw[section][key] = value
        with pytest.raises(ValueError, match=f"{section}.{key}"):
            params_from_dict(raw)
    raw = _raw()
    del raw["train"]["device"]
    with pytest.raises(ValueError, match="missing key.*train.device"):
        params_from_dict(raw)


@pytest.mark.parametrize(
    "section, key, value, words",
    [
        ("profile", "lengths", [128, 0], ["profile.lengths", "0 at [1]", ">= 1"]),
        ("profile", "lengths", [-5], ["profile.lengths", "-5 at [0]"]),
        ("profile", "batch_sizes", [0, 4], ["profile.batch_sizes", "0 at [0]"]),
        ("profile", "packed_seqs", [0], ["profile.packed_seqs"]),
        ("profile", "packed_lengths", [-1], ["profile.packed_lengths"]),
        ("stats", "histogram_bins", 10**9, ["stats.histogram_bins", "<= 1000000"]),
        ("batching", "max_batch_size", 10**12, ["batching.max_batch_size", "token_budget"]),
        ("batching", "token_budget", 10**12, ["batching.token_budget", "<= 16777216"]),
        # issue 48.5: these validated and then forked a million processes or planned for days
        ("plans", "epochs", 1_000_000, ["plans.epochs", "<= 1000", "every epoch plans every strategy"]),
        ("data", "workers", 1_000_000, ["data.workers", "<= 512", "its own tokenizer"]),
        ("train", "nproc", 1_000_000, ["train.nproc", "<= 256", "spread a larger run over train.nodes"]),
    ],
)
def test_list_entries_and_huge_values_are_bounded_naming_the_setting(section, key, value, words):
    """Each of these would end in a traceback or the OOM killer in its stage; the schema editors get
    (`lenbatch params --schema`) states the same bounds."""
    raw = _raw()
    raw[section][key] = value
    with pytest.raises(ValueError) as err:
        params_from_dict(raw)
    for word in words:
        assert word in str(err.value)
    if key != "max_batch_size":  # a bound across two keys is the loader's alone
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(raw, json_schema())


@pytest.mark.parametrize(
    "strategies, words",
    [
        (["random", "packed"], ["train.strategies lacks 'sorted'", "add sorted to the list"]),
        (["sorted", "sorted"], ["train.strategies lists sorted more than once", "list each strategy once"]),
        (["sorted", "packed", "random", "packed"], ["lists packed more than once"]),
    ],
)
def test_a_strategy_list_without_sorted_or_with_duplicates_is_refused(strategies, words):
    """Issue 48.5: it passed `snakemake -n` and failed after profile and the trainings ran (then a reshape
    traceback); now the loader, hence `snakemake -n` and every stage, refuses it first."""
    raw = _raw()
    raw["train"]["strategies"] = strategies
    with pytest.raises(ValueError) as err:
        params_from_dict(raw)
    for word in words:
        assert word in str(err.value), str(err.value)


def test_params_yaml_describes_each_setting_with_its_declared_help():
    """A setting is described once, where it is declared (lenbatch_study.core.config): params.yaml's comment, the
    JSON schema and the CLI flag overriding it all carry that text (the comment may add why this value, after it)."""
    import re

    schema, section, checked = json_schema()["properties"], None, 0
    for line in (ROOT / "params.yaml").read_text().splitlines():
        top = re.match(r"^(\w+):", line)
        if top:
            section = top.group(1)
            continue
        m = re.match(r"^  (\w+):.*?#\s*(.*)$", line)
        if m and section in schema:
            key, comment = m.groups()
            declared = schema[section]["properties"][key]["description"]
            assert comment == declared or comment.startswith((declared + ";", declared + ".")), (
                f"params.yaml {section}.{key}: comment {comment!r} is not its declared help {declared!r}"
            )
            checked += 1
    assert checked >= 70, checked


def test_interleave_max_rounds_below_rounds_is_refused_by_name():
    from lenbatch_study.core.config import load_params

    with pytest.raises(
        ValueError,
        match=r"interleave.max_rounds \(4\) is below interleave.rounds \(6\); set "
        r"max_rounds >= rounds",
    ):
        load_params("params.yaml", '{"interleave": {"rounds": 6, "max_rounds": 4}}')


def test_the_study_params_hand_the_library_their_batching():
    """The study reads ``params.batching`` into the library's spec (core/batchspec.py, build_schedule(params=)): the
    study's Params give the same spec and the same schedule as those numbers passed as a BatchSpec."""
    import numpy as np

    import lenbatch as lb
    from lenbatch_study.runtime.schedule import build_schedule

    params = load_params(
        ROOT / "params.yaml",
        '{"batching": {"token_budget": 512, "max_batch_size": 8, "seed": 3}, "data": {"max_len": 512}}',
    )
    spec = lb.BatchSpec(token_budget=512, max_batch_size=8, seed=3, packed_window=params.batching.packed_window)
    assert batch_spec(params) == spec
    x = np.random.default_rng(0).integers(5, 200, size=120)
    a = build_schedule(x, strategy="random", target_ranks=2, params=params, max_steps=5)
    b = build_schedule(x, strategy="random", target_ranks=2, spec=spec, max_steps=5)
    assert [s.indices.tolist() for s in a] == [s.indices.tolist() for s in b]
    other = build_schedule(
        x, strategy="random", target_ranks=2, spec=lb.BatchSpec(token_budget=512, max_batch_size=8), max_steps=5
    )
    assert [s.indices.tolist() for s in other] != [s.indices.tolist() for s in a]  # the seed travelled
