"""The plans stage's output: ``metrics.json``, one mapping per simulated strategy (``padding_efficiency``,
``budget_fill``, ``steps``, ``composition_repeat``, ``length_mixing`` ...). Written by
:mod:`lenbatch_study.stages.plans`; read by compare (:func:`read_plans`). Cost: one small file read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from lenbatch_study.pipeline.artifacts.bucket_edges import BOUNDARIES_PATH
from lenbatch_study.pipeline.artifacts.reading import read_json, refuse, require_keys, rerun_hint
from lenbatch_study.pipeline.artifacts.tokenized import LENGTHS_PATH

WRITER = "plans"
METRICS = "metrics.json"
TIMINGS = "timings.json"  # seconds to plan an epoch: no stage reads it, no tool tracks it
KEYS = ("padding_efficiency", "composition_repeat", "length_mixing")


def rerun(path: Path) -> str:
    return rerun_hint(
        WRITER,
        f"results/{WRITER}/{METRICS}",
        path.parent,
        flags=f"--lengths {LENGTHS_PATH} --boundaries {BOUNDARIES_PATH}",
    )


def read_plans(plans_dir: str | Path, strategies: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``metrics.json`` of the plans output folder ``plans_dir``, checked to hold every strategy of
    ``strategies`` with the measures compare reads."""
    p = Path(plans_dir) / METRICS
    doc = read_json(p, rerun=rerun(p))
    if not isinstance(doc, dict):
        raise refuse(p, f"holds {type(doc).__name__}, not a mapping of strategies", rerun=rerun(p))
    missing = [s for s in strategies if s not in doc]
    if missing:
        raise refuse(p, f"lacks strategies {missing}", rerun=rerun(p))
    for s in strategies:
        require_keys(p, doc[s], KEYS, rerun=rerun(p), what=f" for {s}")
    return doc


__all__ = ["METRICS", "TIMINGS", "read_plans"]
