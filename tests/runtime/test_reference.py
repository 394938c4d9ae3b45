"""The reference step: a shape every plan can hold, timed per role, and invisible to training (the drafter,
its optimizer and the next step's loss are exactly those of a runner that never timed it)."""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from _tiny import TINY_DATA, TINY_MODEL
from lenbatch_study.core.batchspec import batch_spec
from lenbatch_study.core.config import load_params
from lenbatch_study.runtime import reference
from lenbatch_study.runtime.runner import StepRunner

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _params(tmp_path, max_len: int = TINY_DATA["max_len"], **batching):
    path = tmp_path / "tiny.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "data": {**TINY_DATA, "max_len": max_len},
                "model": TINY_MODEL,
                "batching": {"token_budget": 2048, "max_batch_size": 16, **batching},
            }
        )
    )
    return load_params(REPO / "params.yaml", path)


def test_the_reference_shape_is_an_eighth_of_the_budget_every_plan_can_hold(tmp_path):
    default = load_params(REPO / "params.yaml")
    assert reference.reference_shape(default) == {"layout": "padded", "sequences": 4, "length": 512}
    for max_len, budget, max_bs, want in (
        (1024, 2048, 16, (1, 512)),
        (1024, 49152, 64, (12, 512)),
        (1024, 1024, 4, (1, 512)),
        (1024, 65536, 8, (8, 512)),
        (256, 4096, 16, (2, 256)),
    ):
        p = _params(tmp_path, max_len=max_len, token_budget=budget, max_batch_size=max_bs)
        shape = reference.reference_shape(p)
        assert (shape["sequences"], shape["length"]) == want, (budget, max_bs, shape)
        assert batch_spec(p).fits(shape["sequences"], shape["length"], layout="padded")
    batch = reference.reference_batch(_params(tmp_path))
    assert tuple(batch.input_ids.shape) == (1, 512) and batch.useful_tokens == 512  # no padding


def test_timing_it_leaves_the_drafter_and_the_next_loss_as_without_it(tmp_path):
    """Cost: two tiny runners (the real 248,320-token vocabulary), 8 reference and 2 real steps: ~3 s."""
    p = _params(tmp_path)
    torch.set_num_threads(1)
    timed, plain = StepRunner(p, device="cpu"), StepRunner(p, device="cpu")
    before = {k: v.clone() for k, v in timed.drafter.state_dict().items()}
    waits = []
    point, seconds = reference.measure(timed, p, roles=reference.ROLES, wait=lambda: waits.append(1))
    assert len(waits) == 3  # target's turn, drafter's turn, done: every process calls it three times
    for role in reference.ROLES:
        assert len(point[role]["seconds"]) == reference.REPEATS and min(point[role]["seconds"]) > 0
        assert len(point[role]["cpu_seconds"]) == reference.REPEATS
    assert seconds >= sum(sum(point[r]["seconds"]) for r in reference.ROLES)
    after = timed.drafter.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # no update
    assert not timed.optimizer.state and timed.steps == 0  # AdamW never stepped, the step counter untouched
    assert all(q.grad is None for q in timed.drafter.parameters())  # the probe's gradients are dropped
    batch = reference.reference_batch(p)
    for runner in (timed, plain):
        feats, _ = runner.target_step(batch)
        runner.loss, _ = runner.drafter_step(batch, feats)
    assert timed.loss == plain.loss and not math.isnan(timed.loss)
    # one point of the profile or run: the record keeps both points and their CPU seconds
    end, end_s = reference.measure(timed, p, roles=("drafter",))
    rec = reference.record(p, {"drafter": point["drafter"]}, end, seconds=seconds + end_s)
    assert set(rec) == {"shape", "warmup", "repeats", "seconds", "drafter"}
    assert set(rec["drafter"]) == {"start", "end", "start_cpu", "end_cpu"}
    with pytest.raises(AssertionError):
        reference.record(p, point, end, seconds=0.0)  # the start timed both roles, the end one
