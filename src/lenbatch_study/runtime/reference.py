"""The reference step: one fixed batch, timed at the start and the end of the profile and of every run.

The profile grid and the training runs are timed minutes (or days) apart, and a machine's speed
drifts in between (other tenants, clocks, memory state): the profile alone moved by up to 4.6%
within one benchmark run. Timing the same step in both lets ``compare`` rescale the profile to the
run's speed (:mod:`lenbatch_study.analysis.calibration`).

Shape (:func:`reference_shape`): a padded batch of ``n`` sequences of ``m`` tokens, no padding,
``m = min(512, data.max_len)`` and ``n = clamp(token_budget // (8 m), 1, max_batch_size)``: an eighth
of the budget (the CPU default: 4 x 512 = 2,048 tokens; a quarter cost twice as much for a reference
that only has to move with the machine), a shape every plan can hold; synthetic token ids drawn with
:data:`REFERENCE_SEED`. Profile and runs share these params (compare checks it, and
refuses references of different shapes).

Each role is timed alone, one after the other: the target's forward (``features``, as a target
step) and the drafter's forward and backward on random features of the batch's shape, *without*
the optimizer update, so the trained drafter, its optimizer state and every loss are exactly those
of a run without the reference. :data:`WARMUP` untimed then :data:`REPEATS` timed steps per role;
the compute stream is synchronized around each timed step (nothing else is in flight then).

Who times it: in the profile, the one process (both roles in turn) or each role worker while the
other waits at the lockstep barrier; in a one-process run, that process; in a pipelined run target
rank 0 (on local device 0, where the profile timed the target) and the drafter rank (on the last
device, where the profile timed the drafter), one after the other while every other rank waits at
a barrier of the gloo control group. Other target ranks run the same code on the same kind of
device and do not time it: timing them all at once would measure their contention with each other,
which the profile never times. It runs before the first step and after the last, outside the
measured window.

Record (``reference`` in ``grid.json`` and ``summary.json``): ``shape``, ``warmup``, ``repeats``,
per timed role ``{"start": [s...], "end": [s...], "start_cpu": [...], "end_cpu": [...]}`` (wall and
process CPU seconds), and ``seconds``: the wall time the reference took in all.

Cost: 2 points x (:data:`WARMUP` + :data:`REPEATS`) steps per role of the reference shape: about
2 x 4 x (0.25 + 0.25) s = 4 s per profile or run on the CPU default (a target and a drafter step of
2,048 tokens take about a quarter second each on one core; benchmarks/bench_prediction.py prints the
measured cost).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import numpy as np
import torch

from lenbatch_study.core.batchspec import batch_spec
from lenbatch_study.core.config import Params
from lenbatch.loading.collate import Batch, collate
from lenbatch_study.runtime.synthetic import synthetic_sequences

REFERENCE_LENGTH = 512  # tokens per sequence (at most data.max_len)
BUDGET_SHARE = 8  # the batch holds token_budget // BUDGET_SHARE tokens (rounded down to whole sequences)
REFERENCE_SEED = 20_251_130
WARMUP = 1
REPEATS = 3
ROLES = ("target", "drafter")


def reference_shape(params: Params) -> dict[str, Any]:
    """``{"layout": "padded", "sequences": n, "length": m}`` of the reference batch (module doc)."""
    m = min(REFERENCE_LENGTH, params.data.max_len, params.batching.token_budget)
    n = max(1, min(params.batching.max_batch_size, params.batching.token_budget // (BUDGET_SHARE * m)))
    return {"layout": "padded", "sequences": int(n), "length": int(m)}


def reference_batch(params: Params) -> Batch:
    """The reference batch: ``sequences`` synthetic samples of ``length`` tokens, padded layout."""
    shape = reference_shape(params)
    seqs = synthetic_sequences(
        np.full(shape["sequences"], shape["length"]), vocab_size=params.model.vocab_size, seed=REFERENCE_SEED
    )
    return collate(seqs, layout="padded", spec=batch_spec(params))


def reference_features(params: Params, batch: Batch, device: torch.device) -> torch.Tensor:
    """Random target features ``[n, m, layers x hidden]`` in ``model.dtype`` (the drafter's cost does not
    depend on their values), drawn with :data:`REFERENCE_SEED`."""
    from lenbatch_study.models.target import DTYPES

    fdim = len(params.model.target_layers) * params.model.hidden_size
    gen = torch.Generator().manual_seed(REFERENCE_SEED)
    return torch.randn(*batch.input_ids.shape, fdim, generator=gen).to(DTYPES[params.model.dtype]).to(device)


def _settle(device: torch.device) -> None:
    """Wait for the reference's own work: the compute stream only (never device-wide on a target rank,
    DESIGN.md's NCCL rule; nothing else of this process is queued on the compute stream then)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def _target_once(runner: Any, batch: Batch) -> None:
    runner.target.features(batch.input_ids, attention_mask=batch.attention_mask)


def _drafter_once(runner: Any, batch: Batch, features: torch.Tensor) -> None:
    """The drafter step's forward and backward (:meth:`lenbatch_study.runtime.runner.StepRunner.drafter_step`)
    without clipping or the optimizer update; the gradients are dropped."""
    p = runner.params
    anchors, valid = runner.drafter.anchors_for(
        batch, anchors_per_seq=p.drafter.anchors_per_seq, seed=p.batching.seed, epoch=0, step=0
    )
    with torch.autocast(runner.device.type, dtype=runner.compute_dtype, enabled=runner.compute_dtype != torch.float32):
        out = runner.drafter(features, batch, anchors, valid, embed_tokens=runner.embed_tokens, lm_head=runner.lm_head)
    out.loss.backward()
    runner.drafter.zero_grad(set_to_none=True)


def time_role(
    runner: Any,
    role: str,
    batch: Batch,
    features: Optional[torch.Tensor],
    *,
    warmup: int = WARMUP,
    repeats: int = REPEATS,
) -> tuple[list[float], list[float]]:
    """Wall and process CPU seconds of ``repeats`` reference steps of ``role`` after ``warmup`` untimed ones."""
    assert role in ROLES, role
    assert (runner.target if role == "target" else runner.drafter) is not None, f"this runner has no {role}"
    secs, cpus = [], []
    for i in range(warmup + repeats):
        _settle(runner.device)
        t0, c0 = time.perf_counter(), time.process_time()
        if role == "target":
            _target_once(runner, batch)
        else:
            _drafter_once(runner, batch, features)
        _settle(runner.device)
        if i >= warmup:
            secs.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
    return secs, cpus


def measure(
    runner: Any, params: Params, *, roles: tuple[str, ...], wait: Optional[Callable[[], Any]] = None
) -> tuple[dict[str, dict[str, list[float]]], float]:
    """One reference point: ``({role: {"seconds": [...], "cpu_seconds": [...]}}`` for each of ``roles``
    this process times, the wall seconds the point added)``.

    ``wait`` (a barrier shared by every process of the run or profile): the roles take turns, target
    first, each alone: ``wait(); target times; wait(); drafter times; wait()``, every process calling
    ``wait`` three times whatever it times (``roles=()`` for one that only waits). The seconds count
    from the first barrier on (time spent waiting for another process to arrive is not the reference's).
    Without ``wait`` this process times its ``roles`` in turn."""
    batch = reference_batch(params).to(runner.device)
    feats = reference_features(params, batch, runner.device) if "drafter" in roles else None
    out: dict[str, dict[str, list[float]]] = {}
    t0 = None
    for role in ROLES:
        if wait is not None:
            wait()
        t0 = time.perf_counter() if t0 is None else t0
        if role in roles:
            secs, cpus = time_role(runner, role, batch, feats)
            out[role] = {"seconds": secs, "cpu_seconds": cpus}
    if wait is not None:
        wait()
    return out, time.perf_counter() - t0


def record(
    params: Params, start: dict[str, dict[str, list[float]]], end: dict[str, dict[str, list[float]]], *, seconds: float
) -> dict[str, Any]:
    """The ``reference`` entry of grid.json / summary.json from the start and end points (module doc);
    ``seconds``: the wall time both points added (:func:`measure`'s second value, summed)."""
    assert set(start) == set(end), (sorted(start), sorted(end))
    rec: dict[str, Any] = {
        "shape": reference_shape(params),
        "warmup": WARMUP,
        "repeats": REPEATS,
        "seconds": round(float(seconds), 6),
    }
    for role in ROLES:
        if role in start:
            rec[role] = {
                "start": [round(x, 6) for x in start[role]["seconds"]],
                "end": [round(x, 6) for x in end[role]["seconds"]],
                "start_cpu": [round(x, 6) for x in start[role]["cpu_seconds"]],
                "end_cpu": [round(x, 6) for x in end[role]["cpu_seconds"]],
            }
    return rec


__all__ = ["REPEATS", "WARMUP", "measure", "record", "reference_batch", "reference_shape", "time_role"]
