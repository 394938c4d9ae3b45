"""The inputs the workflow checks as it starts (data source, tokenizer, checkpoint folder): a bad input is refused before any job
runs, naming the setting and the fix, in seconds and touching nothing (real Snakemake, dry run)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from lenbatch_study.core.config import load_params
from lenbatch_study.corpus.chat import check_tokenizer_spec
from lenbatch_study.corpus.sources import check_source
from lenbatch_study.models.target_config import check_pretrained
from test_workflow import ROOT, copy_workflow, run

PARAMS = load_params(ROOT / "params.yaml")


def check_inputs(params):
    """The three checks, as workflow/rules/common.smk makes them."""
    check_source(params.data.source, on_bad_record=params.data.on_bad_record)
    check_tokenizer_spec(params.data.tokenizer)
    check_pretrained(params.model.pretrained)


def _with(section: str, **values):
    return dataclasses.replace(PARAMS, **{section: dataclasses.replace(getattr(PARAMS, section), **values)})


def test_the_shipped_inputs_pass():
    check_inputs(PARAMS)


def test_bad_inputs_are_named_with_the_fix(tmp_path):
    (tmp_path / "garbage.parquet").write_bytes(b"PAR1 this is not parquet")
    (tmp_path / "other.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    (tmp_path / "ckpt").mkdir()
    for params, words in (
        (_with("data", source=str(tmp_path / "chat.jsonl")), ["data.source", "chat.jsonl", "does not exist"]),
        (_with("data", source=str(tmp_path / "garbage.parquet")), ["garbage.parquet", "not a readable Parquet"]),
        (_with("data", source=str(tmp_path / "other.jsonl")), ["data.source", "record 1", "data.on_bad_record"]),
        (_with("data", tokenizer=str(tmp_path / "tok")), ["data.tokenizer", "tok"]),
        (_with("model", pretrained=str(tmp_path / "ckpt")), ["model.pretrained", "has no config.json"]),
        (_with("model", pretrained=str(tmp_path / "none")), ["model.pretrained", "does not exist"]),
    ):
        with pytest.raises(ValueError) as err:
            check_inputs(params)
        for word in words:
            assert word in str(err.value), str(err.value)
    # skip: a record of another schema is skipped (and counted) by tokenize, so it is no reason to refuse
    check_inputs(_with("data", source=str(tmp_path / "other.jsonl"), on_bad_record="skip"))


@pytest.mark.parametrize(
    "override, words",
    [
        ({"data": {"source": "data/chat.jsonl"}}, ["invalid input", "data.source 'data/chat.jsonl' does not exist"]),
        ({"profile": {"lengths": [128, 0]}}, ["invalid params", "profile.lengths", "0 at [1]"]),
        ({"train": {"strategies": ["random", "packed"]}}, ["invalid params", "train.strategies lacks 'sorted'"]),
        ({"train": {"strategies": ["sorted", "sorted"]}}, ["invalid params", "lists sorted more than once"]),
        ({"train": {"nproc": 1_000_000}}, ["invalid params", "train.nproc", "<= 256"]),
    ],
)
def test_the_workflow_refuses_a_bad_input_or_param_before_any_job(tmp_path, override, words):
    """`snakemake -n` with an overlay config: refused at parse time (exit 1, the setting named); no folder
    under results/ is created and no job is listed."""
    work = copy_workflow(tmp_path)
    (work / "bad.yaml").write_text(yaml.safe_dump(override))
    proc = run(["snakemake", "-n", "--configfile", "configs/tiny.yaml", "bad.yaml"], cwd=work, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    for word in words:
        assert word in out, out
    assert "rule tokenize" not in out and not (work / "results").exists()


def test_the_workflow_refuses_a_key_given_twice_in_a_configfile(tmp_path):
    """Issue 48.5: Snakemake's YAML loader kept the last of a key given twice in a --configfile (the stages
    refuse it); the workflow now reads every config file with the stages' loader at parse time."""
    work = copy_workflow(tmp_path)
    (work / "dup.yaml").write_text("boundaries:\n  num_buckets: 4\n  num_buckets: 9\n")
    proc = run(["snakemake", "-n", "--configfile", "configs/tiny.yaml", "dup.yaml"], cwd=work, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "invalid params:" in out and "dup.yaml: key 'num_buckets' is given twice (lines 2 and 3); keep one" in out
    assert "rule tokenize" not in out and not (work / "results").exists()
