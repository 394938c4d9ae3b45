"""Child processes that die with their launcher.

torchrun's workers are children of its agent; when the agent (or the ``lenbatch train`` that
re-executed itself under torchrun) is killed with SIGKILL it cannot stop them, and they would go on
training and writing the run directory. Linux delivers a chosen signal to a process when its parent
dies if the process asked for it with ``prctl(PR_SET_PDEATHSIG)``; :func:`die_with_parent` asks for
SIGTERM (Python's default action for it: exit at once) or the signal given: a training worker, whose
SIGTERM only asks it to stop at the next step (:mod:`lenbatch_study.runtime.stopping`), asks for SIGKILL.
Elsewhere (macOS) it does nothing.

:func:`remove_launcher_logs`: torchrun's agent makes a ``torchelastic_*`` folder in the temp folder for its
workers' log and error files and never removes it (one per training, five per workflow run, on every user's
``$TMPDIR``); the training's local rank 0 removes it as it exits.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Optional

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


def launcher_logs() -> Optional[Path]:
    """The ``torchelastic_*`` folder torchrun's agent made in the temp folder for this worker's job (from
    ``TORCHELASTIC_ERROR_FILE``: ``<folder>/<run id>_<random>/attempt_<n>/<local rank>/error.json``); None outside
    torchrun, or where its ``--log-dir`` named a folder of the user's (never removed)."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not error_file:
        return None
    parents = Path(error_file).parents
    if len(parents) < 5:
        return None
    base = parents[3]
    made = base.name.startswith("torchelastic_") and base.parent == Path(tempfile.gettempdir())
    return base if made else None


def remove_launcher_logs() -> None:
    """Remove :func:`launcher_logs` from local rank 0 as the training ends: the agent has made its folders
    before it started the workers, nothing of ours writes there (no redirects), and a worker's missing error
    file is one the agent's report skips. Best effort: a SIGKILLed worker leaves it."""
    base = launcher_logs()
    if base is not None and os.environ.get("LOCAL_RANK", "0") == "0":
        shutil.rmtree(base, ignore_errors=True)


__all__ = ["children", "die_with_parent", "launcher_logs", "parent_death_signal", "remove_launcher_logs"]
