"""Which positions of each sample the drafter trains at a step: the anchors (numpy only).

Anchors: up to ``num`` per sequence, without replacement among the valid positions
``{a : a+1 < len, loss_mask[a+1]}`` (the first predicted token is a trained token), drawn
from ``numpy.random.default_rng([seed, epoch, step, dataset_index + 1])``: a resumed run, and
the same sequences packed or padded, draw the same anchors. The drafter
(:mod:`lenbatch_study.models.drafter`) trains them; the step-time model
(:func:`lenbatch_study.analysis.shapes.drafter_work`) counts the work they make. Cost O(length).
"""

from __future__ import annotations

import numpy as np

# Trained positions go through the vocabulary-sized lm_head this many rows at a time
# (:class:`lenbatch_study.models.drafter.ChunkedLinearCrossEntropy`): 128 x 248,320 fp32 logits
# = 127 MB alive. Each chunk reads the whole lm_head, so a step costs per chunk as well as per
# position; here, numpy only, because the step-time model counts the chunks as the drafter makes them.
CE_CHUNK_ROWS = 128


def draw_anchors(
    loss_mask: np.ndarray, length: int, *, num: int, seed: int, epoch: int, step: int, seq_id: int
) -> np.ndarray:
    """Up to ``num`` sorted anchor positions of one sequence, without replacement (see module doc)."""
    lm = np.asarray(loss_mask[:length], dtype=bool)
    valid = np.flatnonzero(lm[1:length])  # a such that a+1 < length and loss_mask[a+1]
    if valid.size == 0:
        return valid.astype(np.int64)
    # seq_id may be -1 (synthetic): shift so every entropy word is non-negative
    rng = np.random.default_rng([int(seed), int(epoch), int(step), int(seq_id) + 1])
    k = min(num, valid.size)
    return np.sort(rng.choice(valid, size=k, replace=False)).astype(np.int64)
