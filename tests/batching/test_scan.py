"""The planner's primitive passes (lenbatch.batching.scan): the compiled (numba) and pure paths give
the same results as numpy's own functions, and :class:`lenbatch.Plan` behaves as a list of int64
arrays. About 3 s in all (the first compiled call loads the kernels from numba's cache)."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

import lenbatch as lb
from lenbatch.batching.scan import greedy_starts
from lenbatch.batching import scan
from lenbatch.batching.padding import sorted_greedy_starts

import _reference_planner as ref


@pytest.fixture(params=["compiled", "pure"])
def path(request, monkeypatch):
    if request.param == "compiled":
        monkeypatch.setattr(scan, "COMPILED_FROM", 0)  # the kernels also on the smallest cases
        if scan.kernels(0) is None:
            if os.environ.get("CI"):
                pytest.fail("numba is not installed in CI; the dev extra installs lenbatch[fast]")
            pytest.skip("numba is not installed (pip install lenbatch[fast])")
    else:
        monkeypatch.setenv("LENBATCH_NO_NUMBA", "1")
    return request.param


@pytest.mark.parametrize("words", [64, 1 << 22])
def test_shuffle_is_numpys_shuffle_and_leaves_the_same_generator_state(path, monkeypatch, words):
    """Bit-identical permutations and generator state, also when the bulk draws run out mid-shuffle
    (64 words per call: hundreds of refills) and when a 32-bit half is buffered before and after."""
    monkeypatch.setattr(scan, "SHUFFLE_WORDS", words)
    for n in (1, 2, 4095, 4096, 5001, 70_001):
        for odd in (False, True):
            a, b = np.random.default_rng(n), np.random.default_rng(n)
            if odd:  # leave a buffered uint32 in both generators
                a.integers(0, 10, dtype=np.uint32), b.integers(0, 10, dtype=np.uint32)
            assert np.array_equal(a.permutation(n), scan.permutation(b, n))
            assert a.bit_generator.state == b.bit_generator.state
            m = np.arange(n, dtype=np.int64) * 7 + 3
            assert np.array_equal(a.permutation(m), scan.permutation(b, m))
            assert a.random() == b.random()


def test_gathers_sorts_and_counts(path):
    rng = np.random.default_rng(0)
    for n, top in ((10, 300), (70_000, 300), (70_000, 200_000)):
        x = rng.integers(0, top + 1, n)
        assert np.array_equal(scan.stable_order(x, top), np.argsort(x, kind="stable"))
        assert np.array_equal(scan.value_counts(x, top + 1), np.bincount(x, minlength=top + 1))
        idx = rng.permutation(n).astype(np.int32)
        assert np.array_equal(scan.take(x, idx), x[idx])
        s = np.sort(rng.choice(n, min(n, 50), replace=False))
        e = s + rng.integers(0, 30, s.size)
        e = np.minimum(e, n)
        want = np.concatenate([x[a:b] for a, b in zip(s, e)])
        assert np.array_equal(scan.gather_segments(x, s, e), want)
        cuts = np.unique(np.concatenate([[0], rng.integers(0, n, 40)]))
        x16 = (x % 65536).astype(np.uint16)
        assert np.array_equal(scan.segment_sums(x16, cuts), np.add.reduceat(x16.astype(np.int64), cuts))


def test_greedy_starts_match_the_python_loop(path):
    rng = np.random.default_rng(1)
    for n, budget, mbs in ((1, 500, 1), (70_000, 1000, 64), (5000, 299, 1), (5000, 5000, 3), (5000, 10**6, 10**6)):
        x = rng.integers(1, 300, n)
        want = ref.greedy_starts(x, budget, mbs)
        assert np.array_equal(greedy_starts(x, budget, mbs), want)
        starts, cost = scan.greedy_batches(x, budget, mbs)
        assert np.array_equal(starts, want)
        assert np.array_equal(cost, ref.batch_tokens(x, np.split(np.arange(n), want[1:]))[1])


def test_histogram_greedy_equals_the_greedy_along_the_sorted_order():
    """sorted_greedy_starts works from the counts alone (O(distinct)); the scan along the sorted
    lengths is the definition. Random histograms, caps from 1 to above every count."""
    rng = np.random.default_rng(2)
    for _ in range(300):
        x = np.sort(rng.integers(1, int(rng.integers(2, 200)), int(rng.integers(1, 500))))
        budget = int(x.max()) * int(rng.integers(1, 40))
        mbs = int(rng.choice([1, 2, 5, 64, 1000]))
        want = ref.greedy_starts(x, budget, mbs)
        assert np.array_equal(sorted_greedy_starts(np.bincount(x), budget, mbs), want)


def test_first_fit_rows_match_between_paths(monkeypatch):
    """The compiled first-fit equals the pure loop on windows 1..33 and max_batch_size 1 (the pure
    loop is checked against the old planner in test_plan_reference.py)."""
    monkeypatch.setattr(scan, "COMPILED_FROM", 0)
    if scan.kernels(0) is None:
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(3)
    for _ in range(40):
        n = int(rng.integers(1, 3000))
        x = rng.integers(1, 500, n)
        kw = dict(
            token_budget=int(rng.choice([500, 1000, 4096])),
            max_batch_size=int(rng.choice([1, 2, 8, 64])),
            window=int(rng.choice([1, 2, 8, 33])),
            shortest=int(x.min()),
        )
        ids = rng.permutation(n).astype(np.int32)
        fast = scan.first_fit_rows(ids.copy(), x, **kw)
        monkeypatch.setenv("LENBATCH_NO_NUMBA", "1")
        pure = scan.first_fit_rows(ids.copy(), x, **kw)
        monkeypatch.delenv("LENBATCH_NO_NUMBA")
        assert all(np.array_equal(a, b) for a, b in zip(fast, pure))
        assert np.array_equal(fast[2], x[fast[0]])
        assert np.array_equal(np.sort(fast[0]), np.arange(n))  # every sample once


def test_a_plan_behaves_as_a_list_of_int64_arrays():
    arrays = [np.array([3, 1]), np.array([0]), np.array([4, 2, 5])]
    plan = lb.Plan(arrays, strategy="random")
    assert len(plan) == 3 and plan.layout == "padded" and plan.strategy == "random"
    assert [b.tolist() for b in plan] == [[3, 1], [0], [4, 2, 5]]
    assert plan[-1].tolist() == [4, 2, 5] and plan[0].dtype == np.int64
    assert plan == arrays and plan != arrays[:2] and plan != [np.array([3, 1]), np.array([0]), np.array([4, 2, 6])]
    assert isinstance(plan[1:], lb.Plan) and plan[1:] == arrays[1:] and plan[::2] == arrays[::2]
    assert len(plan[5:]) == 0 and plan[1:].layout == "padded"
    with pytest.raises(IndexError):
        plan[3]
    again = pickle.loads(pickle.dumps(plan))
    assert again == plan and again.strategy == "random"
    assert lb.Plan(plan, strategy="random") == plan and len(lb.Plan([], strategy="packed")) == 0
    assert plan.sizes().tolist() == [2, 1, 3] and plan.indices.tolist() == [3, 1, 0, 4, 2, 5]
    # the metrics read the flat arrays directly: the same numbers as for the list
    x = np.array([5, 6, 7, 8, 9, 10])
    assert lb.padding_efficiency(x, plan) == lb.padding_efficiency(x, arrays)


def test_a_small_plan_does_not_load_numba():
    """Below COMPILED_FROM elements every pass is the pure one: toy data and the many small processes
    of the test suite (torchrun ranks) pay no numba import (~0.5 s each). One subprocess, ~1 s."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np, lenbatch as lb; x = np.random.default_rng(0).integers(65, 8192, 2000); "
        "[lb.plan_epoch(x, strategy=s, token_budget=16384, max_batch_size=64, world_size=3, rank=1, "
        "edges=(0, 2000, 9000) if s == 'bucketed' else None) for s in ('sorted', 'random', 'bucketed', 'packed')]; "
        "print('numba' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_torch_randperm_is_torchs(path, monkeypatch):
    """The compiled torch.randperm (numpy's MT19937 in torch's seeded state) equals torch's own, also
    across the bulk-draw chunks (64 draws per call here) and for seeds above 2**32."""
    import torch

    monkeypatch.setattr(scan, "SHUFFLE_WORDS", 64)
    for n, seed in ((1, 0), (2, 5), (1000, 2**40 + 7), (20_000, 123456789), (70_001, 2**63 - 2)):
        want = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy()
        got = scan.torch_randperm(n, seed)
        assert np.array_equal(got, want) and got.dtype == np.int32
