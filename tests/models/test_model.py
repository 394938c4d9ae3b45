"""The frozen target: real transformers Qwen3_5 classes, seeded weights, features API, real shapes file."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet, Qwen3_5TextModel

from lenbatch_study.core.config import ModelConfig, load_params
from lenbatch_study.models.target import build_heads, build_target, hf_text_config, model_config_from_file

ROOT = Path(__file__).resolve().parents[2]
SMALL = ModelConfig(vocab_size=1000)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def small(one_thread):
    return build_target(SMALL)


def test_weights_are_seeded_by_name_and_reproducible(small):
    again = build_target(SMALL)
    state, state2 = small.state_dict(), again.state_dict()
    assert state.keys() == state2.keys()
    assert all(torch.equal(state[k], state2[k]) for k in state)
    embed, lm_head = build_heads(SMALL)  # the drafter rank builds only these: bit-identical
    assert torch.equal(embed.weight, small.embed_tokens.weight)
    assert torch.equal(lm_head.weight, small.lm_head.weight)
    other = build_target(dataclasses.replace(SMALL, init_seed=1))
    assert not torch.equal(other.lm_head.weight, small.lm_head.weight)
    # Hugging Face's init distributions: normal(0, 0.02), 1-centred norms at 0, A_log = log U(0.01, 16)
    assert abs(small.embed_tokens.weight.std().item() - 0.02) < 1e-3
    assert not torch.equal(small.embed_tokens.weight, small.lm_head.weight)  # untied, own seeds
    gdn = small.model.layers[0].linear_attn
    assert torch.all(small.model.layers[0].input_layernorm.weight == 0)
    assert torch.all(gdn.dt_bias == 1) and torch.all(gdn.norm.weight == 1)
    assert gdn.A_log.exp().min() >= 0.01 and gdn.A_log.exp().max() <= 16


def test_target_is_the_real_hf_model_frozen(small):
    assert isinstance(small.model, Qwen3_5TextModel)
    assert isinstance(small.model.layers[0].linear_attn, Qwen3_5GatedDeltaNet)
    assert not any(p.requires_grad for p in small.parameters())
    small.train()
    assert not small.training and not small.model.training
    assert small.dtype == torch.float32 and small.lm_head.out_features == 1000
    assert small.feature_dim == 2 * 128
    # same parameter names as transformers' own model: a real checkpoint's keys would load
    assert set(small.model.state_dict()) == set(Qwen3_5TextModel(hf_text_config(SMALL)).state_dict())


def test_features_shape_layers_and_early_exit(small):
    ids = torch.randint(0, 1000, (2, 50), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 50, dtype=torch.long)
    mask[1, 30:] = 0
    feats = small.features(ids, attention_mask=mask)
    assert feats.shape == (2, 50, 256) and torch.isfinite(feats).all()
    hidden = small.hidden_states(ids, attention_mask=mask, layers=None)
    torch.testing.assert_close(feats[0], torch.cat([hidden[1][0], hidden[3][0]], dim=-1))
    only_first = build_target(dataclasses.replace(SMALL, target_layers=(1,)))  # stops after layer 1
    torch.testing.assert_close(only_first.features(ids, attention_mask=mask), feats[..., :128])
    assert not feats.requires_grad


def test_bfloat16_target():
    target = build_target(
        dataclasses.replace(
            SMALL,
            dtype="bfloat16",
            num_hidden_layers=2,
            layer_types=("linear_attention", "full_attention"),
            target_layers=(0, 1),
        )
    )
    assert all(p.dtype == torch.bfloat16 for p in target.parameters())
    assert target.model.rotary_emb.inv_freq.dtype == torch.float32  # RoPE frequencies stay exact
    feats = target.features(torch.randint(0, 1000, (1, 70)), cu_seqlens=torch.tensor([0, 20, 70]))
    assert feats.dtype == torch.bfloat16 and torch.isfinite(feats.float()).all()


@pytest.mark.parametrize(
    "override, match",
    [
        ({"target_layers": [0, 4]}, "target_layers"),
        ({"layer_types": ["linear_attention", "linear_attention", "linear_attention", "sliding"]}, "unknown types"),
        ({"num_key_value_heads": 3}, "multiple of"),
        ({"linear_num_value_heads": 6}, "multiple of"),
    ],
)
def test_bad_model_config(override, match):
    with pytest.raises(ValueError, match=match):
        build_target(load_params(ROOT / "params.yaml", overrides={"model": override}).model)


def test_real_qwen36_27b_shapes_file():
    params = load_params(ROOT / "params.yaml", ROOT / "configs" / "qwen3.6-27b-8gpu.yaml")
    cfg = params.model
    assert cfg.layer_types.count("full_attention") == 16 and cfg.layer_types[3::4] == ("full_attention",) * 16
    with torch.device("meta"):  # shapes only, no memory
        model = Qwen3_5TextModel(hf_text_config(cfg))
    n = sum(p.numel() for p in model.parameters()) + cfg.vocab_size * cfg.hidden_size  # + untied lm_head
    assert 26.5e9 < n < 27.5e9, n


def test_model_config_from_a_params_style_file(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("model:\n  hidden_size: 64\n  head_dim: 16\n")
    cfg = model_config_from_file(path)
    assert cfg.hidden_size == 64 and cfg.head_dim == 16 and cfg.vocab_size == ModelConfig().vocab_size
    with pytest.raises(ValueError, match="does not exist"):
        model_config_from_file(tmp_path / "missing.json")
    bad = tmp_path / "llama.json"
    bad.write_text('{"model_type": "llama", "hidden_size": 64}')
    with pytest.raises(ValueError, match="Qwen3.5-architecture"):
        model_config_from_file(bad)
