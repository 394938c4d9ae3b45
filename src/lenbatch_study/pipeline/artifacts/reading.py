"""How a reader refuses a stage's output: one wording everywhere, naming the file, what is wrong and the
rerun that rewrites it.

``<path> <problem>; rerun: snakemake <the file under results/> (or: lenbatch <stage> ... --out <folder>)``

Every reader in :mod:`lenbatch_study.pipeline.artifacts` raises :class:`ArtifactError` (a ``ValueError``:
the CLI prints it as one line and exits 2) through :func:`refuse`. Cost: O(size) per read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lenbatch_study.pipeline.artifacts.writing import PARAMS


class ArtifactError(ValueError):
    """A stage's input file is missing, malformed, or from another run than its neighbours."""


def rerun_hint(stage: str, target: str, folder: str | Path, *, flags: str = "") -> str:
    """``snakemake <target> (or: lenbatch <stage> <flags> --out <folder>)``: the workflow's way and the
    command's way to rewrite the file. ``target`` is its path under the default ``results/``."""
    return f"snakemake {target} (or: lenbatch {stage}{' ' + flags if flags else ''} --out {folder})"


def refuse(path: str | Path, problem: str, *, rerun: str) -> ArtifactError:
    """The error every reader raises: ``<path> <problem>; rerun: <rerun>``."""
    return ArtifactError(f"{path} {problem}; rerun: {rerun}")


def read_json(path: Path, *, rerun: str) -> Any:
    """The JSON document at ``path``; :func:`refuse` when it does not exist or does not parse."""
    if not path.exists():
        raise refuse(path, "does not exist", rerun=rerun)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise refuse(path, f"is not valid JSON ({err})", rerun=rerun) from None


def require_keys(path: Path, doc: Any, keys: tuple[str, ...], *, rerun: str, what: str = "") -> None:
    """:func:`refuse` unless ``doc`` is a mapping holding every key of ``keys`` (not None)."""
    if not isinstance(doc, dict):
        raise refuse(path, f"holds {type(doc).__name__}, not a mapping{what}", rerun=rerun)
    missing = [k for k in keys if doc.get(k) is None]
    if missing:
        raise refuse(path, f"lacks {', '.join(repr(k) for k in missing)}{what} (a partial or older run?)", rerun=rerun)


def read_params(folder: str | Path, *, rerun: str) -> dict[str, Any] | None:
    """The resolved params an output folder was made with (its ``params.json``,
    :func:`lenbatch_study.pipeline.artifacts.writing.write_resolved`), None when the folder has none;
    :func:`refuse` when it is not a JSON mapping."""
    p = Path(folder) / PARAMS
    if not p.exists():
        return None
    doc = read_json(p, rerun=rerun)
    if not isinstance(doc, dict):
        raise refuse(p, "holds no params mapping", rerun=rerun)
    return doc


__all__ = ["ArtifactError", "read_json", "read_params", "refuse", "require_keys", "rerun_hint"]
