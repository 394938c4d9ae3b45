"""A training asked to stop by a signal: checkpoint at a step boundary, exit, resume later exactly.

A batch scheduler warns a job before it ends it, and a person at a terminal presses Ctrl-C (SIGINT): SLURM sends the signal a job asked for ahead of its time
limit (``sbatch --signal=USR1@120``: SIGUSR1 120 s before) and SIGTERM on preemption, ``scontrol requeue`` and
``scancel`` (then SIGKILL after ``KillWait``). :class:`StopRequest` makes both set a flag in a training
process (never anything more inside the handler: the step in flight finishes, a collective is never cut);
the ranks agree on one step boundary (:mod:`lenbatch_study.stages.train`), node 0's drafter writes the
checkpoint of exactly the steps trained (:func:`lenbatch_study.runtime.checkpoint.save_checkpoint`, the
periodic checkpoints' format) and the stop marker beside it (``setup.stop_marker``), and every rank exits with :data:`STOPPED_EXIT`.
No ``summary.json`` is written: the run is not complete, and ``--resume`` continues it on the batches an
uninterrupted run would train.

torchrun's agent must not die of SIGUSR1 (its default action), which would take its workers with it:
start it with SIGUSR1 ignored (:mod:`lenbatch_study.runtime.launch` does so for the torchrun ``lenbatch train``
starts). An ignored disposition survives ``exec``, and each worker installs its own handler.
SIGTERM the agent forwards to its workers itself, then waits 30 s for them before SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from pathlib import Path
from typing import Any, Iterator, Optional

from lenbatch_study.core.log import get_logger
from lenbatch_study.runtime import early_stop

log = get_logger("train")

# SIGINT: Ctrl-C at a terminal (a second Ctrl-C aborts at once, :meth:`StopRequest._handler`)
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)
# EX_TEMPFAIL (sysexits.h): a temporary failure; rerunning (with --resume) continues the work
STOPPED_EXIT = 75


class StopRequest:
    """The first stop signal this process received (``signum``: 0 for none, ``name``: ``"SIGUSR1"``...).

    ``note(signum)`` records one a peer reported (a target rank's, travelling with its batch). Cheap to
    read at every step boundary: one attribute."""

    def __init__(self) -> None:
        self.signum = 0

    def _handler(self, signum: int, _frame: Any) -> None:
        if signum == signal.SIGINT and self.signum:
            # a second Ctrl-C: the user will not wait for the step boundary (the partial folder keeps the last
            # periodic checkpoint; the previous output is untouched)
            raise KeyboardInterrupt
        self.note(signum)

    def note(self, signum: int) -> None:
        if signum and not self.signum:
            self.signum = int(signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    @contextlib.contextmanager
    def installed(self, *, restore: bool = True) -> Iterator["StopRequest"]:
        """Handle :data:`STOP_SIGNALS` with this request while inside; the previous handlers come back after
        when ``restore`` (a caller such as a test process keeps its own), else they are ignored from then on.
        A torchrun worker ignores them: its agent sends SIGTERM to the workers still running once one exits,
        and a worker that stopped must exit with its own code, not die of it on its way out (Python resets a
        handler it installed to the default action when it finalizes, but leaves an ignored signal ignored)."""
        if threading.current_thread() is not threading.main_thread():  # Python handles signals there only
            yield self
            return
        previous = {s: signal.signal(s, self._handler) for s in STOP_SIGNALS}
        self.note(early_stop.taken())  # a SIGUSR1 that came while the process started (lenbatch train's first line)
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h if restore else signal.SIG_IGN)


def write_marker(path: Path, *, signal_name: str, step: int) -> None:
    """The stop marker at ``path`` (beside the checkpoint: the signal and the step the run stopped at), whole
    or not at all (the launching shell reads it to requeue the job)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"signal": signal_name, "step": step}) + "\n")
    os.replace(tmp, path)


def read_marker(path: Path) -> Optional[dict[str, Any]]:
    """The stop recorded at ``path`` (``{"signal", "step"}``), None when the run there did not stop on one."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def stop_line(signal_name: str, step: int, checkpoint: Path) -> str:
    """The one log line of a stopped run."""
    return (
        f"stopped on {signal_name} at step {step}, checkpoint written ({checkpoint}); rerun with --resume "
        "to continue from it"
    )


def stop_here(setup: Any, runner: Any, rec: Any, *, done: int, written: bool) -> None:
    """Stop on the signal ``setup.stop`` holds, on the writing rank: the checkpoint of the schedule's first
    ``done`` steps (unless the periodic one was just ``written`` there), the stop marker beside it (``setup.stop_marker``) and one log
    line. No summary: the run is not complete. ``setup``: the train stage's ``RunSetup``; ``rec``: its
    :class:`lenbatch_study.runtime.records.Recorder`."""
    from lenbatch_study.runtime.checkpoint import save_checkpoint

    ck = setup.checkpoint
    if not written:
        save_checkpoint(
            ck,
            runner=runner,
            step=done,
            sampler_states=setup.schedule.sampler_states(done),
            fp=setup.fp,
            log_sha256=rec.log_sha256(),
        )
    rec.close()
    write_marker(setup.stop_marker, signal_name=setup.stop.name, step=done)
    log.warning("%s: %s", setup.strategy, stop_line(setup.stop.name, done, ck))


def agree_stopped(setup: Any, stopped: bool) -> bool:
    """Whether the drafters stopped on a signal, told to every rank (and kept in ``setup.stopped``): one
    all-reduce of one integer over every rank's gloo group (``setup.reference_group``), once per run after the
    last step. A target rank learns of a stop from its credits only while it still has batches to send."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([int(stopped)], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=setup.reference_group)
    setup.stopped = bool(flag.item())
    return setup.stopped


__all__ = [
    "STOPPED_EXIT",
    "STOP_SIGNALS",
    "StopRequest",
    "agree_stopped",
    "read_marker",
    "stop_here",
    "stop_line",
    "write_marker",
]
