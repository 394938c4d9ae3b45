"""Samples longer than the token budget: refused by default, truncated or split on request, counted and
reported; a split sample's rest is planned as samples of its own whose positions restart."""

import logging

import numpy as np
import pytest
import torch

import lenbatch as lb
from lenbatch.batching.overflow import overflow_pieces
from lenbatch.loading.overflow import PieceDataset, slice_sample
from lenbatch.loading.sampler import LengthBatchSampler

B = 256
X = np.random.default_rng(1).integers(5, 200, size=300)
X[[3, 50, 51, 299]] = [257, 600, 1000, 513]  # 4 over budget: 2, 3, 4 and 3 pieces


def test_error_is_the_default_and_names_the_fix():
    with pytest.raises(
        ValueError,
        match=r"4 sample\(s\) are longer than token_budget=256 .*overflow='truncate'.*"
        r"overflow='split'",
    ):
        LengthBatchSampler(X, strategy="packed", token_budget=B, max_batch_size=32)
    with pytest.raises(ValueError, match="overflow must be one of"):
        LengthBatchSampler(X, strategy="packed", token_budget=B, max_batch_size=32, overflow="drop")


def test_truncate_counts_what_it_drops():
    p = overflow_pieces(X, token_budget=B, overflow="truncate")
    assert p.counts() == {"samples_over_budget": 4, "tokens_dropped": 1 + 344 + 744 + 257, "pieces_added": 0}
    assert p.lengths.max() == B and p.row.tolist() == list(range(300))
    assert p.item(50) == (50, 0, B) and p.item(0) == 0


def test_split_covers_every_token_once_in_budget_sized_pieces():
    p = overflow_pieces(X, token_budget=B, overflow="split")
    assert p.counts() == {"samples_over_budget": 4, "tokens_dropped": 0, "pieces_added": 1 + 2 + 3 + 2}
    assert p.lengths.max() <= B and p.lengths.min() >= 1
    for row in (3, 50, 51, 299, 7):
        spans = sorted((int(s), int(e)) for r, s, e in zip(p.row, p.start, p.end) if r == row)
        assert spans[0][0] == 0 and spans[-1][1] == X[row]
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # contiguous, no overlap


@pytest.mark.parametrize("strategy", ["packed", "sortish", "random"])
def test_split_sampler_two_ranks_train_every_token_once_per_epoch(strategy, caplog):
    dataset = [
        {"input_ids": list(range(1000 * i, 1000 * i + int(n))), "labels": list(range(int(n)))} for i, n in enumerate(X)
    ]
    with caplog.at_level(logging.WARNING, logger="lenbatch.sampler"):
        samplers = [
            LengthBatchSampler(
                X, strategy=strategy, token_budget=B, max_batch_size=32, seed=3, rank=r, world_size=2, overflow="split"
            )
            for r in (0, 1)
        ]
    assert "4 of 300 samples are longer than token_budget=256: split into 12 pieces" in caplog.text
    assert samplers[0].overflow_counts["pieces_added"] == 8
    collate = lb.collate_packed if strategy == "packed" else lb.collate_padded
    epochs = []
    for epoch in (0, 1):
        tokens, batches = [], []
        for s in samplers:
            s.set_epoch(epoch)
            view = s.view(dataset)
            assert isinstance(view, PieceDataset)
            for batch in s:
                batches.append(batch)
                samples = [view[i] for i in batch]
                for item, smp in zip(batch, samples):
                    row, a, e = item if isinstance(item, tuple) else (item, 0, int(X[item]))
                    assert smp["input_ids"] == dataset[row]["input_ids"][a:e]
                    assert smp["labels"] == dataset[row]["labels"][a:e]
                    tokens.extend(smp["input_ids"])
                out = collate(samples)
                assert out.computed_tokens <= B if strategy == "packed" else out.input_ids.shape[1] <= B
                rows, starts = out.seq_rows_starts()
                assert (out.position_ids[rows, starts] == 0).all()  # every piece starts at position 0
        assert sorted(tokens) == sorted(t for d in dataset for t in d["input_ids"])  # each token once
        epochs.append(batches)
    assert epochs[0] != epochs[1]


def test_slice_sample_restarts_positions_and_keeps_other_fields():
    smp = {
        "input_ids": [5, 6, 7, 8],
        "position_ids": [0, 1, 2, 3],
        "attention_mask": torch.ones(4),
        "completion_mask": np.array([0, 1, 1, 1]),
        "source": "web",
        "n": 4,
    }
    out = slice_sample(smp, 2, 4)
    assert out["input_ids"] == [7, 8] and out["position_ids"] == [0, 1] and out["source"] == "web"
    assert out["completion_mask"].tolist() == [1, 1] and out["attention_mask"].shape == (2,) and out["n"] == 4
    with pytest.raises(ValueError, match="mapping with 'input_ids'"):
        slice_sample([1, 2, 3], 0, 2)


def test_no_overflow_yields_rows_and_the_dataset_itself():
    x = np.minimum(X, B)
    s = LengthBatchSampler(x, strategy="packed", token_budget=B, max_batch_size=32, overflow="split")
    plain = LengthBatchSampler(x, strategy="packed", token_budget=B, max_batch_size=32)
    assert list(s) == list(plain) and s.fingerprint == plain.fingerprint
    data = [0] * len(x)
    assert s.view(data) is data and s.overflow_counts["samples_over_budget"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("overflow", ["split", "truncate"])
def test_trainer_overflow_trains_what_it_reports(tmp_path, overflow, caplog):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from lenbatch.hf import LengthBatchTrainer

    x = np.random.default_rng(2).integers(3, 40, size=60)
    x[[4, 9]] = [70, 130]  # budget 64: 2 and 3 pieces
    data = [{"input_ids": [1 + i % 200] * int(n)} for i, n in enumerate(x)]
    steps = []

    class Recording(LengthBatchTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            steps.append((int(inputs["input_ids"].numel()), int((inputs["position_ids"] == 0).sum())))
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        num_train_epochs=1,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",
        seed=1,
        dataloader_num_workers=0,
    )
    kw = dict(
        model=transformers.LlamaForCausalLM(cfg),
        args=args,
        train_dataset=data,
        strategy="packed",
        token_budget=64,
        max_batch_size=8,
    )
    with pytest.raises(ValueError, match="overflow='split'"):
        Recording(**kw)
    with caplog.at_level(logging.WARNING, logger="lenbatch.hf"):
        tr = Recording(**kw, overflow=overflow)
    tr.train()
    assert "2 of 60 samples are longer than token_budget=64" in caplog.text
    counts = tr.pieces.counts()
    trained_tokens, sequences = sum(t for t, _ in steps), sum(s for _, s in steps)
    assert all(t <= 64 for t, _ in steps)
    if overflow == "split":
        assert counts == {"samples_over_budget": 2, "tokens_dropped": 0, "pieces_added": 3}
        assert trained_tokens == int(x.sum()) and sequences == 60 + 3
    else:
        assert counts == {"samples_over_budget": 2, "tokens_dropped": 6 + 66, "pieces_added": 0}
        assert trained_tokens == int(np.minimum(x, 64).sum()) and sequences == 60
