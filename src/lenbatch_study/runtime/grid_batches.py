"""The profile grid's shapes and their batches: every (layout, sequences, length) point the profile times
(:func:`grid_points`, within the token budget, max_batch_size and data.max_len) and a collated batch of
synthetic token ids of given sequence lengths (:func:`make_batch`, what training feeds).

Separate from :mod:`lenbatch_study.stages.profile` (which times the steps and imports these names; the
benchmarks build their batches with :func:`make_batch` too): which shapes are timed and what a timed batch
holds, apart from how they are timed. Cost: O(grid points); a batch, O(its tokens).
"""

from __future__ import annotations

import numpy as np

from lenbatch_study.core.batchspec import batch_spec
from lenbatch_study.core.config import Params
from lenbatch_study.core.log import get_logger
from lenbatch_study.runtime.synthetic import synthetic_sequences

log = get_logger("profile")


def grid_points(params: Params, *, quiet: bool = False) -> list[tuple[str, int, int]]:
    """(layout, sequences, length) of every grid point, smallest shapes first.

    Points above the token budget, above max_batch_size or longer than data.max_len are
    skipped (they can never occur in a plan); the number skipped is logged.
    """
    pr, spec = params.profile, batch_spec(params)
    budget, max_bs, max_len = spec.token_budget, spec.max_batch_size, params.data.max_len
    lengths = sorted({int(m) for m in pr.lengths})
    pts: set[tuple[str, int, int]] = set()
    skipped = 0
    for m in lengths:
        if m > max_len:
            skipped += len(pr.batch_sizes)
            continue
        for n in pr.batch_sizes:
            if spec.fits(n, m, layout="padded"):
                pts.add(("padded", int(n), m))
            else:
                skipped += 1
        fill = min(max_bs, budget // m)  # the batch that fills the budget at this length
        if fill >= 1:
            pts.add(("padded", fill, m))
    for L in sorted({int(x) for x in pr.packed_lengths} | {budget}):
        if L > budget:
            continue
        for k in pr.packed_seqs:
            if k <= L and k * max_len >= L:  # k parts of at most max_len tokens fill the row
                pts.add(("packed", int(k), L))
            else:
                skipped += 1
    if skipped and not quiet:
        log.info(
            "grid: skipped %d shapes outside token_budget=%d, max_batch_size=%d, max_len=%d",
            skipped,
            budget,
            max_bs,
            max_len,
        )
    return sorted(pts, key=lambda p: (p[1] * p[2], p[0], p[1]))


def make_batch(layout: str, lengths: list[int], params: Params, *, seed: int):
    """A collated batch of synthetic token ids with these sequence lengths (what training feeds)."""
    from lenbatch.loading import collate

    seqs = synthetic_sequences(np.asarray(lengths), vocab_size=params.model.vocab_size, seed=seed)
    spec = batch_spec(params)
    # distinct sequence ids, as a real batch's dataset indices are: the drafter draws each sequence's
    # anchors from its id (models.anchors), so equal ids would put every anchor of the batch at one
    # offset, and a step's trained positions and context would swing all-or-nothing from step to step
    return collate.collate(seqs, layout=layout, spec=spec, indices=np.arange(len(lengths)))
