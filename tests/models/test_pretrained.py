"""model.pretrained: the target from a local checkpoint (a tiny Qwen3.5 saved by save_pretrained, reloaded): the
loaded weights are the ones used, in build_target, build_heads, the StepRunner (train/profile) and verify-packing."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lenbatch_study.core.config import ModelConfig, load_params
from lenbatch.loading.collate import collate_padded
from lenbatch_study.runtime.synthetic import synthetic_sequences
from lenbatch_study.models.target import build_heads, build_target, hf_text_config

ROOT = Path(__file__).resolve().parents[2]
SHAPES = {
    "vocab_size": 512,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "layer_types": ["linear_attention", "full_attention", "linear_attention"],
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
}
RANDOM = ModelConfig(**{**SHAPES, "layer_types": tuple(SHAPES["layer_types"])}, target_layers=(0, 1))


def _save(path: Path, *, tie: bool = False, seed: int = 123) -> Path:
    """A tiny Qwen3.5 causal LM with Hugging Face's own random init (not lenbatch's), saved by save_pretrained."""
    from transformers import Qwen3_5ForCausalLM

    hf = hf_text_config(RANDOM)
    hf.tie_word_embeddings = tie
    torch.manual_seed(seed)
    Qwen3_5ForCausalLM(hf).save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("ckpt") / "tiny-qwen3.5")


def _reference_features(path: Path, ids: torch.Tensor, layers=(0, 1)) -> torch.Tensor:
    """A plain from_pretrained forward (transformers' own modules and kernels, no lenbatch code): the
    decoder layers' outputs at ``layers``, concatenated."""
    from transformers import Qwen3_5ForCausalLM

    ref = Qwen3_5ForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=torch.float32).eval()
    out = {}
    hooks = [
        ref.model.layers[i].register_forward_hook(lambda _m, _a, res, i=i: out.__setitem__(i, res)) for i in layers
    ]
    with torch.no_grad():
        ref.model(input_ids=ids, use_cache=False)
    for h in hooks:
        h.remove()
    return torch.cat([out[i] for i in layers], dim=-1), ref


def test_target_and_heads_use_the_checkpoint(ckpt, one_thread):
    """Features of the loaded target differ from the random target's and equal a direct from_pretrained forward;
    build_heads reads the checkpoint's embedding and lm_head, bit-identical to the target's."""
    cfg = dataclasses.replace(RANDOM, pretrained=str(ckpt))
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, 512, size=(1, 23)))
    loaded, random = build_target(cfg), build_target(RANDOM)
    assert loaded.weights == f"checkpoint {ckpt}" and random.weights.startswith("random")
    feats = loaded.features(ids)
    want, ref = _reference_features(ckpt, ids)
    assert not torch.allclose(random.features(ids), feats, atol=1e-3), "the checkpoint's weights were not used"
    torch.testing.assert_close(feats, want, atol=1e-5, rtol=1e-5)
    embed, head = build_heads(cfg)
    for got, mine, theirs in (
        (embed, loaded.embed_tokens, ref.model.embed_tokens),
        (head, loaded.lm_head, ref.lm_head),
    ):
        assert torch.equal(got.weight, mine.weight) and torch.equal(got.weight, theirs.weight)
        assert not got.weight.requires_grad
    bf16 = dataclasses.replace(cfg, dtype="bfloat16")  # cast on load, the same cast in both builders
    assert torch.equal(build_heads(bf16)[1].weight, build_target(bf16).lm_head.weight)


def test_tied_and_vision_language_checkpoints(tmp_path, one_thread):
    """A checkpoint with tied embeddings (no lm_head tensor on disk) and one in the vision-language layout
    (config.json with text_config, weights under model.language_model.) load to the same features as
    from_pretrained of the original."""
    from safetensors.torch import load_file, save_file

    tied = _save(tmp_path / "tied", tie=True, seed=5)
    assert "lm_head.weight" not in load_file(str(tied / "model.safetensors"))
    cfg = dataclasses.replace(RANDOM, pretrained=str(tied))
    embed, head = build_heads(cfg)
    assert torch.equal(head.weight, embed.weight) and torch.equal(build_target(cfg).lm_head.weight, head.weight)

    plain = _save(tmp_path / "plain", seed=6)
    vl = tmp_path / "vl"
    vl.mkdir()
    tensors = {
        k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k: v
        for k, v in load_file(str(plain / "model.safetensors")).items()
    }
    save_file(tensors, str(vl / "model.safetensors"), metadata={"format": "pt"})
    text = json.loads((plain / "config.json").read_text())
    (vl / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen3_5",
                "architectures": ["Qwen3_5ForConditionalGeneration"],
                "text_config": text,
                "tie_word_embeddings": False,
            }
        )
    )
    ids = torch.from_numpy(np.random.default_rng(1).integers(0, 512, size=(1, 17)))
    want, _ = _reference_features(plain, ids)
    vcfg = dataclasses.replace(RANDOM, pretrained=str(vl))
    torch.testing.assert_close(build_target(vcfg).features(ids), want, atol=1e-5, rtol=1e-5)
    assert torch.equal(
        build_heads(vcfg)[1].weight, build_heads(dataclasses.replace(RANDOM, pretrained=str(plain)))[1].weight
    )


def test_bad_checkpoints_are_refused_naming_the_key(ckpt, tmp_path):
    with pytest.raises(ValueError, match=r"model\.hidden_size: params 64, checkpoint 32"):
        build_target(dataclasses.replace(RANDOM, hidden_size=64, pretrained=str(ckpt)))
    with pytest.raises(ValueError, match=r"model\.layer_types: params"):
        build_heads(dataclasses.replace(RANDOM, layer_types=("full_attention",) * 3, pretrained=str(ckpt)))
    with pytest.raises(ValueError, match=r"model\.pretrained=.*has no config\.json"):
        build_target(dataclasses.replace(RANDOM, pretrained=str(tmp_path / "nowhere")))
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text((ckpt / "config.json").read_text())
    with pytest.raises(ValueError, match=r"no \*\.safetensors"):
        build_heads(dataclasses.replace(RANDOM, pretrained=str(tmp_path / "bin")))
    with pytest.raises(ValueError, match="model.pretrained is an empty string"):
        ModelConfig(pretrained=" ")


def _params(ckpt: Path, **model):
    return load_params(
        str(ROOT / "params.yaml"),
        overrides={
            "model": {**SHAPES, "target_layers": [0, 1], "pretrained": str(ckpt), **model},
            "drafter": {"num_layers": 1, "num_heads": 2},
            "batching": {"token_budget": 256, "max_batch_size": 8},
            "data": {"max_len": 256},
        },
    )


def test_step_runner_trains_behind_the_checkpoint(ckpt, one_thread):
    """The train/profile path: StepRunner's target step gives the checkpoint's features (padded batch, padding
    zeroed); the drafter rank's heads are the checkpoint's; a drafter step runs on them."""
    from lenbatch_study.runtime.runner import StepRunner

    params = _params(ckpt)
    seqs = synthetic_sequences([9, 14, 5], vocab_size=512, seed=2)
    batch = collate_padded(seqs, token_budget=256, max_batch_size=8, indices=[0, 1, 2])
    runner = StepRunner(params, role="both")
    feats, _ = runner.target_step(batch)
    for i, s in enumerate(seqs):
        want, ref = _reference_features(ckpt, torch.as_tensor(s["input_ids"])[None])
        torch.testing.assert_close(feats[i, : len(s["input_ids"])], want[0], atol=1e-5, rtol=1e-5)
        assert (feats[i, len(s["input_ids"]) :] == 0).all()
    drafter_rank = StepRunner(params, role="drafter")
    assert torch.equal(drafter_rank.lm_head.weight, ref.lm_head.weight)
    assert torch.equal(drafter_rank.embed_tokens.weight, ref.model.embed_tokens.weight)
    loss, _ = drafter_rank.drafter_step(batch, feats)
    assert np.isfinite(float(loss))


def test_verify_packing_runs_on_the_checkpoint(ckpt, capsys, one_thread):
    """lenbatch verify-packing with model.pretrained: passes on the loaded weights and says where they came from."""
    from lenbatch_study.tools import verify_packing

    model = {**SHAPES, "target_layers": [0, 1], "pretrained": str(ckpt)}
    rc = verify_packing.run(params=[str(ROOT / "params.yaml"), json.dumps({"model": model})], lengths="5,17,30")
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"target weights: checkpoint {ckpt}" in out and "verify-packing: PASS" in out
