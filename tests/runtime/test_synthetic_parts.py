"""The study's synthetic sequences (profile grid, reference step) and the batches rebuilt from the tensors
that travel between ranks (transport)."""

import numpy as np
import pytest
import torch

from lenbatch.loading.collate import collate
from lenbatch_study.runtime.synthetic import synthetic_sequences
from lenbatch_study.runtime.transport import batch_from_parts


def _seqs(lengths, seed=0):
    return synthetic_sequences(lengths, vocab_size=1000, seed=seed)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_parts_round_trip(layout):
    seqs = _seqs([7, 2, 12])
    b = collate(seqs, layout=layout, token_budget=64, max_batch_size=8, indices=[1, 2, 3])
    r = batch_from_parts(layout, b.input_ids, b.loss_mask.to(torch.uint8), b.lengths, b.indices)
    for name in (
        "input_ids",
        "loss_mask",
        "position_ids",
        "lengths",
        "indices",
        "attention_mask",
        "cu_seqlens",
        "seq_index",
    ):
        x, y = getattr(b, name), getattr(r, name)
        assert (x is None and y is None) or torch.equal(x, y), name


def test_synthetic_sequences_are_reproducible_with_a_completion_mask():
    a = synthetic_sequences([10, 3, 1], vocab_size=50, seed=1)
    b = synthetic_sequences([10, 3, 1], vocab_size=50, seed=1)
    c = synthetic_sequences([10, 3, 1], vocab_size=50, seed=2)
    assert [len(s["input_ids"]) for s in a] == [10, 3, 1]
    assert all(np.array_equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, b))
    assert not np.array_equal(a[0]["input_ids"], c[0]["input_ids"])
    assert all(s["input_ids"].max() < 50 and s["loss_mask"][-1] == 1 for s in a)
    assert a[0]["loss_mask"].tolist() == [0, 0] + [1] * 8  # first quarter (rounded) is the prompt
    with pytest.raises(ValueError):
        synthetic_sequences([0], vocab_size=50, seed=0)
