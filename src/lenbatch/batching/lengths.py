"""Length arrays: checks, statistics, histogram and counts per bucket (numpy only).

The study's ``stats`` stage renders these numbers; the study's seed profile (a stand-in for its
published length distribution) lives in :mod:`lenbatch_study.corpus.seed_profile`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lenbatch.batching.strategy import edges_tuple

STAT_PERCENTILES = (10, 25, 50, 75, 90, 95, 99, 100)


def check_lengths(lengths: Any, *, name: str = "lengths") -> np.ndarray:
    """Validate a 1-D array of positive integer lengths and return it as int64.

    Raises ``ValueError`` naming the problem and the fix (empty, not 1-D, not integer,
    zero or negative entries).
    """
    _refuse_datasets(lengths, name)
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of token counts, got shape {arr.shape}; flatten it")
    if arr.size == 0:
        raise ValueError(f"{name} is empty; give at least one sample length (tokens)")
    if not np.issubdtype(arr.dtype, np.integer):
        if np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            if np.any(np.abs(arr) > _MAX_LENGTH):  # the int64 cast would wrap, and a wrapped count looks negative
                first = int(np.argmax(np.abs(arr) > _MAX_LENGTH))
                raise ValueError(
                    f"{name} has a length of {arr[first]:g} tokens at index {first}: too long to be a "
                    f"token count (at most {_MAX_LENGTH:,}); pass integer token counts"
                )
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"{name} must hold integer token counts, got dtype {arr.dtype}; round or cast them")
    arr = arr.astype(np.int64, copy=False)
    bad = int(np.count_nonzero(arr <= 0))
    if bad:
        raise ValueError(
            f"{name} has {bad} zero or negative length(s) (first at index "
            f"{int(np.argmax(arr <= 0))}); drop empty samples before batching"
        )
    return arr


# The longest length accepted: 2**53, where floats stop holding every integer (a count past it is no
# longer exact, and sums over an epoch would leave int64).
_MAX_LENGTH = 2**53


def _refuse_datasets(lengths: Any, name: str) -> None:
    """``ValueError`` for a dataset given where lengths are expected: numpy would read a streaming
    dataset as one object (shape ()) and a map-style one row by row, into an object array."""
    if isinstance(lengths, (np.ndarray, list, tuple, range)):
        return
    if not hasattr(lengths, "__len__") and hasattr(lengths, "__iter__"):
        raise ValueError(
            f"{name} must be one token count per sample, known up front, but got a "
            f"{type(lengths).__name__} with no len() (an IterableDataset or a stream): a plan places "
            "every sample of the epoch, so count the lengths in one pass (lengths = np.array([len(s["
            "'input_ids']) for s in dataset])) and index a map-style copy of the data, or batch the "
            "stream as it comes with lenbatch.StreamingBatcher"
        )
    if hasattr(lengths, "column_names") or hasattr(lengths, "features"):
        raise ValueError(
            f"{name} must be one token count per sample, but got {type(lengths).__name__} (the "
            "dataset itself); pass lb.lengths_of(dataset) (read from the Arrow offsets)"
        )


def length_stats(lengths: Any) -> dict[str, Any]:
    """count, total_tokens, mean, std, min, max and percentiles p10..p100 (numpy's linear method)."""
    x = check_lengths(lengths)
    pct = np.percentile(x, STAT_PERCENTILES)
    return {
        "count": int(x.size),
        "total_tokens": int(x.sum()),
        "mean": float(x.mean()),
        "std": float(x.std()),
        "min": int(x.min()),
        "max": int(x.max()),
        "percentiles": {f"p{p}": float(v) for p, v in zip(STAT_PERCENTILES, pct)},
    }


def histogram(lengths: Any, *, bins: int = 64) -> list[dict[str, int]]:
    """Equal-width histogram rows ``{"lo", "hi", "count"}`` (half-open ``[lo, hi)``, last bin closed)."""
    x = check_lengths(lengths)
    if bins < 1:
        raise ValueError(f"stats.histogram_bins must be >= 1, got {bins}")
    counts, edges = np.histogram(x, bins=bins, range=(0, int(x.max()) + 1))
    return [
        {"lo": int(np.floor(a)), "hi": int(np.floor(b)), "count": int(c)}
        for a, b, c in zip(edges[:-1], edges[1:], counts)
    ]


def bucket_ids(lengths: Any, edges: Any) -> np.ndarray:
    """Bucket index of every sample: bucket k holds ``edges[k] <= length < edges[k+1]``.

    ``ValueError`` if the edges are not strictly increasing or do not cover the lengths.
    """
    x = check_lengths(lengths)
    e = check_edges(edges, x)
    return np.searchsorted(e, x, side="right") - 1


def check_edges(edges: Any, lengths: np.ndarray) -> np.ndarray:
    """``edges`` as an int64 array, checked as :func:`lenbatch.batching.strategy.edges_tuple` checks them (K+1 >= 2
    strictly increasing non-negative ints) and covering ``lengths``: ``edges[0] <= min``, ``edges[-1] > max``."""
    e = np.asarray(edges_tuple(edges), dtype=np.int64)
    if e[0] > lengths.min() or e[-1] <= lengths.max():
        raise ValueError(
            f"edges {e.tolist()} do not cover the lengths {int(lengths.min())}..{int(lengths.max())}: "
            "need edges[0] <= min and edges[-1] > max; recompute boundaries for these lengths"
        )
    return e


def bucket_counts(lengths: Any, edges: Any) -> list[dict[str, Any]]:
    """Per bucket: lo, hi, count, tokens, mean length."""
    x = check_lengths(lengths)
    e = check_edges(edges, x)
    ids = np.searchsorted(e, x, side="right") - 1
    k = len(e) - 1
    counts = np.bincount(ids, minlength=k)
    tokens = np.bincount(ids, weights=x, minlength=k)
    return [
        {
            "lo": int(e[i]),
            "hi": int(e[i + 1]),
            "count": int(counts[i]),
            "tokens": int(tokens[i]),
            "mean": float(tokens[i] / counts[i]) if counts[i] else 0.0,
        }
        for i in range(k)
    ]
