"""Shape tables of batches: the features a step's time depends on (numpy only).

A *shape table* has one row per step: sequences, length (longest, or the packed row's length),
computed and useful tokens, the sum of squared lengths (attention), and the drafter's work
(context tokens and trained positions, exactly as :mod:`lenbatch_study.models.anchors` draws them,
and the lm_head chunks those positions make, ``ceil(positions / CE_CHUNK_ROWS)``).
The profile stage records these for its grid points (:func:`grid_shape`), the compare stage for
every planned step; :mod:`lenbatch_study.analysis.stepmodel` fits and predicts on them.
Cost O(total samples).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lenbatch_study.models.anchors import CE_CHUNK_ROWS, draw_anchors


def batch_columns(
    lengths: np.ndarray,
    batches: Sequence[np.ndarray],
    *,
    layout: str,
    attention: str = "segment",
    drafter: tuple[np.ndarray, np.ndarray] | None = None,
    positions_per_seq: float | None = None,
    lm_chunks: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Shape table of a list of batches (index arrays into ``lengths``).

    padded: computed = n * m, sum_len_sq = n * m^2 (padding attends too), length = m.
    packed: one row per batch, computed = sum l_i (the row length), length = the row
    length, sum_len_sq = sum l_i^2 when attention is restricted to each sequence
    (``attention='segment'``) or L^2 when a dense masked row is computed
    (``attention='dense'``). Drafter work: ``drafter`` = (positions, ctx_tokens) per batch
    from :func:`drafter_work` when the loss masks are known; otherwise ctx_tokens =
    n * max l_i and positions = n * ``positions_per_seq`` (NaN if not given): estimates.
    ``lm_chunks`` = ``ceil(positions / CE_CHUNK_ROWS)``, the row chunks the lm_head runs in (each
    reads the whole ``[V, H]`` matrix), unless given: a profile grid point passes the mean over its
    timed steps, whose positions vary with the anchors drawn (the chunks of the mean positions would
    not be the mean chunks). Cost O(total samples).
    """
    if layout not in ("padded", "packed"):
        raise ValueError(f"layout must be 'padded' or 'packed', got {layout!r}")
    if attention not in ("segment", "dense"):
        raise ValueError(f"attention must be 'segment' or 'dense', got {attention!r}")
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(batches)
    cols = {
        k: np.zeros(n, dtype=np.float64)
        for k in ("sequences", "length", "computed_tokens", "useful_tokens", "sum_len_sq", "ctx_tokens", "positions")
    }
    for i, idx in enumerate(batches):
        ls = lengths[np.asarray(idx, dtype=np.int64)]
        assert ls.size > 0, "empty batch in a plan"
        useful = float(ls.sum())
        if layout == "padded":
            m = float(ls.max())
            computed, sq = ls.size * m, ls.size * m * m
            length = m
        else:
            computed, length = useful, useful
            sq = float((ls.astype(np.float64) ** 2).sum()) if attention == "segment" else useful * useful
        cols["sequences"][i] = ls.size
        cols["length"][i] = length
        cols["computed_tokens"][i] = computed
        cols["useful_tokens"][i] = useful
        cols["sum_len_sq"][i] = sq
        cols["ctx_tokens"][i] = ls.size * float(ls.max())
    cols["positions"] = cols["sequences"] * (np.nan if positions_per_seq is None else float(positions_per_seq))
    if drafter is not None:
        cols["positions"] = np.asarray(drafter[0], dtype=np.float64)
        cols["ctx_tokens"] = np.asarray(drafter[1], dtype=np.float64)
        assert cols["positions"].shape == (n,) and cols["ctx_tokens"].shape == (n,)
    cols["lm_chunks"] = np.ceil(cols["positions"] / CE_CHUNK_ROWS)
    if lm_chunks is not None:
        cols["lm_chunks"] = np.asarray(lm_chunks, dtype=np.float64)
        assert cols["lm_chunks"].shape == (n,)
    return cols


ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}  # bytes of one feature value, by model.dtype


def transport_bytes(
    computed_tokens: np.ndarray, sequences: np.ndarray, *, feature_dim: int, itemsize: int
) -> np.ndarray:
    """Bytes a target rank sends the drafter rank per step on the data group
    (:meth:`lenbatch_study.runtime.transport.TargetLink.send`): input ids (int64) and loss mask (uint8) of
    every computed token, lengths and indices (int64) of every sequence, and the features
    (``feature_dim`` = target layers x hidden size values of ``itemsize`` bytes per computed token). A batch's
    rows x columns are its computed tokens in both layouts (padded n x m; packed: one row). O(steps)."""
    c = np.asarray(computed_tokens, dtype=np.float64)
    return c * (8 + 1 + feature_dim * itemsize) + 16 * np.asarray(sequences, dtype=np.float64)


def grid_shape(layout: str, sequences: int, length: int, *, max_len: int | None = None) -> list[int]:
    """Sequence lengths of one profiling grid point.

    padded: ``sequences`` samples of exactly ``length`` tokens (padding costs as much as
    real tokens in the target, so full rows time the same shape).
    packed: one row of ``length`` tokens split into ``sequences`` parts growing linearly
    from 1 to 8 (weights 1 + 7 i / (k - 1)), like a real row that mixes short and long
    samples, so that row length, sum of squares and sequences x longest are not
    proportional across the grid. If the longest part would exceed ``max_len`` the ramp
    is flattened (down to an equal split); ``ValueError`` if even that does not fit.
    """
    k, L = int(sequences), int(length)
    if layout == "padded":
        return [L] * k
    if k < 1 or L < k:
        raise ValueError(
            f"packed grid point: row length {length} cannot hold {sequences} sequences; lower "
            "profile.packed_seqs or raise profile.packed_lengths"
        )
    for ratio in (8.0, 4.0, 2.0, 1.0):
        weights = 1.0 + (ratio - 1.0) * np.arange(k) / max(k - 1, 1)
        parts = np.maximum(1, np.floor(L * weights / weights.sum())).astype(np.int64)
        parts[-1] += L - parts.sum()
        if max_len is None or parts.max() <= max_len:
            assert parts.sum() == L and parts.min() >= 1
            return [int(x) for x in parts]
    raise ValueError(
        f"packed grid point: a row of {length} tokens cannot hold {sequences} sequences of at most "
        f"data.max_len={max_len} tokens; raise profile.packed_seqs or lower profile.packed_lengths"
    )


def drafter_work(
    lengths: Sequence[int],
    loss_masks: Sequence[np.ndarray],
    seq_ids: Sequence[int],
    *,
    anchors_per_seq: int,
    block_size: int,
    seed: int,
    epoch: int,
    step: int,
) -> tuple[int, int]:
    """(trained positions, context tokens) of one drafter step, exactly as the drafter draws them.

    Anchors come from :func:`lenbatch_study.models.anchors.draw_anchors` (seed, epoch, step, dataset
    index), so this is the work the run will do: positions = block offsets k = 1..b-1
    with a + k inside the sequence and its loss mask (rows through the lm_head);
    context tokens = sequences x the step's largest anchor (the drafter's context tensor).
    Cost O(tokens of the step).
    """
    positions, largest = 0, 1
    offs = np.arange(1, block_size)
    for n, lm, sid in zip(lengths, loss_masks, seq_ids):
        lm = np.asarray(lm, dtype=bool)
        a = draw_anchors(lm, int(n), num=anchors_per_seq, seed=seed, epoch=epoch, step=step, seq_id=int(sid))
        if a.size:
            largest = max(largest, int(a.max()))
            tgt = (a[:, None] + offs[None, :]).ravel()
            tgt = tgt[tgt < int(n)]
            positions += int(lm[tgt].sum())
    return positions, len(lengths) * largest
