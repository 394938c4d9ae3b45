"""One experiment run per DVC workspace: while a DVC stage command of this workflow runs, a second
``dvc exp run`` (or ``--queue``) in the same workspace is refused by DVC itself, before it writes its ``-S``
values into ``params.yaml``.

DVC stashes the workspace and writes a run's params first, and only then meets the stage outputs another
run holds: two runs in one workspace both failed (exit 255) and left ``params.yaml`` at the refused run's
values. DVC takes its experiments' read-write lock (``.dvc/tmp/exps/rwlock``) on ``workspace`` before it
touches anything; :func:`hold_workspace` adds a reader of ``workspace`` for this process (DVC's own
``dvc.rwlock``, under its guard), released when the process exits. A killed holder's entry is dropped by DVC
at the next look (its pid is gone). Between two stage commands of a run nothing is held: a second run
started exactly then fails later as before. Cost: two small file edits per stage command.
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
