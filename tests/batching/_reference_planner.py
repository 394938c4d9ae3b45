"""A frozen copy of the planner as it was before issue 21 (commit 72e1835, batching/strategies.py and
batching/padding.py): the reference that tests/batching/test_plan_reference.py compares the new planner
against, bit for bit. Do not edit it to make a test pass: a difference is a change of plans.

Only the algorithms are kept (no argument checking: the tests pass valid input). ``spec`` is any object
with ``token_budget``, ``max_batch_size``, ``packed_window``, ``edges`` and ``packed``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def greedy_starts(ordered_lengths: Sequence[int] | np.ndarray, token_budget: int, max_batch_size: int) -> np.ndarray:
    """Start offsets of the greedy token-budget batches along ``ordered_lengths``.

    A batch grows while (n+1)*max(m, next) <= token_budget and n < max_batch_size. One pass,
    O(n) (a plain Python loop over ints: ~0.13 s for 902,087 lengths). Assumes every length
    <= token_budget (checked by the callers).
    """
    starts = [0]
    n = 0
    m = 0
    L = ordered_lengths.tolist() if isinstance(ordered_lengths, np.ndarray) else list(ordered_lengths)
    for i, x in enumerate(L):
        mm = x if x > m else m
        if n < max_batch_size and (n + 1) * mm <= token_budget:
            n += 1
            m = mm
        else:
            starts.append(i)
            n = 1
            m = x
    if not L:
        return np.zeros(0, dtype=np.int64)
    return np.asarray(starts, dtype=np.int64)


def greedy_batches(order: np.ndarray, lengths: np.ndarray, token_budget: int, max_batch_size: int) -> list[np.ndarray]:
    """Greedy token-budget batches of the sample indices ``order`` (int64 arrays, in order)."""
    order = np.asarray(order, dtype=np.int64)
    if order.size == 0:
        return []
    starts = greedy_starts(lengths[order], token_budget, max_batch_size)
    return np.split(order, starts[1:])


def _flat(lengths: np.ndarray, batches: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sizes = np.fromiter((len(b) for b in batches), dtype=np.int64, count=len(batches))
    if np.any(sizes == 0):
        raise ValueError("a batch is empty; plans never hold empty batches")
    idx = np.concatenate(batches) if batches else np.zeros(0, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return idx, sizes, starts


def batch_tokens(lengths: Any, batches: Sequence[np.ndarray], *, packed: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per batch: (useful tokens, computed tokens). Computed = n*max for padded batches, the row length if packed."""
    x = np.asarray(lengths, dtype=np.int64)
    idx, sizes, starts = _flat(x, batches)
    if idx.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lx = x[idx]
    useful = np.add.reduceat(lx, starts)
    computed = useful.copy() if packed else sizes * np.maximum.reduceat(lx, starts)
    return useful, computed


def _seq_split(batch: np.ndarray, x: np.ndarray, packed: bool) -> tuple[np.ndarray, np.ndarray]:
    if packed:  # two rows of about equal tokens, order kept
        cum = np.cumsum(x[batch])
        k = int(np.clip(np.searchsorted(cum, cum[-1] / 2), 1, len(batch) - 1))
        return batch[:k], batch[k:]
    srt = batch[np.argsort(x[batch], kind="stable")]  # shorter half pads to a shorter maximum
    k = len(batch) // 2
    return srt[:k], srt[k:]


def split_to_multiple(
    batches: list[np.ndarray], x: np.ndarray, world_size: int, packed: bool, min_batches: int = 0
) -> list[np.ndarray]:
    """Make len(batches) a multiple of world_size (and at least ``min_batches``) by splitting batches
    in two, in place (halves adjacent).

    Each round splits the ``need`` multi-sample batches with the most computed tokens (ties: earlier
    first); rounds repeat only if there were fewer splittable batches than needed. Never drops or
    duplicates a sample; ``ValueError`` when there are fewer samples than batches the ranks need.
    """
    target = max(len(batches), min_batches)
    need = target + (-target) % world_size - len(batches)
    if need and len(batches) + need > x.size:
        raise ValueError(
            f"world_size={world_size} (min_batches={min_batches}) needs {len(batches) + need} batches "
            f"this epoch but there are only {x.size} samples; use fewer ranks or more data"
        )
    while need:
        cost = batch_tokens(x, batches, packed=packed)[1]
        sizes = np.fromiter((len(b) for b in batches), dtype=np.int64, count=len(batches))
        cand = np.flatnonzero(sizes > 1)
        pick = cand[np.argsort(-cost[cand], kind="stable")[:need]]
        chosen = set(pick.tolist())
        out: list[np.ndarray] = []
        for i, b in enumerate(batches):
            out.extend(_seq_split(b, x, packed) if i in chosen else (b,))
        batches = out
        need -= len(pick)
    return batches


def assign_ranks(
    batches: list[np.ndarray], x: np.ndarray, world_size: int, rng: np.random.Generator, packed: bool
) -> list[list[np.ndarray]]:
    """Per rank, its batches in step order (see module doc). Requires len(batches) % world_size == 0."""
    if world_size == 1:
        return [batches]
    assert len(batches) % world_size == 0
    cost = batch_tokens(x, batches, packed=packed)[1]
    order = np.argsort(-cost, kind="stable")
    steps = order.reshape(-1, world_size)
    steps = steps[rng.permutation(len(steps))]
    return [[batches[i] for i in steps[:, r]] for r in range(world_size)]


def _sorted(x, rng, spec, strategy):
    batches = greedy_batches(np.argsort(x, kind="stable"), x, spec.token_budget, spec.max_batch_size)
    return [batches[i] for i in rng.permutation(len(batches))]


def _random(x, rng, spec, strategy):
    return greedy_batches(rng.permutation(x.size), x, spec.token_budget, spec.max_batch_size)


def _bucketed(x, rng, spec, strategy):
    edges = np.asarray(strategy.edges, dtype=np.int64)
    ids = np.searchsorted(edges, x, side="right") - 1
    by_bucket = np.argsort(ids, kind="stable")
    bounds = np.searchsorted(ids[by_bucket], np.arange(len(edges)))
    batches: list[np.ndarray] = []
    for k in range(len(edges) - 1):
        members = by_bucket[bounds[k] : bounds[k + 1]]
        if members.size:
            batches.extend(greedy_batches(rng.permutation(members), x, spec.token_budget, spec.max_batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


def sortish_order(x: np.ndarray, rng: np.random.Generator, max_batch_size: int) -> np.ndarray:
    """Hugging Face ``group_by_length`` order, in numpy: the same indices as transformers'
    ``get_length_grouped_indices(x, max_batch_size, generator=g)`` (a test checks equality),
    with ``g`` a torch generator seeded from ``rng``.

    A torch ``randperm`` of all samples is cut into megabatches of ``m * max_batch_size``
    (m = min(n // (4 * max_batch_size), 50), at least 1); each megabatch is sorted by length,
    longest first, ties kept in permutation order; then the first sample of the megabatch
    holding the longest sample trades places with the very first sample (so the first batch
    is the largest, and out-of-memory shows at once). One stable lexsort over (megabatch,
    -length): 0.18 s per epoch plan for 902,087 lengths; transformers' Python sort alone takes
    0.3-1.1 s (bench_core.py).
    """
    import torch

    x = np.asarray(x, dtype=np.int64)
    n = len(x)
    gen = torch.Generator().manual_seed(int(rng.integers(0, 2**63 - 1)))
    perm = torch.randperm(n, generator=gen).numpy().astype(np.int64)
    if n == 0:
        return perm
    mega = max(min(n // (max_batch_size * 4), 50), 1) * max_batch_size
    # by megabatch, then longest first; lexsort is stable, so equal lengths keep their
    # permutation order, as Python's sorted(..., reverse=True) does
    order = perm[np.lexsort((-x[perm], np.arange(n) // mega))]
    firsts = np.arange(0, n, mega)  # each megabatch's longest sample comes first
    top = int(firsts[int(np.argmax(x[order[firsts]]))])  # first megabatch with the longest
    order[0], order[top] = order[top], order[0]
    return order


def _sortish(x, rng, spec, strategy):
    return greedy_batches(sortish_order(x, rng, spec.max_batch_size), x, spec.token_budget, spec.max_batch_size)


def _packed(x, rng, spec, strategy):
    # first-fit with the spec's fits() rule inlined (rem >= L is fits(n + 1, used + L); a row is closed
    # when it holds max_batch_size sequences): one Python loop over the epoch, so no method calls
    budget, mbs, packed_window = spec.token_budget, spec.max_batch_size, spec.packed_window
    order = rng.permutation(x.size)
    xs = x[order].tolist()
    ids = order.tolist()
    shortest = int(x.min())
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
            if len(rem) >= packed_window:
                k = rem.index(min(rem))  # close the fullest row
                rows.append(members.pop(k))
                rem.pop(k)
            if budget - L < shortest or mbs == 1:
                rows.append([i])
            else:
                members.append([i])
                rem.append(budget - L)
    # end of the epoch: re-pack the sequences of the rows still open, longest first (first-fit
    # decreasing), so a small epoch does not end with a window of half-empty rows
    rest = sorted((i for m in members for i in m), key=lambda i: (-int(x[i]), i))
    tail: list[list[int]] = []
    free: list[int] = []
    for i in rest:
        L = int(x[i])
        for k in range(len(free)):
            if free[k] >= L and len(tail[k]) < mbs:
                tail[k].append(i)
                free[k] -= L
                break
        else:
            tail.append([i])
            free.append(budget - L)
    rows.extend(tail)
    return [np.asarray(r, dtype=np.int64) for r in rows]


_FUNCS = {"sorted": _sorted, "random": _random, "bucketed": _bucketed, "sortish": _sortish, "packed": _packed}


def reference_plan_all(
    x: np.ndarray, *, strategy: Any, spec: Any, epoch: int, world_size: int, min_batches: int = 0
) -> list[list[np.ndarray]]:
    """Every rank's batches of one epoch, as ``plan_epoch_all`` computed them before issue 21."""
    x = np.asarray(x, dtype=np.int64)
    rng = np.random.default_rng(spec.seed + epoch)
    batches = _FUNCS[strategy.name](x, rng, spec, strategy)
    batches = split_to_multiple(batches, x, world_size, strategy.packed, min_batches)
    return assign_ranks(batches, x, world_size, rng, strategy.packed)
