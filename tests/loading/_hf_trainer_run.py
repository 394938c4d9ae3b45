"""Run under ``torchrun --nproc_per_node 2``: LengthBatchTrainer on a tiny Llama, 2 epochs, then a
resume from a mid-epoch-1 checkpoint. Writes, per rank, the sample indices of every trained step.

usage: _hf_trainer_run.py OUT STRATEGY
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

from lenbatch.hf import LengthBatchTrainer

out, strategy = Path(sys.argv[1]), sys.argv[2]
N = 90
lengths = np.random.default_rng(0).integers(3, 40, size=N)
# sample i starts with token 1 + i, so a trained batch tells which samples it held
data = [
    {"input_ids": [1 + i] + list(np.random.default_rng(i).integers(1, 250, size=int(L) - 1)), "n": int(L)}
    for i, L in enumerate(lengths)
]


class Recording(LengthBatchTrainer):
    seen: list

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        ids = inputs["input_ids"]
        if "cu_seq_lens_q" in inputs:
            firsts = ids[0, inputs["cu_seq_lens_q"][:-1].long()]
        else:
            firsts = ids[:, 0]
        self.seen.append([self.length_sampler.epoch, (firsts - 1).tolist()])
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def run(tag: str, resume: str | None = None, save_steps: int = 10**6):
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=256,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
    )
    args = TrainingArguments(
        output_dir=str(out / "ckpt"),
        num_train_epochs=2,
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
    tr = Recording(
        model=model,
        args=args,
        train_dataset=data,
        length_column="n",
        strategy=strategy,
        token_budget=128,
        max_batch_size=8,
    )
    tr.seen = []
    tr.train(resume_from_checkpoint=resume)
    flat = torch.cat([p.detach().flatten() for p in tr.model.parameters()])
    return tr, flat


tr, flat_a = run("full")
steps = len(tr.length_sampler)
k = steps + steps // 2  # a checkpoint in the middle of epoch 1
import shutil  # noqa: E402

if tr.args.process_index == 0:
    shutil.rmtree(out / "ckpt", ignore_errors=True)
tr.accelerator.wait_for_everyone()
tr2, flat_b = run("save", save_steps=k)
tr3, flat_c = run("resume", resume=str(out / "ckpt" / f"checkpoint-{k}"), save_steps=k)
rank = tr.args.process_index
(out / f"rank{rank}.json").write_text(
    json.dumps(
        {
            "world_size": tr.args.world_size,
            "min_batches": tr.length_sampler.min_batches,
            "lengths": lengths.tolist(),
            "steps_per_epoch": steps,
            "k": k,
            "full": tr.seen,
            "save": tr2.seen,
            "resumed": tr3.seen,
            "same_weights_full_vs_resumed": bool(torch.allclose(flat_a, flat_c, atol=1e-6)),
            "max_weight_diff": float((flat_a - flat_c).abs().max()),
        }
    )
)
