"""Token-normalised loss under gradient accumulation: count the learned tokens of a whole optimizer step.

A token budget makes micro-batches carry different numbers of learned tokens, so averaging each
micro-batch's mean loss (``loss / accum``) weights a token of a short micro-batch more than one of a long
one. The loss that weights every token equally is ``sum of token losses / learned tokens of the whole
step``, over every micro-batch and every rank, which is what transformers' ``Trainer`` does with
``num_items_in_batch``. :func:`learned_tokens` gives that denominator; a causal LM of transformers takes
it as ``model(**inputs, num_items_in_batch=n)`` (its loss is then the sum over tokens / n)::

    micro = [next(batches) for _ in range(accum)]           # one optimizer step's micro-batches
    n = lb.learned_tokens(micro)                             # all_ranks=True under DDP
    for batch in micro:
        model(**batch.model_inputs(), num_items_in_batch=n).loss.backward()
    opt.step(); opt.zero_grad()

Under DDP, gradients are averaged over ranks, so with ``all_ranks=True`` multiply each loss by the world
size before ``backward`` (transformers does the same). A learned token is one whose label is not -100
*after the shift* a causal LM applies (position t predicts label t+1): ``(labels[..., 1:] != -100)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def learned_tokens(micro_batches: Iterable[Any], *, all_ranks: bool = False, group: Any = None) -> int:
    """Learned tokens over ``micro_batches`` (and, with ``all_ranks=True``, over every rank).

    Each item is a :class:`lenbatch.loading.collate.Batch`, a mapping with ``labels`` (what
    ``model_inputs()`` returns) or a labels tensor ``[B, T]``. Count = sum over items of
    ``(labels[..., 1:] != -100).sum()`` (for a ``Batch``: its ``model_inputs()`` labels, so packed rows'
    sequence starts are not counted). ``all_ranks=True`` sums the count over the ranks of ``group``
    (default: the whole world) with one ``torch.distributed.all_reduce`` (on the labels' device, which
    must suit the backend: CUDA for NCCL); without an initialised process group it is the local count.
    Cost: O(tokens) comparisons, plus one all-reduce of one int64.
    """
    import torch

    total = None
    for i, item in enumerate(micro_batches):
        labels = _labels(i, item)
        count = (labels[..., 1:] != -100).sum()
        total = count if total is None else total + count.to(total.device)
    if total is None:
        raise ValueError("micro_batches is empty; pass the micro-batches of one optimizer step")
    if all_ranks and torch.distributed.is_available() and torch.distributed.is_initialized():
        total = total.to(torch.int64).clone()
        torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.SUM, group=group)
    return int(total)


def _labels(i: int, item: Any) -> Any:
    import torch

    if isinstance(item, torch.Tensor):
        labels = item
    elif hasattr(item, "model_inputs"):
        labels = item.model_inputs()["labels"]
    elif hasattr(item, "get") and item.get("labels") is not None:
        labels = item["labels"]
    else:
        raise ValueError(
            f"micro-batch {i} is a {type(item).__name__} without labels; pass lenbatch Batches, "
            "model_inputs() dicts or labels tensors"
        )
    if not isinstance(labels, torch.Tensor) or labels.ndim < 1:
        raise ValueError(f"micro-batch {i}: labels must be a tensor [B, T], got {type(labels).__name__}")
    return labels
