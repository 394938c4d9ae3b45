"""The tiny target every training test builds (2 layers, hidden 32, the real 248,320-token vocabulary)
and the environment its subprocesses run in: one definition for test_train, test_transport and test_quality."""

from __future__ import annotations

import os

TINY_DATA = {"max_len": 1024}
TINY_MODEL = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "layer_types": ["linear_attention", "full_attention"],
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "target_layers": [0, 1],
}
# one thread per process: tiny shapes gain nothing from a second one, and a busy CI box stalls on it
# A training of one torchrun of 2 processes long enough to stop midway (about 40 steps), with no periodic
# checkpoint: the only one a stopped run has is the one its signal made it write (the signal and launcher tests)
TINY_STOPPABLE_RUN = {
    "data": TINY_DATA,
    "model": TINY_MODEL,
    "drafter": {"num_layers": 1, "num_heads": 2, "anchors_per_seq": 1},
    "batching": {"token_budget": 2048, "max_batch_size": 8},
    "train": {
        "nproc": 2,
        "useful_tokens": 40000,
        "warmup_steps": 1,
        "queue_size": 2,
        "threads": 1,
        "device": "cpu",
        "checkpoint_every": 0,
    },
}
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def tiny_hf_tokenizer(path, special=("<|im_start|>", "<|im_end|>")):
    """A 400-token byte-level BPE tokenizer with ChatML specials, saved as a local HF tokenizer folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=list(special), initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["Hello world, how are you? I am fine. user assistant system\n"] * 20, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(str(path))
    return path
