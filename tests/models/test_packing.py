"""Packed rows keep sequences apart in every layer; Hugging Face's own fallback does not.

Everything runs the real ``transformers`` Qwen3_5 classes on the tiny CPU config.
"""

from __future__ import annotations

import importlib.util
import inspect

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.qwen3_5 import modeling_qwen3_5

from lenbatch_study.models import varlen, verify
from lenbatch_study.cli import main
from lenbatch_study.core.config import ModelConfig
from lenbatch_study.models.target import build_target
from lenbatch_study.tools.verify_packing import parse_lengths

# transformers' own token-by-token torch kernel (unwrapped: where fla is installed the name calls fla)
torch_recurrent_gated_delta_rule = inspect.unwrap(modeling_qwen3_5.torch_recurrent_gated_delta_rule)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def target(one_thread):
    return build_target(ModelConfig())


def _cu(lengths):
    return torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32)


def _ids(lengths, vocab, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (1, n), generator=gen) for n in lengths]


def test_hf_fallback_leaks_or_refuses(target):
    """The reason this project exists, checked on transformers' own forward (no lenbatch code).

    Given only restarting position ids, the Gated DeltaNet layers carry state from one
    packed sequence into the next; given cu_seq_lens_q, the torch fallback refuses.
    """
    lengths = [5, 17, 30]
    seqs = _ids(lengths, target.cfg.vocab_size)
    row = torch.cat(seqs, dim=1)
    pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    # transformers' own torch kernels, also where flash-linear-attention is installed (it swaps them)
    with torch.no_grad(), varlen.torch_reference_kernels():
        packed = target.model(input_ids=row, position_ids=pos).last_hidden_state
        alone = [target.model(input_ids=s).last_hidden_state for s in seqs]
        first_linear = target.reference_hidden_states(seqs[1])[0]  # layer 0: linear_attention
        hf_layers = {}
        hooks = [target.model.layers[0].register_forward_hook(lambda _m, _a, out: hf_layers.__setitem__(0, out))]
        target.model(input_ids=row, position_ids=pos)
        for h in hooks:
            h.remove()
    starts = np.cumsum([0, *lengths])
    # the first sequence is unaffected, the later ones are not
    assert (packed[:, : lengths[0]] - alone[0]).abs().max() < 1e-4
    for i in (1, 2):
        diff = (packed[:, starts[i] : starts[i + 1]] - alone[i]).abs().max().item()
        assert diff > 0.1, f"expected HF's packed forward to leak into sequence {i}, diff {diff}"
    # already the first Gated DeltaNet layer leaks (state + conv taps), before any attention layer
    leak = (hf_layers[0][:, starts[1] : starts[2]] - first_linear).abs().max().item()
    assert leak > 1e-3
    cu = torch.tensor(starts, dtype=torch.int32)
    if importlib.util.find_spec("fla") is not None:
        return  # with fla installed transformers hands cu_seq_lens_q to fla instead of refusing
    with pytest.raises(ValueError, match="flash-linear-attention"):
        with torch.no_grad():
            target.model(
                input_ids=row,
                position_ids=pos,
                cu_seq_lens_q=cu,
                cu_seq_lens_k=cu,
                max_length_q=max(lengths),
                max_length_k=max(lengths),
            )


def test_packed_equals_per_sequence_at_chunk_and_kernel_edges(target):
    # lengths below the conv width, at and around the chunk size, and longer than several chunks
    lengths = [1, 2, 3, 4, 31, 32, 33, 63, 64, 65, 200]
    result = verify.verify_packing(target, lengths, seed=3)
    worst = result["max_abs_diff"]
    assert worst["linear_attention"] < 1e-5
    assert worst["full_attention"] < 1e-5
    assert worst["final"] < 1e-4
    withheld = verify.verify_packing(target, lengths, seed=3, boundaries=False)["max_abs_diff"]
    assert withheld["linear_attention"] > 1e-3 and withheld["final"] > 1e-2


def test_features_packed_equal_features_padded(target):
    lengths = [70, 5, 33]
    seqs = _ids(lengths, target.cfg.vocab_size, seed=1)
    packed = target.features(torch.cat(seqs, dim=1), cu_seqlens=_cu(lengths))
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : s.shape[1]] = s[0]
        mask[i, : s.shape[1]] = 1
    padded = target.features(ids, attention_mask=mask)
    assert packed.shape == (1, sum(lengths), target.feature_dim)
    starts = np.cumsum([0, *lengths])
    for i, n in enumerate(lengths):
        torch.testing.assert_close(packed[0, starts[i] : starts[i + 1]], padded[i, :n], atol=1e-5, rtol=1e-4)
    assert padded[mask == 0].abs().max() == 0  # padding positions are exact zeros


def test_padded_path_matches_hf_padded_forward(target):
    """The padded layout through lenbatch's kernels == transformers' own padded forward (valid tokens)."""
    lengths = [40, 17, 3]
    ids = torch.zeros(3, 40, dtype=torch.long)
    mask = torch.zeros(3, 40, dtype=torch.long)
    for i, s in enumerate(_ids(lengths, target.cfg.vocab_size, seed=2)):
        ids[i, : lengths[i]] = s[0]
        mask[i, : lengths[i]] = 1
    ours = target.hidden_states(ids, attention_mask=mask, layers=None, final_norm=True)["final"]
    with torch.no_grad(), varlen.torch_reference_kernels():
        theirs = target.model(input_ids=ids, attention_mask=mask).last_hidden_state
    valid = mask.bool()
    torch.testing.assert_close(ours[valid], theirs[valid], atol=1e-4, rtol=1e-4)


@settings(max_examples=12, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 90), min_size=1, max_size=5),
    seed=st.integers(0, 2**16),
    chunk=st.sampled_from([8, 16, 32, 64]),
)
def test_delta_rule_matches_token_by_token_reference(lengths, seed, chunk):
    """Chunked varlen delta rule vs transformers' recurrent (one token at a time) rule per sequence."""
    gen = torch.Generator().manual_seed(seed)
    n, hk, hv, d = sum(lengths), 2, 4, 16
    q, k = torch.randn(1, n, hk, d, generator=gen), torch.randn(1, n, hk, d, generator=gen)
    v = torch.randn(1, n, hv, d, generator=gen)
    g = -torch.rand(1, n, hv, generator=gen) * 3  # decays down to exp(-3) per token
    beta = torch.rand(1, n, hv, generator=gen)
    segs = varlen.make_segments(torch.zeros(1, n, dtype=torch.long), cu_seqlens=_cu(lengths))
    out = varlen.chunk_gated_delta_rule(q, k, v, g, beta, segs, chunk=chunk)
    start = 0
    for length in lengths:
        sl = slice(start, start + length)
        ref, _ = torch_recurrent_gated_delta_rule(
            q[:, sl], k[:, sl], v[:, sl], g=g[:, sl], beta=beta[:, sl], use_qk_l2norm_in_kernel=True
        )
        torch.testing.assert_close(out[:, sl], ref, atol=2e-5, rtol=1e-4)
        start += length


@settings(max_examples=10, deadline=None)
@given(lengths=st.lists(st.integers(1, 12), min_size=1, max_size=6), kernel=st.integers(1, 5))
def test_causal_conv_never_reads_across_a_boundary(lengths, kernel):
    n, ch = sum(lengths), 6
    x = torch.randn(1, n, ch)
    w = torch.randn(ch, kernel)
    segs = varlen.make_segments(torch.zeros(1, n, dtype=torch.long), cu_seqlens=_cu(lengths))
    out = varlen.causal_conv(x, w, segs)
    start = 0
    for length in lengths:
        xs = x[:, start : start + length].transpose(1, 2)
        ref = F.silu(F.conv1d(xs, w.unsqueeze(1), padding=kernel - 1, groups=ch)[..., :length]).transpose(1, 2)
        torch.testing.assert_close(out[:, start : start + length], ref, atol=1e-6, rtol=1e-5)
        start += length


def test_verify_packing_cli_passes_and_fails_on_purpose(capsys):
    assert main(["verify-packing", "--lengths", "5,17,300,64"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "linear_attention" in out and "full_attention" in out and "final hidden" in out
    assert main(["verify-packing", "--lengths", "5,17,300,64", "--no-boundaries"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "WITHHELD" in out


def test_verify_packing_bfloat16_is_judged_relative(capsys):
    assert main(["verify-packing", "--dtype", "bfloat16", "--lengths", "5,40,70"]) == 0
    assert "relative tolerance" in capsys.readouterr().out


def test_verify_packing_with_a_hugging_face_config_json(tmp_path, capsys):
    cfg = {
        "model_type": "qwen3_5",
        "text_config": {
            "model_type": "qwen3_5_text",
            "vocab_size": 512,
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 4,
            "full_attention_interval": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "linear_conv_kernel_dim": 4,
            "rope_parameters": {"rope_theta": 1e6, "partial_rotary_factor": 0.25},
        },
    }
    path = tmp_path / "config.json"
    path.write_text(__import__("json").dumps(cfg))
    assert main(["verify-packing", "--model-config", str(path), "--lengths", "3,40,9"]) == 0
    assert "PASS" in capsys.readouterr().out


@pytest.mark.parametrize("text", ["5,0,3", "5,-2", "a,b", "", "4.5"])
def test_bad_lengths(text, capsys):
    with pytest.raises(ValueError, match="positive integers"):
        parse_lengths(text)
    assert main(["verify-packing", "--lengths", text]) == 2
    assert "--lengths" in capsys.readouterr().err


@pytest.mark.parametrize(
    "cu, match",
    [
        ([0, 3, 9], "inconsistent with input length 10"),
        ([1, 4, 10], "start at 0"),
        ([0, 6, 6, 10], "non-empty"),
        ([[0, 10]], "1-D integer"),
    ],
)
def test_bad_cu_seqlens(target, cu, match):
    with pytest.raises(ValueError, match=match):
        target.features(torch.zeros(1, 10, dtype=torch.long), cu_seqlens=torch.tensor(cu))


def test_bad_padded_batches(target):
    ids = torch.zeros(2, 6, dtype=torch.long)
    with pytest.raises(ValueError, match="right-padded"):
        target.features(ids, attention_mask=torch.tensor([[0, 1, 1, 1, 1, 1], [1] * 6]))
    with pytest.raises(ValueError, match="shape"):
        target.features(ids, attention_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="not both"):
        target.features(ids, attention_mask=torch.ones(2, 6), cu_seqlens=torch.tensor([0, 6]))
    with pytest.raises(ValueError, match=r"\[1, N\]"):
        target.features(ids, cu_seqlens=torch.tensor([0, 6]))
