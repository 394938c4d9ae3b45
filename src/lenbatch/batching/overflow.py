"""Samples longer than the token budget: refuse them (``"error"``), cut them to the budget
(``"truncate"``) or cut them into budget-sized pieces that are planned as samples of their own
(``"split"``).

A plan is built over *pieces*: piece ``v`` is tokens ``start[v]:end[v]`` of dataset row ``row[v]``.
Pieces ``0..N-1`` are the N samples in order (each cut to the budget if longer), so a sample that
fits keeps its row index as its piece index; ``split`` appends every further piece (tokens
``k*B:(k+1)*B`` for k >= 1, the last one shorter) after them, grouped by row. :meth:`Pieces.item`
turns a piece index into what a sampler yields: the row (an ``int``) for a whole sample, else the
tuple ``(row, start, end)`` that :class:`lenbatch.loading.overflow.PieceDataset` slices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lenbatch.batching.lengths import check_lengths

OVERFLOW_MODES = ("error", "truncate", "split")


@dataclass(frozen=True)
class Pieces:
    """What each planned piece is and the counts of what changed. ``lengths`` (int64, one per piece) is
    what the plan is built over; ``row``, ``start``, ``end`` (int64) and ``whole`` (bool) say which
    tokens of which row each piece is. When no sample is cut (always with ``"error"``) piece v is
    sample v, whole: those four are then made only when read (``cut`` is None), so a sampler over 20 M
    lengths builds no 500 MB of per-piece arrays that say nothing."""

    lengths: np.ndarray
    mode: str
    token_budget: int
    num_samples: int
    samples_over_budget: int  # samples longer than token_budget
    tokens_dropped: int  # truncate: tokens cut off and never trained; split: 0
    cut: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None  # (row, start, end, whole)

    @property
    def row(self) -> np.ndarray:
        return np.arange(self.num_samples, dtype=np.int64) if self.cut is None else self.cut[0]

    @property
    def start(self) -> np.ndarray:
        return np.zeros(self.num_samples, dtype=np.int64) if self.cut is None else self.cut[1]

    @property
    def end(self) -> np.ndarray:
        return self.lengths.astype(np.int64) if self.cut is None else self.cut[2]

    @property
    def whole(self) -> np.ndarray:
        return np.ones(self.num_samples, dtype=bool) if self.cut is None else self.cut[3]

    @property
    def pieces_added(self) -> int:
        """Pieces beyond one per sample (split)."""
        return int(self.lengths.size) - self.num_samples

    def counts(self) -> dict[str, int]:
        return {
            "samples_over_budget": self.samples_over_budget,
            "tokens_dropped": self.tokens_dropped,
            "pieces_added": self.pieces_added,
        }

    def item(self, v: int) -> int | tuple[int, int, int]:
        """Piece ``v`` as a sampler yields it: the dataset row, or ``(row, start, end)`` for a part."""
        if self.cut is None:
            return int(v)
        row, start, end, whole = self.cut
        if whole[v]:
            return int(row[v])
        return int(row[v]), int(start[v]), int(end[v])

    def items(self, batch: np.ndarray) -> list[int | tuple[int, int, int]]:
        """Every piece of a batch (``item`` each); plain ints when the batch holds whole samples only."""
        if not self.samples_over_budget:
            return batch.tolist()
        row, _, _, whole = self.cut
        if whole[batch].all():
            return row[batch].tolist()
        return [self.item(v) for v in batch.tolist()]

    def report(self) -> str:
        if not self.samples_over_budget:
            return f"overflow={self.mode!r}: no sample is longer than token_budget={self.token_budget}"
        what = (
            f"truncated to {self.token_budget} tokens, {self.tokens_dropped} tokens dropped"
            if self.mode == "truncate"
            else f"split into {self.samples_over_budget + self.pieces_added} pieces "
            f"of at most {self.token_budget} tokens ({self.pieces_added} extra samples)"
        )
        return (
            f"overflow={self.mode!r}: {self.samples_over_budget} of {self.num_samples} samples are longer than "
            f"token_budget={self.token_budget}: {what}"
        )


def overflow_pieces(lengths: Any, *, token_budget: int, overflow: str) -> Pieces:
    """The pieces the plan is built over (see the module doc). ``"error"`` refuses a sample longer than
    ``token_budget`` (``ValueError`` naming the other modes). Cost: O(samples + pieces); when no sample
    is longer than the budget, one pass and no copy of int64 lengths (the pieces are the samples)."""
    if overflow not in OVERFLOW_MODES:
        raise ValueError(f"overflow must be one of {OVERFLOW_MODES}, got {overflow!r}")
    x = check_lengths(lengths)
    B = int(token_budget)
    over = x > B
    n_over = int(np.count_nonzero(over))
    if n_over and overflow == "error":
        raise ValueError(
            f"{n_over} sample(s) are longer than token_budget={B} (longest {int(x.max())} tokens); "
            "raise token_budget, or pass overflow='truncate' (cut them to the budget) or "
            "overflow='split' (the rest becomes samples of their own)"
        )
    n = x.size
    if not n_over:
        return Pieces(lengths=x, mode=overflow, token_budget=B, num_samples=n, samples_over_budget=0, tokens_dropped=0)
    first_end = np.minimum(x, B)
    row, start, end = np.arange(n, dtype=np.int64), np.zeros(n, dtype=np.int64), first_end.astype(np.int64)
    dropped = 0
    if overflow == "split" and n_over:
        extra = (x - 1) // B  # further pieces per sample
        r = np.repeat(np.arange(n, dtype=np.int64), extra)
        # k-th further piece of its row (1-based): position within the row's run
        first = np.concatenate([[0], np.cumsum(extra)[:-1]])
        k = np.arange(r.size, dtype=np.int64) - np.repeat(first, extra) + 1
        s = k * B
        e = np.minimum(s + B, x[r])
        row, start, end = np.concatenate([row, r]), np.concatenate([start, s]), np.concatenate([end, e])
    elif overflow == "truncate":
        dropped = int((x - first_end).sum())
    whole = np.zeros(row.size, dtype=bool)
    whole[:n] = ~over
    return Pieces(
        lengths=end - start,
        mode=overflow,
        token_budget=B,
        num_samples=n,
        samples_over_budget=n_over,
        tokens_dropped=dropped,
        cut=(row, start, end, whole),
    )
