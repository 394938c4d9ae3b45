"""The quality stage's learnable objective and its inputs: the fixed split of the samples into a training
subset and a held-out set, the draft vocabulary (the most frequent trained tokens plus one "other" class) and
the unigram reference loss, each sample's target features computed once, a batch assembled with its features
in any layout, and the train stage's drafter with a trainable head over the draft vocabulary and its loss.

Separate from :mod:`lenbatch_study.stages.quality` (which runs the experiment over strategies and seeds and
writes its outputs): these are the pieces every run of the experiment shares, pure functions of their
arguments (seeded), no file read or written. Cost: a target forward per packed row of features; the rest
O(tokens).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lenbatch.loading.collate import Batch, collate
from lenbatch_study.core.config import Params
from lenbatch_study.models.drafter import Drafter, build_drafter


# --------------------------------------------------------------------------- data


def split_samples(
    lengths: np.ndarray, *, train_tokens: int, heldout_tokens: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint (train, held-out) dataset indices, each sorted: a seeded permutation, the held-out set
    first (until ``heldout_tokens`` useful tokens), then the training subset (until ``train_tokens``).
    Pure function of (lengths, sizes, seed); ``ValueError`` if the data is too small."""
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.random.default_rng([int(seed), 13]).permutation(lengths.size)
    csum = np.cumsum(lengths[order])
    if csum[-1] < train_tokens + heldout_tokens:
        raise ValueError(
            f"the data holds {int(csum[-1]):,} tokens, fewer than quality.train_tokens + "
            f"quality.heldout_tokens = {train_tokens + heldout_tokens:,}; lower them"
        )
    n_held = int(np.searchsorted(csum, heldout_tokens) + 1)
    rest = np.cumsum(lengths[order[n_held:]])
    n_train = int(np.searchsorted(rest, train_tokens) + 1)
    return np.sort(order[n_held : n_held + n_train]), np.sort(order[:n_held])


def draft_vocabulary(
    samples: dict[int, dict[str, np.ndarray]], indices: np.ndarray, *, size: int, vocab_size: int
) -> tuple[np.ndarray, np.ndarray, float]:
    """The ``size`` most frequent trained (loss-masked) tokens of ``indices``' samples.

    Returns (token ids [<= size], class map [vocab_size] int64: token -> class, others -> the last
    class ``len(ids)``, coverage = share of trained tokens inside the draft vocabulary).
    """
    toks = np.concatenate(
        [np.asarray(samples[int(i)]["input_ids"])[np.asarray(samples[int(i)]["loss_mask"], bool)] for i in indices]
    )
    counts = np.bincount(toks, minlength=vocab_size)
    top = np.argsort(-counts, kind="stable")[:size]
    top = top[counts[top] > 0]
    cmap = np.full(vocab_size, top.size, dtype=np.int64)
    cmap[top] = np.arange(top.size)
    return top, cmap, float(counts[top].sum() / max(toks.size, 1))


def unigram_loss(
    samples: dict[int, dict[str, np.ndarray]],
    train: np.ndarray,
    heldout: np.ndarray,
    *,
    class_map: np.ndarray,
    classes: int,
) -> float:
    """Reference: mean cross-entropy (nats) of the held-out trained tokens' classes under the training
    subset's class frequencies (add-1/2 smoothing): what a drafter that ignores its context reaches."""

    def labels(idx: np.ndarray) -> np.ndarray:
        return np.concatenate([class_map[samples[int(i)]["input_ids"][samples[int(i)]["loss_mask"]]] for i in idx])

    counts = np.bincount(labels(train), minlength=classes) + 0.5
    return float(-np.log(counts / counts.sum())[labels(heldout)].mean())


def target_features(
    target: Any, samples: dict[int, dict[str, np.ndarray]], indices: np.ndarray, *, row_tokens: int
) -> dict[int, torch.Tensor]:
    """Each sample's target features ``[L, F]``, from packed rows of at most ``row_tokens`` tokens (a packed
    forward equals the per-sequence forwards, so the features are the ones any batch would get)."""
    out: dict[int, torch.Tensor] = {}
    row: list[int] = []

    def flush() -> None:
        if not row:
            return
        b = collate([samples[i] for i in row], layout="packed", token_budget=None, max_batch_size=None, indices=row)
        f = target.features(b.input_ids, cu_seqlens=b.cu_seqlens)[0].clone()
        cu = b.cu_seqlens.tolist()
        for k, i in enumerate(row):
            out[i] = f[cu[k] : cu[k + 1]]
        row.clear()

    total = 0
    for i in indices:
        n = len(samples[int(i)]["input_ids"])
        if total + n > row_tokens:
            flush()
            total = 0
        row.append(int(i))
        total += n
    flush()
    return out


def assemble(
    samples: dict[int, dict[str, np.ndarray]], feats: dict[int, torch.Tensor], indices: np.ndarray, *, layout: str
) -> tuple[Batch, torch.Tensor]:
    """The batch of ``indices`` in ``layout`` and its features in the same layout (zeros on padding),
    both on the features' device, features in float32 (the drafter's master precision)."""
    idx = [int(i) for i in indices]
    first = feats[idx[0]]
    batch = collate([samples[i] for i in idx], layout=layout, token_budget=None, max_batch_size=None, indices=idx).to(
        first.device
    )
    if layout == "packed":
        return batch, torch.cat([feats[i] for i in idx])[None].float()
    m = batch.shape_length
    out = torch.zeros(len(idx), m, first.shape[1], device=first.device)
    for k, i in enumerate(idx):
        out[k, : feats[i].shape[0]] = feats[i]
    return batch, out


# --------------------------------------------------------------------------- model


def draft_model(params: Params, *, classes: int, seed: int) -> Drafter:
    """The train stage's drafter (:func:`lenbatch_study.models.drafter.build_drafter`) with a trainable head over
    the draft vocabulary's ``classes``, in float32, its weights drawn from ``model.init_seed + 1 + 1000 * seed``
    (seed k of every strategy starts from the same weights)."""
    return build_drafter(
        params, init_seed=params.model.init_seed + 1 + 1000 * seed, dtype="float32", head_classes=classes
    )


def draft_loss(
    model: Drafter,
    feats: torch.Tensor,
    batch: Batch,
    anchors: torch.Tensor,
    valid: torch.Tensor,
    *,
    embed_tokens: nn.Module,
    class_map: torch.Tensor,
) -> tuple[torch.Tensor, float]:
    """``(sum_i w_i ce_i / sum_i w_i, sum_i w_i)`` over the block positions the train stage trains (the
    drafter's :meth:`~lenbatch_study.models.drafter.Drafter.trained_positions`: same targets, same weights
    exp(-(k-1)/gamma)), through ``model.head``, labels mapped to draft-vocabulary classes."""
    h = model.block_states(feats, batch, anchors, embed_tokens=embed_tokens)
    hid, tok, w = model.trained_positions(h, batch, anchors, valid)
    if w.numel() == 0:
        return h.sum() * 0.0, 0.0
    ce = F.cross_entropy(model.head(hid), class_map[tok], reduction="none")
    wsum = w.sum()
    return (w * ce).sum() / wsum, float(wsum)


def flat_grad(model: nn.Module) -> np.ndarray:
    return (
        torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in model.parameters()])
        .double()
        .cpu()
        .numpy()
    )
