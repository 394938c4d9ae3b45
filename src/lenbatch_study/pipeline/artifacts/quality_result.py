"""The quality stage's output: ``quality.json`` (everything it measured; compare reads it) and, for
``dvc metrics diff`` and plots, ``metrics.json``, ``curves.json``, ``gradients.json``.

Written by :mod:`lenbatch_study.stages.quality`; read by compare (:func:`read_quality`). ``quality.json``: a
mapping with ``strategies`` (those run), ``setting``, ``runs`` (one per strategy and seed: held-out loss
curve), ``gradients`` (``<checkpoint>.<strategy>``), ``summary`` (intervals over seeds) and ``timing``.
Cost: one file read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from lenbatch_study.pipeline.artifacts.bucket_edges import BOUNDARIES_PATH
from lenbatch_study.pipeline.artifacts.reading import read_json, refuse, require_keys, rerun_hint

WRITER = "quality"
QUALITY = "quality.json"
QUALITY_PATH = f"results/{WRITER}/{QUALITY}"  # under the default results folder: what a rerun hint names
METRICS = "metrics.json"
CURVES = "curves.json"
GRADIENTS = "gradients.json"
KEYS = ("strategies", "setting", "runs", "gradients", "summary", "timing")


def rerun(quality_dir: Path) -> str:
    return rerun_hint(
        WRITER, QUALITY_PATH, quality_dir, flags=f"--data results/tokenize --boundaries {BOUNDARIES_PATH}"
    )


def read_quality(quality_dir: str | Path, strategies: Iterable[str]) -> dict[str, Any]:
    """``quality.json`` of the quality output folder ``quality_dir``, checked to cover ``strategies``."""
    d = Path(quality_dir)
    p = d / QUALITY
    result = read_json(p, rerun=rerun(d))
    require_keys(p, result, KEYS, rerun=rerun(d))
    missing = [s for s in strategies if s not in result["strategies"]]
    if missing:
        raise refuse(p, f"lacks strategies {missing}", rerun=rerun(d))
    return result


__all__ = ["CURVES", "GRADIENTS", "METRICS", "QUALITY", "QUALITY_PATH", "read_quality"]
