"""Training across nodes (train.nodes): two torchrun "nodes" on this machine (c10d rendezvous on loopback) train
one drafter data-parallel; the same params emulated by one torchrun of 4 processes give the same losses; a
checkpoint and --resume on two nodes replays the same batches and losses; and the pieces that make it so (the
cluster steps, the roles, the token-weighted gradient all-reduce, the weight checksum)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from lenbatch_study.runtime.schedule import ScheduledStep, build_schedule, cluster_steps
from lenbatch_study.core.config import load_params
from lenbatch_study.runtime.records import batch_hash
from lenbatch_study.runtime.transport import weights_checksum

from _runs import tiny_tokenized
from _tiny import ENV, TINY_DATA, TINY_MODEL

NODES, NPROC = 2, 2
TINY = {
    "data": TINY_DATA,
    "model": TINY_MODEL,
    "drafter": {"num_layers": 1, "num_heads": 2, "anchors_per_seq": 1},
    "batching": {"token_budget": 2048, "max_batch_size": 8},
    "train": {
        "nproc": NPROC,
        "nodes": NODES,
        "useful_tokens": 7000,
        "warmup_steps": 1,
        "queue_size": 2,
        "threads": 1,
        "device": "cpu",
    },
}
STRATEGY = "random"
RUN_TIMEOUT = 300  # seconds per torchrun (a run takes ~40 s on 2 busy cores)


# --------------------------------------------------------------------------- the pieces (fast)


def _steps(n: int, ranks: int) -> list[ScheduledStep]:
    return [ScheduledStep(g, 0, g % ranks, g // ranks, np.array([g]), 1) for g in range(n)]


def test_cluster_steps_give_each_node_its_own_target_ranks_steps_in_order():
    # 2 nodes x 2 target ranks: global target ranks 0, 1 on node 0 and 2, 3 on node 1; a stop inside a round
    clusters = cluster_steps(_steps(9, 4), nodes=2, ranks_per_node=2)
    assert [[None if s is None else s.step for s in c] for c in clusters] == [[0, 2], [1, 3], [4, 6], [5, 7], [8, None]]
    # one node: the schedule itself, one step per cluster step
    assert [c[0].step for c in cluster_steps(_steps(5, 3), nodes=1, ranks_per_node=3)] == list(range(5))


def test_roles_come_from_the_global_rank():
    from lenbatch_study.stages.train import Roles

    roles = [Roles(rank=r, nproc=3, nodes=2) for r in range(6)]
    assert [r.is_drafter for r in roles] == [False, False, True, False, False, True]
    assert [r.node for r in roles] == [0, 0, 0, 1, 1, 1]
    assert [r.target_index for r in roles if not r.is_drafter] == [0, 1, 2, 3]
    assert [r.drafter_process for r in roles] == [2, 2, 2, 5, 5, 5]
    assert [roles[0].target_process(t) for t in range(4)] == [0, 1, 3, 4]
    assert [r.writes for r in roles] == [False, False, True, False, False, False]
    assert roles[0].drafter_ranks == [2, 5]


def test_several_nodes_need_a_target_and_a_drafter_rank_each(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"train": {"nodes": 2, "nproc": 1}}))
    with pytest.raises(ValueError, match="train.nproc >= 2"):
        load_params("params.yaml", str(bad))


def test_the_weight_checksum_sees_one_changed_weight():
    lin = torch.nn.Linear(8, 4)
    before = weights_checksum(lin)
    assert weights_checksum(lin) == before
    with torch.no_grad():
        lin.weight[2, 3] = torch.nextafter(lin.weight[2, 3], torch.tensor(10.0))  # one ulp
    assert weights_checksum(lin) != before


def test_the_token_weighted_all_reduce_gives_the_gradient_of_one_big_batch(tmp_path):
    """Two real gloo processes: drafter k's gradient of its own weighted-mean loss, reduced with weight
    sum(w_k), equals the gradient of the loss of both batches as one batch (module doc of transport); and
    differing weight checksums raise on both."""
    script = tmp_path / "worker.py"
    script.write_text(_REDUCE)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), str(tmp_path)],
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    got = [torch.load(tmp_path / f"grads{r}.pt") for r in range(2)]
    for a, b, want in zip(got[0]["reduced"], got[1]["reduced"], got[0]["whole"]):
        assert torch.equal(a, b)  # every drafter holds the same gradient
        assert torch.allclose(a, want, rtol=1e-5, atol=1e-7)
    for g in got:
        assert "differ between the nodes after cluster step 5" in g["diverged"] and "[7, 8]" in g["diverged"]


_REDUCE = r"""
import sys, torch, torch.distributed as dist
from lenbatch_study.runtime.transport import DrafterGroup
rank, path = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"file://{path}/store", rank=rank, world_size=2)
group = DrafterGroup([0, 1], rank=rank, comm_device=torch.device("cpu"))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
x, w = torch.randn(7, 3), torch.rand(7)
mine = slice(0, 5) if rank == 0 else slice(5, 7)  # unequal shares, as the nodes' batches are
loss = (w[mine] * model(x[mine]).squeeze(-1) ** 2).sum() / w[mine].sum()  # the drafter's sum(w l) / sum(w)
loss.backward()
group.module = model
group.reduce(float(w[mine].sum()))
reduced = [p.grad.clone() for p in model.parameters()]
whole = (w * model(x).squeeze(-1) ** 2).sum() / w.sum()  # both batches as one
try:  # weights that differ between the drafters stop every one of them, naming the step
    group.share(None, 7 + rank, step=5)
    diverged = ""
except RuntimeError as err:
    diverged = str(err)
torch.save({"reduced": reduced, "whole": list(torch.autograd.grad(whole, list(model.parameters()))),
            "diverged": diverged}, f"{path}/grads{rank}.pt")
dist.destroy_process_group()
"""


# --------------------------------------------------------------------------- two torchrun nodes (slow)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("nodes")
    first, data = tiny_tokenized(root, TINY, name="first.yaml", timeout=RUN_TIMEOUT)
    lengths = np.load(data / "lengths.npy")
    # into epoch 1: epoch 0 is complete, so every sample must have been trained exactly once in it
    cfg = {**TINY, "train": {**TINY["train"], "useful_tokens": int(lengths.sum()) + 2000}}
    params = root / "tiny.yaml"
    params.write_text(yaml.safe_dump(cfg))
    return {"root": root, "params": params, "data": data, "lengths": lengths, "runs": {}}


def _train_args(setup, out, *extra):
    return [
        "train",
        "--params",
        "params.yaml",
        str(setup["params"]),
        "--strategy",
        STRATEGY,
        "--data",
        str(setup["data"]),
        "--out",
        str(out),
        *extra,
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_nodes(setup, out, *extra) -> list[str]:
    """One torchrun per node, rendezvous on loopback; returns both nodes' logs (each must exit 0)."""
    port = _free_port()
    procs = [
        subprocess.Popen(
            [
                "timeout",
                "-k",
                "10",
                str(RUN_TIMEOUT),
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                str(NODES),
                "--node-rank",
                str(node),
                "--nproc_per_node",
                str(NPROC),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "-m",
                "lenbatch_study",
                *_train_args(setup, out, *extra),
            ],
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in range(NODES)
    ]
    logs = [p.communicate(timeout=RUN_TIMEOUT + 30)[0] for p in procs]
    for node, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"node {node}:\n{log[-3000:]}"
    return logs


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in (Path(out) / "steps.jsonl").read_text().splitlines()]


def _run(setup, name):
    if name not in setup["runs"]:
        out = setup["root"] / name
        if name == "two_nodes":
            _two_nodes(setup, out)
        else:  # no torchrun: 'lenbatch train' starts one torchrun of nodes x nproc processes
            proc = subprocess.run(
                [
                    "timeout",
                    "-k",
                    "10",
                    str(RUN_TIMEOUT),
                    sys.executable,
                    "-m",
                    "lenbatch_study",
                    *_train_args(setup, out),
                ],
                env=ENV,
                capture_output=True,
                text=True,
            )
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert f"emulating {NODES} nodes" in proc.stderr
        setup["runs"][name] = out
    return setup["runs"][name]


@pytest.mark.slow
def test_two_torchrun_nodes_train_every_sample_once_per_epoch_with_one_model(setup):
    out = _run(setup, "two_nodes")
    rows = _rows(out)
    summary = json.loads((out / "summary.json").read_text())
    params = load_params("params.yaml", str(setup["params"]))
    lengths = setup["lengths"]
    plan = build_schedule(
        lengths,
        strategy=STRATEGY,
        params=params,
        target_ranks=NODES * (NPROC - 1),
        useful_tokens=params.train.useful_tokens,
    )
    # the drafters trained exactly the planned batches, each row once, in global step order
    assert [r["step"] for r in rows] == list(range(len(plan)))
    assert [r["batch_hash"] for r in rows] == [batch_hash(s.indices) for s in plan]
    assert [r["node"] for r in rows] == [s.rank // (NPROC - 1) for s in plan]
    # every sample exactly once in epoch 0, over the union of both nodes' batches (each node trained some)
    assert rows[-1]["epoch"] == 1
    by_node = [
        [i for r, s in zip(rows, plan) if r["node"] == k and s.epoch == 0 for i in s.indices.tolist()]
        for k in range(NODES)
    ]
    assert all(by_node) and sorted(by_node[0] + by_node[1]) == list(range(len(lengths)))
    # the drafter weights: checked equal after every step, and node 1's final ones are node 0's checkpoint's
    sums = summary["weights_checksums"]
    assert len(sums) == NODES and len(set(sums)) == 1
    assert sums[0] == _checkpoint_checksum(out, params)
    # throughput per node and in total; the all-reduce timed in every row
    per_node = summary["per_node"]
    assert summary["nodes"] == NODES and [n["node"] for n in per_node] == [0, 1]
    assert all(n["useful_tokens_per_s"] > 0 for n in per_node)
    assert sum(n["useful_tokens_per_s"] for n in per_node) == pytest.approx(summary["useful_tokens_per_s"])
    assert sum(n["measured_useful_tokens"] for n in per_node) == summary["measured_useful_tokens"]
    assert all(r["allreduce_s"] > 0 for r in rows) and summary["allreduce_s_mean"] > 0
    assert summary["world_size"] == NODES * NPROC and summary["target_ranks"] == NODES * (NPROC - 1)


def _checkpoint_checksum(out, params) -> int:
    from lenbatch_study.models.drafter import build_drafter

    drafter = build_drafter(params).float()
    drafter.load_state_dict(torch.load(out / "checkpoint.pt", weights_only=True)["drafter"])
    return weights_checksum(drafter)


@pytest.mark.slow
def test_two_nodes_train_the_losses_of_the_same_params_emulated_by_one_torchrun(setup):
    two = _rows(_run(setup, "two_nodes"))
    one = _rows(_run(setup, "emulated"))
    assert [r["batch_hash"] for r in one] == [r["batch_hash"] for r in two]
    assert np.allclose([r["loss"] for r in one], [r["loss"] for r in two], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_a_checkpoint_and_resume_on_two_nodes_replays_the_same_batches_and_losses(setup):
    ref = _rows(_run(setup, "two_nodes"))
    assert len(ref) > 7
    out = setup["root"] / "resumed"
    _two_nodes(setup, out, "--max-steps", "4")  # a round boundary: both nodes trained 2 steps
    assert len(_rows(out)) == 4
    # 7 steps: the last cluster step is node 0's step 6 alone, node 1's drafter joins its update with weight 0
    _two_nodes(setup, out, "--resume", "--max-steps", "7")
    resumed = _rows(out)
    assert [r["batch_hash"] for r in resumed] == [r["batch_hash"] for r in ref[:7]]
    assert np.abs(np.array([r["loss"] for r in resumed]) - [r["loss"] for r in ref[:7]]).max() < 1e-6
    assert [(r["node"], r["cluster_step"]) for r in resumed[-3:]] == [(0, 2), (1, 2), (0, 3)]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] == 4 and summary["sessions"] == 2 and summary["useful_tokens_per_s"] > 0
    params = load_params("params.yaml", str(setup["params"]))
    assert summary["weights_checksums"] == [_checkpoint_checksum(out, params)] * NODES
