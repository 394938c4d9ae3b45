"""A dataset view that serves the pieces a ``LengthBatchSampler(overflow="truncate"|"split")`` yields.

The sampler yields a dataset row (``int``) for a whole sample and ``(row, start, end)`` for a part of
one (see :mod:`lenbatch.batching.overflow`); ``PieceDataset(dataset, sampler.pieces)`` (or
``sampler.view(dataset)``) returns ``dataset[row]`` for the first and, for the second, the sample with
every per-token field (a list/array/tensor as long as ``input_ids``: ``labels``, ``loss_mask``,
``attention_mask``, TRL's ``completion_mask``/``assistant_masks``...) cut to ``[start:end]`` and
``position_ids``, if present, restarting at 0: the piece is trained as a sequence of its own. A plain
dataset indexed with a tuple fails loudly (lists and ``datasets.Dataset`` refuse tuples).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from lenbatch.batching.overflow import Pieces


class PieceDataset:
    """Map-style dataset over ``dataset`` serving ints (rows) and ``(row, start, end)`` pieces.
    Cost per piece: one ``dataset[row]`` plus O(fields x piece length) slicing."""

    def __init__(self, dataset: Any, pieces: Pieces) -> None:
        if len(dataset) != pieces.num_samples:
            raise ValueError(
                f"the dataset has {len(dataset)} samples but the sampler's lengths have "
                f"{pieces.num_samples}; pass the dataset the lengths were read from"
            )
        self.dataset = dataset
        self.pieces = pieces

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: int | tuple[int, int, int]) -> Any:
        if not isinstance(item, tuple):
            return self.dataset[item]
        row, start, end = item
        return slice_sample(self.dataset[row], start, end)

    def __getattr__(self, name: str) -> Any:  # column_names, features, ... of the wrapped dataset
        if name in ("dataset", "pieces"):
            raise AttributeError(name)
        return getattr(self.dataset, name)


def slice_sample(sample: Mapping[str, Any], start: int, end: int) -> dict[str, Any]:
    """Tokens ``start:end`` of ``sample``: every field as long as ``input_ids`` is cut; ``position_ids``
    restart at 0; other fields are kept as they are."""
    if not isinstance(sample, Mapping) or "input_ids" not in sample:
        raise ValueError(
            "overflow='truncate'/'split' slices samples: each must be a mapping with 'input_ids' "
            f"(got {type(sample).__name__}); give the dataset that form or use overflow='error'"
        )
    n = len(sample["input_ids"])
    out = {}
    for key, value in sample.items():
        if key == "position_ids" and value is not None:
            out[key] = list(range(end - start))
        elif value is not None and not isinstance(value, (str, bytes)) and np.ndim(value) >= 1 and len(value) == n:
            out[key] = value[start:end]
        else:
            out[key] = value
    return out
