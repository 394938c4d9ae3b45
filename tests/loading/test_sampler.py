"""LengthBatchSampler: the plan as a resumable torch Sampler."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lenbatch as lb
from lenbatch.loading.sampler import LengthBatchSampler

X = np.random.default_rng(0).integers(1, 300, size=400)
KW = dict(token_budget=1024, max_batch_size=16, seed=2)
EDGES = [0, 60, 150, 300]


def kw(strategy: str, **over) -> dict:
    """Planning kwargs for ``strategy`` (edges only for bucketed: other strategies refuse them)."""
    d = dict(KW, strategy=strategy, **over)
    if strategy == "bucketed":
        d["edges"] = EDGES
    return d


@settings(max_examples=30, deadline=None)
@given(
    strategy=st.sampled_from(lb.STRATEGIES), world_size=st.integers(1, 8), epoch=st.integers(0, 2), frac=st.floats(0, 1)
)
def test_resume_from_any_point_equals_uninterrupted(strategy, world_size, epoch, frac):
    rank = world_size - 1
    ref = LengthBatchSampler(X, **kw(strategy, rank=rank, world_size=world_size))
    ref.set_epoch(epoch)
    full = list(ref)
    assert full == [b.tolist() for b in lb.plan_epoch(X, epoch=epoch, rank=rank, world_size=world_size, **kw(strategy))]
    stop = int(frac * len(full))
    s = LengthBatchSampler(X, **kw(strategy, rank=rank, world_size=world_size))
    s.set_epoch(epoch)
    it = iter(s)
    head = [next(it) for _ in range(stop)]
    state = s.state_dict()
    resumed = LengthBatchSampler(X, **kw(strategy, rank=rank, world_size=world_size))
    resumed.load_state_dict(state)
    assert resumed.epoch == epoch and len(resumed) == len(full)
    assert head + list(resumed) == full
    assert list(resumed) == full  # the next pass of the epoch starts from its beginning


def test_state_from_another_plan_or_world_size_is_refused():
    s = LengthBatchSampler(X, **kw("bucketed", rank=0, world_size=2))
    state = s.state_dict()
    with pytest.raises(ValueError, match="world_size=2"):
        LengthBatchSampler(X, **kw("bucketed", rank=0, world_size=4)).load_state_dict(state)
    with pytest.raises(ValueError, match="another plan"):
        LengthBatchSampler(X, **kw("random", rank=0, world_size=2)).load_state_dict(state)
    with pytest.raises(ValueError, match="another plan"):
        LengthBatchSampler(X[:-1], **kw("bucketed", rank=0, world_size=2)).load_state_dict(state)
    with pytest.raises(ValueError, match="another plan"):
        LengthBatchSampler(X, **kw("bucketed", rank=0, world_size=2, seed=3)).load_state_dict(state)
    with pytest.raises(ValueError, match="position"):
        s.load_state_dict(dict(state, position=10**6))


def test_batches_consumed_and_epochs():
    s = LengthBatchSampler(X, **kw("packed"))
    it = iter(s)
    first = [next(it) for _ in range(5)]
    state = s.state_dict(batches_consumed=3)  # a prefetching DataLoader ran 2 batches ahead
    r = LengthBatchSampler(X, **kw("packed"))
    r.load_state_dict(state)
    assert next(iter(r)) == first[3]
    s.set_epoch(1)
    e1 = list(s)
    assert sorted(i for b in e1 for i in b) == list(range(X.size))
    assert e1 != list(LengthBatchSampler(X, **kw("packed")))


def test_works_as_a_dataloader_batch_sampler():
    data = [torch.tensor([i]) for i in range(X.size)]
    s = lb.LengthBatchSampler(X, **kw("bucketed"))
    assert isinstance(s, torch.utils.data.Sampler)
    loader = torch.utils.data.DataLoader(data, batch_sampler=s, collate_fn=lambda b: torch.cat(b))
    seen = torch.cat(list(loader))
    assert sorted(seen.tolist()) == list(range(X.size)) and len(loader) == len(s)


def test_import_lenbatch_is_light():
    import subprocess
    import sys

    code = "import sys, lenbatch; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bad_input():
    with pytest.raises(ValueError, match="rank"):
        LengthBatchSampler(X, **kw("random", rank=3, world_size=2))
    with pytest.raises(ValueError, match="token_budget"):
        LengthBatchSampler(X, **kw("random", token_budget=100))
    with pytest.raises(ValueError, match="strategy"):
        LengthBatchSampler(X, **kw("shuffled"))


def test_rank_and_world_size_come_from_torch_distributed(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        s = LengthBatchSampler(X, **kw("random"))
        assert (s.rank, s.world_size) == (0, 1)
        got = lb.plan_epoch(X, **kw("random"))
        assert [b.tolist() for b in got] == list(s)
    finally:
        dist.destroy_process_group()
