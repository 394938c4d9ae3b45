"""The counting shortcuts that keep planning and boundaries linear at scale give exactly what the sorts,
quantiles and copies they replace give (benchmarks/bench_scale.py measures the speed)."""

from __future__ import annotations

import numpy as np
import pytest

from lenbatch.batching import scan
from lenbatch.batching.boundaries import candidate_values, candidates_of_counts
from lenbatch.batching.overflow import overflow_pieces
from lenbatch.batching.padding import log_factorials, value_counts


def _cases():
    rng = np.random.default_rng(3)
    for t in range(300):
        n = int(rng.integers(1, 3000))
        hi = int(rng.integers(2, 9000))
        x = rng.integers(1, hi, n) if t % 2 else np.minimum(rng.geometric(0.01, n), hi)
        yield x.astype((np.int64, np.int32, np.uint16)[t % 3]), int(rng.integers(1, 400))


def test_value_counts_is_uniques():
    for x, _ in _cases():
        v, c = value_counts(x)
        want_v, want_c = np.unique(x.astype(np.int64), return_counts=True)
        assert np.array_equal(v, want_v) and np.array_equal(c, want_c) and v.dtype == c.dtype == np.int64
    wide = np.array([1, 2**40, 5, 2**40])  # a table over 0..max would dwarf the samples: np.unique's path
    assert value_counts(wide)[0].tolist() == [1, 5, 2**40] and value_counts(wide)[1].tolist() == [1, 1, 2]


def test_candidates_are_numpys_inverted_cdf_quantiles():
    for x, nc in _cases():
        v = np.unique(x)
        want = v[1:]
        if want.size > nc:
            q = np.quantile(x, np.arange(1, nc + 1) / (nc + 1), method="inverted_cdf")
            want = np.unique(q.astype(np.int64))
            want = want[want > v[0]]
        got = candidate_values(x, nc)
        assert np.array_equal(got, want) and np.array_equal(candidates_of_counts(*value_counts(x), nc), want)


@pytest.mark.parametrize("n", [0, 1, 2, (1 << 20) - 1, 1 << 20, (1 << 20) + 3])
def test_log_factorials_are_one_cumsum(n):
    want = np.zeros(n + 1)
    if n:
        np.cumsum(np.log(np.arange(1, n + 1, dtype=np.float64)), out=want[1:])
    assert np.array_equal(log_factorials(n), want)


def test_pieces_without_a_cut_are_the_samples():
    x = np.array([5, 9, 3, 7])
    for mode in ("error", "truncate", "split"):
        p = overflow_pieces(x, token_budget=9, overflow=mode)
        assert p.cut is None and p.lengths is not None and p.lengths.tolist() == x.tolist()
        assert p.row.tolist() == [0, 1, 2, 3] and p.start.tolist() == [0] * 4 and p.end.tolist() == x.tolist()
        assert p.whole.all() and p.item(2) == 2 and p.items(np.array([3, 1])) == [3, 1] and p.pieces_added == 0


def test_randperm_loop_is_torchs():
    torch = pytest.importorskip("torch")
    for n, seed in ((0, 1), (1, 0), (2, 5), (1000, 2**40 + 7), (20_000, 123456789)):
        want = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy()
        got = scan._randperm_loop(n, seed)
        assert np.array_equal(got, want) and got.dtype == np.int32


def test_kernels_load_only_for_a_large_pass(monkeypatch):
    """A process that has not loaded numba pays its load only for a pass of COMPILED_FROM * LOAD_FACTOR."""
    monkeypatch.setattr(scan, "_KERNELS", [])
    monkeypatch.delenv("LENBATCH_NO_NUMBA", raising=False)
    assert scan.kernels(scan.COMPILED_FROM) is None and scan._KERNELS == []
    scan.kernels(scan.COMPILED_FROM * scan.LOAD_FACTOR)
    assert len(scan._KERNELS) == 1
