"""The resumable state of a :class:`lenbatch.LengthBatchSampler`, as a plain dict (numpy-free, torch-free):
what ``state_dict()`` returns and ``load_state_dict`` reads. A training schedule that knows which batches a
rank has handed out can write the same dict for each rank without a sampler."""

from __future__ import annotations

from typing import Any

STATE_VERSION = 1


def sampler_state(
    *, epoch: int, position: int, world_size: int, rank: int, fingerprint: str, strategy: str
) -> dict[str, Any]:
    """The resumable state of a sampler that has handed out ``position`` batches of ``epoch``
    (:meth:`lenbatch.LengthBatchSampler.state_dict`)."""
    return {
        "version": STATE_VERSION,
        "epoch": int(epoch),
        "position": int(position),
        "world_size": int(world_size),
        "rank": int(rank),
        "fingerprint": fingerprint,
        "strategy": strategy,
    }
