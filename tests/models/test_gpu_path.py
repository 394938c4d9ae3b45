"""The GPU path's pure parts, on CPU: each rank's peak memory from the config (issue 15, finding 6)
and fp32 master weights for the trained drafter under bf16 (finding 7)."""

from __future__ import annotations

import copy

import pytest
import torch
import yaml

from lenbatch.models import memory
from lenbatch.loading.collate import collate, synthetic_sequences
from lenbatch.core.config import load_params
from lenbatch.runtime.runner import StepRunner

GB = 10**9
STUDY = "configs/qwen3.6-27b-8gpu.yaml"


def _study(**train):
    return load_params("params.yaml", STUDY, overrides={"train": train} if train else None)


def test_the_27b_setting_fits_an_h200_and_is_refused_on_an_80_gb_card():
    p = _study()
    target, drafter = memory.rank_memory(p)
    assert 26.5e9 < target.weights / 2 < 27.5e9  # Qwen3.6-27B in bf16: 27 B parameters x 2 bytes
    step = 49152 * 5 * 5120 * 2  # the 2.5 GB of features per step
    assert target.features == (8 + 1) * step and drafter.features == step
    assert drafter.optimizer > 0 and drafter.total < target.total
    memory.check_fits(p, device_bytes=141 * GB)
    with pytest.raises(ValueError, match=r"train\.queue_size 8 in flight.*batching\.token_budget 49152"
                                         r".*train\.queue_size <= 2 fits"):
        memory.check_fits(p, device_bytes=80 * GB)
    memory.check_fits(_study(queue_size=2), device_bytes=80 * GB)  # the advice holds
    # one process with both roles: the drafter's memory on top, no queue of features
    both = memory.check_fits(p, device_bytes=141 * GB, single_process=True)
    assert both == (target, drafter)
    with pytest.raises(ValueError):
        memory.check_fits(_study(queue_size=3), device_bytes=80 * GB)  # and is the largest that does


def test_ranks_sharing_a_device_add_up():
    p = load_params("params.yaml", "configs/tiny.yaml")
    target, drafter = memory.rank_memory(p)
    one = memory.check_fits(p, device_bytes=80 * GB, ranks_per_device=3)
    assert one == (target, drafter)
    need = drafter.total + 2 * target.total  # the drafter rank and two target ranks on one device
    have = memory.RESERVED_BYTES + need
    with pytest.raises(ValueError, match="lower batching.token_budget|train.queue_size <="):
        memory.check_fits(p, device_bytes=int(have / memory.USABLE_FRACTION) - 10**6, ranks_per_device=3)


def test_bf16_drafter_keeps_fp32_master_weights_and_the_target_stays_bf16(tmp_path, one_thread):
    cfg = copy.deepcopy(yaml.safe_load(open("configs/tiny.yaml")))
    cfg["model"]["dtype"] = "bfloat16"
    cfg["drafter"] = {**cfg.get("drafter", {}), "lr": 1e-5}
    path = tmp_path / "bf16.yaml"
    path.write_text(yaml.safe_dump(cfg))
    p = load_params("params.yaml", str(path))
    runner = StepRunner(p)
    assert {w.dtype for w in runner.target.parameters()} == {torch.bfloat16}
    assert {w.dtype for w in runner.drafter.parameters()} == {torch.float32}
    batch = collate(synthetic_sequences([40, 60, 30], vocab_size=p.model.vocab_size, seed=0), kind="padded",
                    token_budget=1024, max_batch_size=8)
    before = [w.detach().clone() for w in runner.drafter.parameters()]
    feats, _ = runner.target_step(batch)
    assert feats.dtype == torch.bfloat16
    loss, _ = runner.drafter_step(batch, feats, step=0)
    assert loss == loss and runner.last_output.loss.dtype == torch.float32
    after = list(runner.drafter.parameters())
    moved = sum(int((a != b.detach()).sum()) for a, b in zip(before, after))
    # bf16 storage would have kept most weights: an lr-1e-5 update is below half a bf16 ulp
    moved_bf16 = sum(int((a.bfloat16() != b.detach().bfloat16()).sum()) for a, b in zip(before, after))
    total = sum(a.numel() for a in before)
    assert moved > 0.9 * total and moved_bf16 < 0.2 * total
