"""``LengthBatchSampler``: any strategy's epoch plan as a resumable ``torch.utils.data.Sampler``.

It yields this rank's batches (lists of sample indices) of ``plan_epoch`` for the current epoch.
State = (epoch, batches already yielded in this epoch) plus a fingerprint of the lengths and every
plan parameter, and the world size: ``load_state_dict`` then resumes with exactly the batches the
uninterrupted run would still have yielded, and refuses a state from another plan or world size.

Semantics in other people's loops (DESIGN.md "The library in other people's loops"):

* ``load_state_dict(state)`` then ``set_epoch(state["epoch"])`` keeps the restored position (as
  Lhotse's samplers do: every epoch loop calls ``set_epoch`` after restoring); ``set_epoch`` of
  any other epoch starts that epoch fresh.
* ``rank``/``world_size`` default to torch.distributed's; ``WORLD_SIZE`` > 1 without an initialised
  process group is refused (as ``DistributedSampler`` does) unless both are passed.
* A DataLoader with ``num_workers`` > 0 draws batches ahead of the training loop, so the plain
  ``state_dict()`` counts batches *handed to the loader*, not *trained on*. Either iterate
  ``sampler.consumed(loader)`` (the state then counts the batches the loop received), pass
  ``state_dict(batches_consumed=n)``, or use torchdata's ``StatefulDataLoader``, whose
  ``state_dict()`` snapshots this sampler's state as of each batch it yields (exact with workers).
* ``min_batches`` (default off) pads every epoch to at least that many batches by splitting the
  costliest ones, for trainers that fix the steps per epoch (``lenbatch.loading.trainer`` sets it).
* accelerate: ``accelerator.prepare(loader)`` wraps the batch sampler in ``BatchSamplerShard``, which
  keeps every ``num_processes``-th batch for its process. The sampler notices that it is being iterated
  (or measured) by that wrapper and then yields, per step, ``world_size`` slots with this rank's batch in
  slot ``rank`` (the others empty and never loaded), and reports ``len`` = ``world_size`` x its batches,
  so the wrapper hands each process exactly its own batches. A wrapper whose ``num_processes`` /
  ``process_index`` differ from the sampler's ``world_size``/``rank``, or ``split_batches=True``, is refused.
* ``sampler.sampler.set_epoch(e)`` is ``sampler.set_epoch(e)``: Lightning and accelerate call
  ``set_epoch`` on ``loader.batch_sampler.sampler``, never on the batch sampler itself.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import torch.utils.data

from lenbatch.batching.layouts import layout_of
from lenbatch.batching.spec import BatchSpec, check_int, spec_or_keywords
from lenbatch.batching.schedule import STATE_VERSION, sampler_state  # noqa: F401 (STATE_VERSION: public)
from lenbatch.batching.strategies import Plan, check_plan, plan_epoch, resolve_rank

log = logging.getLogger("lenbatch.sampler")


class _EpochForward:
    """``LengthBatchSampler.sampler``: Lightning's fit loop and accelerate's ``DataLoaderShard`` call
    ``set_epoch`` on ``loader.batch_sampler.sampler`` (the element sampler of torch's ``BatchSampler``),
    never on a custom batch sampler; forwarding it here makes their natural loops plan every epoch.
    Deliberately nothing else (no ``generator``, no ``__iter__``), so nobody mistakes it for a sampler to
    replace or re-seed."""

    __slots__ = ("_owner",)

    def __init__(self, owner: "LengthBatchSampler") -> None:
        self._owner = owner

    def set_epoch(self, epoch: int) -> None:
        self._owner.set_epoch(epoch)

    def __reduce__(self):
        return (_EpochForward, (self._owner,))


def _accelerate_shard(depth: int) -> Any:
    """The accelerate ``BatchSamplerShard`` whose method is the frame ``depth`` levels up, else None.

    Why a frame: ``accelerator.prepare(loader)`` builds ``BatchSamplerShard(our_sampler)`` without telling
    the sampler, and it is the only code that iterates or measures it that way. Cost: one frame lookup
    per ``__iter__``/``__len__`` call; nothing when accelerate is not imported."""
    mod = sys.modules.get("accelerate.data_loader")
    if mod is None:
        return None
    shard_type = getattr(mod, "BatchSamplerShard", None)
    try:
        frame = sys._getframe(depth + 1)
    except ValueError:
        return None
    caller = frame.f_locals.get("self")
    return caller if shard_type is not None and isinstance(caller, shard_type) else None


class LengthBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Yield this rank's batches of one epoch; ``set_epoch`` before each epoch (like DistributedSampler)."""

    def __init__(self, lengths: Any, *, strategy: str, token_budget: int | None = None,
                 max_batch_size: int | None = None, seed: int = 0, edges: Any = None, rank: int | None = None,
                 world_size: int | None = None, packed_window: int = 8, min_batches: int = 0,
                 spec: BatchSpec | None = None) -> None:
        super().__init__()
        spec = spec_or_keywords(spec, layout=layout_of(strategy), token_budget=token_budget,
                                max_batch_size=max_batch_size, seed=seed, edges=edges, packed_window=packed_window,
                                min_batches=min_batches)
        x = check_plan(lengths, strategy=strategy, spec=spec)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.lengths = x
        self.strategy = strategy
        self.spec = spec
        self.epoch = 0
        self._position = 0  # batches yielded in the current epoch
        self._resume: int | None = None
        self._consumed: int | None = None  # batches the loop received, while iterating consumed()
        self._cache: tuple[int, Plan] | None = None
        self.fingerprint = spec.fingerprint(x, strategy)
        self.sampler = _EpochForward(self)

    # the batching values, read from the spec (kept as attributes: callers read them)
    token_budget = property(lambda self: self.spec.token_budget)
    max_batch_size = property(lambda self: self.spec.max_batch_size)
    seed = property(lambda self: self.spec.seed)
    edges = property(lambda self: self.spec.edges)
    packed_window = property(lambda self: self.spec.packed_window)
    min_batches = property(lambda self: self.spec.min_batches)

    def plan(self, epoch: int | None = None) -> Plan:
        """This rank's batches of ``epoch`` (default: the current one); cached for the current epoch."""
        epoch = self.epoch if epoch is None else epoch
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        # only this rank's batches are kept (compact: one int64 index array + offsets)
        batches = plan_epoch(self.lengths, strategy=self.strategy, epoch=epoch, rank=self.rank,
                             world_size=self.world_size, spec=self.spec)
        if epoch == self.epoch:
            self._cache = (epoch, batches)
        return batches

    def set_epoch(self, epoch: int) -> None:
        """Plan ``epoch`` next. After ``load_state_dict`` of the same epoch the restored position is
        kept until the next iteration starts (the loop that restores calls ``set_epoch(saved_epoch)``
        before iterating); any other epoch starts from the epoch's first batch."""
        epoch = check_int("epoch", epoch, minimum=0)
        if self._resume is not None and epoch == self.epoch:
            return  # a restored position not yet iterated: keep it
        if self._resume:
            # e.g. accelerate's loader calls set_epoch(its own counter), 0 in a new process, on iteration
            log.warning("set_epoch(%d) discards the restored position (epoch %d, %d batches done); call "
                        "set_epoch(%d) (or loader.set_epoch(%d)) before iterating to resume", epoch, self.epoch,
                        self._resume, self.epoch, self.epoch)
        self.epoch = epoch
        self._position = 0
        self._resume = None

    def __len__(self) -> int:
        shard = _accelerate_shard(1)
        n = len(self.plan())
        return n * self._check_shard(shard) if shard is not None else n

    def _check_shard(self, shard: Any) -> int:
        """Slots per step under accelerate's ``BatchSamplerShard`` (= world_size), or ``ValueError``."""
        if getattr(shard, "split_batches", False):
            raise ValueError("accelerate's split_batches=True splits every batch across processes, which breaks "
                             "the plan's batches; use DataLoaderConfiguration(split_batches=False) (the default)")
        procs, index = int(shard.num_processes), int(shard.process_index)
        if (procs, index) != (self.world_size, self.rank):
            raise ValueError(f"accelerate shards the loader over {procs} processes (this one is {index}) but the "
                             f"sampler plans for world_size={self.world_size}, rank={self.rank}; build the sampler "
                             "after Accelerator() without rank=/world_size= (or pass accelerator.num_processes and "
                             "accelerator.process_index)")
        return procs

    def __iter__(self) -> Iterator[list[int]]:
        # generator body: frame 1 is whoever calls next() on it (accelerate's BatchSamplerShard if wrapped)
        shard = _accelerate_shard(1)
        batches = self.plan()
        slots = self._check_shard(shard) if shard is not None else 1
        start = self._resume if self._resume is not None else 0
        self._resume = None
        self._position = start
        for i in range(start, len(batches)):
            for slot in range(slots):
                if slot == self.rank % slots:
                    self._position = i + 1
                    yield batches[i].tolist()
                else:
                    # another process's slot: the shard of this process drops it unloaded
                    yield []

    def consumed(self, loader: Iterable[Any]) -> Iterator[Any]:
        """Iterate ``loader`` (a DataLoader over this sampler) counting the batches the loop received.

        While it runs, ``state_dict()`` records that count instead of the batches the sampler handed
        to the loader, which a prefetching DataLoader (``num_workers`` > 0) runs ahead of::

            for batch in sampler.consumed(loader):
                ...train...
                ckpt["sampler"] = sampler.state_dict()   # resumes at the first batch not trained on
        """
        self._consumed = self._resume if self._resume is not None else 0
        try:
            for batch in loader:
                self._consumed += 1
                yield batch
        finally:
            self._consumed = None

    def state_dict(self, batches_consumed: int | None = None) -> dict[str, Any]:
        """Resumable state: epoch and position (batches of this epoch done), plus what identifies the plan.

        The position is ``batches_consumed`` if given, else the count of :meth:`consumed` while it
        runs, else the batches this sampler has yielded.
        """
        if batches_consumed is not None:
            pos = check_int("batches_consumed", batches_consumed, minimum=0)
        else:
            pos = self._position if self._consumed is None else self._consumed
        return sampler_state(epoch=self.epoch, position=pos, world_size=self.world_size, rank=self.rank,
                             fingerprint=self.fingerprint, strategy=self.strategy)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = [k for k in ("version", "epoch", "position", "world_size", "fingerprint") if k not in state]
        if missing:
            raise ValueError(f"sampler state lacks {missing}; pass a dict from LengthBatchSampler.state_dict()")
        if state["fingerprint"] != self.fingerprint:
            raise ValueError("sampler state is from another plan (lengths or batching params differ: strategy, "
                             "token_budget, max_batch_size, seed, edges, packed_window); build the sampler with "
                             "the same lengths and params as the run that saved it, or start a fresh run")
        if int(state["world_size"]) != self.world_size:
            raise ValueError(f"sampler state was saved with world_size={state['world_size']} but this run has "
                             f"world_size={self.world_size}; resume with the same number of ranks, or restart "
                             "the epoch with set_epoch()")
        self.epoch = int(state["epoch"])
        n = len(self.plan())
        pos = int(state["position"])
        if not 0 <= pos <= n:
            raise ValueError(f"sampler state position {pos} is outside 0..{n} batches of epoch {self.epoch}; "
                             "the state is corrupt")
        self._position = pos
        self._resume = pos
