"""One experiment run per DVC workspace (docs/experiments.md): DVC takes its experiments' read-write lock
(``.dvc/tmp/exps/rwlock``) on ``workspace`` before it writes a run's ``-S`` values into ``params.yaml``, so a
reader held by each stage command makes DVC refuse a second ``dvc exp run`` there before it touches anything.
Between two stage commands of a run nothing is held.
"""

from __future__ import annotations

import atexit
from pathlib import Path


def hold_workspace(root: str | Path = ".", *, what: str = "a DVC stage of the workflow") -> bool:
    """Hold ``root``'s experiments lock on ``workspace`` as a reader until this process exits; False where
    ``root`` is no DVC repository or DVC is not installed (nothing held)."""
    dvc_dir = Path(root) / ".dvc"
    if not dvc_dir.is_dir():
        return False
    try:
        from dvc.fs import localfs
        from dvc.rwlock import rwlock
    except ImportError:
        return False
    lock_dir = dvc_dir / "tmp" / "exps"
    lock_dir.mkdir(parents=True, exist_ok=True)
    held = rwlock(
        str(lock_dir),
        localfs,
        f"lenbatch: {what} runs in this workspace; one experiment run at a "
        "time here (several at once: dvc exp run --queue ..., then dvc queue start)",
        ["workspace"],
        [],
        False,
    )
    held.__enter__()
    atexit.register(held.__exit__, None, None, None)
    return True


__all__ = ["hold_workspace"]
