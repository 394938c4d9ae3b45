"""The tokenize stage's output folder: ``lengths.npy`` and ``dataset/``, read by every later stage.

* ``lengths.npy``: int64 tokens per sample (1-D, every length > 0), written by
  :func:`lenbatch_study.corpus.tokenizing.write_outputs` at :func:`output_paths`; read by :func:`read_lengths`.
* ``dataset/``: a ``datasets.save_to_disk`` folder with columns ``input_ids`` (token ids) and
  ``loss_mask`` (1 where a token is trained), one row per sample, row ``i`` holding ``lengths[i]``
  tokens; read by :class:`TokenizedDataset` (:func:`read_dataset`, pyarrow only), which checks the columns and the
  row count against ``lengths.npy`` once, and every row's length as it is read.
* ``stats.json``: what tokenizing read, kept, skipped, dropped and truncated; compare's report quotes it
  (:func:`read_stats`).
* ``timings.json``: the seconds it took (no stage reads it, no tool tracks it: it measures the machine).

:func:`output_paths` names these paths for the writer (:func:`lenbatch_study.corpus.tokenizing.write_outputs`,
which the stage hands them: the corpus layer sits below this one).

The planning stages may read lengths from any ``.npy`` or generate the study's profile instead
(:func:`read_lengths_input`). Cost: ``lengths.npy`` O(N); the dataset is memory-mapped, rows are read
on demand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from lenbatch.batching.lengths import check_lengths
from lenbatch_study.corpus.seed_profile import SEED_COUNT, seed_profile
from lenbatch_study.pipeline.artifacts.reading import read_json, refuse, require_keys, rerun_hint

WRITER = "tokenize"
LENGTHS = "lengths.npy"
LENGTHS_PATH = f"results/{WRITER}/{LENGTHS}"  # under the default results folder: what a rerun hint names
DATASET = "dataset"
STATS = "stats.json"
TIMINGS = "timings.json"
COLUMNS = ("input_ids", "loss_mask")


def output_paths(out: str | Path) -> dict[str, Path]:
    """Where the tokenize output folder ``out`` holds each file: ``{"dataset", "lengths", "stats", "timings"}``
    (the keyword arguments of :func:`lenbatch_study.corpus.tokenizing.write_outputs`)."""
    d = Path(out)
    return {"dataset": d / DATASET, "lengths": d / LENGTHS, "stats": d / STATS, "timings": d / TIMINGS}


def rerun(data: str | Path) -> str:
    return rerun_hint(WRITER, LENGTHS_PATH, data)


def read_stats(data: str | Path) -> dict[str, Any] | None:
    """``stats.json`` of the tokenize output folder ``data`` (records read, skipped, dropped and truncated, the
    source); None where the folder has none (lengths given by hand, not tokenized), refused when malformed."""
    path = Path(data) / STATS
    if not path.exists():
        return None
    doc = read_json(path, rerun=rerun(data))
    require_keys(path, doc, ("samples", "total_tokens"), rerun=rerun(data))
    return doc


def read_lengths(data: str | Path) -> np.ndarray:
    """``lengths.npy`` of the tokenize output folder ``data`` (int64 tokens per sample), checked."""
    path = Path(data) / LENGTHS
    if not path.exists():
        raise refuse(path, "does not exist", rerun=rerun(data))
    return _checked(path, rerun(data))


def read_lengths_input(
    *, lengths: str | Path | None, generate: bool = False, seed_profile_size: int = SEED_COUNT, seed: int = 0
) -> tuple[np.ndarray, str]:
    """The lengths a planning stage reads (tokens, int64) and their source's name: the ``.npy`` at
    ``lengths`` (a tokenize output's ``lengths.npy`` or any other), or with ``generate``
    (``--seed-profile``) the study's profile of ``seed_profile_size`` samples drawn with ``seed``."""
    if generate:
        return seed_profile(seed_profile_size, seed=seed).astype(np.int64), "seed-profile"
    if lengths is None:
        raise ValueError(f"pass --lengths {LENGTHS_PATH} or --seed-profile")
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
    exist and there is one row per length (at open), each row read has its length (on read).

    Read with pyarrow alone: the Arrow stream files the folder's ``state.json`` lists are memory-mapped
    (``datasets`` writes them; training needs no ``datasets`` package, and the GPU check's machine has
    none). Cost: O(files) at open; a read of k rows is one ``take`` of O(k + their tokens)."""

    def __init__(self, data: str | Path, lengths: np.ndarray, *, columns: tuple[str, ...] = COLUMNS) -> None:
        import pyarrow as pa

        self.data = Path(data)
        self.path = self.data / DATASET
        self.hint = rerun(self.data)
        state = self.path / "state.json"
        if not state.exists():
            what = "does not exist" if not self.path.exists() else "is not a saved dataset (no state.json)"
            raise refuse(self.path, what, rerun=self.hint)
        try:
            files = [self.path / f["filename"] for f in json.loads(state.read_text())["_data_files"]]
            tables = [pa.ipc.open_stream(pa.memory_map(str(f))).read_all() for f in files]
        except (OSError, KeyError, TypeError, ValueError, pa.ArrowException) as err:
            raise refuse(self.path, f"could not be read as a saved dataset ({err})", rerun=self.hint) from None
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        missing = sorted(set(columns) - set(table.column_names))
        if missing:
            raise refuse(self.path, f"lacks columns {missing}", rerun=self.hint)
        if table.num_rows != len(lengths):
            raise refuse(
                self.path,
                f"has {table.num_rows} rows but {self.data / LENGTHS} has {len(lengths)} (not from the same run)",
                rerun=self.hint,
            )
        self.table = table.select(list(columns))
        self.lengths = lengths

    def __len__(self) -> int:
        return self.table.num_rows

    def _check(self, i: int, n: int) -> None:
        if n != self.lengths[i]:
            raise refuse(
                self.path,
                f"row {i} has {n} tokens but {LENGTHS} says {self.lengths[i]} (not from the same run)",
                rerun=self.hint,
            )

    def _column(self, idx: list[int], name: str) -> list[np.ndarray]:
        """Rows ``idx`` of list column ``name`` as numpy arrays, each checked against ``lengths``."""
        import pyarrow as pa
        import pyarrow.compute as pc

        arr = self.table.column(name).take(pa.array(idx, type=pa.int64())).combine_chunks()
        sizes = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
        values = arr.flatten().to_numpy(zero_copy_only=False)
        out = np.split(values, np.cumsum(sizes)[:-1]) if len(idx) else []
        for i, n in zip(idx, sizes):
            self._check(i, int(n))
        return out

    def samples(self, indices: Iterable[int]) -> list[dict[str, Any]]:
        """Rows ``indices`` as ``{"input_ids": list, "loss_mask": list}`` (what collate takes), in order."""
        idx = [int(i) for i in indices]
        ids, masks = self._column(idx, "input_ids"), self._column(idx, "loss_mask")
        return [{"input_ids": a.tolist(), "loss_mask": m.tolist()} for a, m in zip(ids, masks)]

    def arrays(self, indices: Iterable[int]) -> dict[int, dict[str, np.ndarray]]:
        """Rows ``indices`` as ``{i: {"input_ids": int64 array, "loss_mask": bool array}}``."""
        idx = [int(i) for i in indices]
        return {
            i: {"input_ids": a.astype(np.int64), "loss_mask": m.astype(bool)}
            for i, a, m in zip(idx, self._column(idx, "input_ids"), self._column(idx, "loss_mask"))
        }

    def loss_masks(self, indices: Iterable[int]) -> list[np.ndarray]:
        """The ``loss_mask`` rows of ``indices`` (bool arrays), in order."""
        return [m.astype(bool) for m in self._column([int(i) for i in indices], "loss_mask")]


def read_dataset(data: str | Path, lengths: np.ndarray, *, columns: tuple[str, ...] = COLUMNS) -> TokenizedDataset:
    """:class:`TokenizedDataset` of the tokenize output folder ``data``, checked against ``lengths``."""
    return TokenizedDataset(data, lengths, columns=columns)


__all__ = [
    "COLUMNS",
    "DATASET",
    "LENGTHS",
    "LENGTHS_PATH",
    "STATS",
    "TIMINGS",
    "TokenizedDataset",
    "output_paths",
    "read_dataset",
    "read_lengths",
    "read_lengths_input",
]
