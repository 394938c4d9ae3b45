"""Every loss mask a chat dataset carries reaches the labels, in both layouts: lenbatch's ``loss_mask``,
TRL's ``completion_mask`` and transformers' chat-template ``assistant_masks``; two masks that disagree
are refused by name; token ids that do not fit int64 are refused with the sample and field."""

from __future__ import annotations

import numpy as np
import pytest

import lenbatch as lb

COLLATES = {"padded": lb.collate_padded, "packed": lb.collate_packed}


def _chats():
    rng = np.random.default_rng(0)
    out = []
    for n, prompt in ((9, 4), (5, 2), (12, 7)):
        mask = np.zeros(n, dtype=np.int64)
        mask[prompt:] = 1
        out.append((rng.integers(1, 500, size=n).tolist(), mask.tolist()))
    return out


def _learned(layout: str, inputs: dict) -> list[list[int]]:
    """The (token, label) pairs each sequence learns, read back from ``model_inputs()``'s labels."""
    labels = inputs["labels"]
    if layout == "padded":
        return [[int(t) for t in row if t != -100] for row in labels]
    cu = inputs["cu_seq_lens_q"].tolist()
    return [[int(t) for t in labels[0, a:b] if t != -100] for a, b in zip(cu, cu[1:])]


@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("field", ["loss_mask", "completion_mask", "assistant_masks"])
def test_each_mask_becomes_the_labels(layout, field):
    chats = _chats()
    batch = COLLATES[layout]([{"input_ids": ids, field: mask} for ids, mask in chats])
    got = _learned(layout, batch.model_inputs())
    # packed: a sequence's first label is -100 anyway (no token predicts across a boundary); every mask
    # here starts with a prompt token, so the learned tokens are exactly those under the mask
    want = [[t for t, m in zip(ids, mask) if m] for ids, mask in chats]
    assert got == want
    assert sum(map(len, got)) == 5 + 3 + 5 < batch.useful_tokens  # the prompts are not learned


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_masks_and_labels_fold_together(layout):
    ids, mask = _chats()[0]
    labels = list(ids)
    labels[-1] = -100  # a label the dataset itself excludes
    batch = COLLATES[layout]([{"input_ids": ids, "assistant_masks": mask, "completion_mask": mask, "labels": labels}])
    assert _learned(layout, batch.model_inputs()) == [ids[4:-1]]


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_two_masks_that_disagree_are_refused_by_name(layout):
    ids, mask = _chats()[2]
    other = list(mask)
    other[3] = 1  # one prompt token learned by one mask only
    with pytest.raises(
        ValueError,
        match=r"sample 1: loss_mask and assistant_masks disagree on 1 of 12 tokens "
        r"\(first at token 3\)",
    ):
        COLLATES[layout]([{"input_ids": [5, 6]}, {"input_ids": ids, "loss_mask": mask, "assistant_masks": other}])
    with pytest.raises(ValueError, match="completion_mask has 11 entries but input_ids has 12"):
        COLLATES[layout]([{"input_ids": ids, "completion_mask": mask[:-1]}])


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_token_ids_beyond_int64_are_refused_not_overflowed(layout):
    with pytest.raises(ValueError, match="sample 0: input_ids must be integer token ids within int64"):
        COLLATES[layout]([{"input_ids": [1, 2**70]}])
    with pytest.raises(ValueError, match="sample 0: labels must be integer token ids within int64"):
        COLLATES[layout]([{"input_ids": [1, 2], "labels": [1, 2**70]}])
    with pytest.raises(ValueError, match="input_ids holds id 18446744073709551615, beyond int64"):
        COLLATES[layout]([{"input_ids": np.array([1, 2**64 - 1], dtype=np.uint64)}])
    with pytest.raises(ValueError, match="input_ids must be integer token ids, got dtype float64"):
        COLLATES[layout]([{"input_ids": [1, 2.5]}])
