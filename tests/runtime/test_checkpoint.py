"""Checkpoints load with torch.load(weights_only=True) (issue 19): a crafted checkpoint.pt cannot run code on
--resume, an older format is refused with the fix, and what a checkpoint holds (drafter, optimizer, sampler
states, torch/numpy/python RNG states) survives the round trip. (~1 s; the resume runs are in
tests/stages/test_train.py.)"""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lenbatch_study.runtime.checkpoint import FORMAT, load_checkpoint, restore, save_checkpoint

FP = {
    "strategy": "packed",
    "target_ranks": 1,
    "edges": None,
    "lengths_sha256": "ab" * 32,
    "model": {"hidden_size": 8, "layer_types": ["linear_attention"]},
    "drafter": {"lr": 0.001},
    "batching": {"token_budget": 64, "seed": 0},
}


def _runner(seed: int) -> SimpleNamespace:
    """What save_checkpoint reads of a StepRunner: a drafter module and its optimizer, after one step."""
    torch.manual_seed(seed)
    drafter = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-2, betas=(0.9, 0.95))
    drafter(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return SimpleNamespace(drafter=drafter, optimizer=optimizer, steps=1)


class _Payload:
    """Unpickling this calls open(marker, "w"): code from the file, run by pickle."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def test_a_crafted_checkpoint_does_not_run_its_payload_and_the_error_names_the_file(tmp_path):
    marker = tmp_path / "payload-ran"
    path = tmp_path / "out" / "checkpoint.pt"
    path.parent.mkdir()
    torch.save({"format": FORMAT, "step": 1, "drafter": _Payload(marker)}, path)
    torch.load(path, weights_only=False)  # the payload is real: a plain unpickle runs it
    assert marker.exists()
    marker.unlink()
    with pytest.raises(
        ValueError,
        match=rf"checkpoint {path} holds more than tensors and plain values "
        r"\(.*GLOBAL (io|builtins)\.open\).*does not unpickle it.*run without --resume",
    ):
        load_checkpoint(path, FP, total_steps=10, checkpoint_every=1)
    assert not marker.exists()


def test_a_format_2_checkpoint_is_refused_with_the_fix(tmp_path):
    """lenbatch's previous format pickled numpy's RNG state as an ndarray: refused, not unpickled."""
    runner = _runner(0)
    path = tmp_path / "checkpoint.pt"
    torch.save(
        {
            "format": 2,
            "fingerprint": FP,
            "step": 1,
            "log_sha256": "",
            "drafter": runner.drafter.state_dict(),
            "optimizer": runner.optimizer.state_dict(),
            "samplers": [],
            "torch_rng": torch.random.get_rng_state(),
            "numpy_rng": np.random.get_state(),
            "python_rng": random.getstate(),
        },
        path,
    )
    with pytest.raises(
        ValueError,
        match=r"holds more than tensors and plain values \(.*numpy.*\): it was written "
        r"by another program or by lenbatch before checkpoint format 3",
    ):
        load_checkpoint(path, FP, total_steps=10, checkpoint_every=1)


def test_what_a_checkpoint_holds_survives_a_weights_only_round_trip(tmp_path):
    runner = _runner(0)
    np.random.seed(5)
    np.random.normal()  # a cached Gaussian in numpy's state, too
    random.seed(6)
    torch.manual_seed(7)
    samplers = [
        {"version": 1, "epoch": 2, "position": 3, "world_size": 1, "rank": 0, "fingerprint": "f", "strategy": "packed"}
    ]
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, runner=runner, step=1, sampler_states=samplers, fp=FP, log_sha256="d" * 64)
    expected = (np.random.normal(size=3), np.random.randint(0, 1 << 30, size=3), random.random(), torch.rand(3))
    np.random.seed(0), random.seed(0), torch.manual_seed(0)  # noqa: B018 (scramble all three)

    state = load_checkpoint(path, FP, total_steps=10, checkpoint_every=1)
    assert state["format"] == FORMAT == 3 and state["samplers"] == samplers and state["fingerprint"] == FP
    other = _runner(1)
    restore(other, state)
    got = (np.random.normal(size=3), np.random.randint(0, 1 << 30, size=3), random.random(), torch.rand(3))
    assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
    assert got[2] == expected[2] and torch.equal(got[3], expected[3])
    for a, b in zip(other.drafter.parameters(), runner.drafter.parameters()):
        assert torch.equal(a, b)
    assert other.optimizer.state_dict()["param_groups"][0]["betas"] == (0.9, 0.95)
    assert all(
        torch.equal(other.optimizer.state_dict()["state"][k]["exp_avg"], v["exp_avg"])
        for k, v in runner.optimizer.state_dict()["state"].items()
    )
    assert other.steps == 1
