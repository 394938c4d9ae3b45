"""An epoch's batches in compact form: :class:`Plan` (one rank's, the public type) and
:class:`EpochBatches` (all of them, while planning), plus the two steps that turn the second into the
first: :func:`split_to_multiple` and :func:`assign_ranks` (rules in :mod:`lenbatch.batching.strategies`).

A list of one numpy array per batch costs ~100 bytes of array header per batch and a Python list
slot, and building millions of them dominates planning at scale. Here a set of batches is one flat
index array plus per-batch bounds: 8 bytes per sample and 16 per batch. :class:`Plan` still behaves as
the documented "list of int64 index arrays" (indexing, slicing, ``len``, iteration, ``==`` with a
list of arrays, pickling), each batch a view into the flat array.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lenbatch.batching.scan import gather_segments, permutation, stable_order
from lenbatch.batching.strategy import check_strategy, layout_of


class Plan(Sequence):
    """One rank's epoch plan: a sequence of int64 index arrays (batch ``i`` is ``plan[i]``, in order) that
    also carries its ``strategy`` and ``layout`` (``"padded"``/``"packed"``), so scoring it
    (:func:`lenbatch.padding_efficiency`, :func:`lenbatch.budget_fill`) cannot use the wrong layout.

    Stored as ``indices`` (every batch's sample indices, concatenated, int64) and ``offsets`` (int64,
    ``len(plan) + 1``: batch i is ``indices[offsets[i]:offsets[i+1]]``, a view). Slicing gives a Plan;
    ``plan == [arrays...]`` compares batch by batch. ``Plan(list_of_arrays, strategy=...)`` builds one.
    """

    __slots__ = ("indices", "offsets", "strategy", "layout")

    def __init__(self, batches: Any = (), *, strategy: str) -> None:
        if isinstance(batches, Plan):
            indices, offsets = batches.indices, batches.offsets
        else:
            arrays = [np.asarray(b, dtype=np.int64).reshape(-1) for b in batches]
            sizes = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
            offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            indices = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
        self._set(indices, offsets, strategy)

    def _set(self, indices: np.ndarray, offsets: np.ndarray, strategy: str) -> None:
        check_strategy(strategy)
        self.indices = indices
        self.offsets = offsets
        self.strategy = strategy
        self.layout = layout_of(strategy)

    @classmethod
    def from_flat(cls, indices: np.ndarray, offsets: np.ndarray, *, strategy: str) -> "Plan":
        """The plan whose batch i is ``indices[offsets[i]:offsets[i+1]]`` (arrays kept, not copied)."""
        plan = cls.__new__(cls)
        plan._set(np.asarray(indices, dtype=np.int64), np.asarray(offsets, dtype=np.int64), strategy)
        return plan

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            sel = np.arange(len(self))[i]
            if not sel.size:
                return Plan.from_flat(self.indices[:0], np.zeros(1, np.int64), strategy=self.strategy)
            if i.step in (None, 1):  # a contiguous run of batches: views, no copy
                lo, hi = int(self.offsets[sel[0]]), int(self.offsets[sel[-1] + 1])
                return Plan.from_flat(
                    self.indices[lo:hi], self.offsets[sel[0] : sel[-1] + 2] - lo, strategy=self.strategy
                )
            return Plan([self[int(k)] for k in sel], strategy=self.strategy)
        n = len(self)
        k = int(i)
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError(f"plan index {i} out of range ({n} batches)")
        return self.indices[self.offsets[k] : self.offsets[k + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        idx, off = self.indices, self.offsets.tolist()
        for k in range(len(off) - 1):
            yield idx[off[k] : off[k + 1]]

    def sizes(self) -> np.ndarray:
        """Samples per batch (int64)."""
        return np.diff(self.offsets)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Plan):
            return (
                self.strategy == other.strategy
                and np.array_equal(self.offsets, other.offsets)
                and np.array_equal(self.indices, other.indices)
            )
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == len(self) and all(np.array_equal(a, b) for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  (mutable arrays inside, as a list)

    def __repr__(self) -> str:
        return f"Plan({len(self)} batches, {self.indices.size} samples, strategy={self.strategy!r})"

    def __reduce__(self):  # pickles (DataLoader workers, checkpoints) keep the layout, compactly
        return (_plan_from_flat, (self.indices, self.offsets, self.strategy))


def _plan_from_flat(indices: np.ndarray, offsets: np.ndarray, strategy: str) -> Plan:
    return Plan.from_flat(indices, offsets, strategy=strategy)


@dataclass
class EpochBatches:
    """Every batch of one epoch in list order: batch b is ``flat[start[b]:end[b]]``; ``cost[b]`` its
    computed tokens (n * max padded, the row's tokens packed)."""

    flat: np.ndarray
    start: np.ndarray
    end: np.ndarray
    cost: np.ndarray

    def __len__(self) -> int:
        return self.start.size

    def reorder(self, perm: np.ndarray) -> "EpochBatches":
        return EpochBatches(self.flat, self.start[perm], self.end[perm], self.cost[perm])


def _top_costs(cost: np.ndarray, need: int) -> np.ndarray:
    """Positions of the ``need`` largest ``cost`` (ties: earlier first), as a stable descending sort's
    first ``need`` would pick them; O(n) (a partition, not a sort)."""
    if need >= cost.size:
        return np.arange(cost.size)
    kth = np.partition(cost, cost.size - need)[cost.size - need]
    above = np.flatnonzero(cost > kth)
    return np.concatenate([above, np.flatnonzero(cost == kth)[: need - above.size]])


def _split_one(batch: np.ndarray, x: np.ndarray, packed: bool) -> tuple[np.ndarray, int]:
    """A batch's members in the order its two halves take them, and where the second half starts."""
    if packed:  # two rows of about equal tokens, order kept
        cum = np.cumsum(x[batch].astype(np.int64))
        return batch, int(np.clip(np.searchsorted(cum, cum[-1] / 2), 1, len(batch) - 1))
    srt = batch[np.argsort(x[batch], kind="stable")]  # shorter half pads to a shorter maximum
    return srt, len(batch) // 2


def split_to_multiple(
    eb: EpochBatches, x: np.ndarray, world_size: int, packed: bool, min_batches: int = 0
) -> EpochBatches:
    """Make len(eb) a multiple of world_size (and at least ``min_batches``) by splitting batches in two,
    in place (halves adjacent).

    Each round splits the ``need`` multi-sample batches with the most computed tokens (ties: earlier
    first); rounds repeat only if there were fewer splittable batches than needed. Never drops or
    duplicates a sample; ``ValueError`` when there are fewer samples than batches the ranks need.
    A split batch's members are rewritten in ``eb.flat`` (padded halves: shorter half first), so
    the cost is O(batches) per round plus the split batches' sizes.
    """
    target = max(len(eb), min_batches)
    need = target + (-target) % world_size - len(eb)
    if need and len(eb) + need > eb.flat.size:
        raise ValueError(
            f"world_size={world_size} (min_batches={min_batches}) needs {len(eb) + need} batches "
            f"this epoch but there are only {eb.flat.size} samples; use fewer ranks or more data"
        )
    while need:
        cand = np.flatnonzero(eb.end - eb.start > 1)
        pick = np.sort(cand[_top_costs(eb.cost[cand], need)])
        mids = np.empty(pick.size, dtype=np.int64)
        first_cost = np.empty(pick.size, dtype=np.int64)
        second_cost = np.empty(pick.size, dtype=np.int64)
        for j, b in enumerate(pick.tolist()):
            s, e = int(eb.start[b]), int(eb.end[b])
            members, k = _split_one(eb.flat[s:e], x, packed)
            eb.flat[s:e] = members
            lx = x[members].astype(np.int64)
            mids[j] = s + k
            first_cost[j] = lx[:k].sum() if packed else k * lx[:k].max()
            second_cost[j] = lx[k:].sum() if packed else (e - s - k) * lx[k:].max()
        # batch b becomes (start, mid) then (mid, end)
        start = np.insert(eb.start, pick + 1, mids)
        end = np.insert(eb.end, pick + 1, eb.end[pick])
        cost = np.insert(eb.cost, pick + 1, second_cost)
        at = pick + np.arange(pick.size)  # the first halves' new positions
        end[at] = mids
        cost[at] = first_cost
        eb = EpochBatches(eb.flat, start, end, cost)
        need -= pick.size
    return eb


def assign_ranks(eb: EpochBatches, world_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Per rank, the positions (in ``eb``) of its batches in step order: batches sorted by ``eb.cost``
    (computed tokens, or a :class:`lenbatch.Cost`'s price; descending, stable), cut into consecutive groups of ``world_size`` (one per step), the
    steps shuffled, rank r taking the r-th of every step. ``world_size == 1`` keeps the list order
    (and draws nothing). Requires len(eb) % world_size == 0. O(batches) (counting sort of the costs)."""
    if world_size == 1:
        return [np.arange(len(eb))]
    assert len(eb) % world_size == 0
    if eb.cost.dtype.kind == "f":  # priced by a lenbatch.Cost: a comparison sort, same order rule
        order = np.argsort(-eb.cost, kind="stable")
    else:
        top = int(eb.cost.max()) if len(eb) else 0
        order = stable_order(top - eb.cost, top)  # descending cost, ties in list order
    steps = order.reshape(-1, world_size)
    steps = steps[permutation(rng, len(steps))]
    return [steps[:, r] for r in range(world_size)]


def rank_plan(eb: EpochBatches, positions: np.ndarray, strategy: str) -> Plan:
    """The :class:`Plan` of the batches at ``positions`` of ``eb``, in that order (int64 indices)."""
    s, e = eb.start[positions], eb.end[positions]
    offsets = np.concatenate([[0], np.cumsum(e - s)]).astype(np.int64)
    return Plan.from_flat(gather_segments(eb.flat, s, e), offsets, strategy=strategy)
