"""Child processes that die with their launcher.

torchrun's workers are children of its agent; when the agent (or the ``lenbatch train`` that
re-executed itself under torchrun) is killed with SIGKILL it cannot stop them, and they would go on
training and writing the run directory. Linux delivers a chosen signal to a process when its parent
dies if the process asked for it with ``prctl(PR_SET_PDEATHSIG)``; :func:`die_with_parent` asks for
SIGTERM (Python's default action for it: exit at once) or the signal given: a training worker, whose
SIGTERM only asks it to stop at the next step (:mod:`lenbatch_study.runtime.stopping`), asks for SIGKILL.
Elsewhere (macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def parent_death_signal(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux); usable as ``preexec_fn``."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def die_with_parent(expected_parent: int | None = None, *, sig: int = signal.SIGTERM) -> None:
    """:func:`parent_death_signal`, and exit now if the parent already died (re-parented) before we asked.
    ``expected_parent``: the pid the process was started by, when known (a spawned worker is handed it):
    without it a parent that died before this call goes unnoticed."""
    parent = os.getppid() if expected_parent is None else expected_parent
    parent_death_signal(sig)
    if os.getppid() != parent:
        raise SystemExit("lenbatch: the process that started this one has exited; stopping")


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux ``/proc``; empty elsewhere). O(processes)."""
    found = []
    proc = "/proc"
    if not os.path.isdir(proc):
        return found
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            found.append(int(name))
    return found


__all__ = ["children", "die_with_parent", "parent_death_signal"]
