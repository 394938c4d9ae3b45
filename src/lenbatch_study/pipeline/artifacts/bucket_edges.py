"""The boundaries stage's output: ``boundaries.json`` (the bucket edges) and ``sweep.json`` (the K sweep).

* ``boundaries.json``: a mapping; ``edges`` (K+1 strictly increasing ints, tokens) is what planning
  reads (:func:`read_edges`: plans, plan, train and quality, for ``bucketed``; any file holding
  ``edges`` will do); compare also reads ``predicted_efficiency`` and ``num_buckets``
  (:func:`read_boundaries`). Written by :mod:`lenbatch_study.stages.boundaries`.
* ``by-strategy/<strategy>.json``: one file per known strategy, what DVC's training stage of that
  strategy depends on (:func:`lenbatch_study.stages.boundaries.by_strategy_files`): ``bucketed``'s holds
  the bytes of ``boundaries.json``, every other strategy's a constant, so new edges rerun only the
  bucketed training. No stage reads them.
* ``sweep.json``: a list, one mapping per K with ``num_buckets``, ``edges``, ``predicted_efficiency``,
  ``simulated_efficiency``, ``composition_repeat``, ``length_mixing`` (:func:`read_sweep`: compare).

Cost: one small file read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from lenbatch_study.pipeline.artifacts.reading import read_json, refuse, require_keys, rerun_hint
from lenbatch_study.pipeline.artifacts.tokenized import LENGTHS_PATH

WRITER = "boundaries"
BOUNDARIES = "boundaries.json"
BOUNDARIES_PATH = f"results/{WRITER}/{BOUNDARIES}"  # under the default results folder: what a hint names
SWEEP = "sweep.json"
BY_STRATEGY = "by-strategy"
TIMINGS = "timings.json"  # the optimizer's seconds: no stage reads it, no tool tracks it
SWEEP_KEYS = (
    "num_buckets",
    "edges",
    "predicted_efficiency",
    "simulated_efficiency",
    "composition_repeat",
    "length_mixing",
)
# what a strategy list that holds 'bucketed' is told without edges
NEEDS_EDGES = (
    f"strategy 'bucketed' needs bucket edges; pass --boundaries {BOUNDARIES_PATH} (written by 'lenbatch boundaries')"
)


def by_strategy_path(out: str | Path, strategy: str) -> Path:
    """``by-strategy/<strategy>.json`` of the boundaries output folder ``out`` (module doc)."""
    return Path(out) / BY_STRATEGY / f"{strategy}.json"


def rerun(path: str | Path) -> str:
    return rerun_hint(
        WRITER, f"results/{WRITER}/{Path(path).name}", Path(path).parent, flags=f"--lengths {LENGTHS_PATH}"
    )


def _edges(path: Path, doc: Any) -> tuple[int, ...]:
    edges = doc.get("edges") if isinstance(doc, dict) else None
    if (
        not isinstance(edges, list)
        or len(edges) < 2
        or not all(isinstance(e, int) for e in edges)
        or any(b <= a for a, b in zip(edges, edges[1:]))
    ):
        raise refuse(
            path, f"holds no bucket edges (need 'edges': K+1 increasing ints, got {edges!r})", rerun=rerun(path)
        )
    return tuple(edges)


def read_edges(path: str | Path | None) -> tuple[int, ...] | None:
    """The bucket edges (tokens) of the ``boundaries.json`` at ``path``; None when no file is given."""
    if path is None:
        return None
    p = Path(path)
    return _edges(p, read_json(p, rerun=rerun(p)))


def edges_for(path: str | Path | None, strategies: Iterable[str]) -> tuple[int, ...] | None:
    """The edges a run of ``strategies`` plans with: those at ``path`` when ``bucketed`` is among them
    (``ValueError`` :data:`NEEDS_EDGES` without a file), None otherwise (no file is read)."""
    if "bucketed" not in list(strategies):
        return None
    if not path:
        raise ValueError(NEEDS_EDGES)
    return read_edges(path)


def read_boundaries(path: str | Path) -> dict[str, Any]:
    """The whole ``boundaries.json`` (compare): its ``edges`` checked, ``predicted_efficiency`` and
    ``num_buckets`` present."""
    p = Path(path)
    doc = read_json(p, rerun=rerun(p))
    _edges(p, doc)
    require_keys(p, doc, ("predicted_efficiency", "num_buckets"), rerun=rerun(p))
    return doc


def read_sweep(path: str | Path) -> list[dict[str, Any]]:
    """``sweep.json``: one checked entry per K (an empty list when the sweep was turned off)."""
    p = Path(path)
    doc = read_json(p, rerun=rerun(p))
    if not isinstance(doc, list):
        raise refuse(p, f"holds {type(doc).__name__}, not a list of K entries", rerun=rerun(p))
    for k, entry in enumerate(doc):
        require_keys(p, entry, SWEEP_KEYS, rerun=rerun(p), what=f" in entry {k}")
    return doc


__all__ = [
    "BOUNDARIES",
    "BOUNDARIES_PATH",
    "BY_STRATEGY",
    "NEEDS_EDGES",
    "SWEEP",
    "TIMINGS",
    "by_strategy_path",
    "edges_for",
    "read_boundaries",
    "read_edges",
    "read_sweep",
]
