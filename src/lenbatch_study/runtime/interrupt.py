"""Ctrl-C under Snakemake: every process of the running jobs gets SIGINT once, and snakemake goes on when
they have all stopped.

Snakemake's local executor, interrupted, waits for its jobs: a training would run to its end and be
discarded as incomplete. The Snakefile installs :func:`install`'s handler, which hands SIGINT to the
processes in snakemake's own process group (torchrun hands it to its workers) unless a terminal's Ctrl-C
already reached that group (:func:`in_terminal_foreground`): a second SIGINT would stop a worker, or make
torchrun's agent SIGTERM it, mid-checkpoint. It then waits (at most :data:`STOP_WAIT_S`; a second Ctrl-C
stops the wait) until they have all ended, so a rerun finds no writer, and lets Snakemake mark the jobs
incomplete; the rerun resumes the training. Linux ``/proc`` only. Limits: docs/reliability.md.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any, Optional, TextIO

from lenbatch_study.runtime.lifetime import children

STOP_WAIT_S = 120.0  # the longest the jobs' processes get to stop


def descendants(pid: int) -> list[int]:
    """Every process now descended from ``pid`` (children, theirs, ...), whatever session or group it is in.
    Cost: one ``/proc`` scan per process found, plus one."""
    found, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        found += kids
        todo += kids
    return found


def start_time(pid: int) -> Optional[str]:
    """The kernel's start time of ``pid`` (``/proc/<pid>/stat`` field 22), which tells it from a later process
    given the same pid; None once it has exited (a zombie has: it only waits to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()  # after the command name, which may hold ") "
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def in_terminal_foreground() -> bool:
    """Whether this process's group is its terminal's foreground group: a Ctrl-C there is the terminal's,
    sent to every process of the group. False without a controlling terminal."""
    try:
        with open("/dev/tty") as tty:
            return os.tcgetpgrp(tty.fileno()) == os.getpgrp()
    except OSError:
        return False


def wait_stopped(procs: dict[int, Optional[str]], *, wait_s: float, out: TextIO) -> list[int]:
    """Wait until every process of ``procs`` (pid -> :func:`start_time` when recorded) has ended, at most
    ``wait_s`` seconds; says what it waits for on ``out`` after 1 s. Returns the pids still running."""
    t0, told = time.monotonic(), False
    while left := [p for p, t in procs.items() if t is not None and start_time(p) == t]:
        waited = time.monotonic() - t0
        if waited > wait_s:
            print(
                f"snakemake: {len(left)} process(es) of the interrupted jobs still running after {wait_s:.0f} s "
                f"(pids {' '.join(map(str, left))}); not waiting longer",
                file=out,
                flush=True,
            )
            return left
        if waited > 1 and not told:
            print(
                f"snakemake: interrupted; waiting for {len(left)} process(es) of the running jobs to stop (a "
                f"training stops at its step boundary, up to {wait_s:.0f} s; Ctrl-C again to stop waiting)",
                file=out,
                flush=True,
            )
            told = True
        time.sleep(0.1)
    return []


def install(*, wait_s: float = STOP_WAIT_S) -> bool:
    """Handle SIGINT in this process as the module doc says, then as before (the previous handler, else
    KeyboardInterrupt). Idempotent. Returns False where nothing was installed: no ``/proc``, or not the
    main thread (an API caller)."""
    previous = signal.getsignal(signal.SIGINT)
    if getattr(previous, "lenbatch_forwards_sigint", False):
        return True
    if not os.path.isdir("/proc"):
        return False
    waiting: list[bool] = []  # non-empty while a first interrupt waits

    def forward(signum: int, frame: Any) -> None:
        procs = {pid: start_time(pid) for pid in descendants(os.getpid())}
        if not in_terminal_foreground():
            group = os.getpgrp()
            for pid in procs:
                try:
                    if os.getpgid(pid) == group:
                        os.kill(pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
        if waiting:  # a second Ctrl-C (it reaches the jobs as the first did: a training stops at once)
            raise KeyboardInterrupt
        waiting.append(True)
        try:
            wait_stopped(procs, wait_s=wait_s, out=sys.stderr)
        finally:
            waiting.clear()
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    forward.lenbatch_forwards_sigint = True  # type: ignore[attr-defined]
    try:
        signal.signal(signal.SIGINT, forward)
    except ValueError:  # not the main thread: nothing to forward from here
        return False
    return True


__all__: list[str] = ["STOP_WAIT_S", "descendants", "in_terminal_foreground", "install", "start_time", "wait_stopped"]
