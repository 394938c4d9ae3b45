"""``lenbatch plots``: ``dvc plots diff`` rendered offline, with the template of
:func:`lenbatch_study.pipeline.dvcplots.offline_template` (Vega inlined) where ``.dvc/config``'s
``plots.html_template`` points, so DVC's own ``dvc plots show``/``diff`` render offline as well."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lenbatch_study.pipeline.dvcplots import write_template


def run(*, revisions: list[str], out: str, write_only: bool = False) -> int:
    """``lenbatch plots``: write the template (:func:`write_template`), then, unless ``write_only``,
    ``dvc plots diff`` of ``revisions`` into ``out`` with it; DVC's exit code."""
    template = write_template(".")
    if write_only:
        print(f"wrote {template} (dvc plots show/diff now render offline)", file=sys.stderr)
        return 0
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = ["dvc", "plots", "diff", "--html-template", str(template.absolute()), "-o", str(out), *revisions]
    code = subprocess.call(cmd)
    if code == 0:
        print(f"wrote {out / 'index.html'} (renders offline)", file=sys.stderr)
    return code
