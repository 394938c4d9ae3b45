"""model.pretrained: the checkpoint's files are inputs of exactly the rules that load the target (profile, train,
quality, interleave) in Snakemake and deps of the same stages in dvc.yaml, so a changed checkpoint reruns them."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from lenbatch_study.models.target_config import checkpoint_files
from lenbatch_study.pipeline import deps

sys.path.insert(0, str(Path(__file__).parent))
from test_workflow import copy_workflow, run  # noqa: E402

LOADERS = {"profile", "train", "quality", "interleave"}


def _checkpoint(root: Path) -> Path:
    ck = root / "ck"
    ck.mkdir()
    for name in (
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
    ):
        (ck / name).write_text("{}")
    return ck


def test_dvc_stages_depend_on_the_checkpoint_files(tmp_path):
    ck = _checkpoint(tmp_path)
    files = checkpoint_files(str(ck))
    assert set(deps.pretrained_stages()) == LOADERS  # derived from the code: the stages importing the target
    assert [Path(f).name for f in files] == [
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ]
    assert checkpoint_files(None) == []
    plain, with_ck = deps.dvc_stages(), deps.dvc_stages(pretrained=str(ck))
    for name, stage in with_ck.items():
        body, plain_body = stage.get("do", stage), plain[name].get("do", plain[name])  # train: a foreach's body
        extra = [d for d in body.get("deps", []) if d not in plain_body.get("deps", [])]
        assert extra == (files if name in LOADERS else []), name


def test_snakemake_rules_that_load_the_target_take_the_checkpoint_as_input(tmp_path):
    work = copy_workflow(tmp_path)
    _checkpoint(work)
    (work / "over.yaml").write_text("model:\n  pretrained: ck\n")
    out = run(["snakemake", "-n", "--configfile", "over.yaml"], cwd=work).stdout
    jobs = re.findall(r"^rule (\w+):\n    input: (.*)$", out, re.M)
    assert {rule for rule, _ in jobs} >= LOADERS | {"tokenize", "compare"}
    for rule, inputs in jobs:
        has = "ck/config.json" in inputs and "ck/model-00002-of-00002.safetensors" in inputs
        assert has == (rule in LOADERS), (rule, inputs)
        assert "ck/tokenizer.json" not in inputs
