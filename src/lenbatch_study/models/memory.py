"""Peak device memory of each training rank, from the config, before anything is launched.

A target rank holds (``b`` = bytes of ``model.dtype``, ``T`` = ``batching.token_budget``,
``H`` hidden, ``I`` MLP width, ``L_t`` = ``len(model.target_layers)``, ``q`` = ``train.queue_size``):

* weights: ``P_target * b`` (parameters counted exactly, in closed form: decoder + embedding
  + the untied lm_head, which the target rank also builds; :func:`target_parameters`);
* activations at the budget (inference, one layer alive at a time, plus the captured layer outputs):
  ``T * b * max(max(4 H + 3 I + W, G) + (L_t - 1) H, 2 L_t H)`` (:func:`target_activation_elements`):
  a layer's working set, ``4 H + 3 I + W`` (residual, normed input, layer output, the MLP's
  gate/up/product, and ``W`` the widest mixer projection: gated-attention ``q``/``k``/``v`` or the Gated
  DeltaNet ``qkvz``) or, with Gated DeltaNet layers, ``G`` the working set inside fla's chunked
  kernel (:func:`gdn_working_elements`: ~138 KB per token at hidden 2048 with 16 key / 48 value
  heads of 128, where the first sum gives 84), while the outputs of the target layers before the last
  are retained for the features; then the capture (``Target.features``): all ``L_t`` retained outputs,
  their concatenation and, in the padded layout, its masked copy alive at once, the last of them the
  features counted below, so ``2 L_t H`` on top;
* features: ``(q + 1) * T * L_t * H * b``: ``q`` batches in flight to the drafter (kept alive
  until credited) plus the one being computed; ``T * L_t * H * b`` alone when ranks share a GPU
  (gloo: a batch in flight is a host copy, ``host_queue``).

The drafter rank holds the target's embedding and lm_head (``2 V H b``), the drafter's fp32
master weights, gradients and AdamW moments (``16`` bytes per drafter parameter), one received
batch of features (``T * L_t * H * b``), the drafter's activations kept for backward
(``T * H * 4 * (2 + 8 * drafter.num_layers)``: the context projection and each layer's
context keys/values and their inputs, fp32 at most), the chunked cross-entropy's logits
(``3 * CE_CHUNK_ROWS * V * 4``) and, per drafter layer, the **block attention windows**: every
sequence ``s`` of a step attends to its own context window of ``Lc`` positions (the step's largest
anchor) plus its ``N = anchors_per_seq * block_size`` block positions, so keys and values are
gathered per sequence: ``W = S * (Lc + N)`` window tokens, which scales with sequences x context
length, not with the batch's tokens (a packed row of 30 sequences holds 30 windows of up to
``max_len``; 1.8-3.2 x ``T`` at budget 49,152 on the study's data). Per layer
``b * H * (2 W + 2 S Lc) + 3 N W``: the concatenated keys and values kept for backward, the
gathered context keys/values alive while they are concatenated, and the boolean mask with its
``model.dtype`` bias (SDPA's memory-efficient kernel; the math fallback would add
``heads * N * W * 4``, not counted). ``W`` comes from the plan (:func:`plan_window_tokens`: the
largest ``S * (longest + N)`` over its batches) or, before there is one, from the config bound
``max_batch_size * (min(max_len, T) + N)``. The block positions themselves (``P = S * N``) keep
``P * b * (20 H + 4 I)`` per layer (:func:`drafter_block_bytes`).

A rank fits when its peak is at most ``USABLE_FRACTION`` of the device memory minus
``RESERVED_BYTES`` (CUDA context, NCCL buffers, allocator fragmentation). Coarse by design:
it refuses settings that cannot fit, it does not promise that the others do. Cost: the drafter
built on the meta device (milliseconds, no memory) and the target's closed-form count; nothing
imports transformers' model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

USABLE_FRACTION = 0.92
RESERVED_BYTES = 2 * 2**30  # CUDA context + NCCL channels per process
BYTES = {"float32": 4, "bfloat16": 2}


@dataclass(frozen=True)
class RankMemory:
    role: str
    weights: int
    activations: int
    features: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.weights + self.activations + self.features + self.optimizer


def target_parameters(model) -> int:
    """Parameters of the target rank's model for ``model`` (a ``ModelConfig``): the Qwen3.5 text
    decoder (``transformers``' ``Qwen3_5TextModel``) plus the untied ``lm_head``, counted in closed
    form so that the drafter rank, which reports this estimate, never imports transformers' model
    (which imports fla: ~7 CPU-s per process). With ``V`` vocab, ``H`` hidden, ``I`` MLP width:

    ``2 V H + H`` (embedding, lm_head, final norm) and per layer ``2 H + 3 H I`` (two norms, MLP) plus
    its mixer: gated attention ``H (2 n_q d + 2 n_kv d) + n_q d H + 2 d`` (``q_proj`` carries the gate;
    ``q_norm``/``k_norm`` per head dim) or Gated DeltaNet with ``K = n_k d_k``, ``C = 2 K + n_v d_v``:
    ``H (C + n_v d_v + 2 n_v) + C k + 2 n_v + d_v + n_v d_v H`` (``in_proj_qkv``/``z``/``b``/``a``, the
    depthwise conv of width ``k``, ``dt_bias``, ``A_log``, the gated norm, ``out_proj``).
    tests/models/test_gpu_path.py checks it equals the meta-device model's count. O(layers)."""
    m = model
    V, H, I = m.vocab_size, m.hidden_size, m.intermediate_size
    q, kv = m.num_attention_heads * m.head_dim, m.num_key_value_heads * m.head_dim
    attn = H * (2 * q + 2 * kv) + q * H + 2 * m.head_dim
    k, v = m.linear_num_key_heads * m.linear_key_head_dim, m.linear_num_value_heads * m.linear_value_head_dim
    conv, nv = 2 * k + v, m.linear_num_value_heads
    gdn = H * (conv + v + 2 * nv) + conv * m.linear_conv_kernel_dim + 2 * nv + m.linear_value_head_dim + v * H
    mixers = sum(attn if t == "full_attention" else gdn for t in m.layer_types)
    return 2 * V * H + H + m.num_hidden_layers * (2 * H + 3 * H * I) + mixers


GDN_CHUNK = 64  # fla's chunk size for the gated delta rule


def gdn_working_elements(model) -> int:
    """Elements per token alive at the peak of a Gated DeltaNet layer's forward on fla's kernels (the
    layer's MLP is not yet alive): with ``K = n_k d_k``, ``V = n_v d_v``, ``C = 2 K + V``,
    ``2 H + C + 2 V + 2 K + n_v (d_k + 3 d_v) + 64 n_v + n_v d_k d_v / 64``: the residual and normed
    input; the conv output ``qkv``; ``z`` and ``v`` as one contiguous row; q and k normalised; fla's
    ``w``, ``u``, ``v_new`` and output; the chunk's triangular solve ``A`` [64 per value head]; the
    chunk states ``h`` [d_k x d_v per value head per 64 tokens]. Read off the live tensors at the peak
    of fla 0.6.0's forward (tests/models/test_fla_cpu.py measures it: within 15%). Each sequence's last
    chunk is partial, so ``h`` grows by up to one chunk per sequence; not counted. O(1)."""
    m = model
    if "linear_attention" not in m.layer_types:
        return 0
    k, v = m.linear_num_key_heads * m.linear_key_head_dim, m.linear_num_value_heads * m.linear_value_head_dim
    nv, dk, dv = m.linear_num_value_heads, m.linear_key_head_dim, m.linear_value_head_dim
    return (
        2 * m.hidden_size
        + (2 * k + v)
        + 2 * v
        + 2 * k
        + nv * (dk + 3 * dv)
        + GDN_CHUNK * nv
        + nv * dk * dv // GDN_CHUNK
    )


def target_activation_elements(model) -> int:
    """Elements per token of the target rank's activations at its peak (module doc): the larger of a
    layer's working set with the ``L_t - 1`` earlier target layers' outputs retained, and the capture's
    retained outputs plus their concatenation (``2 L_t H``; its masked copy is the features). O(1)."""
    m = model
    H, Lt = m.hidden_size, len(m.target_layers)
    attn = m.num_attention_heads * m.head_dim * 2 + 2 * m.num_key_value_heads * m.head_dim  # gated q, k, v
    gdn = 2 * m.linear_num_key_heads * m.linear_key_head_dim + 2 * m.linear_num_value_heads * m.linear_value_head_dim
    layer = max(4 * H + 3 * m.intermediate_size + max(attn, gdn), gdn_working_elements(m))
    return max(layer + (Lt - 1) * H, 2 * Lt * H)


def _drafter_parameters(params) -> int:
    from lenbatch_study.models.drafter import Drafter

    m, d = params.model, params.drafter
    with torch.device("meta"):
        drafter = Drafter(
            feature_dim=len(m.target_layers) * m.hidden_size,
            hidden_size=m.hidden_size,
            intermediate_size=m.intermediate_size,
            num_layers=d.num_layers,
            num_heads=d.num_heads,
            block_size=d.block_size,
            gamma=d.gamma,
        )
    return sum(p.numel() for p in drafter.parameters())


def _block_positions(params) -> int:
    """``N``: block positions per sequence per step (anchors x block size)."""
    return params.drafter.anchors_per_seq * params.drafter.block_size


def window_ratios(params, lengths, batches):
    """``W / T`` of every batch (``W = S * (longest + N)``; index arrays into ``lengths``). O(total indices)."""
    import numpy as np

    n, lengths = _block_positions(params), np.asarray(lengths)
    return np.array([len(b) * (int(lengths[b].max()) + n) for b in batches if len(b)]) / params.batching.token_budget


def plan_window_tokens(params, lengths, batches) -> int:
    """Largest ``W = S * (longest + N)`` over ``batches``: the drafter's block-attention window tokens
    at its busiest step (module doc). O(total indices)."""
    r = window_ratios(params, lengths, batches)
    return int(round(r.max() * params.batching.token_budget)) if r.size else 0


def plan_block_positions(params, batches) -> int:
    """Largest ``P = S * N`` over ``batches``: block positions of the busiest step."""
    return max((len(b) for b in batches), default=0) * _block_positions(params)


def config_window_tokens(params) -> int:
    """The config's bound on ``W`` when no plan is at hand: ``max_batch_size * (min(max_len, T) + N)``."""
    T = params.batching.token_budget
    return params.batching.max_batch_size * (min(params.data.max_len, T) + _block_positions(params))


def drafter_window_bytes(params, window_tokens: int) -> int:
    """Bytes of the drafter's block-attention windows, all layers (module doc):
    ``layers * (b * H * (2 W + 2 S Lc) + (1 + b) N W)`` with ``S Lc <= W``."""
    b, H, n = BYTES[params.model.dtype], params.model.hidden_size, _block_positions(params)
    return params.drafter.num_layers * (b * H * 4 * window_tokens + (1 + b) * n * window_tokens)


def drafter_block_bytes(params, positions: int) -> int:
    """Bytes the drafter keeps per block position ``P = S * N`` for backward, all layers: the block
    states through norms, projections, RoPE, attention output and the MLP, ``P * b * (20 H + 4 I)``
    per layer (counted on a CPU drafter step: 19 hidden-wide and 4 MLP-wide tensors)."""
    m = params.model
    return params.drafter.num_layers * positions * BYTES[m.dtype] * (20 * m.hidden_size + 4 * m.intermediate_size)


def plan_memory_shape(params, lengths, batches) -> dict[str, int]:
    """The keyword arguments of :func:`rank_memory` for a plan's ``batches``."""
    return {
        "window_tokens": plan_window_tokens(params, lengths, batches),
        "block_positions": plan_block_positions(params, batches),
    }


def rank_memory(
    params, *, window_tokens: int | None = None, block_positions: int | None = None, host_queue: bool = False
) -> tuple[RankMemory, RankMemory]:
    """(target rank, drafter rank) peak bytes for ``params`` (formulas in the module doc);
    ``window_tokens`` / ``block_positions``: the plan's ``W`` and ``P`` (:func:`plan_memory_shape`), else
    the config's bounds (``max_batch_size`` sequences). ``host_queue``: the batches in flight are host
    copies (gloo, when ranks share a GPU: :func:`lenbatch_study.runtime.runner.init_process_group`), so the
    target rank's device holds only the batch being computed."""
    from lenbatch_study.models.drafter import CE_CHUNK_ROWS

    m, b = params.model, BYTES[params.model.dtype]
    T, H, V, Lt = params.batching.token_budget, m.hidden_size, m.vocab_size, len(m.target_layers)
    windows = drafter_window_bytes(params, config_window_tokens(params) if window_tokens is None else window_tokens)
    positions = (
        params.batching.max_batch_size * _block_positions(params) if block_positions is None else block_positions
    )
    windows += drafter_block_bytes(params, positions)
    step_features = T * Lt * H * b
    target = RankMemory(
        "target",
        weights=target_parameters(params.model) * b,
        activations=T * b * target_activation_elements(m),
        features=(1 if host_queue else params.train.queue_size + 1) * step_features,
        optimizer=0,
    )
    drafter = RankMemory(
        "drafter",
        weights=2 * V * H * b,
        activations=T * H * 4 * (2 + 8 * params.drafter.num_layers) + 3 * CE_CHUNK_ROWS * V * 4 + windows,
        features=step_features,
        optimizer=16 * _drafter_parameters(params),
    )
    return target, drafter


def usable_bytes(device_bytes: int) -> int:
    return int(device_bytes * USABLE_FRACTION) - RESERVED_BYTES


def check_fits(
    params,
    *,
    device_bytes: int,
    ranks_per_device: int = 1,
    single_process: bool = False,
    window_tokens: int | None = None,
    block_positions: int | None = None,
) -> tuple[RankMemory, RankMemory]:
    """Refuse (``ValueError`` naming ``train.queue_size`` / ``batching.token_budget``) a setting whose
    rank peak (or, with ``ranks_per_device`` ranks sharing one device, the sum of the busiest
    device's ranks: the drafter and ``ranks_per_device - 1`` target ranks) exceeds the usable memory.
    ``single_process``: one process holds both roles and one batch of features (no queue). Ranks sharing
    a device talk over gloo, so their batches in flight are in host memory (``host_queue``)."""
    host_queue = ranks_per_device > 1 and not single_process
    target, drafter = rank_memory(
        params, window_tokens=window_tokens, block_positions=block_positions, host_queue=host_queue
    )
    others = max(ranks_per_device - 1, 0)
    need = max(target.total * ranks_per_device, drafter.total + target.total * others)
    if single_process:  # both models, one batch's features (the drafter's "received" copy is the same tensor)
        need = target.total - target.features + drafter.total
    have = usable_bytes(device_bytes)
    if need <= have:
        return target, drafter
    gib = 2**30
    per_batch = target.features // (params.train.queue_size + 1) * ranks_per_device
    spare = have - (need - target.features * ranks_per_device)  # room left for features
    fits_q = spare // per_batch - 1 if per_batch else -1
    hint = (
        f"train.queue_size <= {fits_q} fits"
        if fits_q >= 1 and not single_process and not host_queue
        else "lower batching.token_budget"
        + (" (one process holds both models)" if single_process else "; even train.queue_size: 1 does not fit")
    )
    raise ValueError(
        f"a rank needs {need / gib:.1f} GiB but the device has {device_bytes / gib:.1f} GiB "
        f"({have / gib:.1f} usable): target weights {target.weights / gib:.1f}, activations "
        f"{target.activations / gib:.1f}, features in flight {target.features / gib:.1f} GiB "
        f"((train.queue_size {params.train.queue_size} in flight + 1 being computed) x batching.token_budget "
        f"{params.batching.token_budget} x {len(params.model.target_layers)} target layers x hidden "
        f"{params.model.hidden_size} x {BYTES[params.model.dtype]} bytes); {hint}"
    )
