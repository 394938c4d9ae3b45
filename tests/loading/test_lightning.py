"""Lightning 2.x with ``DataLoader(batch_sampler=LengthBatchSampler(...))`` and
``use_distributed_sampler=False``: a new plan each epoch without user hooks, every batch of every epoch
although Lightning fixes an epoch's length at setup, exact mid-epoch resume through Lightning's
stateful-loader support, and a plain DataLoader's mid-epoch resume refused by name."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import lenbatch as lb
from lenbatch.loading.sampler import LengthBatchSampler

L = pytest.importorskip("lightning", reason="pip install 'lenbatch[dev]' (lightning)")
pytest.importorskip("torchdata", reason="pip install 'lenbatch[dev]' (torchdata)")

sys.path.insert(0, str(Path(__file__).parent))
from _integrations_doc import section_blocks  # noqa: E402

RUN = Path(__file__).parent / "_lightning_run.py"
PLAN = dict(strategy="sortish", token_budget=1024, max_batch_size=32, seed=0)


def _run(tmp_path, cwd, prefix, *extra):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("MASTER_PORT", None)  # Lightning picks a free loopback port
    proc = subprocess.run(
        [sys.executable, str(RUN), str(tmp_path / "blocks.json"), prefix, *map(str, extra)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((cwd / f"{prefix}{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
def test_documented_lightning_loop_ddp_two_processes(tmp_path):
    blocks = section_blocks("Lightning")
    assert len(blocks) == 2 and "use_distributed_sampler=False" in blocks[1] and "set_epoch" not in "".join(blocks)
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    full_dir.mkdir(), cut_dir.mkdir()
    lengths = np.random.default_rng(0).integers(8, 200, size=600)
    # the case Lightning got wrong: epoch 1 plans more batches than epoch 0 (its length, read at setup)
    raw = [len(lb.plan_epoch(lengths, epoch=e, rank=0, world_size=2, **PLAN)) for e in (0, 1)]
    assert raw[1] > raw[0]

    full = _run(tmp_path, full_dir, "full")
    steps = []
    for epoch in (0, 1):
        per_rank = [[b for e, b in r["seen"] if e == epoch] for r in full]
        steps.append([len(p) for p in per_rank])
        samples = sorted(i for p in per_rank for b in p for i in b)
        assert samples == list(range(600)), f"epoch {epoch}: {len(set(samples))} unique of {len(samples)} visits"
        want = [
            [
                b.tolist()
                for b in lb.plan_epoch(
                    lengths, epoch=epoch, rank=k, world_size=2, min_batches=full[0]["min_batches"], **PLAN
                )
            ]
            for k in (0, 1)
        ]
        assert per_rank == want
    for r in full:
        assert (r["world"], r["sampler_world"]) == (2, 2)
        assert r["len_loader"] == r["len_plan"] == max(raw)
    assert steps == [[max(raw)] * 2] * 2
    assert [b for e, b in full[0]["seen"] if e == 0] != [b for e, b in full[0]["seen"] if e == 1]
    print(f"Lightning ddp 2 procs: raw plan {raw} batches per rank, trained {steps}, 600/600 samples per epoch")

    crash = max(raw) + 15  # mid epoch 1; the last checkpoint (every 10 steps) is step 50
    head = _run(tmp_path, cut_dir, "head", crash)
    assert all(len(r["seen"]) == crash for r in head)
    tail = _run(tmp_path, cut_dir, "tail")
    saved = crash // 10 * 10
    for h, t, f in zip(head, tail, full):
        assert h["seen"][:saved] + t["seen"] == f["seen"]
        assert np.allclose(t["weights"], f["weights"], atol=1e-6)


def _module(loader_cls):
    import torch

    lengths = np.random.default_rng(0).integers(8, 200, size=600)
    dataset = [{"input_ids": [i] * int(n)} for i, n in enumerate(lengths)]

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Embedding(600, 4), torch.nn.Linear(4, 1))

        def train_dataloader(self):
            return loader_cls(
                dataset,
                batch_sampler=LengthBatchSampler(lengths, lightning_trainer=self.trainer, **PLAN),
                collate_fn=lb.collate_padded,
            )

        def training_step(self, batch, batch_idx):
            return self.net(batch.input_ids).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Model()


def _trainer(tmp_path, **kw):
    quiet = dict(
        accelerator="cpu",
        devices=1,
        use_distributed_sampler=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    return L.Trainer(**quiet, **kw)


def test_plain_dataloader_mid_epoch_resume_is_refused(tmp_path):
    import torch

    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "c", every_n_train_steps=10, save_top_k=-1)
    _trainer(tmp_path, max_epochs=1, max_steps=10, callbacks=[ckpt]).fit(_module(torch.utils.data.DataLoader))
    path = tmp_path / "c" / "epoch=0-step=10.ckpt"
    assert path.exists()
    with pytest.raises(ValueError, match="middle of epoch 0.*StatefulDataLoader"):
        _trainer(tmp_path, max_epochs=1).fit(_module(torch.utils.data.DataLoader), ckpt_path=str(path))


def test_unbounded_epochs_are_refused_by_name(tmp_path):
    import torch

    with pytest.raises(ValueError, match=r"max_epochs=-1.*epochs=N"):
        _trainer(tmp_path, max_epochs=-1, max_steps=3).fit(_module(torch.utils.data.DataLoader))


def test_epochs_keyword_gives_every_epoch_the_same_count():
    X = np.random.default_rng(0).integers(8, 200, size=600)
    raw = [len(lb.plan_epoch(X, epoch=e, rank=0, world_size=2, **PLAN)) for e in range(4)]
    assert len(set(raw)) > 1
    s = LengthBatchSampler(X, rank=0, world_size=2, epochs=4, **PLAN)
    counts, seen = [], []
    for e in range(4):
        s.set_epoch(e)
        counts.append(len(s))
        batches = list(s)
        assert len(batches) == len(s)
        others = LengthBatchSampler(X, rank=1, world_size=2, epochs=4, **PLAN)
        others.set_epoch(e)
        seen.append(sorted(i for b in batches + list(others) for i in b))
    assert counts == [max(raw)] * 4
    assert all(x == list(range(600)) for x in seen)
    with pytest.raises(ValueError, match="epochs must be"):
        LengthBatchSampler(X, epochs=0, **PLAN)
    t = LengthBatchSampler(X, **PLAN)
    next(iter(t))
    with pytest.raises(ValueError, match="before the first batch"):
        t.equalize_epochs(3)


@pytest.mark.slow
def test_worker_processes_get_each_epochs_plan(tmp_path):
    """num_workers=2: Lightning creates the loader's iterator before it calls set_epoch; every epoch still
    trains its own plan, whole (the sampler reads the epoch when the first batch is drawn)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    lengths = np.random.default_rng(0).integers(8, 200, size=600)  # _module's
    seen = []
    model = _module(lambda *a, **k: StatefulDataLoader(*a, num_workers=2, **k))
    real_step = type(model).training_step

    def recording_step(self, batch, batch_idx):
        seen.append((self.current_epoch, batch.input_ids[:, 0].tolist()))
        return real_step(self, batch, batch_idx)

    type(model).training_step = recording_step
    trainer = _trainer(tmp_path, max_epochs=3, enable_checkpointing=False)
    trainer.fit(model)
    mb = trainer.train_dataloader.batch_sampler.min_batches
    plans = [[p.tolist() for p in lb.plan_epoch(lengths, epoch=e, min_batches=mb, **PLAN)] for e in range(3)]
    assert [[b for e, b in seen if e == k] for k in range(3)] == plans
    assert plans[0] != plans[1] != plans[2]
    assert all(sorted(i for b in p for i in b) == list(range(600)) for p in plans)


def test_len_has_no_side_effects():
    """``len(sampler)`` reads a count: the spec, fingerprint, epochs and state are what they were, however often
    (and from whatever loop) it is asked. Lightning's equal epochs are fixed when the sampler is built."""
    from types import SimpleNamespace

    X = np.random.default_rng(0).integers(8, 200, size=600)
    trainer = SimpleNamespace(max_epochs=3, training=True, fit_loop=SimpleNamespace(restarted_mid_epoch=False))
    for s in (
        LengthBatchSampler(X, rank=0, world_size=2, **PLAN),
        LengthBatchSampler(X, rank=0, world_size=2, lightning_trainer=trainer, **PLAN),
    ):
        before = (s.spec, s.fingerprint, s.epochs, s.state_dict(), s.epoch)
        counts = [len(s) for _ in range(3)]
        assert (s.spec, s.fingerprint, s.epochs, s.state_dict(), s.epoch) == before
        assert len(set(counts)) == 1 and counts[0] == len(list(s))
    raw = [len(lb.plan_epoch(X, epoch=e, rank=0, world_size=2, **PLAN)) for e in range(3)]
    assert s.epochs == 3 and len(s) == max(raw)
    with pytest.raises(ValueError, match=r"max_epochs=-1.*epochs=N"):
        LengthBatchSampler(X, lightning_trainer=SimpleNamespace(max_epochs=-1), **PLAN)
