"""Random token sequences shaped like chat samples, for the profile grid, the reference step and tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def synthetic_sequences(
    lengths: Sequence[int], *, vocab_size: int, seed: int, loss_fraction: float = 0.75
) -> list[dict[str, np.ndarray]]:
    """Random token sequences of the given lengths (for profiling grids and tests).

    Each sample's first ``1 - loss_fraction`` of tokens is a "prompt" (loss_mask 0), the rest
    the "completion" (loss_mask 1), the shape of a chat sample. Reproducible from ``seed``.
    """
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        n = int(n)
        if n < 1:
            raise ValueError(f"synthetic sequence lengths must be >= 1, got {n}")
        ids = rng.integers(1, vocab_size, size=n, dtype=np.int64)
        mask = np.zeros(n, dtype=np.int64)
        mask[min(n - 1, int(round(n * (1.0 - loss_fraction)))) :] = 1
        out.append({"input_ids": ids, "loss_mask": mask})
    return out
