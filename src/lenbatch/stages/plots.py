"""``lenbatch plots``: ``dvc plots diff`` rendered offline, with the template of
:func:`lenbatch.pipeline.dvcplots.offline_template` (Vega inlined)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lenbatch.pipeline.dvcplots import offline_template


def run(*, revisions: list[str], out: str) -> int:
    """``lenbatch plots``: ``dvc plots diff`` of ``revisions`` into ``out`` with :func:`offline_template`;
    DVC's exit code."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    template = out / "offline-template.html"
    template.write_text(offline_template(), encoding="utf8")
    cmd = ["dvc", "plots", "diff", "--html-template", str(template), "-o", str(out), *revisions]
    code = subprocess.call(cmd)
    if code == 0:
        print(f"wrote {out / 'index.html'} (renders offline)", file=sys.stderr)
    return code
