"""Sample lengths straight from Arrow: :func:`lengths_of` (public as ``lenbatch.lengths_of``).

A list column (``input_ids``) is stored as one values buffer plus ``offsets``: row i holds
``offsets[i+1] - offsets[i]`` tokens. So the lengths of every row are one ``np.diff`` of the offsets,
read without touching a token and without a Python object per row: ~10 ms for 5 M rows
(benchmarks/bench_lengths.py), where ``[len(r) for r in ds["input_ids"]]`` takes minutes.

Accepted: a ``datasets.Dataset`` (its row order: a ``.select``/``.shuffle``/``.filter`` indices
mapping is applied to the lengths), a ``save_to_disk`` folder (its Arrow files memory-mapped, no
``datasets`` needed), a Parquet file (only the column is read), a ``pyarrow`` Table/RecordBatch,
ChunkedArray or list array (``list``, ``large_list``: int32/int64 offsets, sliced arrays, list views,
fixed-size lists), or an integer column (then its values are the lengths). Null rows are refused
(a null is not a length of 0); empty rows are refused like :func:`lenbatch.batching.lengths.check_lengths`
does, naming how many and the first. pyarrow is imported on the first call (``import lenbatch`` stays light).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def lengths_of(data: Any, *, column: str = "input_ids") -> np.ndarray:
    """Per-row lengths (int64, row order) of ``data``'s list column ``column``; see the module doc.

    Cost: O(rows) from the list offsets (a Parquet file: decoding that one column). ``ValueError``
    for a missing column, null or empty rows, a non-list column, an ``IterableDataset``.
    """
    import pyarrow as pa

    if isinstance(data, (str, Path)):
        lengths = _lengths_of_path(Path(data), column)
    elif _is_hf_dataset(data):
        lengths = _lengths_of_hf(data, column)
    elif isinstance(data, (pa.Table, pa.RecordBatch)):
        lengths = _lengths_of_array(_column(data, column), column)
    elif isinstance(data, (pa.Array, pa.ChunkedArray)):
        lengths = _lengths_of_array(data, column)
    else:
        kind = type(data).__name__
        hint = (
            " (an IterableDataset has no random access: its lengths need a pass over the data; load it as a "
            "datasets.Dataset)"
            if "Iterable" in kind
            else ""
        )
        raise ValueError(
            f"lengths_of takes a datasets.Dataset, a save_to_disk folder, a Parquet file or a pyarrow "
            f"Table/ChunkedArray/list array, got {kind}{hint}"
        )
    return check_row_lengths(lengths, column=column)


def check_row_lengths(lengths: np.ndarray, *, column: str) -> np.ndarray:
    """``lengths`` as int64, or ``ValueError`` naming the empty rows (a sample of 0 tokens cannot be batched)."""
    x = np.asarray(lengths).astype(np.int64, copy=False)
    if x.size == 0:
        raise ValueError(f"column {column!r} has no rows; give at least one sample")
    empty = np.flatnonzero(x <= 0)
    if empty.size:
        raise ValueError(
            f"column {column!r} has {empty.size} empty row(s) (length 0; first at row {int(empty[0])}); "
            f"drop them before batching, e.g. dataset.filter(lambda r: len(r[{column!r}]) > 0)"
        )
    return x


def _is_hf_dataset(data: Any) -> bool:
    mod = type(data).__module__ or ""
    return mod.startswith("datasets") and hasattr(data, "data") and hasattr(data, "column_names")


def _column(table: Any, column: str) -> Any:
    names = list(table.schema.names)
    if column not in names:
        raise ValueError(f"no column {column!r} to take lengths from; the columns are {names}; pass column=")
    return table.column(column)


def _lengths_of_hf(ds: Any, column: str) -> np.ndarray:
    """A ``datasets.Dataset``: lengths of its (memory-mapped) table, in the dataset's row order."""
    if column not in ds.column_names:
        raise ValueError(
            f"no column {column!r} to take lengths from; the dataset's columns are {ds.column_names}; pass column="
        )
    table = ds.data.table if hasattr(ds.data, "table") else ds.data
    lengths = _lengths_of_array(table.column(column), column)
    indices = getattr(ds, "_indices", None)  # .select/.shuffle/.filter keep the table and map rows through this
    if indices is not None:
        idx = _array_to_numpy(indices.column(0)).astype(np.int64)
        lengths = lengths[idx]
    return lengths


def _array_to_numpy(arr: Any) -> np.ndarray:
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        parts = [c.to_numpy(zero_copy_only=False) for c in arr.chunks]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return arr.to_numpy(zero_copy_only=False)


def _lengths_of_array(arr: Any, column: str) -> np.ndarray:
    """Lengths of a (chunked) list array from its offsets; an integer array's values; nulls refused."""
    import pyarrow as pa
    import pyarrow.types as pt

    chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
    nulls = sum(c.null_count for c in chunks)
    if nulls:
        raise ValueError(
            f"column {column!r} has {nulls} null row(s); a null is not a sample: drop or fill them "
            f"(e.g. dataset.filter(lambda r: r[{column!r}] is not None))"
        )
    typ = arr.type
    parts = []
    for c in chunks:
        if pt.is_list(typ) or pt.is_large_list(typ):
            off = c.offsets.to_numpy()  # len(c) + 1 offsets, the slice's own
            parts.append(np.diff(off))
        elif getattr(pt, "is_list_view", lambda t: False)(typ) or getattr(pt, "is_large_list_view", lambda t: False)(
            typ
        ):
            parts.append(c.sizes.to_numpy())
        elif pt.is_fixed_size_list(typ):
            parts.append(np.full(len(c), typ.list_size, dtype=np.int64))
        elif pt.is_integer(typ):
            parts.append(c.to_numpy())
        else:
            raise ValueError(
                f"column {column!r} has type {typ}, not a list of tokens (or integer lengths); pass "
                "the token-id column as column="
            )
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def arrow_dir_files(path: Path) -> list[Path]:
    """The Arrow files of a ``datasets.save_to_disk`` folder, in order (from its ``state.json``)."""
    if (path / "dataset_dict.json").exists():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        raise ValueError(
            f"{path} holds a DatasetDict (splits {splits}); pass one split's folder, e.g. "
            f"{path / (splits[0] if splits else 'train')}"
        )
    state = path / "state.json"
    if not state.exists():
        raise ValueError(
            f"{path} is not a datasets.save_to_disk folder (no state.json); pass a Dataset, a Parquet "
            "file or a pyarrow table"
        )
    files = [path / f["filename"] for f in json.loads(state.read_text()).get("_data_files", [])]
    if not files:
        raise ValueError(f"{path}/state.json lists no data files; the folder is incomplete")
    return files


def open_arrow_file(path: Path) -> Any:
    """A memory-mapped Arrow file (the IPC stream format ``datasets`` writes, or the file format)."""
    import pyarrow as pa

    src = pa.memory_map(str(path))
    try:
        return pa.ipc.open_stream(src).read_all()
    except pa.ArrowInvalid:
        return pa.ipc.open_file(pa.memory_map(str(path))).read_all()


def _lengths_of_path(path: Path, column: str) -> np.ndarray:
    if not path.exists():
        raise ValueError(f"{path} does not exist; pass a save_to_disk folder, a Parquet file or a Dataset")
    if path.is_dir():
        return np.concatenate(
            [_lengths_of_array(_column(open_arrow_file(f), column), column) for f in arrow_dir_files(path)]
        )
    with path.open("rb") as fh:
        head = fh.read(4)
    if head == b"PAR1":
        import pyarrow.parquet as pq

        names = pq.read_schema(str(path)).names
        if column not in names:
            raise ValueError(f"no column {column!r} in {path}; its columns are {names}; pass column=")
        return _lengths_of_array(pq.read_table(str(path), columns=[column]).column(column), column)
    return _lengths_of_array(_column(open_arrow_file(path), column), column)
