"""The stats stage's output: ``stats.json`` (percentiles, counts) and ``histogram.json`` (bins), both
read by compare for its report; ``histogram.png`` is for people. Written by :mod:`lenbatch_study.stages.stats`.

* ``stats.json``: a mapping with ``count``, ``mean``, ``max`` and ``percentiles`` (``p50`` ...).
* ``histogram.json``: a list of bins ``{"lo", "hi", "count"}`` (also DVC plot data).

Cost: one small file read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lenbatch_study.pipeline.artifacts.reading import read_json, refuse, require_keys, rerun_hint
from lenbatch_study.pipeline.artifacts.tokenized import LENGTHS_PATH

WRITER = "stats"
STATS = "stats.json"
HISTOGRAM = "histogram.json"
PLOT = "histogram.png"


def rerun(path: Path) -> str:
    return rerun_hint(WRITER, f"results/{WRITER}/{path.name}", path.parent, flags=f"--lengths {LENGTHS_PATH}")


def read_stats(stats_dir: str | Path) -> dict[str, Any]:
    """``stats.json`` of the stats output folder ``stats_dir``, checked."""
    p = Path(stats_dir) / STATS
    doc = read_json(p, rerun=rerun(p))
    require_keys(p, doc, ("count", "mean", "max", "percentiles"), rerun=rerun(p))
    return doc


def read_histogram(stats_dir: str | Path) -> list[dict[str, Any]]:
    """``histogram.json`` of ``stats_dir``: a non-empty list of ``{lo, hi, count}`` bins."""
    p = Path(stats_dir) / HISTOGRAM
    doc = read_json(p, rerun=rerun(p))
    if not isinstance(doc, list) or not doc:
        raise refuse(p, "holds no histogram bins", rerun=rerun(p))
    for k, row in enumerate(doc):
        require_keys(p, row, ("lo", "hi", "count"), rerun=rerun(p), what=f" in bin {k}")
    return doc


__all__ = ["HISTOGRAM", "PLOT", "STATS", "read_histogram", "read_stats"]
