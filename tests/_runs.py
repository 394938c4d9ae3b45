"""The checks every finished pipelined training run must pass (1 target rank -> 1 drafter rank), shared by
tests/stages/test_train.py (its own torchrun runs) and tests/pipeline/test_workflow_e2e.py (the workflow's)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import lenbatch as lb


def planned_hashes(lengths: np.ndarray, params, strategy: str, edges, steps: list[dict]) -> list[int]:
    """crc32 of the batches one target rank (``train.nproc`` 2) was planned to send, over the epochs that
    ``steps`` span, cut to ``len(steps)``."""
    b = params.batching
    hashes: list[int] = []
    for epoch in sorted({s["epoch"] for s in steps}):
        hashes += [zlib.crc32(np.asarray(x, dtype=np.int64).tobytes()) for x in lb.plan_epoch(
            lengths, strategy=strategy, epoch=epoch, seed=b.seed, token_budget=b.token_budget,
            max_batch_size=b.max_batch_size, edges=edges if strategy == "bucketed" else None, rank=0, world_size=1)]
    return hashes[:len(steps)]


def check_pipelined_run(steps: list[dict], summary: dict, *, strategy: str, token_budget: int,
                        useful_tokens: int, warmup_steps: int, planned: list[int]) -> None:
    """``planned``: the crc32 of every planned batch of the one target rank, in order (:func:`planned_hashes`)."""
    useful = np.cumsum([s["useful_tokens"] for s in steps])
    # stops at the first step that reaches train.useful_tokens
    assert useful[-1] >= useful_tokens > (useful[-2] if len(useful) > 1 else 0), strategy
    assert [s["step"] for s in steps] == list(range(len(steps))) and len(steps) >= 3
    assert all(s["rank"] == 0 for s in steps)  # one target rank feeds the drafter rank
    # the drafter trained exactly the planned batches, in order
    assert [s["batch_hash"] for s in steps] == planned, strategy
    for s in steps:
        assert s["computed_tokens"] <= token_budget and np.isfinite(s["loss"]) and s["target_s"] > 0
        # the target rank's CPU seconds travel with its batch (a busy machine shows as a low share)
        assert 0 < s["target_cpu_s"] and 0 < s["drafter_cpu_s"]
        if strategy == "packed":
            assert s["computed_tokens"] == s["useful_tokens"] == s["length"]
        else:
            assert s["computed_tokens"] == s["sequences"] * s["length"] >= s["useful_tokens"]
    assert summary["strategy"] == strategy and summary["steps"] == len(steps)
    assert summary["padding_efficiency"] == pytest.approx(useful[-1] / sum(s["computed_tokens"] for s in steps))
    assert summary["warmup_steps_excluded"] == warmup_steps and summary["useful_tokens_per_s"] > 0
    assert len(summary["loss_curve"]) == len(steps)
    measured = steps[summary["warmup_steps_excluded"]:]
    assert summary["target_cpu_share"] == pytest.approx(
        sum(s["target_cpu_s"] for s in measured) / (sum(s["target_s"] for s in measured) * summary["threads"]))
    assert 0 < summary["target_cpu_share"] < 1.5 and 0 < summary["drafter_cpu_share"] < 1.5
