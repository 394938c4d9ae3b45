"""Child processes that die with their launcher.

torchrun's workers are children of its agent; when the agent (or the ``lenbatch train`` that
re-executed itself under torchrun) is killed with SIGKILL it cannot stop them, and they would go on
training and writing the run directory. Linux delivers a chosen signal to a process when its parent
dies if the process asked for it with ``prctl(PR_SET_PDEATHSIG)``; :func:`die_with_parent` asks for
SIGTERM (Python's default action for it: exit at once). Elsewhere (macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def parent_death_signal() -> None:
    """Ask the kernel to send SIGTERM to this process when its parent dies (Linux); usable as ``preexec_fn``."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def die_with_parent(expected_parent: int | None = None) -> None:
    """:func:`parent_death_signal`, and exit now if the parent already died (re-parented) before we asked.
    ``expected_parent``: the pid the process was started by, when known (a spawned worker is handed it):
    without it a parent that died before this call goes unnoticed."""
    parent = os.getppid() if expected_parent is None else expected_parent
    parent_death_signal()
    if os.getppid() != parent:
        raise SystemExit("lenbatch: the process that started this one has exited; stopping")


__all__ = ["die_with_parent", "parent_death_signal"]
