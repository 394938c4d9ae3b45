"""``StreamingBatcher``: batches of a stream (an iterable of samples, read once per pass) with a bounded
buffer, for data that does not fit in memory or whose lengths are not known up front.

The batches are :class:`lenbatch.batching.stream.StreamPlanner`'s (its module doc has the rules): a
shuffle buffer of ``buffer_size`` samples, then the strategy's own rule (random, bucketed, sortish,
packed) along its output. Every rank reads the whole stream and keeps every ``world_size``-th batch of
the one sequence all ranks compute, so the ranks agree without talking; the last batches are split
(never dropped or repeated) so that every rank gets the same number.

Guarantees, per pass (one ``for batch in batcher``): every sample of the stream in exactly one batch of
one rank; the same number of batches on every rank; no batch over ``token_budget`` (padded: n·longest;
packed: the row's tokens) or ``max_batch_size``; the batches a function of (the stream, the settings,
seed, epoch, world_size) alone; ``state_dict()`` mid-pass resumes with exactly the batches still to come.

What it needs from the stream: the same samples in the same order on every pass of an epoch (an iterable
with ``set_epoch`` gets the batcher's epoch first, so it may reorder per epoch). It has no length (a
stream's batches are known only once it is read): ``len(batcher)`` raises ``TypeError``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch.utils.data

from lenbatch.batching.cost import Cost
from lenbatch.batching.spec import BatchSpec, check_int, spec_or_keywords
from lenbatch.batching.strategies import resolve_rank
from lenbatch.batching.strategy import Strategy
from lenbatch.batching.stream import StreamPlanner, stream_strategy

STATE_VERSION = 1


def default_length(sample: Any) -> int:
    """``len(sample["input_ids"])`` for a mapping, else ``len(sample)``."""
    return len(sample["input_ids"]) if isinstance(sample, Mapping) else len(sample)


class StreamingBatcher(torch.utils.data.IterableDataset):
    """Yield this rank's batches (lists of samples) of one pass over ``iterable``; see the module doc.

    ``length(sample)`` gives a sample's tokens (default: ``len(sample["input_ids"])``). ``buffer_size``:
    samples held by the shuffle buffer (the strategy's open batches and the held-back batches come on
    top: :attr:`peak_held` reports the most held at once in the last pass). ``edges`` for ``bucketed``
    (default: optimal edges of the first buffer's lengths, ``num_buckets`` of them). ``cost`` (a
    :class:`lenbatch.Cost`) and ``cost_budget``: every batch within the cost budget too, each step's
    batches balanced by cost (:mod:`lenbatch.batching.stream`). A sample longer than
    ``token_budget`` raises ``ValueError`` when it is read. Use it in the training process itself or in a
    DataLoader with at most one worker (``DataLoader(batcher, batch_size=None, collate_fn=...)``): more
    workers would each read the whole stream.

    Resume: :meth:`state_dict` stores (epoch, this rank's batches handed out, a hash of the lengths read
    until then); the next pass after :meth:`load_state_dict` **re-reads the stream from its start** and
    re-plans (nothing is yielded until the saved point; samples already handed out are dropped as they
    are released), so resuming costs one read of the stream up to the saved point, in time; memory stays
    bounded as in a pass. A stream that reads differently than when the state was saved is refused.
    """

    def __init__(
        self,
        iterable: Iterable[Any],
        *,
        length: Callable[[Any], int] | None = None,
        strategy: "str | Strategy",
        token_budget: int | None = None,
        max_batch_size: int | None = None,
        buffer_size: int = 4096,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        edges: Any = None,
        packed_window: int = 8,
        num_buckets: int = 6,
        spec: BatchSpec | None = None,
        cost: Cost | None = None,
        cost_budget: float | None = None,
    ) -> None:
        super().__init__()
        name, edges = stream_strategy(strategy, edges)
        spec = spec_or_keywords(
            spec, token_budget=token_budget, max_batch_size=max_batch_size, seed=seed, packed_window=packed_window
        )
        if not isinstance(iterable, Iterable):
            raise ValueError(
                f"iterable must be an iterable of samples (re-iterable: one pass per epoch), got "
                f"{type(iterable).__name__}"
            )
        if length is not None and not callable(length):
            raise ValueError("length must be a function sample -> tokens (e.g. lambda s: len(s['input_ids']))")
        self.iterable = iterable
        self.length = default_length if length is None else length
        self.strategy = name
        self.edges = edges  # bucketed's; None: estimated from the first buffer of each pass
        self.spec = spec
        self.buffer_size = check_int("buffer_size", buffer_size, minimum=1)
        self.num_buckets = check_int("num_buckets", num_buckets, minimum=1)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.cost, self.cost_budget = cost, cost_budget
        self._planner()  # checks the settings now (cost included), not at the first batch
        self.epoch = 0
        self.peak_held = 0
        self._yielded = 0  # this rank's batches handed out in the current pass
        self._mark: tuple[int, int] = (0, 0)  # (samples read, length hash) when the last batch was handed out
        self._resume: dict[str, int] | None = None

    def __len__(self) -> int:
        raise TypeError(
            "a StreamingBatcher has no length: its batches are known only once the stream is read "
            "(plan in memory with lenbatch.LengthBatchSampler when the lengths are known up front)"
        )

    def set_epoch(self, epoch: int) -> None:
        """Plan ``epoch`` next (a new shuffle: seed + epoch); forwarded to the iterable when it has
        ``set_epoch``. After :meth:`load_state_dict` of the same epoch the restored position is kept."""
        epoch = check_int("epoch", epoch, minimum=0)
        if self._resume is not None and epoch == self.epoch:
            return
        self.epoch = epoch
        self._resume = None
        self._yielded = 0

    def _planner(self) -> StreamPlanner:
        return StreamPlanner(
            strategy=self.strategy,
            spec=self.spec,
            buffer_size=self.buffer_size,
            edges=self.edges,
            epoch=getattr(self, "epoch", 0),
            world_size=self.world_size,
            num_buckets=self.num_buckets,
            cost=self.cost,
            cost_budget=self.cost_budget,
        )

    def __iter__(self) -> Iterator[list[Any]]:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 1:
            raise ValueError(
                f"a StreamingBatcher in a DataLoader with num_workers={info.num_workers}: every "
                "worker would read the whole stream and yield every batch; use num_workers=0 or 1"
            )
        set_epoch = getattr(self.iterable, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(self.epoch)
        resume = self._resume
        self._resume = None
        skip = resume["batches"] if resume else 0
        self._yielded = 0
        planner = self._planner()
        held: dict[int, Any] = {}
        rank, length, push = self.rank, self.length, planner.push
        try:
            stream = iter(self.iterable)
            done = False
            while not done:
                sample = next(stream, _END)
                if sample is _END:
                    planner.finish()
                    done = True
                else:
                    held[planner.read] = sample
                    push(length(sample))
                for step in planner.take_steps():
                    for r, batch in enumerate(step):
                        samples = [held.pop(p) for p in batch]
                        if r != rank:
                            continue
                        if self._yielded < skip:
                            self._yielded += 1
                            if self._yielded == skip:
                                self._check_resume(resume, planner)
                            continue
                        self._yielded += 1
                        self._mark = (planner.read, planner.hash)
                        yield samples
            if self._yielded < skip:
                raise ValueError(
                    f"the state resumes after batch {skip} of epoch {self.epoch}, but this stream "
                    f"gives this rank only {self._yielded} batches; resume on the stream it was saved on"
                )
        finally:
            self.peak_held = planner.peak_held

    def _check_resume(self, resume: dict[str, int], planner: StreamPlanner) -> None:
        if (planner.read, planner.hash) != (resume["samples_read"], resume["lengths_hash"]):
            raise ValueError(
                f"the stream differs from the one the state was saved on (at batch {resume['batches']} "
                f"of epoch {self.epoch}: {planner.read} samples read, saved {resume['samples_read']}, "
                "or other lengths); resume on the same stream in the same order, or start the epoch "
                "afresh with set_epoch()"
            )

    def _fingerprint(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "token_budget": self.spec.token_budget,
            "max_batch_size": self.spec.max_batch_size,
            "seed": self.spec.seed,
            "edges": None if self.edges is None else list(self.edges),
            "packed_window": self.spec.packed_window,
            "buffer_size": self.buffer_size,
            "num_buckets": self.num_buckets,
            "cost": None if self.cost is None else [self.cost.per_token, self.cost.per_token_squared],
            "cost_budget": self.cost_budget,
        }

    def state_dict(self) -> dict[str, Any]:
        """Where this rank is in the pass: epoch, batches handed out, the stream read until then (count and
        hash of the lengths), and the settings that shape the batches (checked on load)."""
        if self._resume is not None:  # restored and not iterated yet: the restored position
            return dict(
                self._resume,
                version=STATE_VERSION,
                epoch=self.epoch,
                world_size=self.world_size,
                rank=self.rank,
                settings=self._fingerprint(),
            )
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "batches": self._yielded,
            "samples_read": self._mark[0],
            "lengths_hash": self._mark[1],
            "world_size": self.world_size,
            "rank": self.rank,
            "settings": self._fingerprint(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state`` on the next iteration (module doc: the stream is re-read up to it)."""
        missing = [
            k
            for k in ("version", "epoch", "batches", "samples_read", "lengths_hash", "world_size", "settings")
            if k not in state
        ]
        if missing:
            raise ValueError(f"streaming state lacks {missing}; pass a dict from StreamingBatcher.state_dict()")
        if state["settings"] != self._fingerprint():
            raise ValueError(
                f"the state was saved with other batching settings ({state['settings']}, here "
                f"{self._fingerprint()}); build the batcher with the same settings as the run that "
                "saved it, or start a fresh run"
            )
        if int(state["world_size"]) != self.world_size:
            raise ValueError(
                f"the state was saved with world_size={state['world_size']} but this run has "
                f"world_size={self.world_size}; resume with the same number of ranks"
            )
        self.epoch = check_int("epoch", state["epoch"], minimum=0)
        batches = check_int("batches", state["batches"], minimum=0)
        self._resume = {
            "batches": batches,
            "samples_read": int(state["samples_read"]),
            "lengths_hash": int(state["lengths_hash"]),
        }
        self._yielded = batches
        self._mark = (int(state["samples_read"]), int(state["lengths_hash"]))


_END = object()

__all__ = ["STATE_VERSION", "StreamingBatcher", "default_length"]
