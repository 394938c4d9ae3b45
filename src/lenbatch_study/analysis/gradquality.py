"""Gradient quality and seed statistics: pure functions on arrays (numpy only).

Gradient quality at fixed weights (DESIGN.md "gradient quality"). For a strategy's batches
``b = 1..n`` with flattened gradients ``g_b`` (rows of ``grads [n, P]``), ``B_b`` useful tokens
each, and the full-data gradient ``G``:

* **cosine**: ``mean_b cos(g_b, G)``: how representative one batch is of the data;
* **variance per useful token**: ``tr(Sigma) ~= mean_b B_b * ||g_b - G||^2``. For batches of
  ``B`` tokens drawn independently, ``E ||g_b - G||^2 = tr(Sigma) / B`` with ``Sigma`` the
  per-token gradient covariance, so the estimate is the per-token covariance trace and does not
  depend on the batch size. A batch whose composition is biased (all long samples, all short)
  adds its bias ``||E g_b - G||^2`` undivided by ``B``, so composition bias shows as a larger value;
* **gradient noise scale** ``B_simple = tr(Sigma) / |G|^2`` (McCandlish et al. 2018, in useful
  tokens): the batch size at which the batch gradient's noise equals the signal;
* **length-loss correlation**: Pearson r between a batch's mean sample length and its loss
  (the "sawtooth" of length-grouped sampling: +-1 when the loss follows the length).

Seed statistics (intervals over seeds) are :mod:`lenbatch_study.core.intervals`'.

Cost: ``O(n * P)``.
"""

from __future__ import annotations

import math

import numpy as np


# --------------------------------------------------------------------------- gradient measures


def full_gradient(grads: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``G = sum_b W_b g_b / sum_b W_b``: the gradient of the whole epoch's loss when batch ``b``'s loss is
    a mean over its own loss weight ``W_b`` (an epoch holds every sample once, so this is the
    full-data gradient whatever the strategy). ``grads [n, P]``, ``weights [n]``."""
    g = np.asarray(grads, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if g.ndim != 2 or w.shape != (g.shape[0],) or g.shape[0] == 0:
        raise ValueError(f"grads must be [n, P] and weights [n] with n >= 1, got {g.shape} and {w.shape}")
    if not (w > 0).all():
        raise ValueError("every batch weight must be > 0 (a batch without a trained position has no gradient)")
    return (w[:, None] * g).sum(0) / w.sum()


def gradient_quality(grads: np.ndarray, sizes: np.ndarray, full: np.ndarray) -> dict[str, float]:
    """Cosine to ``full``, variance per useful token and noise scale of batch gradients (module doc).

    ``grads [n, P]`` batch gradients, ``sizes [n]`` useful tokens per batch, ``full [P]`` = G.
    Returns cosine_mean, cosine_min, variance_per_token (tr Sigma), noise_scale (B_simple,
    tokens), full_norm_sq (|G|^2), mean_batch_tokens, batches.
    """
    g = np.asarray(grads, dtype=np.float64)
    B = np.asarray(sizes, dtype=np.float64)
    G = np.asarray(full, dtype=np.float64)
    if g.ndim != 2 or B.shape != (g.shape[0],) or G.shape != (g.shape[1],) or g.shape[0] == 0:
        raise ValueError(f"grads [n, P], sizes [n], full [P] expected, got {g.shape}, {B.shape}, {G.shape}")
    gn = np.linalg.norm(g, axis=1)
    Gn = float(np.linalg.norm(G))
    cos = (g @ G) / np.maximum(gn * Gn, 1e-300)
    dev = ((g - G) ** 2).sum(1)
    tr = float((B * dev).mean())
    return {
        "cosine_mean": float(cos.mean()),
        "cosine_min": float(cos.min()),
        "variance_per_token": tr,
        "noise_scale": tr / Gn**2 if Gn > 0 else float("inf"),
        "full_norm_sq": Gn**2,
        "mean_batch_tokens": float(B.mean()),
        "batches": int(g.shape[0]),
    }


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation; nan when either side is constant or there are fewer than 3 points."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"pearson needs two 1-D arrays of one length, got {x.shape} and {y.shape}")
    if x.size < 3:
        return float("nan")
    dx, dy = x - x.mean(), y - y.mean()
    den = math.sqrt(float((dx * dx).sum() * (dy * dy).sum()))
    return float((dx * dy).sum() / den) if den > 0 else float("nan")


# --------------------------------------------------------------------------- Student t


__all__ = ["full_gradient", "gradient_quality", "pearson"]
