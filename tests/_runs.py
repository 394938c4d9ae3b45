"""The study's training-test helpers: the tiny tokenized data the training tests start from, and the checks
every finished pipelined training run must pass (1 target rank -> 1 drafter rank), shared by
tests/stages/test_train.py (its own torchrun runs) and tests/pipeline/test_workflow_e2e.py (the workflow's).
The library's tests must not import this module: it runs the study."""

from __future__ import annotations

import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import yaml

import lenbatch as lb
from _tiny import ENV


def planned_hashes(lengths: np.ndarray, params, strategy: str, edges, steps: list[dict]) -> list[int]:
    """crc32 of the batches the target ranks (``train.nodes x (train.nproc - 1)``) were planned to send, in the
    order the drafters take them (round robin over the ranks: the k-th batch of rank 0, of rank 1, ...), over
    the epochs that ``steps`` span, cut to ``len(steps)``. Each rank's plan is the library's public one."""
    b, t = params.batching, params.train
    ranks = max(1, t.nproc - 1) * getattr(t, "nodes", 1)
    hashes: list[int] = []
    for epoch in sorted({s["epoch"] for s in steps}):
        plans = [
            lb.plan_epoch(
                lengths,
                strategy=strategy,
                epoch=epoch,
                seed=b.seed,
                token_budget=b.token_budget,
                max_batch_size=b.max_batch_size,
                edges=edges if strategy == "bucketed" else None,
                rank=r,
                world_size=ranks,
            )
            for r in range(ranks)
        ]
        for k in range(max(len(p) for p in plans)):
            hashes += [zlib.crc32(np.asarray(p[k], dtype=np.int64).tobytes()) for p in plans if k < len(p)]
    return hashes[: len(steps)]


def check_pipelined_run(
    steps: list[dict],
    summary: dict,
    *,
    strategy: str,
    token_budget: int,
    useful_tokens: int,
    warmup_steps: int,
    planned: list[int],
    target_ranks: int = 1,
) -> None:
    """``planned``: the crc32 of every planned batch, in the order the drafters take them (:func:`planned_hashes`);
    ``target_ranks``: of all nodes (step g comes from rank g mod target_ranks)."""
    useful = np.cumsum([s["useful_tokens"] for s in steps])
    # stops at the first step that reaches train.useful_tokens
    assert useful[-1] >= useful_tokens > (useful[-2] if len(useful) > 1 else 0), strategy
    assert [s["step"] for s in steps] == list(range(len(steps))) and len(steps) >= 3
    assert all(s["rank"] == s["step"] % target_ranks for s in steps)  # round robin over the target ranks
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
    measured = steps[summary["warmup_steps_excluded"] :]
    assert summary["target_cpu_share"] == pytest.approx(
        sum(s["target_cpu_s"] for s in measured) / (sum(s["target_s"] for s in measured) * summary["threads"])
    )
    assert 0 < summary["target_cpu_share"] < 1.5 and 0 < summary["drafter_cpu_share"] < 1.5


def tiny_tokenized(root, settings: dict, *, name: str = "tiny.yaml", timeout: float = 300):
    """``settings`` written as the params file ``root/name`` over the shipped params.yaml, and the first 40
    samples of the embedded data tokenized with it into ``root/tok``: ``(params file, tokenize output)``."""
    repo = Path(__file__).resolve().parents[1]
    params = root / name
    params.write_text(yaml.safe_dump(settings))
    data = root / "tok"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "lenbatch_study",
            "tokenize",
            "--params",
            str(repo / "params.yaml"),
            str(params),
            "--limit",
            "40",
            "--no-progress",
            "--out",
            str(data),
        ],
        check=True,
        env=ENV,
        capture_output=True,
        timeout=timeout,
    )
    return params, data
