"""How stages write the files every output folder shares: JSON (stats, boundaries, plans, plan) and
``params.json``, the resolved params the folder was made with (its reader:
:func:`lenbatch_study.pipeline.artifacts.reading.read_params`). Cost: O(size).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lenbatch_study.core.config import Params

PARAMS = "params.json"
# the mark of a stage's output folder (lenbatch_study.pipeline.outputs): which stage wrote it and the sha256 of
# its params.json. A stage replaces its --out whole, so only a folder bearing this mark is ever replaced; a
# common name such as params.json is no proof (Meta-Llama checkpoint folders hold one)
MARKER = "lenbatch-output.json"


def write_json(path: Path, data: Any) -> None:
    """``data`` as indented JSON (with a final newline) at ``path``, its folder created. O(size)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def write_resolved(params: Params, out_dir: str | Path, sections: tuple[str, ...] | None = None) -> Path:
    """Write the resolved params (or some sections) as ``params.json`` next to a stage's results."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = params.to_dict()
    if sections is not None:
        data = {k: data[k] for k in sections}
    path = out_dir / PARAMS
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


__all__ = ["MARKER", "PARAMS", "write_json", "write_resolved"]
