"""Batching strategies as pure functions (lengths, params, seed, epoch) -> epoch plan.

Strategies (DESIGN.md):
- ``sorted``: sort by length (stable), greedy token-budget packing; composition fixed forever,
  only the batch order is shuffled each epoch.
- ``random``: shuffle all samples, greedy-pack.
- ``bucketed``: bucket k holds edges[k] <= length < edges[k+1]; shuffle inside each bucket every
  epoch, greedy-pack inside a bucket, shuffle the batch order.
- ``sortish``: the Hugging Face ``group_by_length`` order (the indices of ``transformers``'
  ``trainer_pt_utils.get_length_grouped_indices`` with batch_size = max_batch_size and a torch
  generator seeded per epoch, computed in numpy), then greedy token-budget packing along it:
  the peer baseline.
- ``packed``: shuffle, then first-fit into rows of at most ``token_budget`` tokens and
  ``max_batch_size`` sequences, keeping ``packed_window`` rows open; when a sequence fits no open
  row and the window is full, the fullest open row is closed (it is the one least likely to take
  another sequence). A row whose free space is below the shortest length is closed at once. At the
  end of the epoch the sequences of the rows still open are re-packed first-fit decreasing.

Randomness: one ``numpy.random.Generator`` per (seed + epoch) (``batching.seed``: "epoch e uses
seed + e"), so a plan is a function of (lengths, params, seed, epoch) alone.

Ranks: the epoch's batches are first made a multiple of ``world_size`` by splitting the batches with
the most computed tokens in two (padded: shorter half / longer half; packed: two rows of about
equal tokens; never dropping or duplicating a sample). Then they are sorted by computed tokens
(descending, stable) and cut into consecutive groups of ``world_size``: one group per step, so the
ranks of one step get batches of similar cost (a DDP step waits for its slowest rank). The step order is shuffled; rank r takes the r-th batch of
every step. Every rank gets the same number of batches; together they hold every sample once.
With ``world_size == 1`` the strategy's own order is kept.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from lenbatch.batching.cost import Cost, CostLimit, cost_limit, first_fit_costed
from lenbatch.batching.epoch import EpochBatches, Plan, assign_ranks, rank_plan, split_to_multiple
from lenbatch.batching.lengths import check_lengths
from lenbatch.batching.padding import sorted_greedy_starts
from lenbatch.batching.scan import (
    first_fit_rows,
    greedy_batches,
    histogram_too_wide,
    kernels,
    permutation,
    segment_sums,
    shuffle,
    stable_order,
    take,
    torch_randperm,
    value_counts,
)
from lenbatch.batching.strategy import STRATEGIES, Strategy
from lenbatch.batching.spec import BatchSpec, check_int, spec_or_keywords

__all__ = [
    "Plan",
    "check_plan",
    "named_strategy",
    "plan_epoch",
    "plan_epoch_all",
    "equal_epoch_batches",
    "resolve_rank",
    "sortish_order",
    "validate",
]


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit rank/world_size, else torch.distributed's when initialised (never imports torch), else (0, 1).

    Like ``torch.utils.data.DistributedSampler``, refuses to guess: when ``WORLD_SIZE`` > 1 is set in
    the environment (torchrun, accelerate launch) but no process group is initialised yet, planning
    for one rank would give every rank all the data, so a ``ValueError`` asks for the process group
    or explicit ``rank``/``world_size``.
    """
    if rank is None or world_size is None:
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
        else:
            env = os.environ.get("WORLD_SIZE", "").strip()
            if env.isdigit() and int(env) > 1:
                raise ValueError(
                    f"WORLD_SIZE={env} is set but torch.distributed is not initialised, so this "
                    "process cannot know its rank; call torch.distributed.init_process_group() "
                    "before building the sampler/plan, or pass rank= and world_size= explicitly"
                )
            rank = 0 if rank is None else rank
            world_size = 1 if world_size is None else world_size
    world_size = check_int("world_size", world_size, minimum=1)
    rank = check_int("rank", rank, minimum=0)
    if not 0 <= rank < world_size:
        raise ValueError(
            f"rank {rank} must be in 0..{world_size - 1} (world_size {world_size}); pass the rank of this process"
        )
    return int(rank), int(world_size)


def validate(
    lengths: Any,
    *,
    strategy: "str | Strategy",
    token_budget: int,
    max_batch_size: int,
    edges: Any = None,
    packed_window: int = 8,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Checked lengths (int64) and edges; ``ValueError`` naming the setting and the fix."""
    s = Strategy.of(strategy, edges)
    spec = BatchSpec(token_budget=token_budget, max_batch_size=max_batch_size, packed_window=packed_window)
    x = check_plan(lengths, strategy=s, spec=spec)
    return x, None if s.edges is None else np.asarray(s.edges, dtype=np.int64)


def check_plan(lengths: Any, *, strategy: "str | Strategy", spec: BatchSpec) -> np.ndarray:
    """Checked lengths (int64) for planning ``strategy`` under ``spec``: the strategy is known (a name
    stands for a Strategy without edges), every length fits the budget and the strategy's edges cover the
    lengths. ``ValueError`` naming the setting and the fix. O(n)."""
    strategy = Strategy.of(strategy)
    x = check_lengths(lengths)
    spec.check_lengths(x, strategy)
    return x


def planning_lengths(lengths: Any, *, strategy: "str | Strategy", spec: BatchSpec) -> np.ndarray:
    """:func:`check_plan`'s checks, but the lengths come back in the smallest integer type that holds
    them (uint16 below 65,536 tokens) and are not copied to int64: an epoch of 90 M int32 lengths
    would otherwise take 720 MB before planning starts. Same errors as :func:`check_plan`."""
    arr = np.asarray(lengths)
    if not (arr.ndim == 1 and arr.size and np.issubdtype(arr.dtype, np.integer) and arr.min() > 0):
        return check_plan(lengths, strategy=strategy, spec=spec)  # raises, or converts integral floats
    spec.check_lengths(arr, Strategy.of(strategy))
    top = int(arr.max())
    dtype = np.uint16 if top < 2**16 else np.int32 if top < 2**31 else np.int64
    return arr.astype(dtype, copy=False)


# --------------------------------------------------------------------------- strategies (every batch of the epoch)
# Each takes the planning lengths x (uint16/int32), the epoch's generator, the spec and the Strategy (for
# its edges), and returns the
# epoch's batches in the strategy's list order as EpochBatches, drawing from the generator exactly as
# a straightforward list-of-arrays planner does (tests/batching/test_plan_reference.py compares them).


def _sorted(x, rng, spec, strategy, limit=None):
    # ascending length, ties by index (a counting sort); the greedy batches along a sorted order depend
    # only on how many samples have each length, so their starts come from the histogram, O(distinct)
    top = int(x.max())
    order = stable_order(x, top)
    if limit is not None and limit.effective is not None:  # a cost budget: the greedy scan along the order
        eb = _greedy(order, take(x, order), spec, limit)
        return eb.reorder(permutation(rng, len(eb)))
    if histogram_too_wide(top, x.size):
        values, counts = np.unique(x, return_counts=True)
    else:
        counts = value_counts(x)
        values = np.flatnonzero(counts)
        counts = counts[values]
    starts = sorted_greedy_starts(counts, spec.token_budget, spec.max_batch_size, values=values)
    ends = np.append(starts[1:], x.size)
    last = values[np.searchsorted(np.cumsum(counts), ends - 1, side="right")]  # a batch's max: its last
    eb = EpochBatches(order, starts, ends, (ends - starts) * last.astype(np.int64))
    return eb.reorder(permutation(rng, len(eb)))


def _random(x, rng, spec, strategy, limit=None):
    order = permutation(rng, x.size)
    return _greedy(order, take(x, order), spec, limit)


def _greedy_starts(xo: np.ndarray, spec: BatchSpec, limit: CostLimit | None) -> tuple[np.ndarray, np.ndarray]:
    """(starts, computed tokens) of the greedy batches along ``xo``; with a cost budget the scan runs on
    the effective lengths (:mod:`lenbatch.batching.cost`) and the costs are set later, by the cost model."""
    if limit is None or limit.effective is None:
        return greedy_batches(xo, spec.token_budget, spec.max_batch_size)
    return greedy_batches(take(limit.effective, xo), limit.k, spec.max_batch_size)


def _greedy(order: np.ndarray, xo: np.ndarray, spec: BatchSpec, limit: CostLimit | None = None) -> EpochBatches:
    """The greedy token-budget batches along ``order`` (``xo``: the lengths along it)."""
    starts, cost = _greedy_starts(xo, spec, limit)
    return EpochBatches(order, starts, np.append(starts[1:], order.size), cost)


def _bucketed(x, rng, spec, strategy, limit=None):
    edges = np.asarray(strategy.edges, dtype=np.int64)
    top = int(x.max())
    if histogram_too_wide(top, x.size):
        ids = (np.searchsorted(edges, x, side="right") - 1).astype(np.int16)
    else:  # a table lookup per sample instead of a binary search
        bucket_of_length = (np.searchsorted(edges, np.arange(top + 1), side="right") - 1).astype(np.int16)
        ids = take(bucket_of_length, x)
    order = stable_order(ids, len(edges))  # every bucket's members, in index order
    bounds = np.concatenate([[0], np.cumsum(value_counts(ids, len(edges) - 1))])
    del ids
    starts = []
    for k in range(len(edges) - 1):
        a, b = int(bounds[k]), int(bounds[k + 1])
        if b > a:
            shuffle(rng, order[a:b])  # = rng.permutation(members), in place
    xo = take(x, order)
    costs = []
    for k in range(len(edges) - 1):
        a, b = int(bounds[k]), int(bounds[k + 1])
        if b > a:  # greedy inside the bucket: its first batch starts at the bucket's first sample
            s, c = _greedy_starts(xo[a:b], spec, limit)
            starts.append(a + s)
            costs.append(c)
    starts = np.concatenate(starts)
    eb = EpochBatches(order, starts, np.append(starts[1:], order.size), np.concatenate(costs))
    return eb.reorder(permutation(rng, len(eb)))


def sortish_order(x: np.ndarray, rng: np.random.Generator, max_batch_size: int) -> np.ndarray:
    """Hugging Face ``group_by_length`` order, in numpy: the same indices as transformers'
    ``get_length_grouped_indices(x, max_batch_size, generator=g)`` (a test checks equality),
    with ``g`` a torch generator seeded from ``rng``.

    A torch ``randperm`` of all samples is cut into megabatches of ``m * max_batch_size``
    (m = min(n // (4 * max_batch_size), 50), at least 1); each megabatch is sorted by length,
    longest first, ties kept in permutation order; then the first sample of the megabatch
    holding the longest sample trades places with the very first sample (so the first batch
    is the largest, and out-of-memory shows at once). int64 indices; see :func:`_sortish_order`.
    """
    return _sortish_order(np.asarray(x), rng, max_batch_size)[0].astype(np.int64)


def _sortish_order(x: np.ndarray, rng: np.random.Generator, max_batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, lengths along it) of :func:`sortish_order`, order as int32 below 2**31 samples. Each
    megabatch is sorted by a stable radix sort of (longest - length); torch's ``randperm`` (which
    must stay: it is what transformers draws) is most of the cost."""
    n = len(x)
    perm = torch_randperm(n, int(rng.integers(0, 2**63 - 1)))  # torch.randperm's permutation
    if n == 0:
        return perm, x[:0]
    mega = max(min(n // (max_batch_size * 4), 50), 1) * max_batch_size
    xo = take(x, perm)
    top = int(xo.max())
    k = kernels(n)
    if k is not None and top < 2**16:
        k.sort_blocks_descending(perm, xo, mega)  # compiled: a radix sort per megabatch
    else:
        _sort_megabatches(perm, xo, mega, top)
    firsts = np.arange(0, n, mega)  # each megabatch's longest sample comes first
    t = int(firsts[int(np.argmax(xo[firsts]))])  # first megabatch with the longest
    perm[0], perm[t] = perm[t], perm[0]
    xo[0], xo[t] = xo[t], xo[0]
    return perm, xo


def _sort_megabatches(perm: np.ndarray, xo: np.ndarray, mega: int, top: int) -> None:
    """In place: each run of ``mega`` entries of ``perm`` (and ``xo``, the lengths along it) sorted by
    length, longest first, ties in their order (numpy's stable sort along rows, 2**20 entries a time)."""
    n = perm.size
    key_type = np.uint16 if top < 2**16 else np.int64
    rows_per_block = max(1, (1 << 20) // mega)
    for a in range(0, n, rows_per_block * mega):
        b = min(n, a + rows_per_block * mega)
        full = (b - a) // mega
        for lo, hi, rows in ((a, a + full * mega, full), (a + full * mega, b, 1)):
            if hi <= lo:
                continue
            width = (hi - lo) // rows
            key = (top - xo[lo:hi].astype(np.int64)).astype(key_type).reshape(rows, width)
            srt = np.argsort(key, axis=1, kind="stable")
            perm[lo:hi] = np.take_along_axis(perm[lo:hi].reshape(rows, width), srt, axis=1).ravel()
            xo[lo:hi] = np.take_along_axis(xo[lo:hi].reshape(rows, width), srt, axis=1).ravel()


def _sortish(x, rng, spec, strategy, limit=None):
    order, xo = _sortish_order(x, rng, spec.max_batch_size)
    return _greedy(order, xo, spec, limit)


def _packed(x, rng, spec, strategy, limit=None):
    # first-fit rows along a shuffled order (the rules: lenbatch.batching.scan.first_fit_rows); a row
    # whose free space is below the shortest length is closed at once
    order = permutation(rng, x.size)
    if limit is not None and limit.effective is not None:  # and below the cost budget (pure Python)
        rows, tail = first_fit_costed(
            order,
            x,
            token_budget=spec.token_budget,
            max_batch_size=spec.max_batch_size,
            window=spec.packed_window,
            shortest=int(x.min()),
            limit=limit,
        )
        rows += tail
        sizes = np.asarray([len(r) for r in rows], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        members = np.asarray([i for r in rows for i in r], dtype=order.dtype)
        return EpochBatches(members, offsets[:-1], offsets[1:], segment_sums(take(x, members), offsets[:-1]))
    members, offsets, lengths = first_fit_rows(
        order,
        x,
        token_budget=spec.token_budget,
        max_batch_size=spec.max_batch_size,
        window=spec.packed_window,
        shortest=int(x.min()),
    )
    del order
    cost = segment_sums(lengths, offsets[:-1])
    return EpochBatches(members, offsets[:-1], offsets[1:], cost)


def named_strategy(strategy: "str | Strategy", edges: Any = None) -> Strategy:
    """``strategy`` as a :class:`Strategy`: a name with ``edges=`` beside it builds one; a Strategy carries its
    own edges, so ``edges=`` beside it is a ``ValueError`` naming the fix (:meth:`Strategy.of`)."""
    return Strategy.of(strategy, edges)


_FUNCS = {"sorted": _sorted, "random": _random, "bucketed": _bucketed, "sortish": _sortish, "packed": _packed}
assert tuple(_FUNCS) == STRATEGIES, "every strategy of lenbatch.batching.strategy.STRATEGIES has a planner"


def plan_epoch_all(
    lengths: Any,
    *,
    strategy: "str | Strategy",
    epoch: int = 0,
    seed: int = 0,
    token_budget: int | None = None,
    max_batch_size: int | None = None,
    edges: Any = None,
    world_size: int = 1,
    packed_window: int = 8,
    min_batches: int = 0,
    spec: BatchSpec | None = None,
    cost: Cost | None = None,
    cost_budget: float | None = None,
) -> list[Plan]:
    """Every rank's batches for one epoch: ``out[r]`` is rank r's list of int64 index arrays, in order.

    The batching values come as keyword arguments or whole as ``spec=`` (a :class:`lenbatch.BatchSpec`).
    ``min_batches`` (default 0: off) splits the costliest batches until the epoch has at least that
    many batches (over all ranks): trainers that fix the steps per epoch from the first epoch
    (transformers' ``Trainer``) need every epoch to have the same count; see
    :func:`equal_epoch_batches`. ``strategy`` is a name (``edges=`` beside it for ``bucketed``) or a
    :class:`lenbatch.Strategy`. ``cost`` (a :class:`lenbatch.Cost`) balances each step's batches across
    the ranks by that cost instead of computed tokens; ``cost_budget`` also caps every batch's cost
    (:mod:`lenbatch.batching.cost`).
    """
    strategy = named_strategy(strategy, edges)
    spec = spec_or_keywords(
        spec,
        token_budget=token_budget,
        max_batch_size=max_batch_size,
        seed=seed,
        packed_window=packed_window,
        min_batches=min_batches,
    )
    eb, ranks = epoch_batches(
        lengths, strategy=strategy, spec=spec, epoch=epoch, world_size=world_size, cost=cost, cost_budget=cost_budget
    )
    return [rank_plan(eb, pos, strategy.name) for pos in ranks]


def epoch_batches(
    lengths: Any,
    *,
    strategy: "str | Strategy",
    spec: BatchSpec,
    epoch: int,
    world_size: int,
    cost: Cost | None = None,
    cost_budget: float | None = None,
) -> tuple[EpochBatches, list[np.ndarray]]:
    """The epoch's batches (compact) and, per rank, the positions of its batches in step order.
    O(N) with numba (``lenbatch[fast]``) for every strategy but ``sortish`` (torch's randperm) and
    the Python scans without it; memory O(N) in int32/uint16 (see benchmarks/bench_plans.py). A name
    stands for a :class:`Strategy` without edges."""
    strategy = Strategy.of(strategy)
    x = planning_lengths(lengths, strategy=strategy, spec=spec)
    world_size = check_int("world_size", world_size, minimum=1)
    epoch = check_int("epoch", epoch, minimum=0)
    rng = np.random.default_rng(spec.seed + epoch)
    limit = cost_limit(
        x, token_budget=spec.token_budget, max_batch_size=spec.max_batch_size, cost=cost, cost_budget=cost_budget
    )
    plan, packed = _FUNCS[strategy.name], strategy.packed
    if limit is None:
        eb = plan(x, rng, spec, strategy)
        eb = split_to_multiple(eb, x, world_size, packed, spec.min_batches)
        return eb, assign_ranks(eb, world_size, rng)
    # priced by the cost model: the costliest are split, and each step's batches cost alike
    eb = _priced(plan(x, rng, spec, strategy, limit), x, limit.cost, packed)
    eb = _priced(split_to_multiple(eb, x, world_size, packed, spec.min_batches), x, limit.cost, packed)
    return eb, assign_ranks(eb, world_size, rng)


def _priced(eb: EpochBatches, x: np.ndarray, cost: Cost, packed: bool) -> EpochBatches:
    """``eb`` with ``cost`` = the cost model's price of each batch (float64). O(N)."""
    if not len(eb):
        return eb
    pos = np.argsort(eb.start, kind="stable")  # the batches tile ``flat``: price them in that order
    s = eb.start[pos]
    priced = np.empty(len(eb))
    priced[pos] = cost.of_segments(take(x, eb.flat), s, eb.end[pos] - s, packed=packed)
    return EpochBatches(eb.flat, eb.start, eb.end, priced)


def plan_epoch(
    lengths: Any,
    *,
    strategy: "str | Strategy",
    epoch: int = 0,
    seed: int = 0,
    token_budget: int | None = None,
    max_batch_size: int | None = None,
    edges: Any = None,
    rank: int | None = None,
    world_size: int | None = None,
    packed_window: int = 8,
    min_batches: int = 0,
    spec: BatchSpec | None = None,
    cost: Cost | None = None,
    cost_budget: float | None = None,
) -> Plan:
    """This rank's batches for one epoch (list of int64 index arrays, in order). See the module doc.

    ``rank``/``world_size`` default to torch.distributed's when it is initialised, else 0/1.
    Only this rank's batches are gathered (the epoch's batches are planned, then dropped). Cost: see
    :func:`epoch_batches` (benchmarks/bench_plans.py: 0.9, 9 and 90 M samples). ``strategy`` is a name
    (``edges=`` beside it for ``bucketed``) or a :class:`lenbatch.Strategy`; ``cost``/``cost_budget`` as in
    :func:`plan_epoch_all`.
    """
    strategy = named_strategy(strategy, edges)
    rank, world_size = resolve_rank(rank, world_size)
    spec = spec_or_keywords(
        spec,
        token_budget=token_budget,
        max_batch_size=max_batch_size,
        seed=seed,
        packed_window=packed_window,
        min_batches=min_batches,
    )
    eb, ranks = epoch_batches(
        lengths, strategy=strategy, spec=spec, epoch=epoch, world_size=world_size, cost=cost, cost_budget=cost_budget
    )
    return rank_plan(eb, ranks[rank], strategy.name)  # only this rank's batches are gathered


def equal_epoch_batches(
    lengths: Any,
    *,
    epochs: int,
    strategy: "str | Strategy",
    seed: int = 0,
    token_budget: int | None = None,
    max_batch_size: int | None = None,
    edges: Any = None,
    world_size: int = 1,
    packed_window: int = 8,
    spec: BatchSpec | None = None,
    cost: Cost | None = None,
    cost_budget: float | None = None,
) -> int:
    """The ``min_batches`` that gives epochs 0..epochs-1 the same number of batches: the most any of
    them plans (over all ranks, a multiple of ``world_size``). Strategies other than ``sorted`` plan
    a different count each epoch (greedy packing of a new order). Cost: ``epochs`` plans."""
    epochs = check_int("epochs", epochs, minimum=1)
    strategy = named_strategy(strategy, edges)
    spec = spec_or_keywords(
        spec, token_budget=token_budget, max_batch_size=max_batch_size, seed=seed, packed_window=packed_window
    )
    return max(
        len(
            epoch_batches(
                lengths,
                strategy=strategy,
                spec=spec,
                epoch=e,
                world_size=world_size,
                cost=cost,
                cost_budget=cost_budget,
            )[0]
        )
        for e in range(epochs)
    )  # every rank's batches counted, none gathered
