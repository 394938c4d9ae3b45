"""transformers integration: :class:`LengthBatchMixin` (over any ``Trainer`` subclass, e.g. TRL's
``SFTTrainer``) and :class:`LengthBatchTrainer` (the mixin over ``Trainer``), which train on lenbatch plans.

``class MySFT(LengthBatchMixin, SFTTrainer)`` (the mixin first) trains ``SFTTrainer`` on lenbatch's
batches. What a plain ``DataLoader(batch_sampler=LengthBatchSampler(...))`` returned from
``get_train_dataloader`` gets wrong, and what the mixin does instead:

* **Lengths after the trainer prepared its data.** ``SFTTrainer`` tokenizes (and truncates, filters,
  shuffles) the dataset in its ``__init__``; the lengths exist only then. The mixin reads them after
  ``super().__init__()`` returns, when ``self.train_dataset`` is final, from the Arrow list offsets of
  its ``input_ids`` column (or ``length_column=``): O(rows) numpy, no Python loop over rows. For
  ``bucketed`` without ``edges=`` it computes the optimal edges from them
  (:func:`lenbatch.optimize_boundaries`, ``num_buckets=``, method ``dp``).
* **Every loss mask kept** (:class:`LengthBatchCollator`): ``labels`` (-100 = not learned, what
  ``SFTTrainer`` builds from ``completion_mask``/``assistant_masks``), and those masks themselves
  where a dataset still carries them, folded exactly as TRL folds them; a field the layout cannot
  keep is refused with its name, never dropped.
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
  reproduces the uninterrupted order batch for batch. That holds only for the same plan, and the
  Trainer's checkpoint does not record it: every checkpoint gets ``lenbatch_plan.json`` (world size,
  the lengths' count and hash, the plan parameters, ``min_batches``), and ``train(resume_from_checkpoint=)``
  refuses a checkpoint whose plan differs, naming each change (another world size, other lengths, other
  parameters, another number of epochs), or one without that file.
* **Packed rows in the layout transformers uses** (:meth:`lenbatch.loading.collate.Batch.model_inputs`):
  ``position_ids`` restarting per sequence, ``cu_seq_lens_q/k``, ``max_length_q/k``, ``seq_idx``,
  labels -100 at each sequence start, as TRL's padding-free collator builds them; any causal LM whose
  attention honours packed ``position_ids`` (sdpa/eager masks, flash-attention varlen) trains each
  sequence as if alone.

Importing this module imports transformers (``pip install 'lenbatch[hf]'``; TRL: ``'lenbatch[trl]'``).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
from torch.utils.data import DataLoader
from transformers import Trainer

from lenbatch.batching.boundaries import optimize_boundaries
from lenbatch.batching.overflow import overflow_pieces
from lenbatch.batching.strategy import Strategy, layout_of
from lenbatch.batching.strategies import plan_epoch_all
from lenbatch.log import get_logger
from lenbatch.loading.collate import check_token_ids, collate_packed, collate_padded
from lenbatch.loading.sampler import LengthBatchSampler, SamplerDataLoader

log = get_logger("lenbatch.hf")

# Written into every checkpoint folder: what the plan depended on, checked when resuming from it.
PLAN_FILE = "lenbatch_plan.json"

# Per-token masks a sample may carry for the loss: lenbatch's own, TRL's prompt/completion mask and
# the chat template's assistant-token mask. Kept through Trainer's column removal and folded into labels.
LOSS_MASK_FIELDS = ("loss_mask", "completion_mask", "assistant_masks")
_HANDLED = frozenset({"input_ids", "labels", "attention_mask", "position_ids", *LOSS_MASK_FIELDS})


class EpochDataLoader(SamplerDataLoader):
    """A ``DataLoader`` over a :class:`LengthBatchSampler` with ``set_epoch`` forwarded to it, counting the
    batches it returns to the loop (:class:`lenbatch.loading.sampler.SamplerDataLoader`), so the sampler's
    ``state_dict()`` is the Trainer's position with any ``dataloader_num_workers``."""


class LengthBatchCollator:
    """Samples -> Hugging Face model inputs in ``layout`` "padded" or "packed" (see
    :meth:`lenbatch.loading.collate.Batch.model_inputs`; packed adds ``seq_idx``).

    A sample has ``input_ids`` and may have ``labels`` (-100 = not learned) and the per-token masks
    ``loss_mask``, ``completion_mask``, ``assistant_masks`` (0 = not learned). A token is learned iff
    every applicable mask is nonzero, and is then scored against ``labels`` (or ``input_ids``): TRL's
    rule (``SFTTrainer`` builds ``labels`` the same way; ``assistant_masks`` always applies,
    ``completion_mask`` only with ``completion_only_loss``). The padded batch equals TRL's
    ``DataCollatorForLanguageModeling(pad_token_id=pad_id)``, the packed row its ``padding_free=True``
    output, tensor for tensor. ``attention_mask`` and ``position_ids`` of a sample are accepted when
    they are what the layout rebuilds (all ones; 0..len-1), refused otherwise.

    ``model_fields``: the fields the model (or trainer) consumes; any other field is not a model input
    and is ignored, as ``Trainer``'s ``remove_unused_columns`` does. ``None``: every field counts. A
    counted field the layouts cannot keep (``seq_lengths`` of TRL's own packing, ``token_type_ids``,
    ``pixel_values``, ...) raises ``ValueError`` naming it. Cost: O(tokens) per batch.
    """

    def __init__(
        self,
        *,
        layout: str,
        pad_id: int = 0,
        completion_only_loss: bool = True,
        model_fields: Collection[str] | None = None,
    ) -> None:
        if layout not in ("padded", "packed"):
            raise ValueError(f"layout must be 'padded' or 'packed', got {layout!r}")
        self.layout = layout
        self.pad_id = int(pad_id)
        self.completion_only_loss = bool(completion_only_loss)
        self.model_fields = None if model_fields is None else frozenset(model_fields)
        self._ignored: set[str] = set()

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        rows = [self.row(i, s) for i, s in enumerate(samples)]
        if self.layout == "packed":
            return collate_packed(rows).model_inputs(seq_idx=True)
        return collate_padded(rows, pad_id=self.pad_id).model_inputs()

    def row(self, i: int, sample: Mapping[str, Any]) -> dict[str, Any]:
        """One sample as collate's ``{"input_ids", "loss_mask", "labels"}`` (masks folded into ``loss_mask``)."""
        self._check_fields(i, sample)
        ids = check_token_ids(i, "input_ids", sample["input_ids"])
        n = ids.shape[0] if ids.ndim == 1 else -1
        if sample.get("attention_mask") is not None and not _equals(sample["attention_mask"], np.ones(n)):
            raise ValueError(
                f"sample {i}: attention_mask has zeros (a padded or masked sample); lenbatch pads and "
                "packs itself and cannot keep a mask inside a sample: pass unpadded samples"
            )
        if sample.get("position_ids") is not None and not _equals(sample["position_ids"], np.arange(n)):
            raise ValueError(
                f"sample {i}: position_ids are not 0..{n - 1}; lenbatch rebuilds positions per "
                "sequence and cannot keep custom ones: remove the position_ids field"
            )
        masks = ["loss_mask", "assistant_masks"] + (["completion_mask"] if self.completion_only_loss else [])
        keep = None
        for name in masks:
            if sample.get(name) is None:
                continue
            m = np.asarray(sample[name])
            if m.shape != ids.shape:
                raise ValueError(
                    f"sample {i}: {name} has {m.size} entries but input_ids has {ids.size}; "
                    f"re-tokenize so that {name} has one entry per token"
                )
            keep = (m != 0) if keep is None else keep & (m != 0)
        return {"input_ids": ids, "loss_mask": keep, "labels": sample.get("labels")}

    def _check_fields(self, i: int, sample: Mapping[str, Any]) -> None:
        for key in sample:
            if key in _HANDLED:
                continue
            if self.model_fields is not None and key not in self.model_fields:
                if key not in self._ignored:
                    self._ignored.add(key)
                    log.info("collator: ignoring sample field %r (not an input of the model or trainer)", key)
                continue
            hint = (
                " (TRL's packing=True: lenbatch packs itself, use strategy='packed' with packing=False)"
                if key == "seq_lengths"
                else ""
            )
            raise ValueError(
                f"sample {i} has field {key!r}, which lenbatch's {self.layout} layout cannot keep"
                f"{hint}; remove it from the dataset, or pass data_collator= your own collator"
            )


class LengthBatchMixin:
    """Trains any ``transformers.Trainer`` subclass on lenbatch's plan for this rank:
    ``class MySFT(LengthBatchMixin, SFTTrainer)``, the mixin first.

    Keywords (the rest go to the trainer): ``strategy``, ``token_budget``, ``max_batch_size``,
    ``edges`` (bucketed; default: optimal edges for ``num_buckets`` buckets from the lengths),
    ``packed_window`` and ``seed`` (default ``args.seed``) are :func:`lenbatch.plan_epoch`'s. The
    lengths come from the final ``train_dataset``: the list column ``length_column`` (default
    ``input_ids``; an integer column is read as the lengths), or ``lengths=`` (one int per training
    sample, in the order of the *prepared* dataset). The batch size comes from the plan, so
    ``per_device_train_batch_size`` is ignored for training. Unless ``data_collator=`` is given, the
    trainer's collator is replaced by :class:`LengthBatchCollator` (pad id: ``pad_id``, else the
    trainer's collator's, else the tokenizer's, else 0; ``completion_only_loss`` from the trainer).
    Trainer settings that would change the batches behind the plan's back are refused: TRL's
    ``packing``/``padding_free`` (use ``strategy="packed"``), ``pad_to_multiple_of``,
    ``train_sampling_strategy`` other than ``"random"``.

    ``strategy="packed"`` first runs :func:`lenbatch.check_packing` on the model (once, in ``__init__``:
    1 + 4 small forwards) and refuses, with a ``ValueError`` naming the model class and the fix (a padded
    strategy), a model that lets packed sequences attend to each other; ``packing_check=False`` skips it.

    ``overflow`` (samples longer than ``token_budget``): ``"error"`` (default) refuses them when the
    trainer is built; ``"truncate"`` cuts them to the budget; ``"split"`` trains the rest of each as
    samples of their own (positions restarting), see :class:`LengthBatchSampler`. The counts are logged
    and kept in ``trainer.pieces.counts()``.
    """

    def __init__(
        self,
        *args: Any,
        strategy: "str | Strategy",
        token_budget: int,
        max_batch_size: int,
        lengths: Any = None,
        length_column: str | None = None,
        edges: Any = None,
        num_buckets: int = 6,
        packed_window: int = 8,
        seed: int | None = None,
        pad_id: int | None = None,
        overflow: str = "error",
        packing_check: bool = True,
        **kwargs: Any,
    ) -> None:
        if lengths is not None and length_column is not None:
            raise ValueError(
                "pass at most one of lengths= (one int per training sample) or length_column= "
                "(the dataset column holding the tokens or the lengths)"
            )
        if isinstance(strategy, Strategy):  # a Strategy carries its edges: planned as its name with them
            strategy, edges = strategy.name, Strategy.of(strategy, edges).edges
        layout = layout_of(strategy)
        bound = inspect.signature(super().__init__).bind_partial(*args, **kwargs).arguments
        user_collator = bound.get("data_collator")
        super().__init__(*args, **kwargs)
        self._refuse_batch_changing_args()
        if layout == "packed" and packing_check and self.model is not None:
            # once, before any step: a model that lets packed sequences attend to each other trains a wrong
            # loss without any error, so it is refused here (the same row the collator builds, seq_idx included)
            from lenbatch.packcheck import check_packing

            result = check_packing(self.model, seq_idx=True)
            if not result.ok:
                raise ValueError(f"strategy='packed': {result.message()} (packing_check=False skips this check)")
            log.info("%s", result.message())
        dataset = self.train_dataset
        if dataset is None:
            raise ValueError(f"{type(self).__name__} needs train_dataset=")
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise ValueError(
                f"{type(self).__name__} needs a map-style train_dataset (with len() and indexing) to "
                f"plan an epoch; got {type(dataset).__name__} (an IterableDataset has no lengths up front: "
                "materialise it in one pass, e.g. datasets.Dataset.from_generator, or batch the stream "
                "with lenbatch.StreamingBatcher)"
            )
        if lengths is None:
            lengths = _dataset_lengths(dataset, length_column or "input_ids")
        lengths = np.asarray(lengths)
        if lengths.ndim != 1 or len(lengths) != len(dataset):
            raise ValueError(
                f"lengths has {lengths.size} entries but train_dataset has {len(dataset)} samples "
                "(after the trainer prepared it); pass one length per sample, or length_column="
            )
        seed = self.args.seed if seed is None else seed
        # the plan is over pieces: samples, cut or split at the budget as overflow= says (counted, logged)
        self.pieces = overflow_pieces(lengths, token_budget=token_budget, overflow=overflow)
        self.overflow = overflow
        if self.pieces.samples_over_budget:
            log.warning("%s", self.pieces.report())
        self.plan_lengths = self.pieces.lengths
        if strategy == "bucketed" and edges is None:
            b = optimize_boundaries(
                self.plan_lengths, num_buckets, token_budget=token_budget, max_batch_size=max_batch_size, method="dp"
            )
            edges = b.edges
            log.info(
                "bucketed: %d buckets, dp edges %s (predicted padding efficiency %.1f%%) from %d lengths",
                num_buckets,
                list(edges),
                100 * b.predicted_efficiency,
                len(self.plan_lengths),
            )
        self.plan_args = dict(
            strategy=strategy,
            token_budget=token_budget,
            max_batch_size=max_batch_size,
            edges=edges,
            packed_window=packed_window,
            seed=seed,
        )
        self.lengths = lengths
        self.length_sampler: LengthBatchSampler | None = None
        if user_collator is None:
            self._set_signature_columns_if_needed()
            self.data_collator = LengthBatchCollator(
                layout=layout,
                pad_id=self._pad_id(pad_id),
                completion_only_loss=getattr(self, "completion_only_loss", None) is not False,
                model_fields=self._signature_columns,
            )

    def plan_identity(self) -> dict[str, Any]:
        """What this run's plans depend on: world size, the lengths (count and sha256 of their int64
        bytes), the plan parameters and ``min_batches`` (from the epochs/steps the Trainer will run).
        Cost: O(samples) for the hash, plus the epoch plans of ``min_batches`` (cached per world size)."""
        world = self.args.world_size
        x = np.ascontiguousarray(self.lengths, dtype=np.int64)
        plan = {k: ([int(e) for e in v] if k == "edges" and v is not None else v) for k, v in self.plan_args.items()}
        plan["overflow"] = self.overflow
        return {
            "world_size": world,
            "num_samples": int(x.size),
            "lengths_sha256": hashlib.sha256(x.tobytes()).hexdigest(),
            "plan": plan,
            "min_batches": self._equal_epoch_batches(world),
        }

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train``; resuming first checks the checkpoint's plan (``lenbatch_plan.json``) against
        this run's and refuses any difference by name (the Trainer would skip the wrong batches)."""
        path = resume_from_checkpoint
        if isinstance(path, bool):
            from transformers.trainer_utils import get_last_checkpoint

            path = get_last_checkpoint(self.args.output_dir) if path else None
        if path is not None:
            self.check_resume(str(path))
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def check_resume(self, checkpoint: str) -> None:
        """``ValueError`` naming every way this run's plan differs from the one ``checkpoint`` was trained on."""
        file = os.path.join(checkpoint, PLAN_FILE)
        if not os.path.isfile(file):
            raise ValueError(
                f"checkpoint {checkpoint} has no {PLAN_FILE}, so lenbatch cannot check that this run "
                "plans the same batches (it was not written by LengthBatchMixin); resume from a "
                "checkpoint this trainer wrote, or start a fresh run"
            )
        with open(file) as f:
            saved = json.load(f)
        now = self.plan_identity()
        changes = []
        if saved["world_size"] != now["world_size"]:
            changes.append(
                f"world size {saved['world_size']} -> {now['world_size']} processes (each rank's batches "
                f"depend on it: resume with {saved['world_size']} processes)"
            )
        if (saved["num_samples"], saved["lengths_sha256"]) != (now["num_samples"], now["lengths_sha256"]):
            what = (
                f"{saved['num_samples']} -> {now['num_samples']} samples"
                if saved["num_samples"] != now["num_samples"]
                else f"same {now['num_samples']} samples, other lengths"
            )
            changes.append(f"training lengths ({what}: resume with the same prepared dataset)")
        for key in sorted(set(saved["plan"]) | set(now["plan"])):
            a, b = saved["plan"].get(key), now["plan"].get(key)
            if a != b:
                changes.append(f"{key} {a!r} -> {b!r}")
        if saved["min_batches"] != now["min_batches"] and saved["world_size"] == now["world_size"]:
            changes.append(
                f"min_batches {saved['min_batches']} -> {now['min_batches']} (num_train_epochs, "
                "max_steps or gradient_accumulation_steps changed, so every epoch plans another "
                "number of batches)"
            )
        if changes:
            raise ValueError(
                f"cannot resume from {checkpoint}: its plan differs from this run's: "
                + "; ".join(changes)
                + ". Resume with the checkpoint's settings, or start a fresh run"
            )

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            folder = os.path.join(
                self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            )
            with open(os.path.join(folder, PLAN_FILE), "w") as f:
                json.dump(self.plan_identity(), f, indent=1)

    def _refuse_batch_changing_args(self) -> None:
        args = self.args
        for name, fix in (
            ("packing", "lenbatch plans the packing: use strategy='packed'"),
            ("padding_free", "strategy='packed' is lenbatch's padding-free layout"),
        ):
            if getattr(args, name, False):
                raise ValueError(
                    f"{name}=True in the trainer's args would re-batch lenbatch's plan; set {name}=False ({fix})"
                )
        if getattr(args, "pad_to_multiple_of", None) is not None:
            raise ValueError(
                f"pad_to_multiple_of={args.pad_to_multiple_of} would pad batches beyond the plan's "
                "token_budget; set pad_to_multiple_of=None (the plan sizes every batch)"
            )
        sampling = getattr(args, "train_sampling_strategy", "random")
        if sampling != "random":
            raise ValueError(
                f"train_sampling_strategy={sampling!r}: lenbatch's strategy decides the order and the "
                "batches; leave train_sampling_strategy='random' (ignored) and pick strategy="
            )

    def _pad_id(self, pad_id: int | None) -> int:
        for candidate in (
            pad_id,
            getattr(self.data_collator, "pad_token_id", None),
            getattr(getattr(self, "processing_class", None), "pad_token_id", None),
        ):
            if candidate is not None:
                return int(candidate)
        return 0

    def _set_signature_columns_if_needed(self) -> None:
        # keep the per-token loss masks through remove_unused_columns: the collator folds them into labels
        super()._set_signature_columns_if_needed()
        self._signature_columns = list(self._signature_columns) + [
            f for f in LOSS_MASK_FIELDS if f not in self._signature_columns
        ]

    def get_train_dataloader(self) -> DataLoader:
        dataset = self.train_dataset
        if _is_hf_dataset(dataset):  # drop columns the model does not take, as Trainer does (rows stay in place)
            dataset = self._remove_unused_columns(dataset, description="training")
        # explicit rank/world size from the Trainer's accelerate state (torchrun, accelerate launch)
        world = self.args.world_size
        sampler = LengthBatchSampler(
            self.lengths,
            rank=self.args.process_index,
            world_size=world,
            min_batches=self._equal_epoch_batches(world),
            overflow=self.overflow,
            **self.plan_args,
        )
        sampler._accelerate = False  # this loader is not prepared by accelerate (below): nothing to warn of
        self.length_sampler = sampler
        dataset = sampler.view(dataset)  # serves the (row, start, end) pieces of truncate/split
        workers = self.args.dataloader_num_workers
        # not accelerator.prepare(): that would shard this rank's batches again across ranks
        return EpochDataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=self.data_collator,
            num_workers=workers,
            pin_memory=self.args.dataloader_pin_memory,
            persistent_workers=self.args.dataloader_persistent_workers and workers > 0,
            prefetch_factor=self.args.dataloader_prefetch_factor if workers > 0 else None,
        )

    def _equal_epoch_batches(self, world_size: int) -> int:
        """``min_batches`` giving every epoch the Trainer will run the same number of batches (cached: the
        same arguments give the same count; cost: one plan per epoch)."""
        args = self.args
        key = (world_size, args.num_train_epochs, args.max_steps, args.gradient_accumulation_steps)
        cache = self.__dict__.setdefault("_min_batches_cache", {})
        if key in cache:
            return cache[key]
        cache[key] = self._count_equal_epoch_batches(world_size)
        return cache[key]

    def _count_equal_epoch_batches(self, world_size: int) -> int:
        args, counts = self.args, []
        while True:
            counts.append(
                sum(
                    len(r)
                    for r in plan_epoch_all(
                        self.plan_lengths, epoch=len(counts), world_size=world_size, **self.plan_args
                    )
                )
            )
            steps = math.ceil(max(counts) / world_size / args.gradient_accumulation_steps)
            epochs = math.ceil(args.num_train_epochs) if args.max_steps <= 0 else math.ceil(args.max_steps / steps)
            if len(counts) >= epochs:
                return max(counts)


class LengthBatchTrainer(LengthBatchMixin, Trainer):
    """``transformers.Trainer`` whose training batches are lenbatch's plan for this rank
    (:class:`LengthBatchMixin` over ``Trainer``; see there for the keywords)."""


def _dataset_lengths(dataset: Any, column: str = "input_ids") -> np.ndarray:
    """Token count of every row of ``dataset`` from ``column``: a list column (its lengths) or an
    integer column (its values), int64 ``[len(dataset)]``.

    A ``datasets.Dataset`` or ``pyarrow.Table`` is read from the Arrow list offsets (O(rows) numpy,
    no row is materialized); any other map-style dataset of mappings costs one Python pass over rows.
    """
    if _is_hf_dataset(dataset) or _is_arrow_table(dataset):
        return _lengths_from_arrow(dataset, column)
    try:
        values = [dataset[i][column] for i in range(len(dataset))]
    except (KeyError, TypeError, IndexError) as err:
        raise ValueError(
            f"length_column={column!r}: the training samples have no such field ({err!r}); pass the "
            "column that holds each sample's tokens or token count, or lengths="
        ) from None
    return np.array([int(v) if np.ndim(v) == 0 else len(v) for v in values], dtype=np.int64)


def _lengths_from_arrow(data: Any, column: str) -> np.ndarray:
    """Lengths from the Arrow list offsets of ``column``: :func:`lenbatch.loading.arrow.lengths_of`
    (a ``datasets.Dataset`` in its row order through any indices mapping, or a ``pyarrow.Table``;
    null and empty rows refused). Cost: one diff per chunk, O(rows)."""
    from lenbatch.loading.arrow import lengths_of

    try:
        return lengths_of(data, column=column)
    except ValueError as err:
        raise ValueError(f"length_column={column!r}: {err}; or pass lengths=") from None


def _equals(values: Any, expected: np.ndarray) -> bool:
    values = np.asarray(values)
    return values.shape == expected.shape and bool((values == expected).all())


def _is_hf_dataset(data: Any) -> bool:
    try:
        import datasets
    except ImportError:
        return False
    return isinstance(data, datasets.Dataset)


def _is_arrow_table(data: Any) -> bool:
    try:
        import pyarrow as pa
    except ImportError:
        return False
    return isinstance(data, pa.Table)


__all__ = ["EpochDataLoader", "LOSS_MASK_FIELDS", "LengthBatchCollator", "LengthBatchMixin", "LengthBatchTrainer"]
