"""lenbatch.hf: LengthBatchTrainer under real torchrun (2 processes, gloo) and packed rows for HF models."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("accelerate", reason="Trainer needs accelerate: pip install 'lenbatch[hf]'")
transformers = pytest.importorskip("transformers")

import lenbatch as lb  # noqa: E402
from lenbatch.hf import LengthBatchCollator, LengthBatchTrainer  # noqa: E402

N = 90  # _hf_trainer_run.py's sample count


def _tiny_llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["packed", "random"])
def test_trainer_two_ranks_two_epochs_and_exact_resume(tmp_path, strategy):
    """Under torchrun with 2 ranks: every sample exactly once per epoch across ranks (no re-sharding by
    accelerate, no drop), epoch 1's batches differ from epoch 0's (set_epoch reaches the sampler), and a
    resume from a checkpoint in the middle of epoch 1 trains exactly the uninterrupted run's remaining
    batches and ends with the same weights. ``random`` plans 13 and 14 batches per rank for these two
    epochs: the Trainer (steps per epoch fixed from epoch 0) needs min_batches to train epoch 1 whole."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    script = Path(__file__).with_name("_hf_trainer_run.py")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(script),
            str(tmp_path),
            strategy,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(r["world_size"] == 2 for r in ranks)
    steps = ranks[0]["steps_per_epoch"]
    assert ranks[1]["steps_per_epoch"] == steps
    per_epoch = []
    for e in (0, 1):
        batches = [b for r in ranks for ep, b in r["full"] if int(ep) == e]
        assert len(batches) == 2 * steps
        flat = sorted(i for b in batches for i in b)
        assert flat == list(range(N)), f"epoch {e}: samples missing or repeated across ranks"
        per_epoch.append({frozenset(b) for b in batches})
        for rank, r in enumerate(ranks):  # rank r trained exactly its own plan, in order
            plan = lb.plan_epoch(
                r["lengths"],
                strategy=strategy,
                epoch=e,
                seed=5,
                token_budget=128,
                max_batch_size=8,
                rank=rank,
                world_size=2,
                min_batches=r["min_batches"],
            )
            assert [b for ep, b in r["full"] if int(ep) == e] == [p.tolist() for p in plan]
    assert per_epoch[0] != per_epoch[1], "epoch 1 repeated epoch 0's batches (set_epoch never reached the sampler)"
    for r in ranks:
        k = r["k"]
        assert [b for _, b in r["save"]] == [b for _, b in r["full"]]
        assert [b for _, b in r["resumed"]] == [b for _, b in r["full"][k:]], "resume is not exact"
        assert r["same_weights_full_vs_resumed"], r["max_weight_diff"]


def test_packed_loss_equals_per_sequence_loss():
    """collate_packed(...).model_inputs() in a HF causal LM: the loss of one packed row equals the loss
    of each sequence run alone (token-weighted), and the padded batch's loss: attention and labels stay
    inside each sequence."""
    model = _tiny_llama()
    rng = np.random.default_rng(1)
    seqs = [rng.integers(1, 256, size=n) for n in (7, 19, 3, 12)]
    samples = [{"input_ids": s} for s in seqs]
    with torch.no_grad():
        packed = model(**lb.collate_packed(samples).model_inputs()).loss
        padded = model(**lb.collate_padded(samples).model_inputs()).loss
        alone = [model(input_ids=torch.as_tensor(s)[None], labels=torch.as_tensor(s)[None]).loss for s in seqs]
    weights = torch.tensor([len(s) - 1 for s in seqs], dtype=torch.float32)
    per_seq = (torch.stack(alone) * weights).sum() / weights.sum()
    torch.testing.assert_close(packed, per_seq, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded, per_seq, atol=1e-5, rtol=1e-5)


def test_collator_layout_matches_data_collator_with_flattening():
    """LengthBatchCollator('packed') gives the fields and values transformers' DataCollatorWithFlattening
    gives for the same samples (position_ids, cu_seq_lens_q/k, max_length_q/k, labels -100 at starts)."""
    from transformers import DataCollatorWithFlattening

    rows = [{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}, {"input_ids": [10, 11, 12, 13]}]
    ours = LengthBatchCollator(layout="packed")(rows)
    ref = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_position_ids=True)(
        [dict(r) for r in rows], return_tensors="pt"
    )
    for key in ("input_ids", "labels", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k"):
        assert torch.equal(torch.as_tensor(ours[key]).long(), torch.as_tensor(ref[key]).long()), key
    assert ours["max_length_q"] == int(ref["max_length_q"]) == 4


def test_trainer_refuses_ambiguous_lengths(tmp_path):
    """Both lengths= and length_column= is ambiguous; a count that is not one per sample and a column the
    dataset lacks are refused naming the setting; with neither, the lengths are the input_ids' lengths."""
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    data = [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}] * 2
    with pytest.raises(ValueError, match="at most one of lengths"):
        LengthBatchTrainer(
            model=_tiny_llama(),
            args=args,
            train_dataset=data,
            lengths=[3, 2, 3, 2],
            length_column="n",
            strategy="random",
            token_budget=16,
            max_batch_size=2,
        )
    with pytest.raises(ValueError, match="one length per sample"):
        LengthBatchTrainer(
            model=_tiny_llama(),
            args=args,
            train_dataset=data,
            lengths=[3, 3],
            strategy="random",
            token_budget=16,
            max_batch_size=2,
        )
    with pytest.raises(ValueError, match="length_column='n'"):
        LengthBatchTrainer(
            model=_tiny_llama(),
            args=args,
            train_dataset=data,
            length_column="n",
            strategy="random",
            token_budget=16,
            max_batch_size=2,
        )
    tr = LengthBatchTrainer(
        model=_tiny_llama(), args=args, train_dataset=data, strategy="random", token_budget=16, max_batch_size=2
    )
    assert tr.lengths.tolist() == [3, 2, 3, 2]
