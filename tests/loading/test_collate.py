"""Collation: padded batches and packed rows, their token counts, and budget violations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lenbatch.batching.strategy import layout_of
from lenbatch.loading.collate import collate, collate_packed, collate_padded


def _seqs(lengths, seed=0):
    """Random token samples, the last three quarters of each learned (a chat sample's shape)."""
    rng = np.random.default_rng(seed)
    out = []
    for n in map(int, lengths):
        mask = np.zeros(n, dtype=np.int64)
        mask[min(n - 1, int(round(n * 0.25))) :] = 1
        out.append({"input_ids": rng.integers(1, 1000, size=n, dtype=np.int64), "loss_mask": mask})
    return out


def test_padded_batch_right_pads_and_masks():
    seqs = _seqs([5, 9, 3])
    b = collate_padded(seqs, token_budget=27, max_batch_size=3, indices=[7, 8, 9])
    assert b.layout == "padded" and b.input_ids.shape == (3, 9)
    assert b.lengths.tolist() == [5, 9, 3] and b.indices.tolist() == [7, 8, 9]
    assert b.attention_mask.sum(1).tolist() == [5, 9, 3]
    for i, s in enumerate(seqs):
        n = len(s["input_ids"])
        assert b.input_ids[i, :n].tolist() == list(s["input_ids"])
        assert (b.input_ids[i, n:] == 0).all() and not b.loss_mask[i, n:].any()
        assert b.loss_mask[i, :n].tolist() == [bool(x) for x in s["loss_mask"]]
    assert (b.useful_tokens, b.computed_tokens, b.shape_length, b.num_sequences) == (17, 27, 9, 3)


def test_packed_row_restarts_positions_and_keeps_boundaries():
    seqs = _seqs([4, 1, 6])
    b = collate_packed(seqs, token_budget=11)
    assert b.layout == "packed" and b.input_ids.shape == (1, 11)
    assert b.cu_seqlens.dtype == torch.int32 and b.cu_seqlens.tolist() == [0, 4, 5, 11]
    assert b.position_ids[0].tolist() == [0, 1, 2, 3, 0, 0, 1, 2, 3, 4, 5]
    assert b.seq_index[0].tolist() == [0] * 4 + [1] + [2] * 6
    assert b.input_ids[0].tolist() == [int(t) for s in seqs for t in s["input_ids"]]
    assert (b.useful_tokens, b.computed_tokens, b.shape_length) == (11, 11, 11)
    rows, starts = b.seq_rows_starts()
    assert rows.tolist() == [0, 0, 0] and starts.tolist() == [0, 4, 5]


def test_batches_over_budget_are_refused():
    with pytest.raises(ValueError, match="token_budget"):
        collate_padded(_seqs([5, 9, 3]), token_budget=26, max_batch_size=8)  # 3 x 9 = 27 > 26
    with pytest.raises(ValueError, match="max_batch_size"):
        collate_padded(_seqs([2, 2, 2]), token_budget=100, max_batch_size=2)
    with pytest.raises(ValueError, match="token_budget"):
        collate_packed(_seqs([5, 9, 3]), token_budget=16)
    with pytest.raises(ValueError, match="at least one sample"):
        collate_padded([], token_budget=10, max_batch_size=2)
    bad = {"input_ids": np.arange(4), "loss_mask": np.ones(3)}
    with pytest.raises(ValueError, match="loss_mask"):
        collate_packed([bad], token_budget=10)
    with pytest.raises(ValueError, match="at least one token"):
        collate_packed([{"input_ids": [], "loss_mask": []}], token_budget=10)


def test_layouts_per_strategy():
    assert [layout_of(s) for s in ("sorted", "random", "bucketed", "sortish", "packed")] == ["padded"] * 4 + ["packed"]
    for bad in ("shuffled", None, 3):
        with pytest.raises(ValueError, match="unknown; choose one of"):
            layout_of(bad)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_labels_path(layout):
    """Samples with labels: a learned token needs loss_mask 1 and a label != -100, model_inputs scores the labels
    (padding -100, packed sequence starts -100); labels equal to input_ids give exactly the no-labels inputs, and
    a batch without labels has Batch.labels None."""
    seqs = _seqs([6, 3, 9], seed=2)
    plain = collate(seqs, layout=layout)
    assert plain.labels is None
    same = collate([{**s, "labels": s["input_ids"]} for s in seqs], layout=layout)
    for key, value in plain.model_inputs().items():
        got = same.model_inputs()[key]
        assert torch.equal(got, value) if torch.is_tensor(value) else got == value, key
    labels = [np.where(np.arange(len(s["input_ids"])) % 2 == 0, -100, s["input_ids"] + 1) for s in seqs]
    b = collate([{**s, "labels": y} for s, y in zip(seqs, labels)], layout=layout).to("cpu")
    got = b.model_inputs()["labels"]
    rows, starts = b.seq_rows_starts()
    for i, (s, y) in enumerate(zip(seqs, labels)):
        r, a = int(rows[i]), int(starts[i])
        want = np.where(np.asarray(s["loss_mask"]).astype(bool), y, -100)
        if layout == "packed":
            want[0] = -100  # no token predicts across a sequence boundary
        assert got[r, a : a + len(y)].tolist() == want.tolist()
        assert b.loss_mask[r, a : a + len(y)].tolist() == ((y != -100) & (np.asarray(s["loss_mask"]) == 1)).tolist()
    if layout == "padded":
        assert (got[2 - 1, 3:] == -100).all() and b.labels[1, 3:].eq(-100).all()
