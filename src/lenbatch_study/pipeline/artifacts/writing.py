"""How the cheap stages write their JSON files (stats, boundaries, plans, plan).

Writers import this module, never a reader's: editing how a file is *read* must not rerun the stage
that writes it (DESIGN.md, "what reruns on an edit"). Cost: O(size).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: Path, data: Any) -> None:
    """``data`` as indented JSON (with a final newline) at ``path``, its folder created. O(size)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


__all__ = ["write_json"]
