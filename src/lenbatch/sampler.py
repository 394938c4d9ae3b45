"""``LengthBatchSampler``: any strategy's epoch plan as a resumable ``torch.utils.data.Sampler``.

It yields this rank's batches (lists of sample indices) of ``plan_epoch`` for the current epoch.
State = (epoch, batches already yielded in this epoch) plus a fingerprint of the lengths and every
plan parameter, and the world size: ``load_state_dict`` then resumes with exactly the batches the
uninterrupted run would still have yielded, and refuses a state from another plan or world size.

With a DataLoader that prefetches (num_workers > 0), the sampler runs ahead of the training loop:
save ``sampler.state_dict(batches_consumed=steps_done_this_epoch)`` to resume at the first batch the
model has not seen.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch.utils.data

from lenbatch.strategies import plan_epoch_all, resolve_rank, validate

STATE_VERSION = 1


class LengthBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Yield this rank's batches of one epoch; ``set_epoch`` before each epoch (like DistributedSampler)."""

    def __init__(self, lengths: Any, *, strategy: str, token_budget: int, max_batch_size: int, seed: int = 0,
                 edges: Any = None, rank: int | None = None, world_size: int | None = None,
                 packed_window: int = 8) -> None:
        super().__init__()
        x, e = validate(lengths, strategy=strategy, token_budget=token_budget, max_batch_size=max_batch_size,
                        edges=edges, packed_window=packed_window)
        if seed < 0:
            raise ValueError(f"batching.seed must be >= 0, got {seed}")
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.lengths = x
        self.strategy = strategy
        self.token_budget = int(token_budget)
        self.max_batch_size = int(max_batch_size)
        self.seed = int(seed)
        self.edges = None if e is None else tuple(int(v) for v in e)
        self.packed_window = int(packed_window)
        self.epoch = 0
        self._position = 0  # batches yielded in the current epoch
        self._resume: int | None = None
        self._cache: tuple[int, list[np.ndarray]] | None = None
        h = hashlib.sha256(np.ascontiguousarray(x, dtype="<i8").tobytes())
        h.update(json.dumps({"strategy": strategy, "token_budget": self.token_budget,
                             "max_batch_size": self.max_batch_size, "seed": self.seed, "edges": self.edges,
                             "packed_window": self.packed_window}, sort_keys=True).encode())
        self.fingerprint = h.hexdigest()[:16]

    def plan(self, epoch: int | None = None) -> list[np.ndarray]:
        """This rank's batches of ``epoch`` (default: the current one); cached for the current epoch."""
        epoch = self.epoch if epoch is None else epoch
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        batches = plan_epoch_all(self.lengths, strategy=self.strategy, epoch=epoch, seed=self.seed,
                                 token_budget=self.token_budget, max_batch_size=self.max_batch_size,
                                 edges=self.edges, world_size=self.world_size,
                                 packed_window=self.packed_window)[self.rank]
        if epoch == self.epoch:
            self._cache = (epoch, batches)
        return batches

    def set_epoch(self, epoch: int) -> None:
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.epoch = int(epoch)
        self._position = 0
        self._resume = None

    def __len__(self) -> int:
        return len(self.plan())

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.plan()
        start = self._resume if self._resume is not None else 0
        self._resume = None
        self._position = start
        for i in range(start, len(batches)):
            self._position = i + 1
            yield batches[i].tolist()

    def state_dict(self, batches_consumed: int | None = None) -> dict[str, Any]:
        """Resumable state; ``batches_consumed`` overrides the position (batches of this epoch already used)."""
        pos = self._position if batches_consumed is None else int(batches_consumed)
        return {"version": STATE_VERSION, "epoch": self.epoch, "position": pos, "world_size": self.world_size,
                "rank": self.rank, "fingerprint": self.fingerprint, "strategy": self.strategy}

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
