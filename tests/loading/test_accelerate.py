"""accelerate: ``accelerator.prepare(loader)`` re-shards a batch sampler with ``BatchSamplerShard``; the
sampler must hand each process exactly its own batches (or refuse by name), and the documented
``save_state``/``load_state`` loop must resume mid-epoch exactly."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import lenbatch as lb
from lenbatch.loading.sampler import LengthBatchSampler

accelerate_data_loader = pytest.importorskip("accelerate.data_loader")
BatchSamplerShard = accelerate_data_loader.BatchSamplerShard

sys.path.insert(0, str(Path(__file__).parent))
from _integrations_doc import free_port, section_blocks  # noqa: E402

X = np.random.default_rng(0).integers(1, 300, size=400)


def accelerator(procs, index, **config):
    """What the sampler reads of an ``Accelerator``: its public process count, index and loader settings."""
    from types import SimpleNamespace

    return SimpleNamespace(
        num_processes=procs,
        process_index=index,
        dataloader_config=SimpleNamespace(**{"split_batches": False, "dispatch_batches": None, **config}),
    )


KW = dict(token_budget=1024, max_batch_size=16, seed=2)


@pytest.mark.parametrize("strategy", ["packed", "bucketed", "random"])
def test_batch_sampler_shard_hands_each_process_its_own_batches(strategy):
    kw = dict(KW, edges=(1, 100, 200, 300)) if strategy == "bucketed" else KW
    got = []
    for rank in range(2):
        s = LengthBatchSampler(X, strategy=strategy, accelerator=accelerator(2, rank), **kw)
        shard = BatchSamplerShard(s, num_processes=2, process_index=rank)  # what prepare() builds
        for epoch in (0, 1):
            s.set_epoch(epoch)
            want = [b.tolist() for b in lb.plan_epoch(X, strategy=strategy, epoch=epoch, rank=rank, world_size=2, **kw)]
            assert len(shard) == len(want) == len(s) // 2  # the sampler: 2 slots a step, one of them this rank's
            assert list(shard) == want
            got.append((epoch, rank, want))
    for epoch in (0, 1):
        idx = sorted(i for e, _, w in got if e == epoch for b in w for i in b)
        assert idx == list(range(len(X)))


def test_shard_position_counts_this_ranks_batches():
    s = LengthBatchSampler(X, strategy="packed", accelerator=accelerator(2, 1), **KW)
    it = iter(BatchSamplerShard(s, num_processes=2, process_index=1))
    for _ in range(3):
        next(it)
    assert s.state_dict()["position"] == 3
    r = LengthBatchSampler(X, strategy="packed", accelerator=accelerator(2, 1), **KW)
    r.load_state_dict(s.state_dict())
    rest = list(BatchSamplerShard(r, num_processes=2, process_index=1))
    assert rest == [b.tolist() for b in lb.plan_epoch(X, strategy="packed", rank=1, world_size=2, **KW)][3:]


def test_another_world_size_split_or_dispatched_batches_are_refused():
    with pytest.raises(ValueError, match="over 2 processes.*world_size=1.*accelerator.num_processes"):
        LengthBatchSampler(X, strategy="packed", rank=0, world_size=1, accelerator=accelerator(2, 0), **KW)
    with pytest.raises(ValueError, match="split_batches=False"):
        LengthBatchSampler(X, strategy="packed", accelerator=accelerator(2, 0, split_batches=True), **KW)
    with pytest.raises(ValueError, match="dispatch_batches=False"):
        LengthBatchSampler(X, strategy="packed", accelerator=accelerator(2, 0, dispatch_batches=True), **KW)
    # one process: accelerate neither shards nor dispatches, and the sampler yields plain batches
    one = LengthBatchSampler(X, strategy="packed", accelerator=accelerator(1, 0, dispatch_batches=True), **KW)
    assert len(one) == len(lb.plan_epoch(X, strategy="packed", **KW)) and [] not in list(one)


def test_without_accelerator_a_running_accelerate_state_warns_once(monkeypatch):
    """Forgetting ``accelerator=`` while accelerate runs over the sampler's world size: a prepared loader would
    keep every world_size-th batch of this rank's, so the first iteration says so (public accelerate API:
    ``accelerate.state.is_initialized`` and ``PartialState().num_processes``)."""
    import accelerate.state as state
    from types import SimpleNamespace

    monkeypatch.setattr(state, "is_initialized", lambda: True)
    monkeypatch.setattr(state, "PartialState", lambda: SimpleNamespace(num_processes=2))
    s = LengthBatchSampler(X, strategy="packed", rank=0, world_size=2, **KW)
    with pytest.warns(UserWarning, match="accelerator=accelerator"):
        list(s)
    fine = LengthBatchSampler(X, strategy="packed", accelerator=accelerator(2, 0), **KW)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(fine)


def test_set_epoch_through_the_sampler_attribute():
    s = LengthBatchSampler(X, strategy="random", **KW)
    s.sampler.set_epoch(3)
    assert s.epoch == 3 and list(s) == [b.tolist() for b in lb.plan_epoch(X, strategy="random", epoch=3, **KW)]


def test_discarding_a_restored_position_is_logged(caplog):
    s = LengthBatchSampler(X, strategy="random", **KW)
    s.set_epoch(1)
    it = iter(s)
    next(it), next(it)
    r = LengthBatchSampler(X, strategy="random", **KW)
    r.load_state_dict(s.state_dict())
    with caplog.at_level("WARNING", logger="lenbatch.sampler"):
        r.set_epoch(0)
    assert "discards the restored position (epoch 1, 2 batches done)" in caplog.text


def _accelerate_launch(script, cwd, *args):
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.accelerate_cli",
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_ip",
        "127.0.0.1",
        "--main_process_port",
        str(free_port()),
        str(Path(__file__).parent / script),
        *map(str, args),
    ]
    # no GPU here: ACCELERATE_USE_CPU=1 makes Accelerator() a 2-process CPU (gloo) group, as the doc says
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HOME=str(cwd / "hf"), ACCELERATE_USE_CPU="1")
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)


def _launch(blocks_json, cwd, prefix, *extra):
    proc = _accelerate_launch("_accelerate_run.py", cwd, blocks_json, prefix, *extra)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((cwd / f"{prefix}{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
def test_dispatch_batches_under_two_processes_is_refused(tmp_path):
    proc = _accelerate_launch("_accelerate_dispatch.py", tmp_path)
    assert "TRAINED" not in proc.stdout
    assert "REFUSED 0 accelerate's dispatch_batches=True" in proc.stdout, proc.stderr[-3000:]
    assert "DataLoaderConfiguration(dispatch_batches=False)" in proc.stdout


@pytest.mark.slow
def test_documented_accelerate_loop_under_accelerate_launch(tmp_path):
    blocks = section_blocks("accelerate")
    assert len(blocks) == 2
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    full_dir.mkdir(), cut_dir.mkdir()
    full = _launch(tmp_path / "blocks.json", full_dir, "full")
    lengths = np.random.default_rng(0).integers(8, 200, size=1000)
    n_steps = []
    for r in full:
        assert (r["world"], r["sampler_world"]) == (2, 2)
        assert r["len_loader"] == r["len_plan"]  # not half of it
    for epoch in (0, 1):
        per_rank = [[b for e, b in r["seen"] if e == epoch] for r in full]
        assert len(per_rank[0]) == len(per_rank[1])  # lock-step DDP
        n_steps.append(len(per_rank[0]))
        samples = sorted(i for steps in per_rank for b in steps for i in b)
        assert samples == list(range(len(lengths))), f"epoch {epoch}: {len(set(samples))} unique of {len(samples)}"
        want = [
            [
                b.tolist()
                for b in lb.plan_epoch(
                    lengths,
                    strategy="packed",
                    epoch=epoch,
                    rank=k,
                    world_size=2,
                    token_budget=2048,
                    max_batch_size=32,
                    seed=0,
                )
            ]
            for k in (0, 1)
        ]
        assert per_rank == want
    assert [b for e, b in full[0]["seen"] if e == 0] != [b for e, b in full[0]["seen"] if e == 1]
    print(f"accelerate 2 procs: steps per rank per epoch {n_steps}, 1000/1000 samples each epoch")

    crash = n_steps[0] + 14  # mid epoch 1, 4 steps after a save
    head = _launch(tmp_path / "blocks.json", cut_dir, "head", crash)
    assert all(len(r["seen"]) == crash for r in head)
    tail = _launch(tmp_path / "blocks.json", cut_dir, "tail")
    saved = n_steps[0] + 10
    for h, t, f in zip(head, tail, full):
        assert h["seen"][:saved] + t["seen"] == f["seen"]
        assert np.allclose(t["weights"], f["weights"], atol=1e-6)


def test_prepare_data_loader_without_set_epoch_runs_each_epochs_own_batches():
    """What ``accelerator.prepare(loader)`` builds for process 1 of 2 (accelerate's own
    ``prepare_data_loader``): ``len`` is this rank's batch count, and the loop that never calls
    ``set_epoch`` still gets a new plan each epoch (accelerate's loader calls it with its own counter,
    which reaches the sampler through ``.sampler``)."""
    import torch

    s = LengthBatchSampler(X, strategy="packed", accelerator=accelerator(2, 1), **KW)
    dl = torch.utils.data.DataLoader(list(range(len(X))), batch_sampler=s, collate_fn=list)
    prepared = accelerate_data_loader.prepare_data_loader(dl, num_processes=2, process_index=1, put_on_device=False)
    assert len(prepared) == len(s.plan()) == len(s) // 2
    for epoch in (0, 1):
        want = [b.tolist() for b in lb.plan_epoch(X, strategy="packed", epoch=epoch, rank=1, world_size=2, **KW)]
        assert [b for b in prepared] == want and s.epoch == epoch


@pytest.mark.slow
def test_token_normalised_accumulation_block_under_two_processes(tmp_path):
    """docs/integrations.md's packed + accumulation loop under accelerate launch with 2 processes: it runs
    as written, both processes count the same step total (the all-reduce), and their weights stay equal."""
    (block,) = section_blocks("Packed rows and gradient accumulation in your own loop")
    head = (
        "import lenbatch as _lb\n"
        "CALLS, _count = [], _lb.learned_tokens\n"
        "def _recording(micro, **kw):  # (this process's count, the step total) of every step\n"
        "    CALLS.append((_count(micro), _count(micro, **kw)))\n"
        "    return CALLS[-1][1]\n"
        "_lb.learned_tokens = _recording\n"
    )
    tail = (
        "\nimport json\n"
        'json.dump({"calls": CALLS, "world": accelerator.num_processes,\n'
        '           "weights": float(sum(p.double().sum() for p in model.parameters()))},\n'
        '          open(f"acc{accelerator.process_index}.json", "w"))\n'
    )
    (tmp_path / "acc.py").write_text(head + block + tail)
    proc = _accelerate_launch(tmp_path / "acc.py", tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"acc{r}.json").read_text()) for r in range(2)]
    assert [r["world"] for r in ranks] == [2, 2]
    steps = list(zip(ranks[0]["calls"], ranks[1]["calls"]))
    assert len(steps) == len(ranks[0]["calls"]) == len(ranks[1]["calls"]) > 2
    for (local0, total0), (local1, total1) in steps:
        assert total0 == total1 == local0 + local1  # every step's total is both processes' sum
    assert any(a[0] != b[0] for a, b in steps)  # the processes' counts do differ
    assert ranks[0]["weights"] == pytest.approx(ranks[1]["weights"], abs=1e-9)
