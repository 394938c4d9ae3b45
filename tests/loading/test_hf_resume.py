"""LengthBatchTrainer refuses to resume from a checkpoint whose plan differs from this run's (another
world size, other lengths, other plan parameters, another number of epochs), naming each change: the
Trainer resumes by skipping ``global_step`` batches, which is exact only for the same plan."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("accelerate", reason="Trainer needs accelerate: pip install 'lenbatch[hf]'")
transformers = pytest.importorskip("transformers")

from lenbatch.hf import LengthBatchTrainer  # noqa: E402
from lenbatch.hf import PLAN_FILE  # noqa: E402

N = 90


def data(n=N, seed=0):
    lengths = np.random.default_rng(seed).integers(3, 40, size=n)
    return [{"input_ids": [1 + i % 200] * int(L), "n": int(L)} for i, L in enumerate(lengths)]


def make_trainer(out: Path, *, dataset=None, token_budget=128, epochs=1, max_steps=-1, save_steps=4):
    import torch

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    args = transformers.TrainingArguments(
        output_dir=str(out / "ckpt"),
        num_train_epochs=epochs,
        max_steps=max_steps,
        learning_rate=1e-3,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        logging_steps=1000,
        save_strategy="steps",
        save_steps=save_steps,
        seed=5,
        dataloader_num_workers=0,
    )
    return LengthBatchTrainer(
        model=transformers.LlamaForCausalLM(cfg),
        args=args,
        train_dataset=data() if dataset is None else dataset,
        length_column="n",
        strategy="random",
        token_budget=token_budget,
        max_batch_size=8,
    )


@pytest.mark.slow
def test_checkpoint_of_two_ranks_resumed_by_one_process_is_refused(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(Path(__file__).with_name("_hf_resume_save.py")),
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [(tmp_path / f"world-{r}.txt").read_text() for r in (0, 1)] == ["2", "2"]
    ckpt = tmp_path / "ckpt" / "checkpoint-4"
    saved = json.loads((ckpt / PLAN_FILE).read_text())
    assert saved["world_size"] == 2 and saved["num_samples"] == N
    tr = make_trainer(tmp_path, max_steps=4)  # this process alone: world size 1
    with pytest.raises(ValueError, match=r"world size 2 -> 1 processes.*resume with 2 processes"):
        tr.train(resume_from_checkpoint=str(ckpt))
    assert tr.state.global_step == 0  # refused before a step ran
    with pytest.raises(ValueError, match=r"world size 2 -> 1"):
        make_trainer(tmp_path, max_steps=4).train(resume_from_checkpoint=True)  # the last checkpoint, found


def test_other_lengths_params_or_epochs_are_refused_by_name(tmp_path):
    make_trainer(tmp_path, epochs=1).train()
    ckpt = tmp_path / "ckpt" / "checkpoint-4"
    assert (ckpt / PLAN_FILE).exists()
    make_trainer(tmp_path, epochs=1).check_resume(str(ckpt))  # the same run: accepted
    with pytest.raises(ValueError, match=r"training lengths \(same 90 samples, other lengths"):
        make_trainer(tmp_path, dataset=data(seed=1)).train(resume_from_checkpoint=str(ckpt))
    with pytest.raises(ValueError, match=r"training lengths \(90 -> 80 samples"):
        make_trainer(tmp_path, dataset=data(n=80)).train(resume_from_checkpoint=str(ckpt))
    with pytest.raises(ValueError, match=r"token_budget 128 -> 256"):
        make_trainer(tmp_path, token_budget=256).train(resume_from_checkpoint=str(ckpt))
    # "random" plans 26 batches in epoch 0 and 27 in epoch 1: a second epoch changes every epoch's plan
    with pytest.raises(ValueError, match=r"min_batches 26 -> 27 \(num_train_epochs"):
        make_trainer(tmp_path, epochs=2).train(resume_from_checkpoint=str(ckpt))
    (ckpt / PLAN_FILE).unlink()
    with pytest.raises(ValueError, match=f"has no {PLAN_FILE}"):
        make_trainer(tmp_path).train(resume_from_checkpoint=str(ckpt))
