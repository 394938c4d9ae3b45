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

from lenbatch.batching.padding import batch_tokens, greedy_batches
from lenbatch.batching.lengths import check_lengths
from lenbatch.batching.layouts import STRATEGIES, check_strategy, layout_of
from lenbatch.batching.spec import BatchSpec, check_int, spec_or_keywords




class Plan(list):
    """One rank's epoch plan: a plain ``list`` of int64 index arrays (the stable API) that also
    carries its ``strategy`` and ``layout`` (``"padded"``/``"packed"``), so scoring it
    (:func:`lenbatch.padding_efficiency`, :func:`lenbatch.budget_fill`) cannot use the wrong layout.
    Slicing or copying into a new list drops the attributes (pass ``strategy=`` then)."""

    def __init__(self, batches: Any = (), *, strategy: str) -> None:
        super().__init__(batches)
        check_strategy(strategy)
        self.strategy = strategy
        self.layout = layout_of(strategy)

    def __reduce__(self):  # pickles (DataLoader workers, checkpoints) keep the layout
        return (_make_plan, (list(self), self.strategy))


def _make_plan(batches: list, strategy: str) -> "Plan":
    return Plan(batches, strategy=strategy)


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
                raise ValueError(f"WORLD_SIZE={env} is set but torch.distributed is not initialised, so this "
                                 "process cannot know its rank; call torch.distributed.init_process_group() "
                                 "before building the sampler/plan, or pass rank= and world_size= explicitly")
            rank = 0 if rank is None else rank
            world_size = 1 if world_size is None else world_size
    world_size = check_int("world_size", world_size, minimum=1)
    rank = check_int("rank", rank, minimum=0)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} must be in 0..{world_size - 1} (world_size {world_size}); "
                         "pass the rank of this process")
    return int(rank), int(world_size)


def validate(lengths: Any, *, strategy: str, token_budget: int, max_batch_size: int, edges: Any = None,
             packed_window: int = 8) -> tuple[np.ndarray, np.ndarray | None]:
    """Checked lengths (int64) and edges; ``ValueError`` naming the setting and the fix."""
    spec = BatchSpec(token_budget=token_budget, max_batch_size=max_batch_size, layout=layout_of(strategy),
                     packed_window=packed_window, edges=edges)
    x = check_plan(lengths, strategy=strategy, spec=spec)
    return x, None if spec.edges is None else np.asarray(spec.edges, dtype=np.int64)


def check_plan(lengths: Any, *, strategy: str, spec: BatchSpec) -> np.ndarray:
    """Checked lengths (int64) for planning ``strategy`` under ``spec``: the strategy is known, its
    layout is the spec's, ``bucketed`` has edges (and only it), every length fits the budget and
    the edges cover the lengths. ``ValueError`` naming the setting and the fix."""
    x = check_lengths(lengths)
    check_strategy(strategy)
    if spec.layout != layout_of(strategy):
        raise ValueError(f"strategy {strategy!r} makes {layout_of(strategy)} batches but the BatchSpec has layout "
                         f"{spec.layout!r}; build it with layout={layout_of(strategy)!r} "
                         "(BatchSpec.from_params(params, strategy=...) does)")
    if strategy == "bucketed" and spec.edges is None:
        raise ValueError("strategy 'bucketed' needs edges (bucket boundaries in tokens); pass "
                         "edges=lenbatch.optimize_boundaries(lengths, ...).edges")
    if strategy != "bucketed" and spec.edges is not None:
        raise ValueError(f"edges are only used by strategy 'bucketed', not {strategy!r}; drop edges= or use "
                         "strategy='bucketed'")
    spec.check_lengths(x)
    return x


def _seq_split(batch: np.ndarray, x: np.ndarray, packed: bool) -> tuple[np.ndarray, np.ndarray]:
    if packed:  # two rows of about equal tokens, order kept
        cum = np.cumsum(x[batch])
        k = int(np.clip(np.searchsorted(cum, cum[-1] / 2), 1, len(batch) - 1))
        return batch[:k], batch[k:]
    srt = batch[np.argsort(x[batch], kind="stable")]  # shorter half pads to a shorter maximum
    k = len(batch) // 2
    return srt[:k], srt[k:]


def split_to_multiple(batches: list[np.ndarray], x: np.ndarray, world_size: int, packed: bool,
                      min_batches: int = 0) -> list[np.ndarray]:
    """Make len(batches) a multiple of world_size (and at least ``min_batches``) by splitting batches
    in two, in place (halves adjacent).

    Each round splits the ``need`` multi-sample batches with the most computed tokens (ties: earlier
    first); rounds repeat only if there were fewer splittable batches than needed. Never drops or
    duplicates a sample; ``ValueError`` when there are fewer samples than batches the ranks need.
    """
    target = max(len(batches), min_batches)
    need = target + (-target) % world_size - len(batches)
    if need and len(batches) + need > x.size:
        raise ValueError(f"world_size={world_size} (min_batches={min_batches}) needs {len(batches) + need} batches "
                         f"this epoch but there are only {x.size} samples; use fewer ranks or more data")
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


def assign_ranks(batches: list[np.ndarray], x: np.ndarray, world_size: int, rng: np.random.Generator,
                 packed: bool) -> list[list[np.ndarray]]:
    """Per rank, its batches in step order (see module doc). Requires len(batches) % world_size == 0."""
    if world_size == 1:
        return [batches]
    assert len(batches) % world_size == 0
    cost = batch_tokens(x, batches, packed=packed)[1]
    order = np.argsort(-cost, kind="stable")
    steps = order.reshape(-1, world_size)
    steps = steps[rng.permutation(len(steps))]
    return [[batches[i] for i in steps[:, r]] for r in range(world_size)]


# --------------------------------------------------------------------------- strategies (global batch lists)


def _sorted(x, rng, spec):
    batches = greedy_batches(np.argsort(x, kind="stable"), x, spec.token_budget, spec.max_batch_size)
    return [batches[i] for i in rng.permutation(len(batches))]


def _random(x, rng, spec):
    return greedy_batches(rng.permutation(x.size), x, spec.token_budget, spec.max_batch_size)


def _bucketed(x, rng, spec):
    edges = np.asarray(spec.edges, dtype=np.int64)
    ids = np.searchsorted(edges, x, side="right") - 1
    by_bucket = np.argsort(ids, kind="stable")
    bounds = np.searchsorted(ids[by_bucket], np.arange(len(edges)))
    batches: list[np.ndarray] = []
    for k in range(len(edges) - 1):
        members = by_bucket[bounds[k]:bounds[k + 1]]
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


def _sortish(x, rng, spec):
    return greedy_batches(sortish_order(x, rng, spec.max_batch_size), x, spec.token_budget, spec.max_batch_size)


def _packed(x, rng, spec):
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
assert tuple(_FUNCS) == STRATEGIES, "every strategy of lenbatch.batching.layouts.STRATEGIES has a planner"


def plan_epoch_all(lengths: Any, *, strategy: str, epoch: int = 0, seed: int = 0, token_budget: int | None = None,
                   max_batch_size: int | None = None, edges: Any = None, world_size: int = 1,
                   packed_window: int = 8, min_batches: int = 0, spec: BatchSpec | None = None) -> list[Plan]:
    """Every rank's batches for one epoch: ``out[r]`` is rank r's list of int64 index arrays, in order.

    The batching values come as keyword arguments or whole as ``spec=`` (a :class:`lenbatch.BatchSpec`).
    ``min_batches`` (default 0: off) splits the costliest batches until the epoch has at least that
    many batches (over all ranks): trainers that fix the steps per epoch from the first epoch
    (transformers' ``Trainer``) need every epoch to have the same count; see
    :func:`equal_epoch_batches`.
    """
    spec = spec_or_keywords(spec, layout=layout_of(strategy), token_budget=token_budget, max_batch_size=max_batch_size,
                            seed=seed, edges=edges, packed_window=packed_window, min_batches=min_batches)
    x = check_plan(lengths, strategy=strategy, spec=spec)
    world_size = check_int("world_size", world_size, minimum=1)
    epoch = check_int("epoch", epoch, minimum=0)
    rng = np.random.default_rng(spec.seed + epoch)
    batches = _FUNCS[strategy](x, rng, spec)
    batches = split_to_multiple(batches, x, world_size, spec.packed, spec.min_batches)
    return [Plan(b, strategy=strategy) for b in assign_ranks(batches, x, world_size, rng, spec.packed)]


def plan_epoch(lengths: Any, *, strategy: str, epoch: int = 0, seed: int = 0, token_budget: int | None = None,
               max_batch_size: int | None = None, edges: Any = None, rank: int | None = None,
               world_size: int | None = None, packed_window: int = 8, min_batches: int = 0,
               spec: BatchSpec | None = None) -> Plan:
    """This rank's batches for one epoch (list of int64 index arrays, in order). See the module doc.

    ``rank``/``world_size`` default to torch.distributed's when it is initialised, else 0/1.
    Cost: O(N log N); under 1 s for 902,087 lengths (benchmarks/bench_core.py).
    """
    rank, world_size = resolve_rank(rank, world_size)
    return plan_epoch_all(lengths, strategy=strategy, epoch=epoch, seed=seed, token_budget=token_budget,
                          max_batch_size=max_batch_size, edges=edges, world_size=world_size,
                          packed_window=packed_window, min_batches=min_batches, spec=spec)[rank]


def equal_epoch_batches(lengths: Any, *, epochs: int, strategy: str, seed: int = 0, token_budget: int | None = None,
                        max_batch_size: int | None = None, edges: Any = None, world_size: int = 1,
                        packed_window: int = 8, spec: BatchSpec | None = None) -> int:
    """The ``min_batches`` that gives epochs 0..epochs-1 the same number of batches: the most any of
    them plans (over all ranks, a multiple of ``world_size``). Strategies other than ``sorted`` plan
    a different count each epoch (greedy packing of a new order). Cost: ``epochs`` plans."""
    epochs = check_int("epochs", epochs, minimum=1)
    spec = spec_or_keywords(spec, layout=layout_of(strategy), token_budget=token_budget, max_batch_size=max_batch_size,
                            seed=seed, edges=edges, packed_window=packed_window)
    return max(sum(len(r) for r in plan_epoch_all(lengths, strategy=strategy, epoch=e, world_size=world_size,
                                                  spec=spec)) for e in range(epochs))
