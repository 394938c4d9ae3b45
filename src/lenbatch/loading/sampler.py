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
* A DataLoader with ``num_workers`` > 0 draws batches ahead of the training loop. ``state_dict()``
  reports the batches this sampler has handed out, which is exact when the loop receives each batch as it
  is drawn (``num_workers=0``) and under torchdata's ``StatefulDataLoader`` (whose ``state_dict()``
  snapshots this sampler's state as of each batch it yields), but runs ahead of the loop behind a plain
  prefetching ``DataLoader``. The sampler cannot see its loader (torch does not tell a batch sampler who
  iterates it), so the exact routes are explicit: build the loader with ``sampler.dataloader(dataset, ...)``
  (a ``DataLoader`` that counts the batches it returns to the loop), iterate ``sampler.consumed(loader)``,
  or pass ``state_dict(batches_consumed=n)``.
* A second pass over the same epoch without ``set_epoch`` repeats its batches (every epoch would be
  epoch 0); it warns once, naming ``set_epoch``.
* ``min_batches`` (default off) pads every epoch to at least that many batches by splitting the
  costliest ones, for trainers that fix the steps per epoch (``lenbatch.hf`` sets it).
* accelerate: ``accelerator.prepare(loader)`` wraps the batch sampler in ``BatchSamplerShard``, which
  keeps every ``num_processes``-th batch for its process. Built with ``accelerator=accelerator`` (its public
  ``num_processes``, ``process_index`` and data loader settings) the sampler yields, per step, ``world_size``
  slots with this rank's batch in slot ``rank`` (the others empty and never loaded), and reports ``len`` =
  ``world_size`` x its batches, so the wrapper hands each process exactly its own batches. ``split_batches=True``,
  ``dispatch_batches=True`` over several processes, or a ``rank``/``world_size`` other than the accelerator's,
  are refused. Without ``accelerator=`` while an accelerate state runs over this many processes, the first
  iteration warns (``UserWarning``) that a prepared loader would drop batches.
* ``sampler.sampler.set_epoch(e)`` is ``sampler.set_epoch(e)``: Lightning and accelerate call
  ``set_epoch`` on ``loader.batch_sampler.sampler``, never on the batch sampler itself.
* ``epochs=N`` gives epochs 0..N-1 the same number of batches (``min_batches`` = the most any of them
  plans, by splitting the costliest batches of the others), for loops that fix an epoch's length once.
  Lightning does (it reads ``len(loader)`` at setup and stops every epoch there, dropping the rest): build the
  sampler in ``train_dataloader()`` with ``lightning_trainer=self.trainer``, which equalises epochs
  0..``trainer.max_epochs``-1 (refused when ``max_epochs`` is unbounded and ``epochs=`` not given) and refuses
  Lightning resuming mid-epoch through a loader that cannot restore the sampler (a plain ``DataLoader``): use
  torchdata's ``StatefulDataLoader``, whose state Lightning saves and restores. ``len(sampler)`` never changes
  the sampler: the counts are fixed when it is built.
* ``overflow`` (samples longer than ``token_budget``): ``"error"`` (default) refuses them;
  ``"truncate"`` cuts them to the budget; ``"split"`` cuts them into budget-sized pieces, each planned
  as a sample of its own. The plan is then over pieces (:mod:`lenbatch.batching.overflow`): a batch
  holds the row index (``int``) of a whole sample and ``(row, start, end)`` for a piece, which
  ``sampler.view(dataset)`` serves (per-token fields cut, positions restarting). The counts are in
  ``sampler.overflow_counts`` and logged once at WARNING when any sample is over the budget.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch.utils.data

from lenbatch.batching.strategy import Strategy
from lenbatch.batching.cost import cost_fingerprint, cost_limit
from lenbatch.batching.overflow import Pieces, overflow_pieces
from lenbatch.batching.spec import BatchSpec, check_int, spec_or_keywords
from lenbatch.batching.state import STATE_VERSION, sampler_state  # noqa: F401 (STATE_VERSION: public)
from lenbatch.batching.strategies import (
    Plan,
    equal_epoch_batches,
    named_strategy,
    plan_epoch,
    planning_lengths,
    resolve_rank,
)

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
        trainer = self._owner._lightning
        if trainer is not None and self._owner._resume is None and _lightning_restarts_mid_epoch(trainer):
            raise ValueError(
                "Lightning resumes this run in the middle of epoch "
                f"{epoch}, but the DataLoader cannot restore the sampler's position (a plain "
                "torch DataLoader has no state_dict), so the epoch would restart and skip or repeat "
                "samples; build the loader as torchdata.stateful_dataloader.StatefulDataLoader("
                "dataset, batch_sampler=sampler, ...), whose state Lightning checkpoints"
            )
        self._owner.set_epoch(epoch)

    def __reduce__(self):
        return (_EpochForward, (self._owner,))


def _lightning_restarts_mid_epoch(trainer: Any) -> bool:
    """Whether the Lightning ``trainer`` handed to the sampler is training and restarting its fit loop in the
    middle of an epoch (its public ``training`` and ``fit_loop.restarted_mid_epoch``). A validation loader's
    sampler, whose epoch Lightning sets while validating, has no position to lose."""
    loop = getattr(trainer, "fit_loop", None)
    return bool(getattr(trainer, "training", True)) and bool(getattr(loop, "restarted_mid_epoch", False))


def _lightning_epochs(trainer: Any) -> int:
    """``trainer.max_epochs``, or ``ValueError`` when it leaves the number of epochs open."""
    max_epochs = getattr(trainer, "max_epochs", None)
    if isinstance(max_epochs, bool) or not isinstance(max_epochs, int) or max_epochs < 1:
        raise ValueError(
            f"Lightning reads len(loader) once and stops every epoch there, but max_epochs="
            f"{max_epochs} leaves the number of epochs open, and lenbatch plans a different number "
            "of batches each epoch; pass LengthBatchSampler(..., epochs=N) (every epoch 0..N-1 then "
            "has the same number of batches) or Trainer(max_epochs=N)"
        )
    return max_epochs


def _accelerate_ranks(accelerator: Any, rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world size) from accelerate's ``accelerator`` (its public ``num_processes``, ``process_index``
    and ``dataloader_config``), or ``ValueError`` for settings that break the plan's per-rank batches."""
    procs, index = int(accelerator.num_processes), int(accelerator.process_index)
    cfg = getattr(accelerator, "dataloader_config", None)
    source = cfg if cfg is not None else accelerator
    if getattr(source, "split_batches", False):
        raise ValueError(
            "accelerate's split_batches=True splits every batch across processes, which breaks "
            "the plan's batches; use DataLoaderConfiguration(split_batches=False) (the default)"
        )
    if getattr(source, "dispatch_batches", None) and procs > 1:
        raise ValueError(
            f"accelerate's dispatch_batches=True makes process 0 draw every batch and split "
            f"{procs} of them concatenated across the processes, which breaks the plan's "
            "per-rank batches; use DataLoaderConfiguration(dispatch_batches=False) (the "
            "default for map-style datasets)"
        )
    if (rank is not None and int(rank) != index) or (world_size is not None and int(world_size) != procs):
        raise ValueError(
            f"accelerate shards the loader over {procs} processes (this one is {index}) but the "
            f"sampler was given world_size={world_size}, rank={rank}; pass accelerator= alone (the "
            "sampler then takes accelerator.num_processes and accelerator.process_index)"
        )
    return index, procs


def _accelerate_processes() -> int:
    """The processes of a running accelerate state (``accelerate.state.is_initialized``, ``PartialState``:
    public), 0 when there is none or accelerate is not imported."""
    mod = sys.modules.get("accelerate.state")
    is_init = getattr(mod, "is_initialized", None) if mod is not None else None
    if is_init is None or not is_init():
        return 0
    return int(getattr(mod.PartialState(), "num_processes", 0))


class LengthBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Yield this rank's batches of one epoch; ``set_epoch`` before each epoch (like DistributedSampler)."""

    def __init__(
        self,
        lengths: Any,
        *,
        strategy: "str | Strategy",
        token_budget: int | None = None,
        max_batch_size: int | None = None,
        seed: int = 0,
        edges: Any = None,
        rank: int | None = None,
        world_size: int | None = None,
        packed_window: int = 8,
        min_batches: int = 0,
        epochs: int | None = None,
        overflow: str = "error",
        spec: BatchSpec | None = None,
        cost: Any = None,
        cost_budget: float | None = None,
        accelerator: Any = None,
        lightning_trainer: Any = None,
    ) -> None:
        super().__init__()
        plan_strategy = named_strategy(strategy, edges)  # a name with edges= beside it, or a Strategy
        spec = spec_or_keywords(
            spec,
            token_budget=token_budget,
            max_batch_size=max_batch_size,
            seed=seed,
            packed_window=packed_window,
            min_batches=min_batches,
        )
        # the plan is over pieces; with "error" (and nothing over budget) they are the samples themselves
        self.pieces: Pieces = overflow_pieces(lengths, token_budget=spec.token_budget, overflow=overflow)
        self.overflow = overflow
        if self.pieces.samples_over_budget:
            log.warning("%s", self.pieces.report())
        # checked, and kept in the smallest integer type (uint16 below 65,536 tokens): 2 bytes a sample
        x = planning_lengths(self.pieces.lengths, strategy=plan_strategy, spec=spec)
        if accelerator is not None:
            rank, world_size = _accelerate_ranks(accelerator, rank, world_size)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        # accelerate's BatchSamplerShard keeps every world_size-th batch: this rank's batch in its slot
        self._slots = self.world_size if accelerator is not None else 1
        self._accelerate: bool | None = True if accelerator is not None else None  # None: not said (warns)
        self._lightning = lightning_trainer
        self.lengths = x
        self.plan_strategy: Strategy = plan_strategy
        self.strategy: str = plan_strategy.name  # the name (states and logs carry it)
        self.spec = spec
        self.epoch = 0
        self._position = 0  # batches yielded in the current epoch
        self._resume: int | None = None
        self._consumed: int | None = None  # batches the loop received, while iterating consumed()
        self._cache: tuple[int, Plan] | None = None
        self._viewed = False  # view() was asked for: the loader can serve pieces
        self._iterated_epoch: int | None = None  # the epoch a pass has started over, since set_epoch
        self._warned: set[str] = set()
        # cost=/cost_budget=: passed to plan_epoch (lenbatch.batching.cost); checked here, once
        cost_limit(
            x, token_budget=spec.token_budget, max_batch_size=spec.max_batch_size, cost=cost, cost_budget=cost_budget
        )
        self.cost, self.cost_budget = cost, cost_budget
        self.fingerprint = cost_fingerprint(spec.fingerprint(x, plan_strategy), cost, cost_budget)
        self.sampler = _EpochForward(self)
        self.epochs: int | None = None
        if epochs is None and lightning_trainer is not None:
            epochs = _lightning_epochs(lightning_trainer)
            before = len(self.plan(0))
            n = self.equalize_epochs(epochs)
            log.info(
                "Lightning: epochs 0..%d planned to %d batches each on this rank (epoch 0 had %d; "
                "min_batches=%d) so that Lightning's fixed epoch length runs every batch",
                epochs - 1,
                n,
                before,
                self.spec.min_batches,
            )
        elif epochs is not None:
            self.equalize_epochs(epochs)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_lightning"] = None  # the trainer stays with the process that trains
        return state

    @property
    def overflow_counts(self) -> dict[str, int]:
        """``samples_over_budget``, ``tokens_dropped`` (truncate), ``pieces_added`` (split)."""
        return self.pieces.counts()

    def view(self, dataset: Any) -> Any:
        """``dataset`` as the loader must see it: itself when every batch holds whole samples, else a
        :class:`lenbatch.loading.overflow.PieceDataset` serving the ``(row, start, end)`` pieces."""
        if not self.pieces.samples_over_budget:
            return dataset
        from lenbatch.loading.overflow import PieceDataset

        self._viewed = True
        return PieceDataset(dataset, self.pieces)

    def equalize_epochs(self, epochs: int) -> int:
        """Give epochs 0..``epochs``-1 the same number of batches: ``min_batches`` becomes the most any of
        them plans (over all ranks), the others split their costliest batches up to it (no sample dropped
        or repeated). Returns this rank's batches per epoch. Only before the first batch is drawn (the
        plans change). Cost: ``epochs`` full plans, once."""
        epochs = check_int("epochs", epochs, minimum=1)
        if self._position or self._resume:
            raise ValueError(
                "epochs= changes every epoch's plan, so it must be set before the first batch is "
                "drawn or a state restored; build the sampler with epochs="
            )
        most = equal_epoch_batches(
            self.lengths,
            epochs=epochs,
            strategy=self.plan_strategy,
            world_size=self.world_size,
            spec=dataclasses.replace(self.spec, min_batches=0),
            cost=self.cost,
            cost_budget=self.cost_budget,
        )
        self.spec = dataclasses.replace(self.spec, min_batches=max(self.spec.min_batches, most))
        self.fingerprint = cost_fingerprint(
            self.spec.fingerprint(self.lengths, self.plan_strategy), self.cost, self.cost_budget
        )
        self.epochs = epochs
        self._cache = None
        return len(self.plan())

    # the batching values, read from the spec and the strategy (kept as attributes: callers read them)
    token_budget = property(lambda self: self.spec.token_budget)
    max_batch_size = property(lambda self: self.spec.max_batch_size)
    seed = property(lambda self: self.spec.seed)
    edges = property(lambda self: self.plan_strategy.edges)
    layout = property(lambda self: self.plan_strategy.layout)
    packed_window = property(lambda self: self.spec.packed_window)
    min_batches = property(lambda self: self.spec.min_batches)

    def plan(self, epoch: int | None = None) -> Plan:
        """This rank's batches of ``epoch`` (default: the current one); cached for the current epoch."""
        epoch = self.epoch if epoch is None else epoch
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        # only this rank's batches are kept (compact: one int64 index array + offsets)
        batches = plan_epoch(
            self.lengths,
            strategy=self.plan_strategy,
            epoch=epoch,
            rank=self.rank,
            world_size=self.world_size,
            spec=self.spec,
            cost=self.cost,
            cost_budget=self.cost_budget,
        )
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
            log.warning(
                "set_epoch(%d) discards the restored position (epoch %d, %d batches done); call "
                "set_epoch(%d) (or loader.set_epoch(%d)) before iterating to resume",
                epoch,
                self.epoch,
                self._resume,
                self.epoch,
                self.epoch,
            )
        self.epoch = epoch
        self._position = 0
        self._resume = None
        self._iterated_epoch = None

    def __len__(self) -> int:
        """This rank's batches of the current epoch (x ``world_size`` slots under ``accelerator=``). No side
        effect: the batch counts are fixed when the sampler is built (``epochs=``, ``lightning_trainer=``)."""
        return len(self.plan()) * self._slots

    def __iter__(self) -> Iterator[list[int]]:
        if self._accelerate is None and self.world_size > 1 and _accelerate_processes() == self.world_size:
            self._warn_accelerate()
        batches = self.plan()
        slots = self._slots
        if not self._viewed and not bool(self.pieces.whole.all()):
            raise ValueError(
                f"overflow={self.overflow!r} cut {self.pieces.samples_over_budget} samples longer than "
                f"token_budget={self.token_budget} into (row, start, end) pieces, which only the view "
                "serves; build the loader over sampler.view(dataset): DataLoader(sampler.view(dataset), "
                "batch_sampler=sampler, ...)"
            )
        start = self._resume if self._resume is not None else 0
        if self._resume is None and self._iterated_epoch == self.epoch:
            self._warn_once(
                "set_epoch",
                f"a second pass over epoch {self.epoch} without set_epoch repeats its "
                "batches (every epoch would train epoch 0's plan); call sampler.set_epoch(epoch) (or "
                "loader.set_epoch) before each epoch",
            )
        self._iterated_epoch = self.epoch
        self._resume = None
        self._position = start
        for i in range(start, len(batches)):
            for slot in range(slots):
                if slot == self.rank % slots:
                    self._position = i + 1
                    yield self.pieces.items(batches[i])
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

        The position is ``batches_consumed`` if given, else the count of :meth:`consumed` (or of a loader
        from :meth:`dataloader`) while it runs, else the batches this sampler has handed out: exact with
        ``num_workers=0`` and under torchdata's ``StatefulDataLoader`` (it snapshots this state as each batch
        is drawn), ahead of the loop behind a plain prefetching ``DataLoader`` (see the module docstring).
        Cost: O(1).
        """
        if batches_consumed is not None:
            pos = check_int("batches_consumed", batches_consumed, minimum=0)
        elif self._consumed is not None:
            pos = self._consumed
        else:
            pos = self._position
        return sampler_state(
            epoch=self.epoch,
            position=pos,
            world_size=self.world_size,
            rank=self.rank,
            fingerprint=self.fingerprint,
            strategy=self.strategy,
        )

    def dataloader(self, dataset: Any, **kwargs: Any) -> "SamplerDataLoader":
        """``torch.utils.data.DataLoader(self.view(dataset), batch_sampler=self, **kwargs)`` that counts the
        batches it returns to the loop (as :meth:`consumed` does), so a plain ``state_dict()`` resumes at the
        first batch not trained on however many ``num_workers`` prefetch; ``loader.set_epoch(e)`` is
        ``self.set_epoch(e)``. ``ValueError`` for ``batch_sampler=``, ``batch_size=``, ``sampler=``,
        ``shuffle=`` or ``drop_last=`` in ``kwargs`` (this sampler decides the batches)."""
        taken = sorted(k for k in ("batch_sampler", "batch_size", "sampler", "shuffle", "drop_last") if k in kwargs)
        if taken:
            raise ValueError(
                f"sampler.dataloader() passes batch_sampler=sampler itself, so {taken} cannot be "
                "given; drop them (the sampler's plan decides the batches)"
            )
        return SamplerDataLoader(self.view(dataset), batch_sampler=self, **kwargs)

    def _warn_accelerate(self) -> None:
        if "accelerate" in self._warned:
            return
        self._warned.add("accelerate")
        warnings.warn(
            f"an accelerate state runs over {self.world_size} processes but this LengthBatchSampler was "
            "built without accelerator=: if accelerator.prepare(loader) wraps it, each process keeps only "
            f"every {self.world_size}-th of its own batches; build it with "
            "LengthBatchSampler(..., accelerator=accelerator)",
            UserWarning,
            stacklevel=3,
        )

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", message)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict):
            raise ValueError(
                f"sampler state must be a dict from LengthBatchSampler.state_dict(), got {type(state).__name__}"
            )
        missing = [k for k in ("version", "epoch", "position", "world_size", "fingerprint") if k not in state]
        if missing:
            raise ValueError(f"sampler state lacks {missing}; pass a dict from LengthBatchSampler.state_dict()")
        version = state["version"]
        if (
            isinstance(version, (bool, np.bool_))
            or not isinstance(version, (int, np.integer))
            or version != STATE_VERSION
        ):
            raise ValueError(
                f"sampler state has version {state['version']!r}, but this lenbatch reads version "
                f"{STATE_VERSION}; resume with the lenbatch that saved it, or start a fresh run"
            )
        for key in ("epoch", "position", "world_size"):
            value = state[key]
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                raise ValueError(
                    f"sampler state {key} must be an int, got {value!r} ({type(value).__name__}); "
                    "the state is corrupt: pass a dict from LengthBatchSampler.state_dict()"
                )
            if value < (1 if key == "world_size" else 0):
                raise ValueError(
                    f"sampler state {key} is {value}; the state is corrupt: pass a dict from "
                    "LengthBatchSampler.state_dict()"
                )
        if state["fingerprint"] != self.fingerprint:
            raise ValueError(
                "sampler state is from another plan (lengths or batching params differ: strategy, "
                "token_budget, max_batch_size, seed, edges, packed_window, min_batches or epochs, "
                "overflow); build the sampler with the same lengths and params as the run that saved "
                "it, or start a fresh run"
            )
        if int(state["world_size"]) != self.world_size:
            raise ValueError(
                f"sampler state was saved with world_size={state['world_size']} but this run has "
                f"world_size={self.world_size}; resume with the same number of ranks, or restart "
                "the epoch with set_epoch()"
            )
        self.epoch = int(state["epoch"])
        n = len(self.plan())
        pos = int(state["position"])
        if not 0 <= pos <= n:
            raise ValueError(
                f"sampler state position {pos} is outside 0..{n} batches of epoch {self.epoch}; the state is corrupt"
            )
        self._position = pos
        self._resume = pos
        self._iterated_epoch = None


class SamplerDataLoader(torch.utils.data.DataLoader):
    """A ``DataLoader`` over a :class:`LengthBatchSampler` (``batch_sampler=``) that counts the batches it
    returns to the loop, through :meth:`LengthBatchSampler.consumed`, so the sampler's plain ``state_dict()``
    is the loop's position even while ``num_workers`` prefetch ahead; ``set_epoch`` is forwarded to the
    sampler. Build it with :meth:`LengthBatchSampler.dataloader`. Cost: O(1) a batch."""

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        sampler = self.batch_sampler
        if not isinstance(sampler, LengthBatchSampler):
            return super().__iter__()
        # consumed() reads the restored position before the loader's iterator starts the sampler
        return sampler.consumed(_LoaderIteration(self))


class _LoaderIteration:
    """``loader`` iterated as a plain ``DataLoader`` (what :class:`SamplerDataLoader` counts)."""

    __slots__ = ("loader",)

    def __init__(self, loader: torch.utils.data.DataLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Any]:
        return torch.utils.data.DataLoader.__iter__(self.loader)
