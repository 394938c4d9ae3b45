"""Behaviours that peer samplers test, checked on lenbatch (our own tests of the same behaviour, no
code taken from them). Each docstring names the peer test file and the behaviour; where lenbatch
differs on purpose, it says so.

Peers: Lhotse (test/dataset/sampling/test_sampling.py, test_sampler_restoring.py), torch
(test/test_dataloader.py, ``DistributedSampler``), transformers (tests/trainer/test_trainer_utils.py,
``get_length_grouped_indices`` / ``LengthGroupedSampler``).
"""

import io

import numpy as np
import pytest
import torch

import lenbatch as lb
from lenbatch.loading.sampler import LengthBatchSampler
from lenbatch.batching.strategies import sortish_order

X = np.random.default_rng(3).integers(1, 500, size=1000)
KW = dict(token_budget=2048, max_batch_size=32, seed=7)
EDGES = [0, 100, 250, 500]


def _sampler(strategy, **over):
    extra = {"edges": EDGES} if strategy == "bucketed" else {}
    return LengthBatchSampler(X, strategy=strategy, **dict(KW, **extra, **over))


# --------------------------------------------------------------------------- Lhotse


@pytest.mark.parametrize("strategy", lb.STRATEGIES)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_lhotse_ranks_are_disjoint_and_complete(strategy, world_size):
    """Lhotse test_sampling.py (samplers with ``world_size``/``rank``): the ranks' samples are disjoint and
    together are the whole set. lenbatch also gives every rank the same number of batches."""
    seen = []
    for rank in range(world_size):
        s = _sampler(strategy, rank=rank, world_size=world_size)
        s.set_epoch(1)
        seen.append([i for b in s for i in b])
    flat = sorted(i for r in seen for i in r)
    assert flat == list(range(X.size))
    assert len({len(_sampler(strategy, rank=r, world_size=world_size)) for r in range(world_size)}) == 1


@pytest.mark.parametrize("strategy", lb.STRATEGIES)
def test_lhotse_deterministic_per_seed_and_epoch(strategy):
    """Lhotse test_sampling.py (shuffle with a seed): the same (seed, epoch) gives the same batches; another
    epoch or seed gives another order (for ``sorted`` only the order of the fixed batches changes)."""
    a, b = _sampler(strategy), _sampler(strategy)
    for epoch in (0, 3):
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        assert list(a) == list(b)
    a.set_epoch(0)
    b.set_epoch(1)
    assert list(a) != list(b)
    assert list(_sampler(strategy)) != list(_sampler(strategy, seed=8))


@pytest.mark.parametrize("strategy", lb.STRATEGIES)
def test_lhotse_len_equals_batches_yielded(strategy):
    """Lhotse test_sampling.py (``len(sampler)``): len equals the number of batches one epoch yields,
    for every epoch (lenbatch plans the epoch to know it; the count may change between epochs)."""
    s = _sampler(strategy, rank=1, world_size=2)
    for epoch in range(3):
        s.set_epoch(epoch)
        assert len(s) == len(list(s))


@pytest.mark.parametrize("strategy", lb.STRATEGIES)
def test_lhotse_restored_sampler_continues_then_restarts(strategy):
    """Lhotse test_sampler_restoring.py (test_restore_sampler_state, test_restored_sampler_continues_as_normal):
    a sampler restored mid-epoch yields exactly the original's remaining batches, its state equals the
    original's, and the next pass over the same epoch is the full epoch again."""
    s = _sampler(strategy)
    s.set_epoch(3)
    it = iter(s)
    for _ in range(5):
        next(it)
    state = s.state_dict()
    rest = list(it)
    r = _sampler(strategy)
    r.load_state_dict(state)
    assert r.state_dict() == state
    assert list(r) == rest
    assert len(list(r)) == len(s) == len(rest) + 5


def test_lhotse_restored_sampler_forced_to_start_from_scratch():
    """Lhotse test_sampler_restoring.py (test_restored_sampler_forced_to_start_from_scratch uses
    ``allow_iter_to_reset_state()``): lenbatch's way to discard a restored position is ``set_epoch`` of
    another epoch (the same epoch keeps the position, as Lhotse's set_epoch does)."""
    s = _sampler("random")
    s.set_epoch(3)
    it = iter(s)
    for _ in range(5):
        next(it)
    r = _sampler("random")
    r.load_state_dict(s.state_dict())
    r.set_epoch(4)
    assert len(list(r)) == len(r)


def test_lhotse_state_survives_torch_save():
    """Lhotse test_sampler_restoring.py (test_save_and_load_sampler_state): the state round-trips through
    torch.save/torch.load (weights_only, plain types) unchanged."""
    s = _sampler("packed")
    iter(s).__next__()
    buf = io.BytesIO()
    torch.save(s.state_dict(), buf)
    buf.seek(0)
    assert torch.load(buf, weights_only=True) == s.state_dict()


def test_lhotse_state_from_another_plan_is_refused():
    """Differs on purpose from Lhotse test_sampler_restoring.py, which restores into "differently
    initialized" samplers (other max_duration, shuffle): lenbatch refuses a state saved with other
    lengths or parameters, because the position would point into another plan."""
    state = _sampler("random").state_dict()
    with pytest.raises(ValueError, match="another plan"):
        _sampler("random", token_budget=4096).load_state_dict(state)


def test_lhotse_e2e_dataloader_with_a_worker_loses_no_batch():
    """Differs on purpose from Lhotse test_sampler_restoring.py (test_e2e_restore_with_dataloader): with
    num_workers=1 Lhotse's resumed loader "lost" 2 prefetched batches; lenbatch's ``consumed(loader)`` counts
    what the loop received, so the resume continues at the next batch (StatefulDataLoader: test_loops.py)."""
    ds = list(range(X.size))
    s = _sampler("bucketed")
    dl = torch.utils.data.DataLoader(ds, batch_sampler=s, num_workers=1, collate_fn=list)
    s.set_epoch(1)
    expected, state = [], None
    for idx, b in enumerate(s.consumed(dl)):
        if idx == 4:
            state = s.state_dict()
        if idx > 4:
            expected.append(b)
    r = _sampler("bucketed")
    r.load_state_dict(state)
    r.set_epoch(1)
    assert list(torch.utils.data.DataLoader(ds, batch_sampler=r, num_workers=1, collate_fn=list)) == expected


# --------------------------------------------------------------------------- torch DistributedSampler


@pytest.mark.parametrize("n", [7, 10, 11, 13, 97, 101])
@pytest.mark.parametrize("world_size", [2, 3, 5])
@pytest.mark.parametrize("strategy", lb.STRATEGIES)
def test_torch_no_duplicate_or_drop_at_awkward_sizes(n, world_size, strategy):
    """torch test_dataloader.py (DistributedSampler with dataset sizes not divisible by num_replicas):
    every rank gets the same count. Differs on purpose: DistributedSampler pads by repeating samples
    (drop_last=False) or drops the tail (drop_last=True); lenbatch splits batches instead, so every
    sample appears exactly once."""
    x = np.random.default_rng(n).integers(1, 60, size=n)
    kw = dict(
        strategy=strategy,
        token_budget=128,
        max_batch_size=8,
        seed=0,
        edges=[0, 20, 40, 60] if strategy == "bucketed" else None,
    )
    ranks = lb.plan_epoch_all(x, world_size=world_size, **kw)
    assert len({len(r) for r in ranks}) == 1
    flat = sorted(int(i) for r in ranks for b in r for i in b)
    assert flat == list(range(n))


def test_torch_fewer_samples_than_ranks_is_refused():
    """Differs on purpose from torch's DistributedSampler, which repeats samples so that each of more
    ranks than samples gets one: lenbatch never duplicates a sample and raises instead."""
    with pytest.raises(ValueError, match="world_size=4.*only 3 samples"):
        lb.plan_epoch_all(np.array([5, 6, 7]), strategy="random", token_budget=64, max_batch_size=8, world_size=4)


def test_torch_set_epoch_changes_the_shuffle_and_is_deterministic():
    """torch test_dataloader.py (DistributedSampler.set_epoch): the order depends on (seed, epoch) only, the
    same on every process; a new epoch gives a new order."""
    a = [_sampler("random", rank=r, world_size=2) for r in (0, 1)]
    b = [_sampler("random", rank=r, world_size=2) for r in (0, 1)]
    for s in a + b:
        s.set_epoch(2)
    assert [list(s) for s in a] == [list(s) for s in b]
    a[0].set_epoch(3)
    assert list(a[0]) != list(b[0])


# --------------------------------------------------------------------------- transformers group_by_length


@pytest.mark.parametrize("n, mbs", [(100, 4), (1000, 16), (30, 8)])
def test_transformers_megabatch_order(n, mbs):
    """transformers tests/trainer/test_trainer_utils.py (test_group_by_length): all indices once, and the
    longest sample comes first (so out-of-memory shows at step 0); inside each megabatch of
    ``min(n // (4 * mbs), 50) * mbs`` samples, lengths are non-increasing apart from that one swap."""
    x = np.random.default_rng(n).integers(1, 1000, size=n)
    x[n // 3] = 5000  # one clear longest
    order = sortish_order(x, np.random.default_rng(0), mbs)
    assert sorted(order.tolist()) == list(range(n))
    assert order[0] == n // 3
    mega = max(min(n // (4 * mbs), 50), 1) * mbs
    for start in range(0, n, mega):
        chunk = x[order[start : start + mega]]
        if start == 0:
            chunk = chunk[1:]  # the swapped-in longest
        bad = np.flatnonzero(np.diff(chunk) > 0)
        assert bad.size <= 1  # at most where the swapped-out sample landed
    plan = lb.plan_epoch(x, strategy="sortish", token_budget=8192, max_batch_size=mbs, seed=0)
    assert n // 3 in plan[0].tolist()
