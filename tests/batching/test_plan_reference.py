"""The scalable planner (issue 21) gives the same plans, bit for bit, as the planner before it
(tests/batching/_reference_planner.py, a frozen copy): every strategy, world sizes 1..8,
``min_batches``, edges, ``packed_window``, ``max_batch_size`` 1, budgets at the longest length,
on both paths (compiled with numba, and pure numpy/Python with ``LENBATCH_NO_NUMBA=1``)."""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest

import lenbatch as lb
from lenbatch.batching import scan
from lenbatch.batching.spec import BatchSpec

import _reference_planner as ref
from _chat_lengths import chat_lengths

PATHS = ["compiled", "pure"]


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    if request.param == "compiled":
        monkeypatch.setattr(scan, "COMPILED_FROM", 0)  # the kernels also on the smallest cases
        if scan.kernels(0) is None:
            if os.environ.get("CI"):  # CI installs the dev extra, which has numba: a missing one is a failure
                pytest.fail("numba is not installed in CI; the dev extra installs lenbatch[fast]")
            pytest.skip("numba is not installed (pip install lenbatch[fast]); the pure path is tested")
    else:
        monkeypatch.setenv("LENBATCH_NO_NUMBA", "1")
    return request.param


def _case(rng: np.random.Generator, n: int) -> dict:
    kind = rng.integers(0, 6)
    if kind == 0:
        x = rng.integers(1, 300, n)
    elif kind == 1:  # few distinct lengths: ties everywhere
        x = rng.choice([3, 17, 64, 65], n)
    elif kind == 2:  # heavy tail
        x = np.minimum(rng.geometric(0.01, n), 2000)
    elif kind == 3:
        x = np.full(n, int(rng.integers(1, 50)))
    elif kind == 4:  # lengths beyond 16 bits: the int32 planning lengths and the two-pass radix sorts
        x = rng.integers(1, 100_000, n)
    else:  # lengths far above the sample count: sorting instead of the O(longest) histograms
        x = rng.integers(1, 30_000_000, n)
    longest = int(x.max())
    budget = int(rng.choice([longest, longest + 1, 2 * longest, 8 * longest, 40 * longest]))
    mbs = int(rng.choice([1, 2, 3, 8, 64, 10_000]))
    edges = np.unique(np.concatenate([[int(x.min())], rng.integers(int(x.min()), longest + 1, 3), [longest + 1]]))
    world = int(rng.integers(1, 9))
    dtype = rng.choice([np.int64, np.int32] + ([np.uint16] if x.max() < 2**16 else []))
    return dict(
        x=x.astype(dtype),
        token_budget=budget,
        max_batch_size=mbs,
        edges=tuple(int(e) for e in edges),
        packed_window=int(rng.choice([1, 2, 8, 33])),
        world_size=world,
        min_batches=int(rng.choice([0, 0, world, n // 3 + 1, n])),
        seed=int(rng.integers(0, 1000)),
    )


def _same(new: list, old: list) -> None:
    assert len(new) == len(old)
    for r, (a, b) in enumerate(zip(new, old)):
        assert len(a) == len(b), f"rank {r}: {len(a)} batches, reference {len(b)}"
        for i, (p, q) in enumerate(zip(a, b)):
            assert p.dtype == np.int64
            assert np.array_equal(p, q), f"rank {r} batch {i}: {p.tolist()} != {q.tolist()}"


def _compare(c: dict, strategy: str, epoch: int) -> None:
    spec = BatchSpec(
        token_budget=c["token_budget"],
        max_batch_size=c["max_batch_size"],
        seed=c["seed"],
        packed_window=c["packed_window"],
        min_batches=c["min_batches"],
    )
    strategy = lb.Strategy.sharing(strategy, c["edges"])
    try:
        old = ref.reference_plan_all(
            c["x"], strategy=strategy, spec=spec, epoch=epoch, world_size=c["world_size"], min_batches=c["min_batches"]
        )
    except ValueError as e:  # more ranks/min_batches than samples: the new planner refuses too
        with pytest.raises(ValueError, match="needs"):
            lb.plan_epoch_all(c["x"], strategy=strategy, epoch=epoch, world_size=c["world_size"], spec=spec)
        assert "needs" in str(e)
        return
    new = lb.plan_epoch_all(c["x"], strategy=strategy, epoch=epoch, world_size=c["world_size"], spec=spec)
    _same(new, old)
    r = epoch % c["world_size"]
    assert (
        lb.plan_epoch(c["x"], strategy=strategy, epoch=epoch, rank=r, world_size=c["world_size"], spec=spec) == old[r]
    )


@pytest.mark.parametrize("strategy", lb.STRATEGIES)
def test_small_random_cases_match_the_reference(strategy, path):
    """60 random small cases per strategy (n = 1..400, every edge of the parameters): ~1 s each path."""
    rng = np.random.default_rng(zlib.crc32(strategy.encode()))
    for trial in range(60):
        n = int(rng.choice([1, 2, 3, 7, 50, 400])) if trial % 4 else int(rng.integers(1, 400))
        _compare(_case(rng, n), strategy, epoch=int(rng.integers(0, 3)))


@pytest.mark.parametrize("strategy", lb.STRATEGIES)
def test_large_cases_match_the_reference(strategy, path):
    """Cases above the gathers' size threshold (n = 70,000, chat-like lengths) at the study's
    setting: one rank, 7 ranks, and 8 ranks with min_batches: ~1-3 s per strategy and path (the
    reference's Python loops are most of it)."""
    x = chat_lengths(70_000, seed=3)
    for world, mbs, mb in ((1, 64, 0), (7, 64, 0), (8, 64, 9000)):
        c = dict(
            x=x,
            token_budget=16384,
            max_batch_size=mbs,
            edges=(0, 770, 1216, 1728, 2432, 3296, 8192),
            packed_window=8,
            world_size=world,
            min_batches=mb,
            seed=5,
        )
        _compare(c, strategy, epoch=1)


def test_the_comparison_can_fail():
    """A plan that differs in one index is caught by _same."""
    x = chat_lengths(500)
    spec = BatchSpec(token_budget=16384, max_batch_size=64)
    old = ref.reference_plan_all(x, strategy=lb.Strategy("random"), spec=spec, epoch=0, world_size=1)
    new = [[b.copy() for b in old[0]]]
    new[0][3][0], new[0][3][1] = new[0][3][1], new[0][3][0]
    with pytest.raises(AssertionError):
        _same(new, old)
