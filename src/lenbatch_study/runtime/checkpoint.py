"""Train checkpoints and the run that owns a train output directory.

``checkpoint.pt`` (written to ``checkpoint.pt.tmp``, fsynced, then renamed over it, so a kill or a full
disk during the save leaves the previous one; a refused write removes the temp file and raises a
``ValueError`` naming the path and the rerun) holds the drafter,
the optimizer, every target rank's sampler state, the step counter, RNG states, a fingerprint of
the params (:func:`fingerprint`: what a resumed run must share with the run that wrote it) and
``log_sha256``: the SHA-256 of the ``steps.jsonl`` lines of the steps it covers. That digest ties a
checkpoint to the log it extends: ``--resume`` continues only when ``steps.jsonl`` holds exactly the
rows ``0 .. step-1`` that were written beside that checkpoint (so an older run's checkpoint is never
resumed under a newer run's log, which used to lose the steps in between with exit code 0).

Across nodes (``train.nodes > 1``) node 0's drafter writes and reads it; on resume it sends the restored
checkpoint to the other drafters (:meth:`lenbatch_study.runtime.transport.DrafterGroup.broadcast`), so every
drafter continues from the same weights, optimizer and RNG state.

It holds only tensors and plain values (dicts, lists, tuples, str, int, float, bool, None: numpy's RNG
state is stored as a tensor), so it is read with ``torch.load(..., weights_only=True)``: a
``checkpoint.pt`` someone else wrote (a shared results folder, a copied experiment) cannot run code
on ``--resume``. A file holding anything else -- a crafted pickle, or a checkpoint of format 2
(an older format, with numpy's RNG state pickled as an ndarray) -- is refused with an error
naming it, before any object but those is built. Format 2 could be loaded by allow-listing numpy's array
reconstruction, but a checkpoint only resumes the run that wrote it: rerunning that run afresh costs
less than widening what ``--resume`` unpickles.

A fresh run (no ``--resume``) owns its directory from its first step: :func:`start_fresh` removes
the previous run's ``checkpoint.pt``, ``summary.json``, ``params.json`` and ``steps.jsonl`` before
it trains, so a killed fresh run never leaves an older complete-looking summary beside it, and a later
``--resume`` cannot pick up the older checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import pickle
import random
from pathlib import Path
from typing import Any, Iterable, Optional

import numpy as np
import torch

from lenbatch_study.core.config import Params
from lenbatch_study.core.machine import changed_fields

FORMAT = 3  # 2: log_sha256 ties the checkpoint to its steps.jsonl; 3: tensors and plain values only (weights_only)
# a write the file system refused (full, over quota, file too large, read-only, not permitted, I/O error)
REFUSED_WRITE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO)


def fingerprint(
    params: Params, *, strategy: str, edges: Optional[tuple[int, ...]], lengths: np.ndarray, target_ranks: int
) -> dict[str, Any]:
    """What a resumed run must share with the run that wrote the checkpoint (plan, model, drafter).

    train.useful_tokens, --max-steps, queue_size, threads and checkpoint_every may change on resume.
    ``train.nodes`` may not (above 1 it groups the steps into the drafters' updates), and is recorded only
    then, so a one-node checkpoint stays what it was. ``train.nproc`` (the run's shape with the nodes) may not
    either: ``nproc`` 1 and 2 plan the same steps, but their steps are timed differently (one process, or a
    pipeline), and one run's throughput cannot mix them (:func:`check_fingerprint` refuses such a resume).
    """
    p = params.to_dict()
    nodes = {"nodes": p["train"]["nodes"]} if p["train"]["nodes"] > 1 else {}
    return {
        "strategy": strategy,
        "target_ranks": target_ranks,
        "edges": list(edges) if edges else None,
        "lengths_sha256": hashlib.sha256(np.ascontiguousarray(lengths, dtype=np.int64).tobytes()).hexdigest(),
        "model": p["model"],
        "drafter": p["drafter"],
        "batching": p["batching"],
        **nodes,
        "nproc": p["train"]["nproc"],
    }


class RunShapeError(ValueError):
    """A resume with another ``train.nproc`` or ``train.nodes`` than the checkpoint's run: refused before any
    step, never set aside (the checkpoint is good; the setting is the mistake)."""


def shape_of(fp: dict[str, Any]) -> Optional[tuple[int, int]]:
    """(``train.nproc``, ``train.nodes``) a fingerprint records; None for a checkpoint written before it
    recorded ``nproc``."""
    return None if fp.get("nproc") is None else (int(fp["nproc"]), int(fp.get("nodes", 1)))


def check_shape(saved: dict[str, Any], current: dict[str, Any], path: Path, *, work: Path, final: Path) -> None:
    """:class:`RunShapeError` naming the settings and both ways out when the run that wrote the checkpoint at
    ``path`` had another shape than this one (``work``: the folder it is in; ``final``: the ``--out``)."""
    was, now = shape_of(saved), shape_of(current)
    if was is None or now is None or was == now:
        return
    afresh = (
        "rerun without --resume"
        if work == final
        else f"remove {work} (the interrupted run's folder; {final} is not touched), then rerun without --resume"
    )
    raise RunShapeError(
        f"--resume: checkpoint {path} was trained with train.nproc={was[0]}, train.nodes={was[1]} "
        f"but this run has train.nproc={now[0]}, train.nodes={now[1]}: its steps were timed in "
        f"another shape, and one run's throughput cannot mix them; resume with train.nproc: {was[0]} "
        f"and train.nodes: {was[1]}, or to train afresh {afresh}"
    )


def check_fingerprint(saved: dict[str, Any], current: dict[str, Any], path: Path) -> None:
    if shape_of(saved) is None:  # written before nproc was recorded: compare what it has
        current = {k: v for k, v in current.items() if k != "nproc"}
    diff = changed_fields(saved, current)
    if diff:
        shown = ", ".join(diff[:6])
        raise ValueError(
            f"checkpoint {path} was written with other params ({shown}); resume with the params it "
            "was written with, or start afresh without --resume (or with another --out)"
        )


def start_fresh(out: Path, files: Iterable[str]) -> None:
    """A new run takes ``out`` over: the previous run's ``files`` (checkpoint, summary, params and log:
    :data:`lenbatch_study.pipeline.artifacts.train_runs.RUN_FILES`) go first."""
    for name in files:
        (out / name).unlink(missing_ok=True)


def save_checkpoint(
    path: Path, *, runner: Any, step: int, sampler_states: list[Any], fp: dict[str, Any], log_sha256: str
) -> None:
    """Durable atomic write: ``checkpoint.pt.tmp``, fsynced, renamed over ``path``, the folder fsynced. A kill
    during the save leaves the previous checkpoint; so does a write the file system refuses (a full disk,
    ``ulimit -f``): the temp file is removed and a ``ValueError`` names ``path``, what is kept and the
    rerun. Cost: one serialisation of the state and two fsyncs.

    ``runner``: a :class:`lenbatch_study.runtime.runner.StepRunner` with its drafter and optimizer; ``log_sha256``: the
    digest of the ``steps.jsonl`` lines of steps ``0 .. step-1``.
    """
    assert runner.drafter is not None and runner.optimizer is not None
    state = {
        "format": FORMAT,
        "fingerprint": fp,
        "step": step,
        "log_sha256": log_sha256,
        "drafter": runner.drafter.state_dict(),
        "optimizer": runner.optimizer.state_dict(),
        "samplers": sampler_states,
        "torch_rng": torch.random.get_rng_state(),
        "numpy_rng": _numpy_rng_state(),
        "python_rng": random.getstate(),
    }
    tmp = path.with_suffix(".pt.tmp")
    try:
        with open(tmp, "wb") as fh:  # a file object, so a failed write surfaces as its OSError
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as err:
        refused = _refused_write(err)
        if refused is None:
            raise
        with contextlib.suppress(OSError):
            tmp.unlink()
        fix = {
            errno.EFBIG: "raise the file size limit (ulimit -f)",
            errno.EIO: "check the disk",
            errno.ENOSPC: "free space",
            errno.EDQUOT: "free space",
        }.get(refused.errno or 0, f"make {path.parent} writable")
        kept = (
            f"the previous checkpoint {path} is kept: {fix}, then rerun with --resume to continue from it"
            if path.exists()
            else f"no earlier checkpoint of this run exists at {path}: {fix}, then rerun"
        )
        raise ValueError(
            f"could not write the checkpoint of step {step} to {tmp} ({refused.strerror or refused}); {kept}"
        ) from None
    with contextlib.suppress(OSError):  # the rename durable too (some file systems refuse a folder fsync)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _refused_write(err: BaseException) -> Optional[OSError]:
    """The refused-write ``OSError`` behind ``err`` (itself, or its cause or context: torch.save wraps the
    file object's failed ``write`` in a ``RuntimeError``), None when ``err`` is something else (a bug)."""
    seen: set[int] = set()
    cur: Optional[BaseException] = err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in REFUSED_WRITE:
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


def summary_problem(path: Path) -> Optional[str]:
    """Why the run summary at ``path`` is not a finished run's (``"<path> is missing"``, ``"<path> is not
    valid JSON ..."``), None when it is a JSON mapping. O(file size)."""
    if not path.exists():
        return f"{path} is missing"
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        return f"{path} is not valid JSON (torn: {err})"
    return None if isinstance(doc, dict) else f"{path} holds {type(doc).__name__}, not a summary"


def peek_fingerprint(path: Path) -> Optional[dict[str, Any]]:
    """The fingerprint of the checkpoint at ``path`` without reading its tensors (memory-mapped), None when
    there is none or it cannot be read that way (:func:`load_checkpoint` then says why)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # missing, torn, another format: load_checkpoint reports it with the fix
        return None
    fp = state.get("fingerprint") if isinstance(state, dict) else None
    return fp if isinstance(fp, dict) else None


def load_checkpoint(
    path: Path, fp: dict[str, Any], *, total_steps: int, checkpoint_every: int, final: Optional[Path] = None
) -> dict[str, Any]:
    """The checkpoint at ``path``, checked: readable, this format, this run's shape (:func:`check_shape`:
    ``final`` is the run's ``--out``), these params, inside this schedule.

    ``total_steps``: the steps this run plans (``train.useful_tokens`` / ``--max-steps``); a checkpoint
    past them is refused rather than rewritten as an earlier step.
    """
    if not path.exists():
        why = (
            " train.checkpoint_every is 0, so a run saves its checkpoint only when it finishes: a run killed "
            "before that cannot be resumed; set train.checkpoint_every > 0 for that."
            if checkpoint_every == 0
            else ""
        )
        raise ValueError(f"--resume: no checkpoint at {path}.{why} Run without --resume to start afresh")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "weights only" not in str(err).lower():
            raise ValueError(
                f"checkpoint {path} cannot be read ({type(err).__name__}: {str(err)[:80]}); delete it "
                "and run without --resume to start afresh"
            ) from None
        found = next(
            (
                line.strip().split(" was not an allowed")[0]
                for line in str(err).splitlines()
                if "Unsupported global" in line
            ),
            "",
        )
        raise ValueError(
            f"checkpoint {path} holds more than tensors and plain values ({found or 'see torch.load'}): "
            "it was written by another program or by lenbatch before checkpoint format 3, and lenbatch "
            "does not unpickle it (that could run code); delete it and run without --resume to start "
            "afresh"
        ) from None
    except Exception as err:  # truncated or corrupt file: torch/pickle raise many types
        raise ValueError(
            f"checkpoint {path} cannot be read ({type(err).__name__}: {str(err)[:80]}); delete it and "
            "run without --resume to start afresh"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        got = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(
            f"checkpoint {path} has format {got!r}, this lenbatch writes {FORMAT}; run without --resume to start afresh"
        )
    check_shape(state["fingerprint"], fp, path, work=path.parent, final=final or path.parent)
    check_fingerprint(state["fingerprint"], fp, path)
    step = int(state["step"])
    if step > total_steps:
        raise ValueError(
            f"checkpoint {path} is at step {step} but this run plans only {total_steps} steps "
            "(train.useful_tokens / --useful-tokens / --max-steps): resuming would rewrite it as an "
            f"earlier step; resume with a target of at least {step} steps, or start afresh without "
            "--resume (or with another --out)"
        )
    return state


def check_log(path: Path, state: dict[str, Any], steps: list[int], digest: str) -> None:
    """``steps.jsonl`` must hold exactly the rows the checkpoint covers, as written beside it."""
    step = int(state["step"])
    if steps != list(range(step)) or digest != state["log_sha256"]:
        raise ValueError(
            f"{path} does not belong to the checkpoint beside it (checkpoint at step {step}, log with "
            f"{len(steps)} rows up to there): another run wrote one of them; run without --resume to "
            "start afresh"
        )


def restore(runner: Any, state: dict[str, Any], *, path: Optional[Path] = None) -> None:
    """Load ``state`` (read from ``path``, named in the error) into ``runner`` after checking that every
    tensor fits: a checkpoint whose fingerprint matches but whose tensors do not (a drafter built by other
    code) raises ``ValueError`` before anything is loaded, so a run that then starts afresh starts from
    untouched weights."""
    assert runner.drafter is not None and runner.optimizer is not None
    check_tensors(runner, state, path)
    runner.drafter.load_state_dict(state["drafter"])
    runner.optimizer.load_state_dict(state["optimizer"])
    runner.steps = int(state["step"])
    torch.random.set_rng_state(state["torch_rng"])
    _set_numpy_rng_state(state["numpy_rng"])
    random.setstate(state["python_rng"])


def check_tensors(runner: Any, state: dict[str, Any], path: Optional[Path]) -> None:
    """``ValueError`` naming ``path`` unless the checkpoint's drafter tensors have this drafter's names and
    shapes and its optimizer state matches this optimizer's parameters (groups, sizes, per-parameter
    state shapes). Reads only; O(parameters)."""
    mine = runner.drafter.state_dict()
    saved = state.get("drafter")
    problems: list[str] = []
    if not isinstance(saved, dict):
        problems.append("no drafter tensors")
    else:
        missing = sorted(set(mine) - set(saved))
        extra = sorted(set(saved) - set(mine))
        if missing:
            problems.append(f"lacks {', '.join(missing[:3])}")
        if extra:
            problems.append(f"has unknown {', '.join(extra[:3])}")
        for name in sorted(set(mine) & set(saved)):
            theirs = saved[name]
            if not isinstance(theirs, torch.Tensor) or tuple(theirs.shape) != tuple(mine[name].shape):
                got = tuple(theirs.shape) if isinstance(theirs, torch.Tensor) else type(theirs).__name__
                problems.append(f"{name} is {got}, this drafter's is {tuple(mine[name].shape)}")
                break
    opt = state.get("optimizer")
    groups = runner.optimizer.param_groups
    if not isinstance(opt, dict) or [len(g.get("params", ())) for g in opt.get("param_groups", ())] != [
        len(g["params"]) for g in groups
    ]:
        problems.append("its optimizer has other parameter groups")
    else:
        params = [p for g in groups for p in g["params"]]
        ids = [i for g in opt["param_groups"] for i in g["params"]]
        for i, p in zip(ids, params):
            for key, value in (opt.get("state", {}).get(i) or {}).items():
                if isinstance(value, torch.Tensor) and value.dim() > 0 and tuple(value.shape) != tuple(p.shape):
                    problems.append(
                        f"optimizer state {key!r} is {tuple(value.shape)} for a parameter of {tuple(p.shape)}"
                    )
                    break
    if problems:
        named = f"checkpoint {path}" if path is not None else "the checkpoint"
        raise ValueError(
            f"{named} does not fit this drafter ({'; '.join(problems[:3])}): it was written by other "
            "code with the same params; run without --resume to start afresh"
        )


def _numpy_rng_state() -> dict[str, Any]:
    """numpy's global RNG state with its key array as an int64 tensor (an ndarray needs unpickling code)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "bit_generator": str(name),
        "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }


def _set_numpy_rng_state(state: dict[str, Any]) -> None:
    np.random.set_state(
        (
            state["bit_generator"],
            state["keys"].numpy().astype(np.uint32),
            state["pos"],
            state["has_gauss"],
            state["cached_gaussian"],
        )
    )


__all__ = [
    "RunShapeError",
    "check_fingerprint",
    "check_log",
    "check_shape",
    "check_tensors",
    "fingerprint",
    "load_checkpoint",
    "peek_fingerprint",
    "restore",
    "save_checkpoint",
    "shape_of",
    "start_fresh",
    "summary_problem",
]
