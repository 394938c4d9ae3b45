"""Token lengths of a chat-like corpus for the library's tests, from numpy alone (seeded).

Tokenized chat data is long-tailed: many short single-turn exchanges, a broad body of multi-turn
threads, a thin tail of long documents and code, all cut at the model's context length. A mixture
of three log-normal parts reproduces that shape (median about 1,350 tokens, mean about 1,950, 1-2%
of the samples at the cap), so the planning tests see the ties, the spread and the tail that real
lengths have, without depending on any corpus or on the study's data. Cost: O(n).
"""

from __future__ import annotations

import numpy as np

MIN_LEN = 48  # the chat template and the shortest prompt
MAX_LEN = 8191  # the cap: edges ending at 8192 cover every length
PARTS = (  # (share of samples, median tokens, log-normal sigma)
    (0.45, 650.0, 0.65),  # single-turn question and answer
    (0.40, 1900.0, 0.55),  # multi-turn threads
    (0.15, 4300.0, 0.50),  # long documents, code, transcripts
)


def chat_lengths(n: int, *, seed: int = 0, max_len: int = MAX_LEN) -> np.ndarray:
    """``n`` int64 token lengths in ``MIN_LEN..max_len``, deterministic in ``seed`` (module doc)."""
    if n < 1:
        raise ValueError(f"chat_lengths needs n >= 1, got {n}")
    rng = np.random.default_rng(seed)
    share, median, sigma = (np.asarray(c, dtype=np.float64) for c in zip(*PARTS))
    part = rng.choice(len(PARTS), size=n, p=share / share.sum())
    x = np.rint(median[part] * np.exp(sigma[part] * rng.standard_normal(n)))
    return np.clip(x, MIN_LEN, max_len).astype(np.int64)
