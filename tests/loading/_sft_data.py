"""Tiny SFT inputs shared by test_trl.py and _sft_trainer_run.py: a local ChatML tokenizer whose template
marks assistant turns ({% generation %}, for TRL's assistant_only_loss), a tiny random Qwen2 and a small
conversational dataset (every sample's text unique, so its tokens identify it)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _tiny import tiny_hf_tokenizer  # noqa: E402

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}"
    "{% else %}{{ m['content'] }}<|im_end|>{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = "hello world how are you I am fine user assistant".split()


def chat_tokenizer(path):
    """tests/_tiny.py's 400-token BPE with the ChatML template above; pad = eos = <|im_end|>. Saved at ``path``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_hf_tokenizer(path)))
    tok.chat_template = CHATML
    tok.pad_token = tok.eos_token = "<|im_end|>"
    tok.save_pretrained(str(path))
    return tok


def tiny_qwen2(vocab_size: int, seed: int = 0):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=vocab_size,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
        )
    )


def _text(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def conversations(n: int, *, fmt: str, seed: int = 0) -> list[dict]:
    """``fmt`` "prompt_completion" (one user turn -> one assistant turn; TRL trains the completion) or
    "messages" (two user/assistant exchanges; TRL's assistant_only_loss trains the assistant turns)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        user = [{"role": "user", "content": f"#{i} " + _text(rng, 1, 25)}]
        answer = [{"role": "assistant", "content": _text(rng, 1, 30)}]
        if fmt == "prompt_completion":
            rows.append({"prompt": user, "completion": answer})
        elif fmt == "messages":
            more = [{"role": "user", "content": _text(rng, 1, 8)}, {"role": "assistant", "content": _text(rng, 1, 10)}]
            rows.append({"messages": user + answer + more})
        else:
            raise ValueError(fmt)
    return rows
