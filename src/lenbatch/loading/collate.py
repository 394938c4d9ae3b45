"""Batch collation: a planned batch of samples -> the tensors one training step consumes.

Public as ``lenbatch.collate_padded`` / ``lenbatch.collate_packed`` (DESIGN.md). A sample is a
mapping with ``input_ids`` (1-D ints) and optionally a loss mask (same length; 1 = a token the
loss predicts; absent = every token) under any of the names ``loss_mask``, ``completion_mask``
(TRL's prompt/completion data) or ``assistant_masks`` (transformers' chat template with
``return_assistant_tokens_mask=True``): a sample carrying two of them must carry equal ones
(``ValueError`` naming both otherwise); and ``labels`` (same length; the token each position is
scored against, -100 = not learned, as Hugging Face and TRL datasets carry them; absent = the
sample's ``input_ids``). Both return a :class:`Batch`; ``Batch.model_inputs()`` gives the keyword
arguments a Hugging Face causal LM takes (``labels`` = -100 where nothing is learned).

**Labels path.** When any sample of a batch has ``labels``, the batch keeps them (``Batch.labels``,
-100 on padding; a sample without them contributes its ``input_ids``, as TRL's collator does) and
a token is learned iff its ``loss_mask`` (if given) is 1 *and* its label is not -100:
``Batch.loss_mask = loss_mask & (labels != -100)``; ``model_inputs()`` scores ``labels`` instead of
``input_ids``. Without ``labels`` nothing changes: ``Batch.labels`` is None and every tensor is the
one earlier versions built (the train stage's batches depend on it).

Two layouts, one :class:`Batch` type (``S`` sequences):

* **padded** (``sorted``, ``random``, ``bucketed``, ``sortish``): ``n = S`` samples right-padded
  to the longest, ``m``; ``input_ids``/``attention_mask``/``loss_mask``/``position_ids`` are
  ``[n, m]`` (positions 0..m-1 in every row). computed tokens = ``n * m``; the batch must satisfy
  ``n * m <= token_budget`` and ``n <= max_batch_size`` (the greedy token-budget rule of DESIGN.md).
* **packed** (``packed``): the samples concatenated into one row ``[1, T]``, ``T = sum(len)``;
  ``position_ids`` restart at 0 at every sequence, ``cu_seqlens`` (int32, ``[S+1]``, 0 first, T
  last) holds the sequence starts, ``seq_index`` (``[1, T]``) the sequence of every token. No
  attention mask: attention must stay inside each sequence (varlen kernels read ``cu_seqlens``;
  transformers reads ``position_ids`` or ``cu_seq_lens_q/k``, see ``model_inputs``). computed
  tokens = ``T`` (no fixed capacity); the row must satisfy ``T <= token_budget``.

Every layout also has ``lengths`` ``[S]`` and ``indices`` ``[S]`` (dataset rows; -1 when not given).
A batch that breaks its budget raises ``ValueError``: a plan that does not fit would silently
change the shapes being measured. Cost: O(total tokens) copies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from lenbatch.batching.spec import refuse_both
from lenbatch.batching.strategy import Strategy


@dataclass
class Batch:
    """One step's tensors (CPU or device). ``S`` sequences in ``[B, T]`` (padded: B = S; packed: B = 1)."""

    layout: str  # "padded" | "packed"
    input_ids: torch.Tensor  # [B, T] int64 (pad id 0 beyond a sequence)
    loss_mask: torch.Tensor  # [B, T] bool, False on padding
    position_ids: torch.Tensor  # [B, T] int64 (packed: restart per sequence)
    lengths: torch.Tensor  # [S] int64
    indices: torch.Tensor  # [S] int64 dataset row of every sequence (-1: synthetic)
    attention_mask: Optional[torch.Tensor] = None  # [B, T] int64 (padded only)
    cu_seqlens: Optional[torch.Tensor] = None  # [S+1] int32 (packed only)
    seq_index: Optional[torch.Tensor] = None  # [1, T] int64 (packed only)
    labels: Optional[torch.Tensor] = None  # [B, T] int64 given labels, -100 on padding (None: input_ids)

    @property
    def num_sequences(self) -> int:
        return int(self.lengths.numel())

    @property
    def useful_tokens(self) -> int:
        return int(self.lengths.sum())

    @property
    def computed_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def shape_length(self) -> int:
        """Padded: the longest sequence (padded length); packed: the row length."""
        return int(self.input_ids.shape[1])

    def seq_rows_starts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Where each sequence lives in ``[B, T]``: (row [S], start [S]) int64."""
        if self.layout == "packed":
            assert self.cu_seqlens is not None
            starts = self.cu_seqlens[:-1].to(torch.int64)
            return torch.zeros_like(starts), starts
        rows = torch.arange(self.num_sequences, dtype=torch.int64, device=self.lengths.device)
        return rows, torch.zeros_like(rows)

    def model_inputs(self, *, seq_idx: bool = False) -> dict[str, Any]:
        """Keyword arguments for a Hugging Face causal LM (``model(**batch.model_inputs())``).

        ``labels`` = ``input_ids`` (or the samples' own ``labels``, see the module doc) where
        ``loss_mask``, else -100 (the model shifts them by one).
        Padded: ``input_ids``, ``attention_mask``, ``labels`` ``[n, m]``. Packed: the flattened
        layout of transformers' ``DataCollatorWithFlattening``: ``input_ids``, ``labels``,
        ``position_ids`` ``[1, T]`` (restarting per sequence; each sequence's first label is -100
        so no token predicts across a boundary), ``cu_seq_lens_q``/``cu_seq_lens_k`` (int32
        ``[S+1]``), ``max_length_q``/``max_length_k`` (int, the longest sequence) and
        ``use_cache=False``: transformers' sdpa/eager attention builds the per-sequence mask from
        ``position_ids`` only when no KV cache is in use (``masking_utils``); with the default
        cache, packed sequences attend to each other (a test measures it). ``seq_idx=True`` adds
        (packed only) ``seq_idx``, int32 ``[1, T]``, the sequence of every token, which TRL's
        padding-free collator passes for the short convolutions of linear-attention layers.
        """
        target = self.input_ids if self.labels is None else self.labels
        labels = torch.where(self.loss_mask, target, torch.full_like(self.input_ids, -100))
        if self.layout == "padded":
            return {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "labels": labels}
        assert self.cu_seqlens is not None
        labels[0, self.cu_seqlens[:-1].to(torch.int64)] = -100
        longest = int(self.lengths.max())
        out = {
            "input_ids": self.input_ids,
            "labels": labels,
            "position_ids": self.position_ids,
            "cu_seq_lens_q": self.cu_seqlens,
            "cu_seq_lens_k": self.cu_seqlens,
            "max_length_q": longest,
            "max_length_k": longest,
            "use_cache": False,
        }
        if seq_idx:
            assert self.seq_index is not None
            out["seq_idx"] = self.seq_index.to(torch.int32)
        return out

    def to(self, device: torch.device | str) -> "Batch":
        def mv(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return None if t is None else t.to(device, non_blocking=True)

        return Batch(
            self.layout,
            mv(self.input_ids),
            mv(self.loss_mask),
            mv(self.position_ids),
            mv(self.lengths),
            mv(self.indices),
            mv(self.attention_mask),
            mv(self.cu_seqlens),
            mv(self.seq_index),
            mv(self.labels),
        )


IGNORE_INDEX = -100  # the label Hugging Face losses skip


# Per-token loss masks a sample may carry (1 = learned): lenbatch's own, TRL's prompt/completion mask
# and transformers' chat-template assistant mask (``return_assistant_tokens_mask=True``). Any of them is
# read; two present in one sample must agree, since dropping either would train tokens the data excludes.
MASK_FIELDS = ("loss_mask", "completion_mask", "assistant_masks")


def _sample_mask(i: int, sample: Mapping[str, Any], n: int) -> np.ndarray:
    """The sample's loss mask (bool ``[n]``) from whichever of :data:`MASK_FIELDS` it carries (all ones
    when none); ``ValueError`` for a mask of the wrong length or two masks that disagree."""
    found: list[tuple[str, np.ndarray]] = []
    for name in MASK_FIELDS:
        if sample.get(name) is None:
            continue
        m = np.asarray(sample[name])
        if m.shape != (n,):
            raise ValueError(
                f"sample {i}: {name} has {m.size} entries but input_ids has {n}; "
                f"re-tokenize so that both have one entry per token"
            )
        m = m != 0
        for other, mo in found:
            if not np.array_equal(m, mo):
                where = np.flatnonzero(m != mo)
                raise ValueError(
                    f"sample {i}: {other} and {name} disagree on {where.size} of {n} tokens (first at "
                    f"token {int(where[0])}); a token is learned by one and not the other, so keep one "
                    f"of the two fields (drop the other) or make them equal"
                )
        found.append((name, m))
    return found[0][1] if found else np.ones(n, dtype=bool)


def _as_lists(
    samples: Sequence[Mapping[str, Any]],
) -> tuple[list[np.ndarray], list[np.ndarray], Optional[list[np.ndarray]]]:
    """Per sample: input_ids (int64), loss_mask (bool: the sample's mask, see :data:`MASK_FIELDS`, folded
    with labels != -100) and labels (int64; None for the whole batch when no sample has labels)."""
    if len(samples) == 0:
        raise ValueError("a batch needs at least one sample; the plan produced an empty batch")
    with_labels = any(sample.get("labels") is not None for sample in samples)
    ids, masks, labels = [], [], []
    for i, sample in enumerate(samples):
        x = check_token_ids(i, "input_ids", sample["input_ids"])
        if x.ndim != 1 or x.size == 0:
            raise ValueError(f"sample {i} has {x.size} tokens; every sample needs at least one token")
        m = _sample_mask(i, sample, x.size)
        if with_labels:
            y = check_token_ids(i, "labels", sample["labels"]) if sample.get("labels") is not None else x
            if y.shape != x.shape:
                raise ValueError(
                    f"sample {i}: labels has {y.size} entries but input_ids has {x.size}; "
                    "labels must hold one entry per token (-100 where nothing is learned)"
                )
            m = m & (y != IGNORE_INDEX)
            labels.append(y)
        ids.append(x)
        masks.append(m)
    return ids, masks, (labels if with_labels else None)


def check_token_ids(i: int, name: str, values: Any) -> np.ndarray:
    """``values`` as int64 token ids; ``ValueError`` naming the sample and field for ids that are not
    integers or do not fit int64 (numpy would raise OverflowError, or wrap silently from uint64)."""
    try:
        arr = np.asarray(values)
        if arr.dtype == object:  # Python ints beyond int64 stay objects until converted
            arr = np.asarray(values, dtype=np.int64)
    except (OverflowError, ValueError, TypeError) as err:
        raise ValueError(
            f"sample {i}: {name} must be integer token ids within int64 ({err}); check the tokenizer's output"
        ) from None
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.floating) and np.all(arr == np.round(arr))):
            raise ValueError(
                f"sample {i}: {name} must be integer token ids, got dtype {arr.dtype}; check the tokenizer's output"
            )
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"sample {i}: {name} holds id {int(arr.max())}, beyond int64; check the tokenizer's output")
    if np.issubdtype(arr.dtype, np.floating) and arr.size and float(np.abs(arr).max()) >= 2.0**63:
        raise ValueError(
            f"sample {i}: {name} holds id {float(np.abs(arr).max()):g}, beyond int64; check the tokenizer's output"
        )
    return arr.astype(np.int64)


def collate_padded(
    samples: Sequence[Mapping[str, Any]],
    *,
    token_budget: int | None = None,
    max_batch_size: int | None = None,
    indices: Sequence[int] | None = None,
    pad_id: int = 0,
) -> Batch:
    """Right-pad ``samples`` (dicts with ``input_ids``, optional ``loss_mask``, ``labels``) to their longest.

    Fields ``[n, m]``: ``input_ids`` (``pad_id`` beyond each sample), ``attention_mask`` (1 on
    tokens), ``loss_mask`` (False on padding), ``position_ids`` (0..m-1), ``labels`` (when given;
    -100 on padding); ``lengths``/``indices`` ``[n]``.
    Raises ``ValueError`` when ``n * longest > token_budget`` or ``n > max_batch_size``
    (a limit left at None is not checked: profiling grids build shapes on purpose).
    """
    ids, masks, given = _as_lists(samples)
    n, m = len(ids), max(x.size for x in ids)
    if (max_batch_size is not None and n > max_batch_size) or (token_budget is not None and n * m > token_budget):
        raise ValueError(
            f"padded batch of {n} samples x {m} tokens = {n * m} padded tokens does not fit "
            f"token_budget={token_budget} / max_batch_size={max_batch_size}; the plan must "
            "come from the same batching parameters (re-plan, or raise the budget)"
        )
    input_ids = np.full((n, m), pad_id, dtype=np.int64)
    loss_mask = np.zeros((n, m), dtype=bool)
    attention = np.zeros((n, m), dtype=np.int64)
    for i, (x, lm) in enumerate(zip(ids, masks)):
        input_ids[i, : x.size] = x
        loss_mask[i, : x.size] = lm
        attention[i, : x.size] = 1
    labels = None
    if given is not None:
        labels = np.full((n, m), IGNORE_INDEX, dtype=np.int64)
        for i, y in enumerate(given):
            labels[i, : y.size] = y
        labels = torch.from_numpy(labels)
    lengths = torch.tensor([x.size for x in ids], dtype=torch.int64)
    idx = (
        torch.full((n,), -1, dtype=torch.int64)
        if indices is None
        else torch.as_tensor(np.asarray(indices, dtype=np.int64))
    )
    return Batch(
        "padded",
        torch.from_numpy(input_ids),
        torch.from_numpy(loss_mask),
        torch.arange(m, dtype=torch.int64).expand(n, m).contiguous(),
        lengths,
        idx,
        attention_mask=torch.from_numpy(attention),
        labels=labels,
    )


def collate_packed(
    samples: Sequence[Mapping[str, Any]], *, token_budget: int | None = None, indices: Sequence[int] | None = None
) -> Batch:
    """Concatenate ``samples`` (dicts with ``input_ids``, optional ``loss_mask``, ``labels``) into one row ``[1, T]``.

    Fields: ``input_ids``/``loss_mask``/``position_ids``/``seq_index`` ``[1, T]`` (positions restart
    at 0 at every sequence), ``labels`` ``[1, T]`` (when given), ``cu_seqlens`` int32 ``[S+1]``,
    ``lengths``/``indices`` ``[S]``.
    Raises ``ValueError`` when ``T = sum(lengths) > token_budget`` (None: not checked).
    """
    ids, masks, given = _as_lists(samples)
    lens = np.array([x.size for x in ids], dtype=np.int64)
    total = int(lens.sum())
    if token_budget is not None and total > token_budget:
        raise ValueError(
            f"packed row of {len(ids)} samples holds {total} tokens > token_budget="
            f"{token_budget}; the plan must come from the same batching parameters (re-plan, or "
            "raise the budget)"
        )
    cu = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(lens, out=cu[1:])
    positions = np.arange(total, dtype=np.int64) - np.repeat(cu[:-1], lens)
    seq_index = np.repeat(np.arange(len(ids), dtype=np.int64), lens)
    idx = (
        torch.full((len(ids),), -1, dtype=torch.int64)
        if indices is None
        else torch.as_tensor(np.asarray(indices, dtype=np.int64))
    )
    labels = None if given is None else torch.from_numpy(np.concatenate(given))[None]
    return Batch(
        "packed",
        torch.from_numpy(np.concatenate(ids))[None],
        torch.from_numpy(np.concatenate(masks))[None],
        torch.from_numpy(positions)[None],
        torch.from_numpy(lens),
        idx,
        cu_seqlens=torch.from_numpy(cu.astype(np.int32)),
        seq_index=torch.from_numpy(seq_index)[None],
        labels=labels,
    )


def collate(
    samples: Sequence[Mapping[str, Any]],
    *,
    layout: Any = None,
    token_budget: int | None = None,
    max_batch_size: int | None = None,
    indices: Sequence[int] | None = None,
    spec: Any = None,
) -> Batch:
    """Collate in ``layout`` (``"padded"`` or ``"packed"``, or the :class:`lenbatch.Strategy` whose batches
    these are), checked against ``token_budget``/``max_batch_size`` (None: not checked), or both limits from
    ``spec`` (a :class:`lenbatch.BatchSpec`; the layout is the strategy's, never the spec's). Cost: O(tokens)."""
    refuse_both(spec, token_budget=token_budget, max_batch_size=max_batch_size)
    if spec is not None:
        token_budget, max_batch_size = spec.token_budget, spec.max_batch_size
    if isinstance(layout, Strategy):
        layout = layout.layout
    if layout == "padded":
        return collate_padded(samples, token_budget=token_budget, max_batch_size=max_batch_size, indices=indices)
    if layout == "packed":
        return collate_packed(samples, token_budget=token_budget, indices=indices)
    raise ValueError(
        f"unknown batch layout {layout!r}; pass layout='padded' or 'packed' (or the lenbatch.Strategy "
        "that planned the batch: its layout)"
    )
