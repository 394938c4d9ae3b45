"""Run under ``torchrun --nproc_per_node 2``: ``LengthBatchMixin`` over TRL's ``SFTTrainer`` on a tiny
Qwen2, 2 epochs of completion-only SFT on a conversational dataset, saving a checkpoint mid-epoch 1, then
a resume from it. Writes, per rank, the sample indices of every trained step and, for every step of the
first run, the loss of lenbatch's batch and of SFTTrainer's default collator on the same samples at the
same weights, and whether the labels (the per-token loss weights) are identical.

usage: _sft_trainer_run.py OUT TOKENIZER_DIR STRATEGY:FORMAT...   (several cases share one launch: imports
of trl and transformers are most of a case's time)
"""

import json
import shutil
import sys
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoTokenizer
from trl import SFTConfig, SFTTrainer
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

sys.path.insert(0, str(Path(__file__).parent))
from _sft_data import conversations, tiny_qwen2  # noqa: E402

from lenbatch.hf import LengthBatchMixin  # noqa: E402

N, BUDGET, MAX_BS = 64, 384, 8
tok = AutoTokenizer.from_pretrained(sys.argv[2])


class Recording(LengthBatchMixin, SFTTrainer):
    check_loss = False

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        idx = self.identify(inputs)
        self.seen.append([self.length_sampler.epoch, idx])
        if self.check_loss:
            self.compare_with_trl_collator(model, inputs, idx)
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def identify(self, inputs):
        ids = inputs["input_ids"]
        if "cu_seq_lens_q" in inputs:
            cu = inputs["cu_seq_lens_q"].tolist()
            seqs = [ids[0, a:b] for a, b in zip(cu[:-1], cu[1:])]
        else:
            seqs = [row[: int(n)] for row, n in zip(ids, inputs["attention_mask"].sum(1))]
        return [self.row_of[tuple(s.tolist())] for s in seqs]

    def compare_with_trl_collator(self, model, inputs, idx):
        """SFTTrainer's default collator on the same samples: same labels per sample, same loss (fixed weights)."""
        samples = [{k: self.train_dataset[i][k] for k in ("input_ids", "labels")} for i in idx]
        ref = self._prepare_inputs(self.trl_collator(samples))
        ours_labels = _per_sample(inputs, "labels")
        ref_labels = _per_sample(ref, "labels")
        # padded: identical; packed: also identical except the first label of every sequence, which no token
        # predicts in either layout (the loss shifts labels by one), and which the packed row sets to -100
        same = all(
            torch.equal(a[1:], b[1:]) and (a[0] == -100 or torch.equal(a[:1], b[:1]))
            for a, b in zip(ours_labels, ref_labels)
        )
        with torch.no_grad():
            ours = SFTTrainer.compute_loss(self, model, dict(inputs))
            theirs = SFTTrainer.compute_loss(self, model, dict(ref))
        self.loss_pairs.append(
            [float(ours), float(theirs), bool(same), int(sum(int((lab[1:] != -100).sum()) for lab in ours_labels))]
        )


def _per_sample(inputs, key):
    x = inputs[key]
    if "cu_seq_lens_q" in inputs:
        cu = inputs["cu_seq_lens_q"].tolist()
        return [x[0, a:b] for a, b in zip(cu[:-1], cu[1:])]
    return [row[: int(n)] for row, n in zip(x, inputs["attention_mask"].sum(1))]


def run(out, strategy, fmt, resume=None, save_mid_epoch_1=False, check_loss=False):
    args = SFTConfig(
        output_dir=str(out / "ckpt"),
        num_train_epochs=2,
        learning_rate=1e-3,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        logging_steps=1000,
        save_strategy="steps",
        save_steps=10**6,
        seed=5,
        dataloader_num_workers=0,
        assistant_only_loss=fmt == "messages",
    )
    tr = Recording(
        model=tiny_qwen2(len(tok)),
        args=args,
        train_dataset=Dataset.from_list(conversations(N, fmt=fmt)),
        processing_class=tok,
        strategy=strategy,
        token_budget=BUDGET,
        max_batch_size=MAX_BS,
        num_buckets=3,
    )
    tr.seen, tr.loss_pairs, tr.check_loss = [], [], check_loss
    tr.row_of = {tuple(ids): i for i, ids in enumerate(tr.train_dataset["input_ids"])}
    assert len(tr.row_of) == N, "two samples tokenized identically; the test cannot tell them apart"
    tr.trl_collator = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id)  # SFTTrainer's default
    tr.steps = len(tr.get_train_dataloader())
    tr.k = tr.steps + tr.steps // 2  # a checkpoint in the middle of epoch 1
    if save_mid_epoch_1:
        tr.args.save_steps = tr.k  # read when training starts
    tr.train(resume_from_checkpoint=None if resume is None else str(out / "ckpt" / f"checkpoint-{resume}"))
    return tr, torch.cat([p.detach().flatten() for p in tr.model.parameters()])


for case in sys.argv[3:]:
    strategy, fmt = case.split(":")
    out = Path(sys.argv[1]) / strategy
    full, flat_full = run(out, strategy, fmt, save_mid_epoch_1=True, check_loss=True)
    resumed, flat_resumed = run(out, strategy, fmt, resume=full.k)
    rank, prepared = full.args.process_index, full.train_dataset
    (out / f"rank{rank}.json").write_text(
        json.dumps(
            {
                "world_size": full.args.world_size,
                "steps_per_epoch": full.steps,
                "k": full.k,
                "full": full.seen,
                "resumed": resumed.seen,
                "loss_pairs": full.loss_pairs,
                "edges": list(full.plan_args["edges"] or []),
                "lengths": full.lengths.tolist(),
                "prepared_lengths": [len(x) for x in prepared["input_ids"]],
                "trained_tokens": sum(sum(1 for v in lab if v != -100) for lab in prepared["labels"]),
                "all_tokens": sum(len(x) for x in prepared["input_ids"]),
                "min_batches": full.length_sampler.min_batches,
                "max_weight_diff": float((flat_full - flat_resumed).abs().max()),
            }
        )
    )
    full.accelerator.wait_for_everyone()
    if rank == 0:
        shutil.rmtree(out / "ckpt", ignore_errors=True)
