"""The planner's primitive passes over an epoch, each with a pure numpy/Python path and, when numba is
installed (the ``fast`` extra), a compiled twin that gives the same result bit for bit.

* :func:`permutation` / :func:`shuffle`: numpy's ``Generator.permutation``/``shuffle`` (Fisher-Yates
  with ``random_interval`` draws), leaving the generator in the same state. The compiled path draws
  from the PCG64 stream in bulk (``random_raw``) and swaps in a tight loop: at 90 M samples about
  2.5 s instead of numpy's 8 s, whose loop waits on a cache miss per swap.
* :func:`take`: ``x[idx]`` (3x faster compiled on large random gathers).
* :func:`stable_order`: ``np.argsort(x, kind="stable")`` for bounded non-negative ints, as int32 when
  it fits: a counting sort, O(n + max) compiled; numpy's radix sort (16-bit keys) otherwise.
* :func:`greedy_starts`: where the greedy token-budget batches start along an order (a sequential
  scan: O(n) compiled, a Python loop otherwise, ~0.15 us per sample).
* :func:`first_fit_rows`: the ``packed`` strategy's first-fit rows (a sequential scan).

Which path runs: the compiled one when ``import numba`` works and ``LENBATCH_NO_NUMBA`` is not set
(read at every call, so tests compare both in one process), for passes over at least
``COMPILED_FROM`` elements, and, until the kernels are loaded in this process, over at least
``COMPILED_FROM * LOAD_FACTOR`` (2 M): loading numba and the cached kernels takes ~0.5-0.8 s once, what
the pure passes take at about that size, so a small call with ``lenbatch[fast]`` installed costs what
it costs without it (:func:`preload` pays the load up front). Index arrays are int32 while the epoch
has fewer than 2**31 samples (half the memory of int64, and faster to gather).
"""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Any

import numpy as np

_KERNELS: list[Any] = []  # [module or None] once tried
# Passes over fewer elements run the pure path: a small plan (tests, toy data) then never imports
# numba or loads its kernels (~0.5 s once per process); tests lower it to check the kernels on edges.
COMPILED_FROM = 1 << 14
# A process that has not loaded the kernels yet loads them only for a pass this many times larger
# (2 M elements): below it the pure passes cost less than the load (benchmarks/bench_scale.py).
LOAD_FACTOR = 128


def kernels(n: int) -> ModuleType | None:
    """The numba kernels (:mod:`lenbatch.batching._jit`) for a pass over ``n`` elements, or None:
    n < COMPILED_FROM (n < COMPILED_FROM * LOAD_FACTOR while they are not loaded yet), numba missing,
    or LENBATCH_NO_NUMBA=1."""
    if n < COMPILED_FROM or os.environ.get("LENBATCH_NO_NUMBA", "").strip() not in ("", "0"):
        return None
    if not _KERNELS:
        if n < COMPILED_FROM * LOAD_FACTOR:
            return None
        preload()
    return _KERNELS[0]


def preload() -> bool:
    """Load the numba kernels now (~0.5-0.8 s, once per process), whatever the size of the next pass;
    whether they are available. Warm-ups and long-running loops call it to pay the load up front."""
    if not _KERNELS:
        try:
            from lenbatch.batching import _jit
        except ImportError:  # numba is an optional extra
            _jit = None
        _KERNELS.append(_jit)
    return _KERNELS[0] is not None


def index_dtype(n: int) -> type:
    """int32 for indices below 2**31 (every epoch of fewer samples), else int64."""
    return np.int32 if n < 2**31 else np.int64


SHUFFLE_WORDS = 1 << 22  # PCG64 outputs drawn per bulk call (32 MB); a draw needs ~0.7 on average


def shuffle(rng: np.random.Generator, a: np.ndarray) -> None:
    """``rng.shuffle(a)`` for a 1-D array, in place; the same swaps and the same generator state after."""
    k = kernels(a.size)
    bg = rng.bit_generator
    if k is None or a.ndim != 1 or a.size > 2**32 or type(bg).__name__ != "PCG64":
        rng.shuffle(a)
        return
    st = bg.state
    has_half, half = bool(st["has_uint32"]), np.uint64(st["uinteger"])
    i = a.size - 1
    while i >= 1:
        before = bg.state
        chunk = int(min(SHUFFLE_WORDS, 0.75 * i + 1024))
        words = bg.random_raw(chunk)
        # fixed argument types (numba returns its uint64 as a Python int): one compiled signature
        i, used, has_half, half = k.shuffle_chunk(a, int(i), words, bool(has_half), np.uint64(half))
        if used < chunk:  # drew too many: rewind to exactly the words consumed
            bg.state = before
            bg.advance(used)
    st = bg.state
    st["has_uint32"], st["uinteger"] = int(has_half), int(half)
    bg.state = st


def permutation(rng: np.random.Generator, n: int | np.ndarray) -> np.ndarray:
    """``rng.permutation(n)`` (an int: a shuffled arange, as int32 when n < 2**31) or
    ``rng.permutation(array)`` (a shuffled copy); the same values and generator state as numpy's."""
    if isinstance(n, np.ndarray):
        a = n.copy()
    else:
        a = np.arange(int(n), dtype=index_dtype(int(n)))
    shuffle(rng, a)
    return a


def _mt19937_seeded(seed: int) -> np.random.MT19937:
    """numpy's MT19937 in the state torch's CPU generator has after ``manual_seed(seed)``: the
    reference ``init_genrand(seed mod 2**32)`` (mt[i] = 1812433253 (mt[i-1] ^ (mt[i-1] >> 30)) + i),
    the next draw regenerating the block (pos 624)."""
    key = np.empty(624, dtype=np.uint32)
    v = seed & 0xFFFFFFFF
    for i in range(624):
        key[i] = v
        v = (1812433253 * (v ^ (v >> 30)) + i + 1) & 0xFFFFFFFF
    mt = np.random.MT19937(0)
    mt.state = {"bit_generator": "MT19937", "state": {"key": key, "pos": 624}}
    return mt


def torch_randperm(n: int, seed: int) -> np.ndarray:
    """``torch.randperm(n, generator=torch.Generator().manual_seed(seed))`` (CPU) as int32 below 2**31.

    torch draws it with its mt19937 (seeded by ``init_genrand(seed mod 2**32)``): for i = 0..n-2,
    z = next32() % (n - i) and r[i], r[i + z] swap (while n < (2**32 - 1) / 20; above that torch takes
    another algorithm and is called itself). Compiled: numpy's MT19937 in the same state gives the
    same 32-bit stream, and the swaps run in a loop without torch's int64 tensor (a test compares the
    two); pure: torch's own ``randperm``, or, below ``RANDPERM_LOOP_BELOW`` samples while torch is not
    imported (importing it takes 1-4 s), the same swaps in a Python loop (~0.3 us a sample).
    """
    k = kernels(n)
    if k is None and n < RANDPERM_LOOP_BELOW and "torch" not in sys.modules:
        return _randperm_loop(n, seed)
    if k is None or n >= (2**32 - 1) // 20:
        import torch

        return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy().astype(index_dtype(n))
    mt = _mt19937_seeded(seed)
    r = np.arange(n, dtype=index_dtype(n))
    for i in range(0, n - 1, SHUFFLE_WORDS):
        k.randperm_chunk(r, i, mt.random_raw(min(SHUFFLE_WORDS, n - 1 - i)))
    return r


RANDPERM_LOOP_BELOW = 1 << 20


def _randperm_loop(n: int, seed: int) -> np.ndarray:
    """:func:`torch_randperm` without torch or numba: position i swaps with i + next32() % (n - i)."""
    raw = _mt19937_seeded(seed).random_raw(max(n - 1, 0))
    i = np.arange(raw.size, dtype=np.uint64)
    targets = (i + raw % (np.uint64(n) - i)).tolist()
    r = list(range(n))
    for a, b in enumerate(targets):
        r[a], r[b] = r[b], r[a]
    return np.asarray(r, dtype=index_dtype(n))


CHUNK = 1 << 22  # elements per numpy pass where a pass would make an int64 copy of a large array


def take(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``x[idx]`` for 1-D arrays (numpy casts a non-intp index to an int64 copy: done in chunks)."""
    if idx.size < 1 << 16:
        return x[idx]
    out = np.empty(idx.size, dtype=x.dtype)
    k = kernels(idx.size)
    if k is not None:
        k.take(x, idx, out)
        return out
    for a in range(0, idx.size, CHUNK):
        out[a : a + CHUNK] = x[idx[a : a + CHUNK]]
    return out


def segment_sums(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """int64 sums of ``values[starts[b]:starts[b+1]]`` (the last to the end): ``np.add.reduceat`` in
    int64 without casting all of ``values`` to int64 at once (720 MB at 90 M uint16 lengths)."""
    out = np.empty(starts.size, dtype=np.int64)
    bounds = np.append(starts, values.size)
    step = max(1, CHUNK // max(1, int(values.size // max(starts.size, 1))))  # batches per pass: ~CHUNK values
    for b0 in range(0, starts.size, step):
        b1 = min(b0 + step, starts.size)
        lo, hi = int(bounds[b0]), int(bounds[b1])
        out[b0:b1] = np.add.reduceat(values[lo:hi].astype(np.int64), starts[b0:b1] - lo)
    return out


def value_counts(x: np.ndarray, minlength: int = 0) -> np.ndarray:
    """``np.bincount(x, minlength=minlength)`` without the int64 copy of ``x`` (chunked)."""
    counts = np.zeros(max(minlength, int(x.max()) + 1 if x.size else 0), dtype=np.int64)
    for a in range(0, x.size, CHUNK):
        part = np.bincount(x[a : a + CHUNK])
        counts[: part.size] += part
    return counts


def histogram_too_wide(top: int, n: int) -> bool:
    """Whether a table over lengths 0..top would dwarf the n samples (a huge token_budget with few
    samples): then the histogram-based passes give way to sorting (O(n log n), no O(top) table)."""
    return top > max(1 << 22, 8 * n)


def stable_order(x: np.ndarray, top: int) -> np.ndarray:
    """``np.argsort(x, kind="stable")`` of ints in 0..top (int32 when len(x) < 2**31): the indices in
    ascending ``x``, ties in index order. Compiled: a counting sort, O(n + top); else numpy's radix
    sort on 16-bit keys (two LSD passes when top >= 2**16)."""
    k = kernels(x.size)
    if k is not None and not histogram_too_wide(top, x.size):
        out = np.empty(x.size, dtype=index_dtype(x.size))
        k.stable_counting_order(x, int(top), out)
        return out
    if top < 2**16:
        return np.argsort(x.astype(np.uint16, copy=False), kind="stable").astype(index_dtype(x.size))
    if top >= 2**32:
        return np.argsort(x, kind="stable").astype(index_dtype(x.size))
    lo = np.argsort((x & 0xFFFF).astype(np.uint16), kind="stable")
    hi = (x[lo] >> 16).astype(np.uint16)
    return lo[np.argsort(hi, kind="stable")].astype(index_dtype(x.size))


def greedy_start_mask(xo: np.ndarray, token_budget: int, max_batch_size: int) -> np.ndarray:
    """uint8 mask of the positions where a greedy token-budget batch starts along ``xo`` (the
    lengths in plan order; each <= token_budget): a batch grows while (n+1)*max(m, next) <=
    token_budget and n < max_batch_size."""
    mask = np.zeros(xo.size, dtype=np.uint8)
    k = kernels(xo.size)
    if k is not None:
        k.greedy_start_mask(xo, int(token_budget), int(max_batch_size), mask)
        return mask
    n = m = 0
    for i, v in enumerate(xo.tolist()):
        mm = v if v > m else m
        if n < max_batch_size and (n + 1) * mm <= token_budget:
            n += 1
            m = mm
        else:
            mask[i] = 1
            n = 1
            m = v
    if xo.size:
        mask[0] = 1
    return mask


def greedy_batches(xo: np.ndarray, token_budget: int, max_batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(start offsets, computed tokens n * max) of the greedy token-budget batches along ``xo``, int64.
    Compiled: a counting pass and a filling pass (no per-sample mask); pure: the mask, then maxima."""
    k = kernels(xo.size)
    if k is not None:
        count = k.greedy_count(xo, int(token_budget), int(max_batch_size))
        starts = np.empty(count, dtype=np.int64)
        cost = np.empty(count, dtype=np.int64)
        k.greedy_fill(xo, int(token_budget), int(max_batch_size), starts, cost)
        return starts, cost
    starts = greedy_starts(xo, token_budget, max_batch_size)
    if not starts.size:
        return starts, starts.copy()
    sizes = np.diff(np.append(starts, xo.size))
    return starts, sizes * np.maximum.reduceat(xo, starts).astype(np.int64)


def greedy_starts(xo: np.ndarray, token_budget: int, max_batch_size: int) -> np.ndarray:
    """Start offsets (int64) of the greedy token-budget batches along ``xo``; see :func:`greedy_start_mask`."""
    return np.flatnonzero(greedy_start_mask(xo, token_budget, max_batch_size))


def gather_segments(flat: np.ndarray, starts: np.ndarray, ends: np.ndarray, dtype: Any = np.int64) -> np.ndarray:
    """The concatenation of ``flat[starts[b]:ends[b]]`` over b, as ``dtype``."""
    total = int(np.sum(ends - starts))
    out = np.empty(total, dtype=dtype)
    k = kernels(total)
    if k is not None:
        k.gather_segments(flat, starts.astype(np.int64, copy=False), ends.astype(np.int64, copy=False), out)
        return out
    sizes = ends - starts
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    step = 1 << 20  # batches per pass: bounds the int64 index temporary
    for b0 in range(0, starts.size, step):
        b1 = min(b0 + step, starts.size)
        lo, hi = int(offsets[b0]), int(offsets[b1])
        idx = np.repeat(starts[b0:b1] - (offsets[b0:b1] - lo), sizes[b0:b1]) + np.arange(hi - lo)
        out[lo:hi] = flat[idx]
    return out


def first_fit_rows(
    ids: np.ndarray, x: np.ndarray, *, token_budget: int, max_batch_size: int, window: int, shortest: int
) -> tuple[np.ndarray, np.ndarray]:
    """First-fit rows of the samples ``ids`` in order (``x``: every sample's length; ``ids`` may be
    overwritten):
    (members in row order, row offsets (int64, len(rows) + 1), the members' lengths).

    Each sequence goes to the first open row (in opening order) with room for it; a row closes when
    its free space drops below ``shortest`` or it holds ``max_batch_size`` sequences. When a
    sequence fits no open row and ``window`` rows are open, the fullest (the first with the least
    free space) is closed; the sequence opens a new row, or is a row of its own when even a fresh
    row could not take another sequence. At the end, the sequences of the rows still open are
    re-packed first-fit decreasing (longest first, ties by index) into rows appended at the end.
    One pass, O(n * window).
    """
    n = ids.size
    k = kernels(n)
    if k is not None:  # in place: ``ids`` becomes the closed rows' members (the caller's array is consumed)
        xs = take(x, ids)
        row_start = np.zeros(n + 1, dtype=np.uint8)
        cap = int(max(1, min(max_batch_size, token_budget // max(shortest, 1), n)))
        buf = np.empty((window, cap), dtype=np.int64)
        buf_len = np.empty((window, cap), dtype=np.int64)
        pos, nopen, slot, rem, cnt = k.first_fit(
            ids, xs, int(token_budget), int(max_batch_size), int(window), int(shortest), row_start, buf, buf_len
        )
        open_members = [int(i) for q in range(nopen) for i in buf[slot[q], : cnt[q]]]
        members, lengths, starts = ids, xs, np.flatnonzero(row_start[:pos])
    else:
        closed_rows, open_rows = _first_fit_loop(
            take(x, ids).tolist(), ids.tolist(), token_budget, max_batch_size, window, shortest
        )
        open_members = [i for m in open_rows for i in m]
        sizes = np.fromiter((len(r) for r in closed_rows), dtype=np.int64, count=len(closed_rows))
        pos = int(sizes.sum())
        members = np.empty(n, dtype=ids.dtype)
        members[:pos] = np.fromiter((i for r in closed_rows for i in r), dtype=ids.dtype, count=pos)
        lengths = np.empty(n, dtype=x.dtype)
        lengths[:pos] = take(x, members[:pos])
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) if sizes.size else sizes
    tail = _first_fit_decreasing(
        open_members,
        xs_of={i: int(x[i]) for i in open_members},
        token_budget=token_budget,
        max_batch_size=max_batch_size,
    )
    tail_sizes = np.asarray([len(r) for r in tail], dtype=np.int64)
    tail_starts = pos + np.cumsum(tail_sizes) - tail_sizes
    tail_members = np.asarray([i for r in tail for i in r], dtype=ids.dtype)
    members[pos:] = tail_members  # the open rows' sequences: exactly the n - pos not yet written
    lengths[pos:] = x[tail_members]
    offsets = np.concatenate([starts, tail_starts, [members.size]]).astype(np.int64)
    return members, offsets, lengths


def _first_fit_loop(
    xs: list[int], ids: list[int], budget: int, mbs: int, window: int, shortest: int
) -> tuple[list[list[int]], list[list[int]]]:
    """The pure first-fit pass of :func:`first_fit_rows`: (closed rows in closing order, open rows)."""
    rows: list[list[int]] = []
    rem: list[int] = []  # free tokens of each open row
    members: list[list[int]] = []
    for i, L in zip(ids, xs):
        for k in range(len(rem)):
            if rem[k] >= L:
                members[k].append(i)
                rem[k] -= L
                if rem[k] < shortest or len(members[k]) >= mbs:
                    rows.append(members.pop(k))
                    rem.pop(k)
                break
        else:
            if len(rem) >= window:
                k = rem.index(min(rem))  # close the fullest row
                rows.append(members.pop(k))
                rem.pop(k)
            if budget - L < shortest or mbs == 1:
                rows.append([i])
            else:
                members.append([i])
                rem.append(budget - L)
    return rows, members


def _first_fit_decreasing(
    members: list[int], *, xs_of: dict[int, int], token_budget: int, max_batch_size: int
) -> list[list[int]]:
    """First-fit decreasing of a few sequences (the rows still open at the epoch's end)."""
    rest = sorted(members, key=lambda i: (-xs_of[i], i))
    tail: list[list[int]] = []
    free: list[int] = []
    for i in rest:
        L = xs_of[i]
        for k in range(len(free)):
            if free[k] >= L and len(tail[k]) < max_batch_size:
                tail[k].append(i)
                free[k] -= L
                break
        else:
            tail.append([i])
            free.append(token_budget - L)
    return tail
