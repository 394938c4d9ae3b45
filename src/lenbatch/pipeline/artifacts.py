"""The files stages hand each other: where each lives, how it is read (with its checks) and written.

One reader per artifact, so every stage refuses a missing or stale file with the same words and the
same fix:

| artifact | written by | read by |
|---|---|---|
| ``<tokenize>/lengths.npy`` | tokenize | stats, boundaries, plans, plan, train, quality, compare |
| ``<boundaries>/boundaries.json`` | boundaries | plans, plan, train (bucketed), quality, compare |
| ``<tokenize>/dataset/`` (Arrow) | tokenize (``datasets``) | train, compare (:func:`read_token_dataset`: pyarrow only) |
| any ``*.json`` a stage writes | :func:`write_json` | |

Cost: each reader is one file read (O(size)).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from lenbatch.batching.lengths import SEED_COUNT, check_lengths, seed_profile


def write_json(path: Path, data: Any) -> None:
    """``data`` as indented JSON (with a final newline) at ``path``, its folder created. O(size)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def read_boundaries(path: str | Path | None) -> tuple[int, ...] | None:
    """Bucket edges (tokens) of the boundaries stage's ``boundaries.json`` at ``path`` (None: no file
    given). ``ValueError`` naming the file and the rerun when it is missing or holds no edges."""
    if path is None:
        return None
    p = Path(path)
    if not p.exists():
        raise ValueError(f"--boundaries {p} does not exist; run 'lenbatch boundaries' first")
    try:
        edges = json.loads(p.read_text()).get("edges")
    except (json.JSONDecodeError, AttributeError):
        edges = None
    if not edges:
        raise ValueError(f"{p} has no 'edges'; regenerate it with 'lenbatch boundaries'")
    return tuple(int(e) for e in edges)


def read_edges(boundaries: str | Path | None, strategy: str) -> tuple[int, ...] | None:
    """The edges ``strategy`` plans with: those of ``boundaries`` for ``bucketed`` (required), None
    for every other strategy (they plan without edges)."""
    if strategy != "bucketed":
        return None
    if not boundaries:
        raise ValueError("strategy 'bucketed' needs bucket edges; pass --boundaries "
                         "results/boundaries/boundaries.json (run 'lenbatch boundaries' first)")
    return read_boundaries(boundaries)


def read_token_dataset(path: Path, columns: tuple[str, ...] = ("input_ids", "loss_mask")) -> Any:
    """The tokenize stage's ``dataset/`` (``datasets.Dataset.save_to_disk``) as one pyarrow Table of
    ``columns``, read with pyarrow alone (memory-mapped Arrow stream files listed in its
    ``state.json``), so training needs no ``datasets`` package (the GPU check machine has none).
    ``ValueError`` naming the rerun when the folder or a column is missing. O(1) until rows are taken."""
    import pyarrow as pa

    state = path / "state.json"
    if not state.exists():
        raise ValueError(f"{path} does not exist or is not a saved dataset (no state.json); run "
                         f"'lenbatch tokenize --out {path.parent}' first (or pass --data)")
    files = [path / f["filename"] for f in json.loads(state.read_text())["_data_files"]]
    tables = [pa.ipc.open_stream(pa.memory_map(str(f))).read_all() for f in files]
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    missing = set(columns) - set(table.column_names)
    if missing:
        raise ValueError(f"{path} lacks columns {sorted(missing)}; re-run 'lenbatch tokenize'")
    return table.select(list(columns))


def read_lengths(data: str | Path) -> np.ndarray:
    """``lengths.npy`` of the tokenize stage's output folder ``data`` (int64 tokens per sample)."""
    path = Path(data) / "lengths.npy"
    if not path.exists():
        raise ValueError(f"{path} does not exist; run 'lenbatch tokenize --out {data}' first (or pass --data)")
    return check_lengths(np.load(path), name=str(path))


def read_lengths_input(*, lengths: str | None, generate: bool = False, seed_profile_size: int = SEED_COUNT,
                       seed: int = 0) -> tuple[np.ndarray, str]:
    """The lengths a planning stage reads (tokens, int64) and their source's name: the ``.npy`` at
    ``lengths``, or with ``generate`` (``--seed-profile``) the study's profile of ``seed_profile_size``
    samples drawn with ``seed``."""
    if generate:
        return seed_profile(seed_profile_size, seed=seed).astype(np.int64), "seed-profile"
    path = Path(lengths)
    if not path.exists():
        raise ValueError(f"--lengths {path} does not exist; run 'lenbatch tokenize' first or pass --seed-profile")
    return check_lengths(np.load(path), name=str(path)), str(path)


__all__ = ["read_boundaries", "read_edges", "read_lengths", "read_lengths_input", "read_token_dataset", "write_json"]
