"""Where a training run writes, and how it resumes: the partial folder, the checkpoint a resume continues
(checked, or set aside when it cannot be resumed) and the resume point every rank is told.

``setup``: the train stage's ``RunSetup`` (:mod:`lenbatch_study.stages.train`: params, schedule, out, rank...,
and the paths of the run's files in ``out``: ``checkpoint``, ``summary``, ``steps_log``, ``run_files``);
``runner``: a :class:`lenbatch_study.runtime.runner.StepRunner` with its drafter.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Optional

from lenbatch_study.core.log import get_logger
from lenbatch_study.runtime.checkpoint import (
    RunShapeError,
    check_shape,
    load_checkpoint,
    peek_fingerprint,
    restore,
    start_fresh,
    summary_problem,
)
from lenbatch_study.runtime.records import resumed_log

log = get_logger("train")


def partial_dir(out: Path) -> Path:
    """Where a fresh run of ``--out out`` trains until it is complete (then swapped into ``out``)."""
    return out.parent / f".{out.name}.partial"


def set_aside_and_start_afresh(setup: Any, err: ValueError) -> None:
    """Rename the checkpoint that cannot be resumed beside OUT (named in the log) and make ``setup`` a fresh
    run in the partial folder: the previous complete output stays until the new one is whole."""
    final = setup.final or setup.out
    ck = setup.checkpoint
    aside = final.parent / f"{final.name}.set-aside-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.pt"
    os.replace(ck, aside)
    log.warning("%s: cannot resume: %s. Set %s aside as %s; training afresh", setup.strategy, err, ck, aside)
    setup.out = partial_dir(final)
    setup.out.mkdir(exist_ok=True)
    start_fresh(setup.out, setup.run_files)
    setup.resume = False


def resume_point(
    setup: Any, runner: Any
) -> tuple[int, Optional[list[Any]], Optional[list[str]], Optional[dict[str, Any]]]:
    """(start step, sampler states, kept log lines, checkpoint) of a resume on the writing rank, with ``runner``
    restored; (0, None, None, None) after setting aside a checkpoint it cannot resume. No checkpoint at all
    stays an error."""
    try:
        ck = load_run_checkpoint(setup)
        kept = resumed_log(setup.steps_log, ck)
        setup.schedule.check_sampler_states(ck["samplers"], int(ck["step"]))
        torn = summary_problem(setup.summary) if int(ck["step"]) >= len(setup.schedule) else None
        if torn:
            raise ValueError(
                f"it is at the last planned step but {torn} (the run was killed before writing it), "
                "so its throughput was never recorded"
            )
        restore(runner, ck, path=setup.checkpoint)  # checks every tensor fits before loading one
    except RunShapeError:  # the checkpoint is good, the setting is the mistake: refused, never set aside
        raise
    except ValueError as err:
        if not setup.checkpoint.exists():
            raise
        set_aside_and_start_afresh(setup, err)
        return 0, None, None, None
    return int(ck["step"]), ck["samplers"], kept, ck


def load_run_checkpoint(setup: Any) -> dict[str, Any]:
    return load_checkpoint(
        setup.checkpoint,
        setup.fp,
        total_steps=len(setup.schedule),
        checkpoint_every=setup.params.train.checkpoint_every,
        final=setup.final,
    )


def check_resume_shape(out: Path, params: Any, *, checkpoint: str) -> None:
    """Before anything starts (torchrun included): :class:`lenbatch_study.runtime.checkpoint.RunShapeError` when
    the checkpoint a ``--resume`` of ``--out out`` would continue (``checkpoint``: its file name; in the partial
    folder when it holds one, else in ``out``) was trained with another ``train.nproc`` or ``train.nodes`` than
    ``params``. Reads only the checkpoint's fingerprint (memory-mapped)."""
    out = Path(out)
    work = partial_dir(out) if (partial_dir(out) / checkpoint).exists() else out
    saved = peek_fingerprint(work / checkpoint)
    if saved is not None:
        check_shape(
            saved, {"nproc": params.train.nproc, "nodes": params.train.nodes}, work / checkpoint, work=work, final=out
        )


def share_resume(setup: Any, runner: Optional[Any]) -> tuple[int, Optional[list[Any]], Optional[list[str]]]:
    """The writing drafter rank (node 0's) loads and checks the checkpoint and the log it extends, and tells
    every rank the start step and sampler states; on several nodes it sends the restored state to the other
    drafters, so every drafter resumes the same weights. Returns (start, sampler states, kept log lines on
    the writing rank)."""
    import torch.distributed as dist

    drafter_rank = setup.params.train.nproc - 1  # node 0's drafter (the only one with one node)
    if not setup.resume:
        return 0, None, None
    payload: list[Any] = [None]
    kept, ck = None, None
    if setup.rank == drafter_rank:
        try:
            assert runner is not None
            step, samplers, kept, ck = resume_point(setup, runner)
            payload = [{"step": step, "samplers": samplers}]
        except ValueError as err:
            payload = [{"error": str(err)}]
    dist.broadcast_object_list(payload, src=drafter_rank)
    if "error" in payload[0]:
        raise ValueError(payload[0]["error"])
    if setup.drafters is not None and runner is not None:  # the drafters: node 0's restored state to all
        ck = setup.drafters.broadcast(ck)
        if ck is not None and setup.rank != drafter_rank:
            restore(runner, ck)
    return payload[0]["step"], payload[0]["samplers"], kept


__all__ = [
    "check_resume_shape",
    "load_run_checkpoint",
    "partial_dir",
    "resume_point",
    "set_aside_and_start_afresh",
    "share_resume",
]
