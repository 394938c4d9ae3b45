"""``lenbatch machine``: write this machine's fingerprint (:mod:`lenbatch_study.core.machine`) to
``OUT/machine.json``, only when its content changed.

Meant as the dependency of the measuring stages (profile, train, quality, compare): on the machine
that wrote it the file keeps its bytes and its modification time, so neither DVC nor Snakemake
reruns anything; on another machine, or after a library upgrade, the bytes change and the
measurements rerun. Cost: ~20 ms on a CPU machine (no torch import), ``import torch`` plus one
device query per GPU where a GPU driver is present.
"""

from __future__ import annotations

import json
from pathlib import Path

from lenbatch_study.core.log import get_logger
from lenbatch_study.core.machine import describe, fingerprint, write_if_changed
from lenbatch_study.pipeline.artifacts.machine_file import MACHINE


def run(*, out: str | Path, show: bool = False) -> int:
    """``lenbatch machine``: ``out/machine.json`` rewritten only when this machine's fingerprint differs
    from what it holds; ``show`` also prints the fingerprint as JSON. Returns the exit code (0)."""
    log = get_logger("machine")
    fp = fingerprint()
    path = Path(out) / MACHINE
    old = None
    if path.exists():
        try:
            old = json.loads(path.read_text()).get("id")
        except (json.JSONDecodeError, AttributeError):
            old = "unreadable"
    wrote = write_if_changed(path, fp)
    if show:
        print(json.dumps(fp, indent=2, sort_keys=True))
    if not wrote:
        log.info("fingerprint %s unchanged: %s left as it is (%s)", fp["id"], path, describe(fp))
    else:
        was = f" (was {old})" if old else ""
        log.info("fingerprint %s%s: wrote %s (%s)", fp["id"], was, path, describe(fp))
    return 0
