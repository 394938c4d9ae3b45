"""The sampler in other people's loops (DESIGN.md "The library in other people's loops"): each silent
failure of issue 14 as a test that failed before the fix."""

import pickle
from collections.abc import Sequence

import numpy as np
import pytest
import torch

import lenbatch as lb
from lenbatch.batching.strategies import equal_epoch_batches
from lenbatch.loading.sampler import LengthBatchSampler

X = np.random.default_rng(0).integers(1, 300, size=400)
KW = dict(token_budget=1024, max_batch_size=16, seed=2)


def _epoch_loop(sampler, epochs, state=None, stop_after=None):
    """The loop everyone writes: restore, then ``set_epoch`` + iterate for each epoch from the saved one."""
    trained, start = [], 0
    if state is not None:
        sampler.load_state_dict(state)
        start = state["epoch"]
    for epoch in range(start, epochs):
        sampler.set_epoch(epoch)
        for batch in sampler:
            trained.append((epoch, batch))
            if stop_after is not None and len(trained) == stop_after:
                return trained, sampler.state_dict()
    return trained, None


@pytest.mark.parametrize("strategy", ["random", "packed"])
def test_restore_then_set_epoch_of_the_same_epoch_keeps_the_position(strategy):
    """Lhotse semantics: load_state_dict followed by set_epoch(saved epoch) resumes mid-epoch instead of
    replaying the whole epoch (issue 14: 355 batches instead of the 348 left)."""
    full, _ = _epoch_loop(LengthBatchSampler(X, strategy=strategy, **KW), 3)
    cut = len(full) // 2 + 3  # in epoch 1
    head, state = _epoch_loop(LengthBatchSampler(X, strategy=strategy, **KW), 3, stop_after=cut)
    assert state["epoch"] == 1
    tail, _ = _epoch_loop(LengthBatchSampler(X, strategy=strategy, **KW), 3, state=state)
    assert head + tail == full


def test_restore_then_set_epoch_of_another_epoch_starts_it_fresh():
    s = LengthBatchSampler(X, strategy="random", **KW)
    it = iter(s)
    for _ in range(5):
        next(it)
    state = s.state_dict()
    r = LengthBatchSampler(X, strategy="random", **KW)
    r.load_state_dict(state)
    r.set_epoch(1)
    assert list(r) == [b.tolist() for b in lb.plan_epoch(X, strategy="random", epoch=1, **KW)]
    r.load_state_dict(state)
    r.set_epoch(0)
    r.set_epoch(0)  # a second call before iterating still keeps the restored position
    assert list(r) == [b.tolist() for b in lb.plan_epoch(X, strategy="random", epoch=0, **KW)][5:]


def test_world_size_in_the_environment_without_a_process_group_is_refused(monkeypatch):
    """As torch's DistributedSampler: WORLD_SIZE=2 set (torchrun) but no process group -> refuse to plan
    for one rank, which would train every rank on all data."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ValueError, match="WORLD_SIZE=2.*init_process_group.*rank= and world_size="):
        LengthBatchSampler(X, strategy="random", **KW)
    with pytest.raises(ValueError, match="WORLD_SIZE=2"):
        lb.plan_epoch(X, strategy="random", **KW)
    with pytest.raises(ValueError, match="WORLD_SIZE=2"):
        LengthBatchSampler(X, strategy="random", rank=1, **KW)  # half given is not enough
    s = LengthBatchSampler(X, strategy="random", rank=1, world_size=2, **KW)
    assert (s.rank, s.world_size) == (1, 2)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert LengthBatchSampler(X, strategy="random", **KW).world_size == 1


@pytest.mark.parametrize(
    "over, words",
    [
        (dict(seed=None), "seed must be an int, got None"),
        (dict(seed=np.random.default_rng(0)), "seed must be an int.*Generator"),
        (dict(seed=-1), "seed must be >= 0"),
        (dict(token_budget=16384.5), "token_budget must be an int, got 16384.5"),
        (dict(max_batch_size=8.0), "max_batch_size must be an int"),
        (dict(edges=[0, 100, 300]), "edges are only used by strategy 'bucketed'"),
    ],
)
def test_bad_arguments_are_clear_value_errors(over, words):
    for make in (lambda **k: LengthBatchSampler(X, **k), lambda **k: lb.plan_epoch(X, **k)):
        with pytest.raises(ValueError, match=words):
            make(strategy="random", **dict(KW, **over))


def test_library_errors_do_not_name_config_keys():
    """Python API users never wrote a params file: messages name the argument, not ``batching.*`` keys or
    CLI commands."""
    cases = [
        dict(strategy="random", token_budget=100, max_batch_size=4),  # a sample longer than the budget
        dict(strategy="bucketed", token_budget=1024, max_batch_size=4),  # no edges
        dict(strategy="random", token_budget=0, max_batch_size=4),
        dict(strategy="random", token_budget=1024, max_batch_size=0),
        dict(strategy="random", token_budget=1024, max_batch_size=4, seed=-2),
    ]
    for kwargs in cases:
        with pytest.raises(ValueError) as err:
            lb.plan_epoch(X, **kwargs)
        assert "batching." not in str(err.value) and "lenbatch boundaries" not in str(err.value), str(err.value)
    with pytest.raises(ValueError) as err:
        lb.collate_padded([{"input_ids": [1] * 10}] * 3, token_budget=20)
    assert "batching." not in str(err.value)


def test_a_plan_carries_its_layout_so_packed_cannot_be_misscored():
    """padding_efficiency of a packed plan without strategy= was 0.34 (scored as padded rows)."""
    packed = lb.plan_epoch(X, strategy="packed", **KW)
    # a sequence of int64 index arrays (compact since issue 21: one flat array + offsets, not a list)
    assert isinstance(packed, lb.Plan) and isinstance(packed, Sequence) and all(b.dtype == np.int64 for b in packed)
    assert (packed.layout, packed.strategy) == ("packed", "packed")
    assert lb.padding_efficiency(X, packed) == 1.0
    assert lb.padding_efficiency(X, packed) == lb.padding_efficiency(X, list(packed), strategy="packed")
    assert lb.budget_fill(X, packed, 1024) == lb.budget_fill(X, list(packed), 1024, strategy="packed")
    with pytest.raises(ValueError, match="this plan is packed"):
        lb.padding_efficiency(X, packed, strategy="bucketed")
    with pytest.raises(ValueError, match="this plan is padded"):
        lb.budget_fill(X, lb.plan_epoch(X, strategy="random", **KW), 1024, strategy="packed")
    padded = lb.plan_epoch(X, strategy="random", **KW)
    assert padded.layout == "padded" and lb.padding_efficiency(X, padded, strategy="sorted") < 1.0
    again = pickle.loads(pickle.dumps(packed))
    assert again.layout == "packed" and [b.tolist() for b in again] == [b.tolist() for b in packed]
    assert LengthBatchSampler(X, strategy="packed", **KW).plan().layout == "packed"


def test_min_batches_gives_every_epoch_the_same_count():
    """Trainers that fix the steps per epoch (transformers) need equal epochs; lossless, within budget."""
    counts = [len(lb.plan_epoch(X, strategy="random", epoch=e, **KW)) for e in range(4)]
    assert len(set(counts)) > 1  # the problem exists
    m = equal_epoch_batches(X, epochs=4, strategy="random", world_size=2, **KW)
    for e in range(4):
        ranks = lb.plan_epoch_all(X, strategy="random", epoch=e, world_size=2, min_batches=m, **KW)
        assert sum(len(r) for r in ranks) == m
        flat = np.sort(np.concatenate([b for r in ranks for b in r]))
        assert np.array_equal(flat, np.arange(X.size))
        assert all(len(b) * X[b].max() <= KW["token_budget"] for r in ranks for b in r)
    default = lb.plan_epoch(X, strategy="random", epoch=0, **KW)
    assert [b.tolist() for b in default] == [
        b.tolist() for b in lb.plan_epoch(X, strategy="random", epoch=0, min_batches=0, **KW)
    ]


# --------------------------------------------------------------------------- DataLoader workers


class _Rows(torch.utils.data.Dataset):
    def __len__(self):
        return X.size

    def __getitem__(self, i):
        return int(i)


def _collate(rows):
    return list(rows)


def test_stateful_dataloader_resumes_exactly_with_workers():
    """torchdata's StatefulDataLoader snapshots the sampler's state_dict as of each batch it yields, so
    its own state_dict resumes at the first batch the loop has not received, with num_workers > 0."""
    sdl = pytest.importorskip("torchdata.stateful_dataloader", reason="pip install 'lenbatch[dev]' (torchdata)")

    def loader():
        s = LengthBatchSampler(X, strategy="bucketed", edges=[0, 60, 150, 300], **KW)
        return s, sdl.StatefulDataLoader(_Rows(), batch_sampler=s, num_workers=2, collate_fn=_collate)

    s, dl = loader()
    full = []
    for epoch in range(2):
        s.set_epoch(epoch)
        full += [(epoch, b) for b in dl]
    n0 = sum(1 for e, _ in full if e == 0)
    s, dl = loader()
    head, state = [], None
    for epoch in range(2):
        s.set_epoch(epoch)
        for b in dl:
            head.append((epoch, b))
            if len(head) == n0 + 7:  # 7 batches into epoch 1
                state = dl.state_dict()
                break
        if state is not None:
            break
    assert s.state_dict()["position"] > 7  # the sampler itself ran ahead (prefetch)
    s, dl = loader()
    dl.load_state_dict(state)
    tail = []
    for epoch in range(1, 2):
        s.set_epoch(epoch)
        tail += [(epoch, b) for b in dl]
    assert head + tail == full


def test_plain_dataloader_with_workers_consumed_counts_what_the_loop_received():
    """A plain DataLoader prefetches: after 7 batches the sampler has handed out more (issue 14: position
    11). ``sampler.consumed(loader)`` makes state_dict() count the batches the loop received."""
    s = LengthBatchSampler(X, strategy="packed", **KW)
    dl = torch.utils.data.DataLoader(_Rows(), batch_sampler=s, num_workers=2, collate_fn=_collate)
    full = list(dl)
    got = []
    for batch in s.consumed(dl):
        got.append(batch)
        if len(got) == 7:
            state = s.state_dict()
            ahead = s._position
            break
    assert state["position"] == 7 and ahead > 7
    r = LengthBatchSampler(X, strategy="packed", **KW)
    r.load_state_dict(state)
    r.set_epoch(0)
    rest = list(r.consumed(torch.utils.data.DataLoader(_Rows(), batch_sampler=r, num_workers=2, collate_fn=_collate)))
    assert got + rest == full
    assert r.state_dict()["position"] == len(full)
