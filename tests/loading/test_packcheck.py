"""``lb.check_packing`` measured on real transformers model classes (tiny random configs built from their
config classes, nothing downloaded): the families that keep packed sequences apart pass, OPT and BLOOM
(which mix them) fail with their max difference, and the packed Trainer refuses a mixing model by name."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
import torch  # noqa: E402

import lenbatch as lb  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_packing_models import build, families  # noqa: E402

CLEAN = ("Llama", "Qwen2", "Mistral", "Phi3", "GPT-2", "GPT-NeoX")
MIXING = ("OPT", "BLOOM")


def _model(name: str):
    return build(families()[name], "eager" if name == "BLOOM" else "sdpa")


@pytest.mark.parametrize("name", CLEAN + MIXING)
def test_each_family_is_measured(name):
    model = _model(name).train()  # the check runs in eval mode and gives the mode back
    r = lb.check_packing(model)
    assert model.training
    assert r.model_class == type(model).__name__ and r.lengths == (7, 13, 5, 11) and r.error is None
    assert r.tolerance == 1e-4 and "float32" in r.compared and "model_inputs()" in r.compared
    if name in CLEAN:
        assert r.ok and r.max_abs_diff < 1e-5 and r.max_cross_diff == 0, (name, r)
    else:
        # measured: OPT 0.25 (positions from an attention mask the row lacks), BLOOM 6.2e-3 (ALiBi)
        assert not r.ok and r.max_abs_diff > 1e-3 and r.max_cross_diff > 1e-3, (name, r)


@pytest.mark.parametrize("name", ["Llama", "GPT-2", "BLOOM"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_does_not_hide_a_small_leak(name, dtype):
    """BLOOM's 6e-3 against each sequence alone is within bfloat16's rounding; with the other sequences
    redrawn a clean model's logits do not move at all, BLOOM's by 2e-3..4e-3."""
    r = lb.check_packing(_model(name).to(dtype))
    assert r.tolerance >= 2e-2 and r.max_abs_diff < r.tolerance  # the comparison with alone alone passes
    if name == "BLOOM":
        assert not r.ok and r.max_cross_diff > r.cross_tolerance, r
    else:
        assert r.ok and r.max_cross_diff == 0, r


def test_strict_refuses_naming_the_model_and_the_fix():
    with pytest.raises(
        ValueError,
        match=r"OPTForCausalLM cannot train packed rows: packed sequences attend to "
        r"each other: max \|logit difference\| .* Use the padded layout",
    ):
        lb.check_packing(_model("OPT"), strict=True)
    assert lb.check_packing(_model("Llama"), strict=True).ok


def test_model_inputs_is_the_clean_path():
    """What model_inputs() passes matters: the same row without use_cache=False mixes sequences."""
    from bench_packing_models import by_hand

    ways = by_hand(_model("Llama"))
    assert ways["model_inputs() without use_cache=False"] > 1e-2
    assert ways["input_ids only"] > 1e-2
    inputs = lb.collate_packed([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}]).model_inputs()
    assert inputs["use_cache"] is False and inputs["position_ids"].tolist() == [[0, 1, 2, 0, 1]]


def test_a_forward_that_refuses_the_packed_keywords_is_not_ok():
    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(50, 4)

        def forward(self, input_ids):
            return self.emb(input_ids)

    r = lb.check_packing(Plain())
    assert not r.ok and r.error.startswith("TypeError") and r.max_abs_diff == float("inf")
    with pytest.raises(ValueError, match="at least two sequences"):
        lb.check_packing(Plain(), lengths=[5])


@pytest.mark.parametrize("strategy", ["packed", "sortish"])
def test_the_packed_trainer_refuses_a_mixing_model(tmp_path, strategy):
    from transformers import TrainingArguments

    from lenbatch.hf import LengthBatchTrainer

    rng = np.random.default_rng(0)
    data = [{"input_ids": rng.integers(1, 256, size=n).tolist()} for n in rng.integers(8, 40, size=24)]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, use_cpu=True, report_to="none")
    kw = dict(args=args, train_dataset=data, strategy=strategy, token_budget=256, max_batch_size=8)
    if strategy == "packed":
        with pytest.raises(
            ValueError,
            match=r"strategy='packed': OPTForCausalLM cannot train packed rows.*a "
            r"strategy other than 'packed'",
        ):
            LengthBatchTrainer(model=_model("OPT"), **kw)
        assert LengthBatchTrainer(model=_model("OPT"), packing_check=False, **kw) is not None
        assert LengthBatchTrainer(model=_model("Qwen2"), **kw) is not None
    else:
        LengthBatchTrainer(model=_model("OPT"), **kw)  # padded: OPT is fine, no check runs
