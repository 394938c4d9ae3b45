"""lenbatch: choose how to batch variable-length samples for LLM training.

Public API (stable, DESIGN.md)::

    import lenbatch as lb
    b = lb.optimize_boundaries(lengths, num_buckets=6, token_budget=49152, max_batch_size=64, method="dp")
    batches = lb.plan_epoch(lengths, strategy="bucketed", epoch=0, seed=0, token_budget=49152,
                            max_batch_size=64, edges=b.edges, rank=0, world_size=1)
    lb.padding_efficiency(lengths, batches, strategy="bucketed")
    sampler = lb.LengthBatchSampler(lengths, strategy="packed", token_budget=8192, max_batch_size=64, seed=0)

``import lenbatch`` stays light (numpy only): ``LengthBatchSampler`` imports torch on first access.
"""

from __future__ import annotations

from typing import Any

from lenbatch.boundaries import METHODS, Boundaries, optimize_boundaries, sweep_num_buckets
from lenbatch.padding import (
    budget_fill,
    composition_repeat,
    expected_max,
    greedy_bucket_computed,
    greedy_starts,
    length_mixing,
    padding_efficiency,
    predict_bucketed,
    study_bucket_computed,
)
from lenbatch.stats import bucket_counts, histogram, length_stats, seed_profile
from lenbatch.strategies import STRATEGIES, plan_epoch, plan_epoch_all

__version__ = "0.1.0"

__all__ = [
    "METHODS", "STRATEGIES", "Boundaries", "LengthBatchSampler", "bucket_counts", "budget_fill",
    "composition_repeat", "expected_max", "greedy_bucket_computed", "greedy_starts", "histogram",
    "length_mixing", "length_stats", "optimize_boundaries", "padding_efficiency", "plan_epoch", "plan_epoch_all",
    "predict_bucketed", "seed_profile", "study_bucket_computed", "sweep_num_buckets",
]


def __getattr__(name: str) -> Any:
    if name == "LengthBatchSampler":
        from lenbatch.sampler import LengthBatchSampler

        return LengthBatchSampler
    raise AttributeError(f"module 'lenbatch' has no attribute {name!r}")
