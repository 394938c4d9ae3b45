"""StreamingBatcher on real iterables: it yields the stream planner's batches as samples, every sample once
per pass over the ranks, resumes mid-pass exactly (each strategy, several ranks), refuses what it cannot do
(a changed stream or settings, sorted, a length, several DataLoader workers) and works in a DataLoader."""

import numpy as np
import pytest
import torch

import lenbatch as lb
from lenbatch.batching.spec import BatchSpec
from lenbatch.batching.stream import STREAM_STRATEGIES, plan_stream

X = np.clip(np.rint(np.random.default_rng(11).lognormal(7.2, 0.8, 3000)), 48, 8191).astype(np.int64)  # chat-like


class Stream:
    """A re-iterable stream of samples (dicts of token ids) that is not a list: no len, no indexing."""

    def __init__(self, lengths, tokens=False):
        self.lengths = list(lengths)
        self.tokens = tokens  # real token lists (for collate), else a range of that length: cheap, same len()
        self.epochs = []

    def set_epoch(self, epoch):
        self.epochs.append(epoch)

    def __iter__(self):
        for i, n in enumerate(self.lengths):
            yield {"id": i, "input_ids": [1] * n if self.tokens else range(n)}


def _batcher(strategy, stream=None, **kw):
    kw = dict(dict(token_budget=16384, max_batch_size=64, buffer_size=400, seed=1, rank=0, world_size=1), **kw)
    return lb.StreamingBatcher(Stream(X) if stream is None else stream, strategy=strategy, **kw)


def _ids(batches):
    return [[s["id"] for s in b] for b in batches]


@pytest.mark.parametrize("strategy", STREAM_STRATEGIES)
def test_it_yields_the_planners_batches_and_every_sample_once_over_the_ranks(strategy):
    spec = BatchSpec(token_budget=16384, max_batch_size=64, seed=1)
    ranks = plan_stream(X, strategy=strategy, spec=spec, buffer_size=400, world_size=3)
    got = []
    for r in range(3):
        b = _batcher(strategy, rank=r, world_size=3)
        mine = _ids(b)
        assert mine == [a.tolist() for a in ranks[r]]
        assert b.peak_held <= 400 + 50 * 64 + 3 * 64 * 3
        got += mine
    assert len({len(_ids(_batcher(strategy, rank=r, world_size=3))) for r in range(3)}) == 1
    assert sorted(i for b in got for i in b) == list(range(X.size))


@pytest.mark.parametrize("strategy", STREAM_STRATEGIES)
@pytest.mark.parametrize("world_size", [1, 4])
def test_resume_mid_pass_yields_exactly_the_remaining_batches(strategy, world_size):
    rank = world_size - 1
    b = _batcher(strategy, rank=rank, world_size=world_size)
    b.set_epoch(2)
    full = _ids(b)
    for stop in (0, 1, len(full) // 2, len(full)):
        b = _batcher(strategy, rank=rank, world_size=world_size)
        b.set_epoch(2)
        it = iter(b)
        head = [[s["id"] for s in next(it)] for _ in range(stop)]
        state = b.state_dict()
        again = _batcher(strategy, rank=rank, world_size=world_size)
        again.load_state_dict(state)
        again.set_epoch(2)  # a loop's own set_epoch of the saved epoch keeps the position
        assert again.state_dict()["batches"] == stop
        assert head + _ids(again) == full
        assert _ids(again) == full  # the next pass is a whole epoch again


def test_epochs_differ_and_reach_the_stream():
    stream = Stream(X)
    b = _batcher("bucketed", stream=stream)
    b.set_epoch(0)
    e0 = _ids(b)
    b.set_epoch(1)
    e1 = _ids(b)
    assert stream.epochs == [0, 1]
    assert lb.composition_repeat([np.array(x) for x in e0], [np.array(x) for x in e1], X.size) < 0.5
    b.set_epoch(0)
    assert _ids(b) == e0


def test_resume_refuses_another_stream_or_other_settings():
    b = _batcher("random")
    it = iter(b)
    for _ in range(5):
        next(it)
    state = b.state_dict()
    other = _batcher("random", stream=Stream(np.r_[X[:100], X[100:][::-1]]))
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="the stream differs"):
        list(other)
    with pytest.raises(ValueError, match="other batching settings"):
        _batcher("random", buffer_size=401).load_state_dict(state)
    with pytest.raises(ValueError, match="world_size=1"):
        _batcher("random", rank=0, world_size=2).load_state_dict(dict(state, settings=state["settings"]))
    with pytest.raises(ValueError, match="lacks"):
        b.load_state_dict({"epoch": 0})


def test_what_a_stream_cannot_do_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="sorted.*needs every length"):
        _batcher("sorted")
    with pytest.raises(TypeError, match="no length"):
        len(_batcher("packed"))
    with pytest.raises(ValueError, match="only used by strategy 'bucketed'"):
        _batcher("random", edges=[0, 100, 20000])
    over = _batcher("random", token_budget=4096)
    with pytest.raises(ValueError, match="tokens, outside 1..token_budget=4096"):
        list(over)
    with pytest.raises(ValueError, match="iterable"):
        lb.StreamingBatcher(5, strategy="random", token_budget=10, max_batch_size=2)


def test_in_a_dataloader_with_collate_and_one_worker_at_most():
    b = _batcher("packed", stream=Stream(X, tokens=True), buffer_size=200)
    loader = torch.utils.data.DataLoader(b, batch_size=None, collate_fn=lb.collate_packed)
    rows = list(loader)
    assert sum(int(r.model_inputs()["input_ids"].numel()) for r in rows) == int(X.sum())
    assert all(r.model_inputs()["input_ids"].numel() <= 16384 for r in rows)
    two = torch.utils.data.DataLoader(_batcher("packed"), batch_size=None, num_workers=2, collate_fn=lambda s: s)
    with pytest.raises(ValueError, match="num_workers=2"):
        list(two)


def test_a_cost_reaches_the_planner_and_the_state():
    cost = lb.Cost(per_token=1.0, per_token_squared=1 / 2048)
    cap = float(cost.per_row(8191)) * 1.5
    b = _batcher("packed", rank=1, world_size=4, cost=cost, cost_budget=cap)
    spec = BatchSpec(token_budget=16384, max_batch_size=64, seed=1)
    want = plan_stream(X, strategy="packed", spec=spec, buffer_size=400, world_size=4, cost=cost, cost_budget=cap)[1]
    assert _ids(b) == [a.tolist() for a in want]
    it = iter(b)
    next(it)
    with pytest.raises(ValueError, match="other batching settings"):
        _batcher("packed", rank=1, world_size=4).load_state_dict(b.state_dict())
    with pytest.raises(ValueError, match="alone costs more than cost_budget=10"):
        list(_batcher("packed", cost=cost, cost_budget=10.0))  # known when the first sample is read
    with pytest.raises(ValueError, match="cost_budget needs cost="):
        _batcher("packed", cost_budget=10.0)
