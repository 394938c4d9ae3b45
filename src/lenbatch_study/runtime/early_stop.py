"""The first moments of ``lenbatch train``: a SIGUSR1 held until the training's stop handler takes it.

SLURM's ``--signal=USR1@<secs>`` (and ``kill -USR1``) may arrive while the process still imports torch and
builds its models, a second or more; at its default action SIGUSR1 ended the process there (exit 138), with
nothing saved. :func:`hold` installs, first thing in ``lenbatch train`` (before any slow import: this module
imports only the standard library), a handler that only records the signal;
:class:`lenbatch_study.runtime.stopping.StopRequest` takes it (:func:`taken`) when it installs its own, so the
training stops at its first step boundary with a checkpoint and exits 75, as for a later signal. Only the
interpreter's own start (tens of milliseconds) stays uncovered. SIGTERM and SIGINT keep their default action
until then: before the first step nothing is lost by ending at once.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

_HELD: list[int] = []  # the signal recorded before the stop handler was installed (at most one)


def _record(signum: int, _frame: Any) -> None:
    if not _HELD:
        _HELD.append(int(signum))


def hold() -> None:
    """Record SIGUSR1 from now on (main thread only: Python handles signals there)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, _record)


def taken() -> int:
    """The signal held so far (0 for none), forgotten once taken."""
    return _HELD.pop() if _HELD else 0


__all__ = ["hold", "taken"]
