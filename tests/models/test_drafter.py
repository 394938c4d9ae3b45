"""The DFlash drafter: packed == unpacked, attention structure, anchors, the weighted loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lenbatch.loading.collate import collate_packed, collate_padded
from lenbatch_study.runtime.synthetic import synthetic_sequences
from lenbatch_study.core.config import load_params
from lenbatch_study.models.anchors import draw_anchors
from lenbatch_study.models.drafter import ChunkedLinearCrossEntropy, block_attention_mask, build_drafter
from lenbatch_study.runtime.runner import StepRunner

# A small target (the real Qwen3.5 classes): 3 Gated DeltaNet layers + 1 full attention, small vocab.
SMALL = {
    "model": {
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "target_layers": [1, 3],
    },
    "drafter": {"num_layers": 2, "num_heads": 4, "anchors_per_seq": 3},
    "batching": {"token_budget": 2048, "max_batch_size": 8},
    "data": {"max_len": 1024},
}
LENGTHS = [37, 300, 5, 181, 90]


@pytest.fixture(scope="module")
def runner():
    torch.manual_seed(0)
    params = load_params("params.yaml", overrides=SMALL)
    return StepRunner(params, device="cpu")


@pytest.fixture(scope="module")
def batches():
    seqs = synthetic_sequences(LENGTHS, vocab_size=512, seed=3)
    idx = list(range(100, 100 + len(LENGTHS)))
    return (
        collate_padded(seqs, token_budget=2048, max_batch_size=8, indices=idx),
        collate_packed(seqs, token_budget=2048, indices=idx),
    )


def _loss(runner, batch, feats, step=7):
    d = runner.drafter
    a, v = d.anchors_for(batch, anchors_per_seq=runner.params.drafter.anchors_per_seq, seed=0, epoch=1, step=step)
    out = d(feats, batch, a, v, embed_tokens=runner.embed_tokens, lm_head=runner.lm_head)
    return out, a, v


def test_packed_loss_equals_unpacked_loss_with_real_target_features(runner, batches):
    padded, packed = batches
    f_pad, _ = runner.target_step(padded)
    f_pk, _ = runner.target_step(packed)
    out_pad, a1, v1 = _loss(runner, padded, f_pad.clone())
    out_pk, a2, v2 = _loss(runner, packed, f_pk.clone())
    assert torch.equal(a1, a2) and torch.equal(v1, v2)
    assert out_pad.positions == out_pk.positions > 0
    assert abs(out_pad.loss.item() - out_pk.loss.item()) < 1e-5
    # gradients agree too: the packed row trains the drafter exactly like the padded batch
    params = list(runner.drafter.parameters())
    g_pad = torch.autograd.grad(out_pad.loss, params)
    g_pk = torch.autograd.grad(out_pk.loss, params)
    for x, y in zip(g_pad, g_pk):
        assert torch.allclose(x, y, atol=1e-5, rtol=1e-4)


def test_blocks_see_only_their_own_sequence_before_the_anchor(runner, batches):
    _, packed = batches
    f, _ = runner.target_step(packed)
    f = f.clone()
    a, _ = runner.drafter.anchors_for(packed, anchors_per_seq=3, seed=0, epoch=0, step=0)
    with torch.no_grad():
        h0 = runner.drafter.block_states(f, packed, a, embed_tokens=runner.embed_tokens)
        cu = packed.cu_seqlens.tolist()
        # perturb sequence 1's features at and after its last anchor, and all of sequence 3's
        s1_from = cu[1] + int(a[1].max())
        f2 = f.clone()
        f2[0, s1_from : cu[2]] += 5.0
        f2[0, cu[3] : cu[4]] -= 3.0
        h1 = runner.drafter.block_states(f2, packed, a, embed_tokens=runner.embed_tokens)
    diff = (h1 - h0).abs().amax(dim=(2, 3))  # [S, A]
    assert diff[[0, 2, 4]].max() == 0  # other sequences untouched
    assert diff[1].max() == 0  # nothing at or after an anchor is visible to its block
    assert diff[3].max() > 1e-3  # but a sequence's own earlier context is


def test_block_attention_mask_structure():
    anchors = torch.tensor([[3, 7]])
    m = block_attention_mask(anchors, context_len=8, block_size=4)[0]  # [8, 8 + 8]
    assert m.shape == (8, 16)
    assert m[:4, :3].all() and not m[:4, 3:8].any()  # block 0: context < 3
    assert m[4:, :7].all() and not m[4:, 7:8].any()  # block 1: context < 7
    assert m[:4, 8:12].all() and not m[:4, 12:].any()  # bidirectional inside its own block only
    assert m[4:, 12:].all() and not m[4:, 8:12].any()


def test_anchors_are_reproducible_valid_and_step_dependent():
    rng = np.random.default_rng(0)
    mask = (rng.random(200) < 0.5).astype(int)
    a = draw_anchors(mask, 200, num=5, seed=0, epoch=2, step=11, seq_id=42)
    b = draw_anchors(mask, 200, num=5, seed=0, epoch=2, step=11, seq_id=42)
    c = draw_anchors(mask, 200, num=5, seed=0, epoch=2, step=12, seq_id=42)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert len(set(a.tolist())) == 5 and all(a + 1 < 200) and mask[a + 1].all()
    # fewer valid positions than anchors: all of them, never a position outside the mask
    few = np.zeros(50, dtype=int)
    few[[10, 20]] = 1
    assert draw_anchors(few, 50, num=5, seed=0, epoch=0, step=0, seq_id=0).tolist() == [9, 19]
    assert draw_anchors(np.zeros(9), 9, num=3, seed=0, epoch=0, step=0, seq_id=0).size == 0


def test_loss_is_the_weighted_cross_entropy_of_the_block_states(runner, batches):
    padded, _ = batches
    f, _ = runner.target_step(padded)
    f = f.clone()
    d, b, gamma = runner.drafter, runner.params.drafter.block_size, runner.params.drafter.gamma
    out, a, v = _loss(runner, padded, f)
    with torch.no_grad():
        h = d.block_states(f, padded, a, embed_tokens=runner.embed_tokens)
    num, den, count = 0.0, 0.0, 0
    ids, lm = padded.input_ids, padded.loss_mask
    for s in range(a.shape[0]):
        for j in range(a.shape[1]):
            if not v[s, j]:
                continue
            for k in range(1, b):
                p = int(a[s, j]) + k
                if p < int(padded.lengths[s]) and lm[s, p]:
                    w = float(np.exp(-(k - 1) / gamma))
                    logits = runner.lm_head(h[s, j, k])
                    num += w * F.cross_entropy(logits[None], ids[s, p][None]).item()
                    den += w
                    count += 1
    assert out.positions == count > 0
    assert abs(out.loss.item() - num / den) < 1e-4
    assert abs(out.weight_sum - den) < 1e-4


def test_trained_positions_are_the_loss_targets_in_both_layouts(runner, batches):
    """What the loss trains (states, target tokens, weights exp(-(k-1)/gamma)), from the block states, equals
    a loop over sequences, anchors and offsets, in the padded and the packed layout: the quality stage's
    head trains exactly the positions the train stage's lm_head loss does."""
    d, b, gamma = runner.drafter, runner.params.drafter.block_size, runner.params.drafter.gamma
    for batch in batches:
        f, _ = runner.target_step(batch)
        a, v = d.anchors_for(batch, anchors_per_seq=3, seed=0, epoch=1, step=7)
        with torch.no_grad():
            h = d.block_states(f.clone(), batch, a, embed_tokens=runner.embed_tokens)
            hid, tok, w = d.trained_positions(h, batch, a, v)
        rows, starts = batch.seq_rows_starts()
        want_h, want_tok, want_w = [], [], []
        for s in range(a.shape[0]):
            r, st = int(rows[s]), int(starts[s])
            for j in range(a.shape[1]):
                for k in range(1, b):
                    p = int(a[s, j]) + k
                    if v[s, j] and p < int(batch.lengths[s]) and batch.loss_mask[r, st + p]:
                        want_h.append(h[s, j, k])
                        want_tok.append(int(batch.input_ids[r, st + p]))
                        want_w.append(float(np.exp(-(k - 1) / gamma)))
        assert len(want_tok) > 0 and tok.tolist() == want_tok
        assert torch.equal(hid, torch.stack(want_h)) and np.allclose(w.numpy(), want_w, rtol=1e-6)


def test_a_head_is_created_last_and_leaves_the_other_weights_as_drawn():
    params = load_params("params.yaml", overrides=SMALL)
    plain = build_drafter(params)
    headed = build_drafter(params, head_classes=17, dtype="float32")
    assert plain.head is None and tuple(headed.head.weight.shape) == (17, SMALL["model"]["hidden_size"])
    names = [n for n, _ in headed.named_parameters()]
    assert names[-1] == "head.weight" and names[:-1] == [n for n, _ in plain.named_parameters()]
    for (n, x), (_, y) in zip(plain.named_parameters(), headed.named_parameters()):
        assert torch.equal(x, y), n
    other = build_drafter(params, init_seed=params.model.init_seed + 1001)
    assert not torch.equal(other.ctx_proj.weight, plain.ctx_proj.weight)


def test_chunked_cross_entropy_matches_autograd_in_float64():
    torch.manual_seed(0)
    h = torch.randn(300, 16, dtype=torch.float64, requires_grad=True)
    W = torch.randn(1000, 16, dtype=torch.float64)
    y = torch.randint(0, 1000, (300,))
    w = torch.rand(300, dtype=torch.float64)
    loss = ChunkedLinearCrossEntropy.apply(h, W, y, w)
    (g,) = torch.autograd.grad(loss, h)
    ref = (F.cross_entropy(h @ W.T, y, reduction="none") * w).sum()
    (g_ref,) = torch.autograd.grad(ref, h)
    assert abs(loss.item() - ref.item()) / ref.item() < 1e-6
    assert torch.allclose(g, g_ref, atol=1e-6)


def test_training_steps_lower_the_loss_on_a_repeated_batch():
    params = load_params("params.yaml", overrides={**SMALL, "drafter": {**SMALL["drafter"], "lr": 0.003}})
    r = StepRunner(params, device="cpu")
    seqs = synthetic_sequences([120, 80, 64], vocab_size=512, seed=5)
    batch = collate_padded(seqs, token_budget=2048, max_batch_size=8, indices=[1, 2, 3])
    f, _ = r.target_step(batch)
    losses = [r.drafter_step(batch, f, step=0)[0] for _ in range(15)]  # same anchors every time
    assert losses[-1] < losses[0] - 0.5, losses  # 6.25 -> 5.61 when written


def test_drafter_rejects_heads_that_do_not_divide_the_width():
    params = load_params("params.yaml", overrides={**SMALL, "drafter": {"num_heads": 3}})
    with pytest.raises(ValueError, match="drafter.num_heads"):
        build_drafter(params)
