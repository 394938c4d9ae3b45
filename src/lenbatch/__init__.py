"""lenbatch: batch variable-length samples for LLM training.

Public API (stable)::

    import lenbatch as lb
    b = lb.optimize_boundaries(lengths, num_buckets=6, token_budget=49152, max_batch_size=64, method="dp")
    batches = lb.plan_epoch(lengths, strategy="bucketed", epoch=0, seed=0, token_budget=49152,
                            max_batch_size=64, edges=b.edges, rank=0, world_size=1)
    # or strategy=lb.Strategy("bucketed", edges=b.edges): a strategy carries its own edges
    lb.padding_efficiency(lengths, batches, strategy="bucketed")
    rows = lb.compare_strategies(lengths, token_budget=49152, max_batch_size=64)   # which strategy: one row each
    lengths = lb.lengths_of(dataset, column="input_ids")   # from the Arrow offsets: no row loop
    sampler = lb.LengthBatchSampler(lengths, strategy="packed", token_budget=8192, max_batch_size=64, seed=0)
    batcher = lb.StreamingBatcher(stream, strategy="bucketed", token_budget=8192, max_batch_size=64,
                                  buffer_size=4096)                    # lengths not known up front

    batch = lb.collate_packed([{"input_ids": ids} for ids in samples])   # or collate_padded
    model(**batch.model_inputs())                                       # any HF causal LM
    lb.check_packing(model, strict=True)       # refuses a model that lets packed sequences mix
    n = lb.learned_tokens(micro_batches)       # one step's learned tokens: num_items_in_batch=n

``import lenbatch`` stays light (numpy only): ``LengthBatchSampler``, ``StreamingBatcher``, ``collate_padded`` and
``collate_packed`` import torch on first access, ``lengths_of`` pyarrow on its first call; transformers
only in :mod:`lenbatch.hf`. The library never imports the study (``lenbatch_study``) that measures it.
"""

from __future__ import annotations

from typing import Any

from lenbatch import log as _log  # noqa: F401 (a NullHandler on the 'lenbatch' logger; messages propagate to the user's handlers)
from lenbatch.batching.boundaries import METHODS, Boundaries, optimize_boundaries, sweep_num_buckets
from lenbatch.batching.compare import compare_strategies
from lenbatch.batching.cost import Cost
from lenbatch.batching.lengths import bucket_counts, histogram, length_stats
from lenbatch.batching.padding import (
    budget_fill,
    composition_repeat,
    greedy_bucket_computed,
    length_mixing,
    padding_efficiency,
    predict_bucketed,
)
from lenbatch.batching.spec import BatchSpec
from lenbatch.batching.strategies import STRATEGIES, Plan, plan_epoch, plan_epoch_all
from lenbatch.batching.strategy import Strategy
from lenbatch.loading.arrow import lengths_of

__version__ = "0.1.0"

__all__ = [
    "METHODS",
    "STRATEGIES",
    "BatchSpec",
    "Boundaries",
    "Cost",
    "LengthBatchSampler",
    "PackingCheck",
    "Plan",
    "Strategy",
    "StreamingBatcher",
    "bucket_counts",
    "budget_fill",
    "check_packing",
    "collate_packed",
    "collate_padded",
    "compare_strategies",
    "composition_repeat",
    "greedy_bucket_computed",
    "histogram",
    "learned_tokens",
    "length_mixing",
    "length_stats",
    "lengths_of",
    "optimize_boundaries",
    "padding_efficiency",
    "plan_epoch",
    "plan_epoch_all",
    "predict_bucketed",
    "sweep_num_buckets",
]


def __getattr__(name: str) -> Any:
    if name == "LengthBatchSampler":
        from lenbatch.loading.sampler import LengthBatchSampler

        return LengthBatchSampler
    if name in ("check_packing", "PackingCheck"):
        from lenbatch import packcheck

        return getattr(packcheck, name)
    if name == "learned_tokens":
        from lenbatch.loss import learned_tokens

        return learned_tokens
    if name == "StreamingBatcher":
        from lenbatch.loading.streaming import StreamingBatcher

        return StreamingBatcher
    if name in ("collate_padded", "collate_packed"):
        from lenbatch.loading import collate as _collate

        return getattr(_collate, name)
    raise AttributeError(f"module 'lenbatch' has no attribute {name!r}")
