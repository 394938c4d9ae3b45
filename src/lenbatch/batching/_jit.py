"""The planner's sequential loops compiled with numba (optional: ``pip install lenbatch[fast]``).

Imported only by :mod:`lenbatch.batching.scan`, which falls back to its pure numpy/Python loops when
numba is missing (or ``LENBATCH_NO_NUMBA=1``); every kernel here computes exactly what its pure twin
computes (tests/batching/test_scan.py compares them on random cases). Kernels are compiled on first
use and cached on disk (``cache=True``: about 0.1 s to load afterwards).
"""

from __future__ import annotations

import numba
import numpy as np

_jit = numba.njit(cache=True, nogil=True)


@_jit
def greedy_start_mask(xo, token_budget, max_batch_size, mask):
    """mask[i] = 1 where a greedy token-budget batch starts along ``xo`` (the lengths in plan order):
    a batch grows while (n+1)*max(m, next) <= token_budget and n < max_batch_size. O(n)."""
    n = 0
    m = 0
    for i in range(xo.size):
        v = np.int64(xo[i])
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


@_jit
def shuffle_chunk(a, i, words, has_half, half):
    """numpy ``Generator.shuffle`` of ``a`` (1-D) for positions i, i-1, ..., 1, drawing from ``words``
    (the PCG64 stream's next 64-bit outputs). numpy's ``random_interval(max)``: values of the uint32
    stream (each 64-bit output gives its low half, then its high half) masked to the smallest
    all-ones mask >= max, redrawn while > max; then a[i], a[j] swap. Stops when ``words`` run out
    (a draw cut short restarts with the next words: its rejected values are consumed either way).
    Returns (next i, words used, has_half, half). Only for len(a) <= 2**32 (32-bit draws).

    The draws of a block of 4,096 positions come first, then their swaps: the swaps of a block do not
    wait on one another's cache misses (numpy's loop interleaves them with the draws)."""
    w = 0
    nw = words.size
    block = np.empty(4096, dtype=np.int64)
    while i >= 1:
        got = 0
        top = i
        while got < block.size and i >= 1:
            mask = np.uint64(i)
            mask |= mask >> np.uint64(1)
            mask |= mask >> np.uint64(2)
            mask |= mask >> np.uint64(4)
            mask |= mask >> np.uint64(8)
            mask |= mask >> np.uint64(16)
            done = False
            while True:
                if has_half:
                    v = half
                    has_half = False
                else:
                    if w == nw:
                        break
                    word = words[w]
                    w += 1
                    v = word & np.uint64(0xFFFFFFFF)
                    half = word >> np.uint64(32)
                    has_half = True
                v &= mask
                if v <= np.uint64(i):
                    done = True
                    break
            if not done:
                break
            block[got] = np.int64(v)
            got += 1
            i -= 1
        for q in range(got):  # position top - q swaps with its draw
            p = top - q
            j = block[q]
            t = a[p]
            a[p] = a[j]
            a[j] = t
        if got < block.size and i >= 1:
            return i, w, has_half, half  # the words ran out
    return i, w, has_half, half


@_jit
def take(x, idx, out):
    """out[k] = x[idx[k]] (numpy's fancy indexing, about 3x faster on large random gathers)."""
    for k in range(idx.size):
        out[k] = x[idx[k]]


@_jit
def stable_counting_order(x, top, out):
    """out = the stable ascending order of ``x`` (ints in 0..top): a counting sort, O(n + top)."""
    count = np.zeros(top + 2, dtype=np.int64)
    for k in range(x.size):
        count[np.int64(x[k]) + 1] += 1
    for v in range(1, top + 2):
        count[v] += count[v - 1]
    for k in range(x.size):
        v = np.int64(x[k])
        out[count[v]] = k
        count[v] += 1


@_jit
def gather_segments(flat, starts, ends, out):
    """out = concatenation of flat[starts[b]:ends[b]] over b, in order."""
    p = 0
    for b in range(starts.size):
        for k in range(starts[b], ends[b]):
            out[p] = flat[k]
            p += 1


@_jit
def _close_row(k, pos, nopen, nfree, ids, xs, row_start, buf, buf_len, slot, rem, cnt, free):
    """Write open row k to ids/xs at ``pos`` and drop it from the open list; returns (pos, nopen, nfree)."""
    s = slot[k]
    row_start[pos] = 1
    for q in range(cnt[k]):
        ids[pos] = buf[s, q]
        xs[pos] = buf_len[s, q]
        pos += 1
    free[nfree] = s
    for q in range(k, nopen - 1):
        slot[q] = slot[q + 1]
        rem[q] = rem[q + 1]
        cnt[q] = cnt[q + 1]
    return pos, nopen - 1, nfree + 1


@_jit
def first_fit(ids, xs, token_budget, max_batch_size, window, shortest, row_start, buf, buf_len):
    """First-fit packing of ``ids`` (lengths ``xs``, in the same order) into rows, ``window`` rows open;
    the rules of :func:`lenbatch.batching.scan.first_fit_rows` (its pure loop is the specification).

    In place: closed rows overwrite ``ids`` (members) and ``xs`` (their lengths) from the front, in
    closing order -- safe, since no more sequences are written than have been read --, and
    row_start[p] = 1 where one begins. Returns (entries written, open rows, and per open row in list
    order: its buffer slot, free tokens, count); the open rows' members are in ``buf``/``buf_len``."""
    slot = np.empty(window, dtype=np.int64)
    rem = np.empty(window, dtype=np.int64)
    cnt = np.empty(window, dtype=np.int64)
    free = np.arange(window - 1, -1, -1).astype(np.int64)  # a stack of free buffer slots
    nfree = window
    nopen = 0
    pos = 0
    for t in range(ids.size):
        i = ids[t]
        L = np.int64(xs[t])
        k = 0
        while k < nopen and rem[k] < L:
            k += 1
        if k < nopen:  # the first open row with room
            s = slot[k]
            buf[s, cnt[k]] = i
            buf_len[s, cnt[k]] = L
            cnt[k] += 1
            rem[k] -= L
            if rem[k] < shortest or cnt[k] >= max_batch_size:
                pos, nopen, nfree = _close_row(
                    k, pos, nopen, nfree, ids, xs, row_start, buf, buf_len, slot, rem, cnt, free
                )
            continue
        if nopen >= window:  # close the fullest open row (the first of the smallest free space)
            k = 0
            for q in range(1, nopen):
                if rem[q] < rem[k]:
                    k = q
            pos, nopen, nfree = _close_row(k, pos, nopen, nfree, ids, xs, row_start, buf, buf_len, slot, rem, cnt, free)
        if token_budget - L < shortest or max_batch_size == 1:  # a row of its own
            row_start[pos] = 1
            ids[pos] = i
            xs[pos] = L
            pos += 1
        else:
            nfree -= 1
            s = free[nfree]
            buf[s, 0] = i
            buf_len[s, 0] = L
            slot[nopen] = s
            rem[nopen] = token_budget - L
            cnt[nopen] = 1
            nopen += 1
    return pos, nopen, slot, rem, cnt


@_jit
def sort_blocks_descending(perm, xo, width):
    """Within each block of ``width`` consecutive entries (the last may be shorter): reorder ``perm``
    and ``xo`` (the lengths along it) by ``xo`` descending, ties in their current order -- a stable
    LSD radix sort of (65535 - xo) on two 8-bit digits. Needs xo < 65536. O(n + 256 per block)."""
    n = perm.size
    tmp_p = np.empty(width, dtype=perm.dtype)
    tmp_x = np.empty(width, dtype=xo.dtype)
    count = np.empty(257, dtype=np.int64)
    for lo in range(0, n, width):
        hi = min(n, lo + width)
        for shift in (0, 8):
            count[:] = 0
            for k in range(lo, hi):
                d = ((65535 - np.int64(xo[k])) >> shift) & 255
                count[d + 1] += 1
            for d in range(1, 257):
                count[d] += count[d - 1]
            for k in range(lo, hi):
                d = ((65535 - np.int64(xo[k])) >> shift) & 255
                q = count[d]
                tmp_p[q] = perm[k]
                tmp_x[q] = xo[k]
                count[d] = q + 1
            for k in range(hi - lo):
                perm[lo + k] = tmp_p[k]
                xo[lo + k] = tmp_x[k]


@_jit
def randperm_chunk(r, i0, raw):
    """torch's CPU ``randperm`` swaps for positions i0 .. i0 + len(raw) - 1: z = raw[q] % (n - i),
    then r[i] and r[i + z] trade places (``raw``: the generator's 32-bit mt19937 outputs; n < 2**32).
    The targets of a block of 4,096 positions come first (32-bit remainders, independent of each
    other), then the swaps, whose cache misses then overlap: half the time of one interleaved loop."""
    n = r.size
    m = raw.size
    block = np.empty(4096, dtype=np.int64)
    for b0 in range(0, m, 4096):
        b1 = min(m, b0 + 4096)
        for q in range(b0, b1):
            i = i0 + q
            block[q - b0] = i + np.int64(np.uint32(raw[q]) % np.uint32(n - i))
        for q in range(b0, b1):
            i = i0 + q
            j = block[q - b0]
            t = r[i]
            r[i] = r[j]
            r[j] = t


@_jit
def greedy_count(xo, token_budget, max_batch_size):
    """How many greedy token-budget batches ``xo`` makes (the rule of :func:`greedy_start_mask`)."""
    n = 0
    m = 0
    count = 0
    for i in range(xo.size):
        v = np.int64(xo[i])
        mm = v if v > m else m
        if n < max_batch_size and (n + 1) * mm <= token_budget and count:
            n += 1
            m = mm
        else:
            count += 1
            n = 1
            m = v
    return count


@_jit
def greedy_fill(xo, token_budget, max_batch_size, starts, cost):
    """starts[b] and cost[b] = n * max of every greedy token-budget batch along ``xo`` (sized by
    :func:`greedy_count`)."""
    n = 0
    m = 0
    b = -1
    for i in range(xo.size):
        v = np.int64(xo[i])
        mm = v if v > m else m
        if n < max_batch_size and (n + 1) * mm <= token_budget and b >= 0:
            n += 1
            m = mm
        else:
            if b >= 0:
                cost[b] = n * m
            b += 1
            starts[b] = i
            n = 1
            m = v
    if b >= 0:
        cost[b] = n * m
