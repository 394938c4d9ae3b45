"""transformers integration: :class:`LengthBatchTrainer`, a ``Trainer`` that trains on lenbatch plans.

What a plain ``DataLoader(batch_sampler=LengthBatchSampler(...))`` returned from
``get_train_dataloader`` gets wrong, and what this class does instead:

* **Epochs advance.** The loader has ``set_epoch``, which the Trainer calls before every epoch, and
  forwards it to the sampler (otherwise every epoch repeats epoch 0's batches).
* **Each rank keeps its own batches.** The sampler is built with the Trainer's
  ``process_index``/``world_size`` and the loader is *not* passed through
  ``accelerator.prepare``, which would shard the already per-rank batches again (each rank would
  train half of its batches). Every rank has the same number of batches (the planner guarantees it),
  so DDP steps stay in lock-step and no sample is dropped or repeated.
* **The same number of steps every epoch.** The Trainer fixes the steps per epoch from the first
  epoch's length, but most strategies plan a different number of batches each epoch (it would
  drop the extra batches of a longer epoch); the trainer plans the epochs it will run once, up
  front, and passes ``min_batches`` = the most of them, so every epoch splits its costliest
  batches up to that count (no sample dropped or repeated; cost: one plan per epoch).
* **Exact resume.** A plan is a function of (lengths, parameters, seed, epoch); the Trainer resumes
  by ``set_epoch(epoch)`` plus skipping the batches already trained (``skip_first_batches``), which
  reproduces the uninterrupted order batch for batch.
* **Packed rows in the layout transformers uses** (:meth:`lenbatch.loading.collate.Batch.model_inputs`):
  ``position_ids`` restarting per sequence, ``cu_seq_lens_q/k``, ``max_length_q/k``, labels -100 at
  each sequence start, as ``DataCollatorWithFlattening`` builds them; any causal LM whose attention
  honours packed ``position_ids`` (sdpa/eager masks, flash-attention varlen) trains each sequence
  as if alone.

Importing this module imports transformers (``pip install 'lenbatch[model,hf]'``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from torch.utils.data import DataLoader
from transformers import Trainer

from lenbatch.batching.layouts import layout_of
from lenbatch.loading.collate import collate_packed, collate_padded
from lenbatch.loading.sampler import LengthBatchSampler
from lenbatch.batching.strategies import plan_epoch_all


class EpochDataLoader(DataLoader):
    """A ``DataLoader`` over a :class:`LengthBatchSampler` with ``set_epoch`` forwarded to it."""

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)


class LengthBatchCollator:
    """Samples (mappings with ``input_ids`` and optional ``loss_mask``) -> HF model inputs.

    ``layout`` "padded" or "packed" (see :meth:`lenbatch.loading.collate.Batch.model_inputs`). Other
    fields of the samples are ignored.
    """

    def __init__(self, *, layout: str, pad_id: int = 0) -> None:
        if layout not in ("padded", "packed"):
            raise ValueError(f"layout must be 'padded' or 'packed', got {layout!r}")
        self.layout = layout
        self.pad_id = int(pad_id)

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        rows = [{"input_ids": s["input_ids"], "loss_mask": s.get("loss_mask")} for s in samples]
        if self.layout == "packed":
            return collate_packed(rows).model_inputs()
        return collate_padded(rows, pad_id=self.pad_id).model_inputs()


class LengthBatchTrainer(Trainer):
    """``transformers.Trainer`` whose training batches are lenbatch's plan for this rank.

    ``lengths`` (one int per training sample) or ``length_column`` (a column of a ``datasets``
    dataset, or a key of every sample) give the token counts; ``strategy``, ``token_budget``,
    ``max_batch_size``, ``edges`` (bucketed only), ``packed_window`` and ``seed`` (default
    ``args.seed``) are :func:`lenbatch.plan_epoch`'s. The batch size comes from the plan, so
    ``per_device_train_batch_size`` is ignored for training. Samples need ``input_ids`` and may
    have ``loss_mask``; pass ``data_collator=`` to replace :class:`LengthBatchCollator`.
    """

    def __init__(self, *args: Any, lengths: Any = None, length_column: str | None = None, strategy: str,
                 token_budget: int, max_batch_size: int, edges: Any = None, packed_window: int = 8,
                 seed: int | None = None, pad_id: int = 0, **kwargs: Any) -> None:
        if (lengths is None) == (length_column is None):
            raise ValueError("LengthBatchTrainer needs exactly one of lengths= (one int per training sample) "
                             "or length_column= (the dataset column holding them)")
        kwargs.setdefault("data_collator", LengthBatchCollator(
            layout=layout_of(strategy), pad_id=pad_id))
        super().__init__(*args, **kwargs)
        if self.train_dataset is None:
            raise ValueError("LengthBatchTrainer needs train_dataset=")
        if length_column is not None:
            lengths = _column(self.train_dataset, length_column)
        lengths = np.asarray(lengths)
        if lengths.ndim != 1 or len(lengths) != len(self.train_dataset):
            raise ValueError(f"lengths has {lengths.size} entries but train_dataset has {len(self.train_dataset)} "
                             "samples; pass one length per sample")
        self.plan_args = dict(strategy=strategy, token_budget=token_budget, max_batch_size=max_batch_size,
                              edges=edges, packed_window=packed_window,
                              seed=self.args.seed if seed is None else seed)
        self.lengths = lengths
        self.length_sampler: LengthBatchSampler | None = None

    def get_train_dataloader(self) -> DataLoader:
        # explicit rank/world size from the Trainer's accelerate state (torchrun, accelerate launch)
        world = self.args.world_size
        sampler = LengthBatchSampler(self.lengths, rank=self.args.process_index, world_size=world,
                                     min_batches=self._equal_epoch_batches(world), **self.plan_args)
        self.length_sampler = sampler
        workers = self.args.dataloader_num_workers
        # not accelerator.prepare(): that would shard this rank's batches again across ranks
        return EpochDataLoader(self.train_dataset, batch_sampler=sampler, collate_fn=self.data_collator,
                               num_workers=workers, pin_memory=self.args.dataloader_pin_memory,
                               persistent_workers=self.args.dataloader_persistent_workers and workers > 0,
                               prefetch_factor=self.args.dataloader_prefetch_factor if workers > 0 else None)


    def _equal_epoch_batches(self, world_size: int) -> int:
        """``min_batches`` giving every epoch the Trainer will run the same number of batches."""
        args, counts = self.args, []
        while True:
            counts.append(sum(len(r) for r in plan_epoch_all(self.lengths, epoch=len(counts),
                                                             world_size=world_size, **self.plan_args)))
            steps = math.ceil(max(counts) / world_size / args.gradient_accumulation_steps)
            epochs = math.ceil(args.num_train_epochs) if args.max_steps <= 0 else math.ceil(args.max_steps / steps)
            if len(counts) >= epochs:
                return max(counts)


def _column(dataset: Any, name: str) -> np.ndarray:
    try:
        col = dataset[name]  # datasets.Dataset: the whole column
        if not isinstance(col, (str, bytes)) and len(col) == len(dataset):
            return np.asarray(col)
    except (KeyError, TypeError, IndexError, ValueError):
        pass
    try:
        return np.asarray([dataset[i][name] for i in range(len(dataset))])
    except (KeyError, TypeError) as err:
        raise ValueError(f"length_column={name!r}: the training samples have no such field ({err!r}); pass "
                         "the column that holds each sample's token count, or lengths=") from None


__all__ = ["EpochDataLoader", "LengthBatchCollator", "LengthBatchTrainer"]
