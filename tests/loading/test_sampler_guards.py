"""The sampler is right or says so: a state taken while DataLoader workers prefetch resumes at the first
batch not trained on; a second pass without set_epoch warns; pieces without view() fail at the first batch;
a dataset or stream given as lengths, a corrupt state and out-of-range plan indices are refused by name."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import torch

import lenbatch as lb

KW = dict(strategy="packed", token_budget=1024, max_batch_size=16, seed=0)


def _data(n=400):
    lengths = np.random.default_rng(0).integers(8, 120, size=n)
    return lengths, [{"input_ids": [i] * int(x)} for i, x in enumerate(lengths)]


def _rows(batch):
    return sorted(set(batch.input_ids[0].tolist()))


def test_state_through_sampler_dataloader_with_workers_resumes_at_the_first_batch_not_trained():
    """sampler.dataloader() counts the batches it returns to the loop, so a plain state_dict() is exact while
    two workers prefetch; a plain DataLoader's state is what the sampler handed out (documented: ahead)."""
    lengths, data = _data()
    sampler = lb.LengthBatchSampler(lengths, **KW)
    loader = sampler.dataloader(data, num_workers=2, collate_fn=lb.collate_packed)
    for i, _ in enumerate(loader):
        if i == 9:
            state = sampler.state_dict()
            break
    assert sampler._position > 10  # the workers were handed more than the loop received
    assert state["position"] == 10
    assert copy.deepcopy(sampler).plan() == sampler.plan()
    again = lb.LengthBatchSampler(lengths, **KW)
    again.load_state_dict(state)
    rest = list(again.dataloader(data, num_workers=2, collate_fn=lb.collate_packed))
    plan = sampler.plan()
    assert [_rows(b) for b in rest] == [sorted(int(j) for j in b) for b in plan[10:]]
    assert again.state_dict()["position"] == len(plan)

    plain = lb.LengthBatchSampler(lengths, **KW)
    for i, _ in enumerate(
        torch.utils.data.DataLoader(data, batch_sampler=plain, num_workers=2, collate_fn=lb.collate_packed)
    ):
        if i == 9:
            assert plain.state_dict()["position"] == plain._position > 10  # handed out, as documented
            break


def test_sampler_dataloader_refuses_batching_arguments():
    lengths, data = _data()
    sampler = lb.LengthBatchSampler(lengths, **KW)
    with pytest.raises(ValueError, match=r"\['batch_size', 'shuffle'\] cannot be given"):
        sampler.dataloader(data, batch_size=4, shuffle=True)


def test_state_behind_a_wrapper_with_workers_is_exact_through_consumed():
    """A batch sampler around ours (as accelerate's shard is) with prefetching workers: consumed(loader)
    counts what the loop received, which is where a resume must start."""
    lengths, data = _data()
    sampler = lb.LengthBatchSampler(lengths, **KW)

    class Wrapper(torch.utils.data.Sampler):
        def __iter__(self):
            yield from sampler

        def __len__(self):
            return len(sampler)

    loader = torch.utils.data.DataLoader(data, batch_sampler=Wrapper(), num_workers=2, collate_fn=lb.collate_packed)
    for i, _ in enumerate(sampler.consumed(loader)):
        if i == 3:
            state = sampler.state_dict()
            break
    assert state["position"] == 4 and sampler._position > 4


def test_a_second_pass_without_set_epoch_warns_once(caplog):
    lengths, _ = _data()
    sampler = lb.LengthBatchSampler(lengths, **KW)
    with caplog.at_level(logging.WARNING, logger="lenbatch.sampler"):
        first = [list(b) for b in sampler]
        assert "set_epoch" not in caplog.text
        second = [list(b) for b in sampler]
        list(sampler)
    assert first == second
    assert caplog.text.count("a second pass over epoch 0 without set_epoch") == 1
    caplog.clear()
    quiet = lb.LengthBatchSampler(lengths, **KW)
    with caplog.at_level(logging.WARNING, logger="lenbatch.sampler"):
        for epoch in range(3):
            quiet.set_epoch(epoch)
            list(quiet)
    assert "set_epoch" not in caplog.text


def test_split_without_view_fails_at_the_first_batch_with_the_fix():
    lengths, data = _data(300)
    lengths[-1] = 3000
    data[-1] = {"input_ids": [1] * 3000}
    sampler = lb.LengthBatchSampler(lengths, overflow="split", **KW)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler, collate_fn=lb.collate_packed)
    with pytest.raises(
        ValueError,
        match=r"overflow='split' cut 1 samples .* build the loader over "
        r"sampler.view\(dataset\)",
    ):
        next(iter(loader))
    view = torch.utils.data.DataLoader(sampler.view(data), batch_sampler=sampler, collate_fn=lb.collate_packed)
    assert sum(b.useful_tokens for b in view) == int(lengths.sum())


def test_streams_and_datasets_given_as_lengths_are_refused_with_the_way_out():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield {"input_ids": [1, 2]}

    with pytest.raises(ValueError, match=r"no len\(\).*count the lengths in one pass.*lenbatch.StreamingBatcher"):
        lb.LengthBatchSampler(Stream(), **KW)
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([{"input_ids": [1, 2, 3]}] * 4)
    with pytest.raises(ValueError, match=r"no len\(\).*lenbatch.StreamingBatcher"):
        lb.LengthBatchSampler(ds.to_iterable_dataset(), **KW)
    with pytest.raises(ValueError, match=r"got Dataset \(the dataset itself\); pass lb.lengths_of\(dataset\)"):
        lb.LengthBatchSampler(ds, **KW)


def test_a_huge_length_is_too_long_not_negative():
    with pytest.raises(ValueError, match=r"length of 1e\+300 tokens at index 1: too long to be a token count"):
        lb.LengthBatchSampler([5.0, 1e300], **KW)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"position": 1.5}, "position must be an int, got 1.5"),
        ({"position": "1"}, "position must be an int, got '1'"),
        ({"epoch": True}, "epoch must be an int, got True"),
        ({"epoch": -1}, "epoch is -1"),
        ({"version": 999}, "version 999, but this lenbatch reads version 1"),
    ],
)
def test_a_corrupt_state_is_refused(change, message):
    lengths, _ = _data()
    sampler = lb.LengthBatchSampler(lengths, **KW)
    state = sampler.state_dict()
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        lb.LengthBatchSampler(lengths, **KW).load_state_dict({**state, **change})


@pytest.mark.parametrize(
    "batches, message",
    [
        ([np.array([0, -1])], "sample index -1, outside 0..2"),
        ([np.array([3])], "sample index 3, outside 0..2"),
        ([np.array([0.0, 1.0])], "integer sample indices .* got dtype float64"),
    ],
)
def test_padding_efficiency_refuses_indices_numpy_would_wrap(batches, message):
    with pytest.raises(ValueError, match=rf"batches (must hold|holds) .*{message}|{message}"):
        lb.padding_efficiency(np.array([3, 4, 5]), batches)
    with pytest.raises(ValueError, match="batches"):
        lb.budget_fill(np.array([3, 4, 5]), batches, 10)


def test_the_trainer_refuses_a_stream_pointing_to_the_way_out(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from lenbatch.hf import LengthBatchTrainer

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield {"input_ids": [1, 2, 3]}

    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
        )
    )
    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=1, use_cpu=True, report_to="none")
    with pytest.raises(ValueError, match=r"map-style train_dataset.*lenbatch.StreamingBatcher"):
        LengthBatchTrainer(
            model=model, args=args, train_dataset=Stream(), strategy="sortish", token_budget=64, max_batch_size=4
        )


def test_sampler_dataloader_serves_the_pieces_and_forwards_set_epoch():
    """dataloader() builds its loader over view(dataset), so split pieces load without a second step, and
    loader.set_epoch(e) plans epoch e."""
    lengths, data = _data()
    lengths = lengths.copy()
    lengths[0] = 1500  # over the budget: split into two pieces
    data[0] = {"input_ids": [0] * 1500}
    sampler = lb.LengthBatchSampler(lengths, overflow="split", **KW)
    loader = sampler.dataloader(data, collate_fn=lb.collate_packed)
    loader.set_epoch(1)
    assert sampler.epoch == 1
    batches = list(loader)
    assert sum(b.useful_tokens for b in batches) == int(lengths.sum())
    assert sampler.state_dict()["position"] == len(batches) == len(sampler.plan(1))
