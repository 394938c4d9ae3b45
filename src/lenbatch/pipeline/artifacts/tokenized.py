"""The tokenize stage's output folder: ``lengths.npy`` and ``dataset/``, read by every later stage.

* ``lengths.npy``: int64 tokens per sample (1-D, every length > 0), written by
  :func:`lenbatch.corpus.tokenizing.write_outputs`; read by :func:`read_lengths`.
* ``dataset/``: a ``datasets.save_to_disk`` folder with columns ``input_ids`` (token ids) and
  ``loss_mask`` (1 where a token is trained), one row per sample, row ``i`` holding ``lengths[i]``
  tokens; read by :class:`TokenizedDataset` (:func:`read_dataset`), which checks the columns and the
  row count against ``lengths.npy`` once, and every row's length as it is read.
* ``stats.json``: what tokenizing read, kept and dropped (for people; no stage reads it).

The planning stages may read lengths from any ``.npy`` or generate the study's profile instead
(:func:`read_lengths_input`). Cost: ``lengths.npy`` O(N); the dataset is memory-mapped, rows are read
on demand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import numpy as np

from lenbatch.batching.lengths import SEED_COUNT, check_lengths, seed_profile
from lenbatch.pipeline.artifacts.reading import refuse, rerun_hint

WRITER = "tokenize"
LENGTHS = "lengths.npy"
DATASET = "dataset"
STATS = "stats.json"
COLUMNS = ("input_ids", "loss_mask")


def rerun(data: str | Path) -> str:
    return rerun_hint(WRITER, f"results/{WRITER}/{LENGTHS}", data)


def read_lengths(data: str | Path) -> np.ndarray:
    """``lengths.npy`` of the tokenize output folder ``data`` (int64 tokens per sample), checked."""
    path = Path(data) / LENGTHS
    if not path.exists():
        raise refuse(path, "does not exist", rerun=rerun(data))
    return _checked(path, rerun(data))


def read_lengths_input(*, lengths: str | Path | None, generate: bool = False, seed_profile_size: int = SEED_COUNT,
                       seed: int = 0) -> tuple[np.ndarray, str]:
    """The lengths a planning stage reads (tokens, int64) and their source's name: the ``.npy`` at
    ``lengths`` (a tokenize output's ``lengths.npy`` or any other), or with ``generate``
    (``--seed-profile``) the study's profile of ``seed_profile_size`` samples drawn with ``seed``."""
    if generate:
        return seed_profile(seed_profile_size, seed=seed).astype(np.int64), "seed-profile"
    if lengths is None:
        raise ValueError("pass --lengths results/tokenize/lengths.npy or --seed-profile")
    path = Path(lengths)
    hint = rerun(path.parent) + " or pass --seed-profile"
    if not path.exists():
        raise refuse(path, "does not exist", rerun=hint)
    return _checked(path, hint), str(path)


def _checked(path: Path, hint: str) -> np.ndarray:
    try:
        raw = np.load(path)
    except (ValueError, OSError) as err:
        raise refuse(path, f"is not a .npy array ({err})", rerun=hint) from None
    try:
        return check_lengths(raw, name=str(path))
    except ValueError as err:
        raise refuse(path, f"holds no valid lengths ({err})", rerun=hint) from None


class TokenizedDataset:
    """``dataset/`` of a tokenize output folder, checked against its ``lengths.npy``: the ``columns``
    exist and there is one row per length (at open), each row read has its length (on read)."""

    def __init__(self, data: str | Path, lengths: np.ndarray, *, columns: tuple[str, ...] = COLUMNS) -> None:
        import datasets

        self.data = Path(data)
        self.path = self.data / DATASET
        self.hint = rerun(self.data)
        if not self.path.exists():
            raise refuse(self.path, "does not exist", rerun=self.hint)
        ds = datasets.load_from_disk(str(self.path))
        missing = sorted(set(columns) - set(ds.column_names))
        if missing:
            raise refuse(self.path, f"lacks columns {missing}", rerun=self.hint)
        if len(ds) != len(lengths):
            raise refuse(self.path, f"has {len(ds)} rows but {self.data / LENGTHS} has {len(lengths)} (not from "
                         "the same run)", rerun=self.hint)
        self.ds = ds.select_columns(list(columns))
        self.lengths = lengths
        self._numpy: Any = None

    def _check(self, i: int, n: int) -> None:
        if n != self.lengths[i]:
            raise refuse(self.path, f"row {i} has {n} tokens but {LENGTHS} says {self.lengths[i]} (not from the "
                         "same run)", rerun=self.hint)

    def samples(self, indices: Iterable[int]) -> list[dict[str, Any]]:
        """Rows ``indices`` as ``{"input_ids": list, "loss_mask": list}`` (what collate takes), in order."""
        idx = [int(i) for i in indices]
        rows = self.ds[idx]
        out = []
        for i, ids, mask in zip(idx, rows["input_ids"], rows["loss_mask"]):
            self._check(i, len(ids))
            out.append({"input_ids": ids, "loss_mask": mask})
        return out

    def arrays(self, indices: Iterable[int]) -> dict[int, dict[str, np.ndarray]]:
        """Rows ``indices`` as ``{i: {"input_ids": int64 array, "loss_mask": bool array}}``."""
        idx = [int(i) for i in indices]
        return {i: {"input_ids": np.asarray(s["input_ids"], dtype=np.int64),
                    "loss_mask": np.asarray(s["loss_mask"], dtype=bool)}
                for i, s in zip(idx, self.samples(idx))}

    def loss_masks(self, indices: Iterable[int]) -> list[np.ndarray]:
        """The ``loss_mask`` rows of ``indices`` (bool arrays), in order."""
        if self._numpy is None:
            self._numpy = self.ds.select_columns(["loss_mask"]).with_format("numpy")
        idx = [int(i) for i in indices]
        out = []
        for i, m in zip(idx, self._numpy[idx]["loss_mask"]):
            self._check(i, len(m))
            out.append(np.asarray(m, dtype=bool))
        return out


def read_dataset(data: str | Path, lengths: np.ndarray, *, columns: tuple[str, ...] = COLUMNS) -> TokenizedDataset:
    """:class:`TokenizedDataset` of the tokenize output folder ``data``, checked against ``lengths``."""
    return TokenizedDataset(data, lengths, columns=columns)


__all__ = ["COLUMNS", "DATASET", "LENGTHS", "STATS", "TokenizedDataset", "read_dataset", "read_lengths",
           "read_lengths_input"]
