"""The target -> drafter transport under NCCL's blocking semantics, emulated on gloo
(``LENBATCH_RENDEZVOUS_P2P=1``): the old protocol hangs in that mode, the new one completes, and
training with 2 target ranks + 1 drafter rank gives the same batches and losses in both modes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import lenbatch as lb
from lenbatch_study.runtime import transport
from lenbatch_study.core.config import load_params

from _tiny import ENV, TINY_DATA, TINY_MODEL

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
TINY3 = {
    "data": TINY_DATA,
    "model": TINY_MODEL,
    "drafter": {"num_layers": 1, "num_heads": 2, "anchors_per_seq": 1},
    "batching": {"token_budget": 1024, "max_batch_size": 8},
    "train": {"nproc": 3, "useful_tokens": 4000, "warmup_steps": 1, "queue_size": 2, "threads": 1, "device": "cpu"},
}


def _protocol(mode: str, rendezvous: bool, steps: int = 12, queue: int = 2) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "3",
        str(HERE / "_p2p_protocols.py"),
        mode,
        str(steps),
        str(queue),
    ]
    env = {**ENV, transport.RENDEZVOUS_ENV: "1" if rendezvous else "0"}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)


def test_old_protocol_hangs_under_rendezvous_semantics_and_the_new_one_completes():
    expected = sum(float(g) * 24 for g in range(12))  # every step's features (2 x 3 x 4 of value g) arrived
    old = _protocol("old", rendezvous=False)
    assert old.returncode == 0 and f"OK {expected}" in old.stdout, old.stderr[-2000:]  # works on eager gloo
    new = _protocol("new", rendezvous=True)
    assert new.returncode == 0 and f"OK {expected}" in new.stdout, new.stderr[-2000:]
    # NCCL's semantics: the drafter's ack send waits for a receive the target posts only `queue`
    # sends later, while the target's next send waits for the drafter: a cycle, ended by the
    # 15 s gloo timeout of the script
    hung = _protocol("old", rendezvous=True)
    assert hung.returncode != 0 and "OK" not in hung.stdout
    assert "Timed out waiting" in hung.stderr, hung.stderr[-2000:]


def test_rendezvous_flag_is_validated(monkeypatch):
    monkeypatch.setenv(transport.RENDEZVOUS_ENV, "yes")
    with pytest.raises(ValueError, match="LENBATCH_RENDEZVOUS_P2P must be 0 or 1"):
        transport.rendezvous_requested()
    monkeypatch.setenv(transport.RENDEZVOUS_ENV, "1")
    assert transport.rendezvous_requested()


def test_settle_synchronizes_cudas_compute_stream_at_the_measured_boundary(monkeypatch):
    # No GPU here: record the call the CUDA path makes (on a GPU, make gpu-check measures it for real).
    # The current (compute) stream, never the device: that would wait for NCCL's sends too (issue 18).
    calls = []

    class Stream:
        def __init__(self, device):
            self.device = device

        def synchronize(self):
            calls.append(self.device)

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream(device))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(("device-wide", device)))
    transport.settle(torch.device("cpu"))
    assert calls == []
    transport.settle(torch.device("cuda", 1))
    assert calls == [torch.device("cuda", 1)]


# --------------------------------------------------------------------------- training, 2 target ranks


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("transport")
    params = root / "tiny3.yaml"
    params.write_text(yaml.safe_dump(TINY3))
    data = root / "tok"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "lenbatch_study",
            "tokenize",
            "--params",
            "params.yaml",
            str(params),
            "--limit",
            "30",
            "--no-progress",
            "--out",
            str(data),
        ],
        check=True,
        env=ENV,
        capture_output=True,
    )
    lengths = np.load(data / "lengths.npy")
    inner = np.quantile(lengths, [0.25, 0.5, 0.75]).astype(int)
    edges = sorted({int(lengths.min()), *inner.tolist(), int(lengths.max()) + 1})
    (root / "boundaries.json").write_text(json.dumps({"method": "test quantiles", "edges": edges}))
    return {"root": root, "params": params, "data": data, "lengths": lengths, "edges": edges}


def _train(setup, strategy: str, rendezvous: bool) -> list[dict]:
    out = setup["root"] / f"{strategy}_{'rdv' if rendezvous else 'normal'}"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "3",
        "-m",
        "lenbatch_study",
        "train",
        "--params",
        "params.yaml",
        str(setup["params"]),
        "--strategy",
        strategy,
        "--data",
        str(setup["data"]),
        "--boundaries",
        str(setup["root"] / "boundaries.json"),
        "--out",
        str(out),
    ]
    env = {**ENV, transport.RENDEZVOUS_ENV: "1" if rendezvous else "0"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]


# a padded layout (with the edges path) and the packed one: the transport sees only shapes, and each run is
# ~30 s on 2 cores (every strategy runs under torchrun in tests/stages/test_train.py and the e2e run)
@pytest.mark.parametrize("strategy", ["bucketed", "packed"])
def test_two_target_ranks_train_the_same_batches_and_losses_under_rendezvous(setup, strategy):
    normal = _train(setup, strategy, rendezvous=False)
    rdv = _train(setup, strategy, rendezvous=True)
    # the planned batches, round-robin over the two target ranks
    b = load_params("params.yaml", str(setup["params"])).batching
    plans = lb.plan_epoch_all(
        setup["lengths"],
        strategy=strategy,
        epoch=0,
        seed=b.seed,
        token_budget=b.token_budget,
        max_batch_size=b.max_batch_size,
        world_size=2,
        packed_window=b.packed_window,
        edges=setup["edges"] if strategy == "bucketed" else None,
    )
    planned = [lb_hash(plans[g % 2][g // 2]) for g in range(len(normal))]
    assert len(normal) >= 4 and all(s["epoch"] == 0 for s in normal)
    assert [s["rank"] for s in normal] == [g % 2 for g in range(len(normal))]
    assert [s["batch_hash"] for s in normal] == planned
    assert [s["batch_hash"] for s in rdv] == planned
    assert [s["loss"] for s in rdv] == [s["loss"] for s in normal]  # bit for bit: same math, other transport
    assert all(np.isfinite(s["loss"]) for s in rdv)


def lb_hash(indices) -> int:
    from lenbatch_study.runtime.records import batch_hash

    return batch_hash(np.asarray(indices, dtype=np.int64))
