"""The frozen target: a ``transformers`` Qwen3.5/3.6 text model with seeded random weights, or the
weights of a local Hugging Face checkpoint (``model.pretrained``).

API (stable; the drafter, the collation and the train stage rely on it)::

    from lenbatch_study.models.target import build_target, build_heads
    target = build_target(params.model, device="cpu")       # frozen, eval, params.model.dtype
    feats = target.features(input_ids, attention_mask=mask)  # padded   [B, T] -> [B, T, F]
    feats = target.features(row_ids, cu_seqlens=cu)          # packed   [1, N] -> [1, N, F]
    target.embed_tokens, target.lm_head                      # frozen nn.Embedding / nn.Linear
    target.feature_dim                                       # F = len(target_layers) * hidden_size
    embed, lm_head = build_heads(params.model)               # the same two modules, bit-identical, alone

The model is the real ``Qwen3_5TextModel`` (``transformers.models.qwen3_5``) plus an
``lm_head`` Linear(hidden -> vocab). Its Gated DeltaNet and full-attention modules are
made sequence-boundary aware by :mod:`lenbatch_study.models.varlen` (same weights, same module
names, the Hugging Face forward is untouched when no boundaries are passed).

Determinism: every parameter is drawn from its own generator seeded by
``(init_seed, parameter name)`` (``_param_seed``), with the distributions Hugging Face's
``_init_weights`` uses (normal(0, 0.02) for Linear/Embedding/Conv1d, zeros for the
1-centred RMSNorm, ones for the gated norm and ``dt_bias``, log U(0.01, 16) for
``A_log``). So two processes get bit-identical weights on the same device type without
any transfer, independently of construction order, and :func:`build_heads` can build
``embed_tokens`` and ``lm_head`` alone (the drafter rank never builds the whole target).
Nothing is downloaded.

**A local checkpoint** (``model.pretrained: DIR``, the folder ``save_pretrained`` writes:
``config.json`` + ``*.safetensors``, text-only or a Qwen3.5 vision-language checkpoint, whose
``language_model`` weights are used): read with ``local_files_only`` (never downloaded). The
architecture comes from the checkpoint's own config (every detail, e.g. ``rms_norm_eps``, tied
embeddings), and the ``model`` section's shape keys (:data:`SHAPE_KEYS`) must *equal* it: a
mismatch is refused naming each key with both values. Why refuse rather than ignore the params:
the params are what the workflow records, diffs and feeds to the memory check and the step-time
prediction; a run whose recorded shapes are not the ones that ran would be a silent lie, and
guessing which of the two was meant is worse (the error prints the values to copy).
``init_seed`` is unused then; ``dtype`` still chooses the compute dtype (weights cast on load).
:func:`build_heads` reads only the two head tensors from the safetensors files (the drafter rank
never loads the decoder), bit-identical to the target's.

Cost: ``features`` runs the decoder layers up to ``max(target_layers)`` only (later layers
and the final norm are skipped) and never the lm_head (vocab 248,320: the drafter applies
it on its block positions only).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lenbatch_study.core.config import ModelConfig
from lenbatch_study.core.log import get_logger

# the target's shapes from files (config only, its own module), re-exported: tests and tools import them from here
from lenbatch_study.models.target_config import (
    SHAPE_KEYS,
    checkpoint_dir,
    model_config_from_file,
    pretrained_text_config,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
INITIALIZER_RANGE = 0.02  # std of the normal init (Hugging Face Qwen3_5TextConfig default)


def hf_text_config(cfg: ModelConfig) -> Any:
    """``ModelConfig`` -> ``transformers.Qwen3_5TextConfig`` (attention routed through lenbatch)."""
    from transformers import Qwen3_5TextConfig

    from lenbatch_study.models import varlen

    _check_model_config(cfg)
    varlen.register_attention()
    if cfg.pretrained is not None:
        hf = pretrained_text_config(cfg)
        hf._attn_implementation = varlen.ATTN_IMPLEMENTATION
        return hf
    hf = Qwen3_5TextConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        layer_types=list(cfg.layer_types),
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        linear_num_key_heads=cfg.linear_num_key_heads,
        linear_num_value_heads=cfg.linear_num_value_heads,
        linear_key_head_dim=cfg.linear_key_head_dim,
        linear_value_head_dim=cfg.linear_value_head_dim,
        linear_conv_kernel_dim=cfg.linear_conv_kernel_dim,
        rope_parameters={"rope_type": "default", "rope_theta": float(cfg.rope_theta), "partial_rotary_factor": 0.25},
        initializer_range=INITIALIZER_RANGE,
        tie_word_embeddings=False,
        use_cache=False,
    )
    # Plain HF calls (no boundaries) behave exactly like "sdpa"; with boundaries the
    # attention is computed per sequence (lenbatch_study.models.varlen.varlen_attention).
    hf._attn_implementation = varlen.ATTN_IMPLEMENTATION
    return hf


def _check_model_config(cfg: ModelConfig) -> None:
    """Shape rules the dataclass cannot see; ``ValueError`` names the key and the fix."""
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ValueError(
            f"model.num_attention_heads ({cfg.num_attention_heads}) must be a multiple of "
            f"model.num_key_value_heads ({cfg.num_key_value_heads}); change one of them"
        )
    if cfg.linear_num_value_heads % cfg.linear_num_key_heads:
        raise ValueError(
            f"model.linear_num_value_heads ({cfg.linear_num_value_heads}) must be a multiple of "
            f"model.linear_num_key_heads ({cfg.linear_num_key_heads}); change one of them"
        )
    if cfg.head_dim % 8:
        raise ValueError(
            f"model.head_dim ({cfg.head_dim}) must be a multiple of 8 (a quarter of it is rotated "
            "by RoPE in pairs); use e.g. 32, 64, 128 or 256"
        )
    outside = [i for i in cfg.target_layers if not 0 <= i < cfg.num_hidden_layers]
    if outside or not cfg.target_layers:
        raise ValueError(
            f"model.target_layers {list(cfg.target_layers)} must be non-empty layer ids in "
            f"0..{cfg.num_hidden_layers - 1}; pick layers the model has"
        )
    bad = [t for t in cfg.layer_types if t not in ("linear_attention", "full_attention")]
    if bad or len(cfg.layer_types) != cfg.num_hidden_layers:
        raise ValueError(
            f"model.layer_types {list(cfg.layer_types)} must give one of linear_attention / "
            f"full_attention for each of the {cfg.num_hidden_layers} layers"
        )


def _param_seed(init_seed: int, name: str) -> int:
    digest = hashlib.blake2b(f"{init_seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


@torch.no_grad()
def _init_param(param: torch.Tensor, name: str, kind: str, init_seed: int) -> None:
    """Fill one parameter in place from its own seeded generator (device-local RNG)."""
    gen = torch.Generator(device=param.device)
    gen.manual_seed(_param_seed(init_seed, name))
    if kind == "normal":
        buf = torch.empty(param.shape, dtype=torch.float32, device=param.device)
        buf.normal_(0.0, INITIALIZER_RANGE, generator=gen)
    elif kind == "zeros":
        buf = torch.zeros(param.shape, dtype=torch.float32, device=param.device)
    elif kind == "ones":
        buf = torch.ones(param.shape, dtype=torch.float32, device=param.device)
    elif kind == "a_log":
        buf = torch.empty(param.shape, dtype=torch.float32, device=param.device)
        buf.uniform_(0.01, 16.0, generator=gen).log_()
    else:
        raise AssertionError(f"unknown init kind {kind}")
    param.copy_(buf)


def _init_kind(module: nn.Module, pname: str) -> str:
    if isinstance(module, (nn.Linear, nn.Embedding, nn.Conv1d)) and pname == "weight":
        return "normal"
    # only now: build_heads (the drafter rank) never imports transformers' model, which imports fla
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq

    if isinstance(module, mq.Qwen3_5RMSNorm):
        return "zeros"  # this RMSNorm multiplies by (1 + weight)
    if isinstance(module, mq.Qwen3_5RMSNormGated):
        return "ones"
    if isinstance(module, mq.Qwen3_5GatedDeltaNet) and pname == "dt_bias":
        return "ones"
    if isinstance(module, mq.Qwen3_5GatedDeltaNet) and pname == "A_log":
        return "a_log"
    raise AssertionError(f"no init rule for {type(module).__name__}.{pname}; transformers changed the model")


def _materialize(root: nn.Module, prefix: str, init_seed: int, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """Allocate a meta-device module on ``device`` in ``dtype`` and fill every parameter by name."""
    root = root.to(dtype).to_empty(device=device)  # .to on meta is free: one allocation, in dtype
    for mod_name, module in root.named_modules():
        for pname, param in module.named_parameters(recurse=False):
            full = f"{prefix}{mod_name}.{pname}" if mod_name else f"{prefix}{pname}"
            _init_param(param, full, _init_kind(module, pname), init_seed)  # drawn in fp32, cast on copy
            param.requires_grad_(False)
    return root


class Target(nn.Module):
    """Frozen Qwen3.5-architecture target: ``model`` (Qwen3_5TextModel) + ``lm_head``."""

    def __init__(self, cfg: ModelConfig, model: nn.Module, lm_head: nn.Linear) -> None:
        super().__init__()
        self.cfg = cfg
        # where the weights come from, for logs and results
        self.weights = (
            f"checkpoint {cfg.pretrained}" if cfg.pretrained is not None else f"random (init_seed {cfg.init_seed})"
        )
        self.model = model
        self.lm_head = lm_head
        self.target_layers = tuple(int(i) for i in cfg.target_layers)
        self.feature_dim = len(self.target_layers) * cfg.hidden_size

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.embed_tokens

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def train(self, mode: bool = True) -> "Target":  # frozen: always eval (no dropout, no grad)
        return super().train(False)

    @torch.inference_mode()
    def features(
        self,
        input_ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hidden states of ``cfg.target_layers`` concatenated: ``[B, T, len(target_layers) * hidden]``.

        Padded layout: ``input_ids`` [B, T] right-padded, ``attention_mask`` [B, T] (1 = token,
        0 = padding; None = no padding). Each row is one sequence; padding positions come
        out as exact zeros. Packed layout: ``input_ids`` [1, N] and ``cu_seqlens`` int
        [S+1] (0, end of seq 1, ..., N): positions restart at every sequence start, no token
        attends across a boundary, no conv tap or recurrent state crosses one. The output
        for a sequence equals the output of that sequence alone (``lenbatch verify-packing``).
        A layer's hidden state is the decoder layer's output (the residual stream, before
        the final norm). Runs under ``torch.inference_mode``.
        Cost: linear in tokens for the Gated DeltaNet layers (chunks of 32 tokens on CPU, 64 in
        fla, padded per sequence), sum of L_i^2 for attention (B * T^2 in the padded layout).
        """
        outs = self.hidden_states(
            input_ids, attention_mask=attention_mask, cu_seqlens=cu_seqlens, layers=self.target_layers
        )
        feats = torch.cat([outs[i] for i in self.target_layers], dim=-1)
        if attention_mask is not None:
            feats = feats * attention_mask.to(device=feats.device, dtype=feats.dtype).unsqueeze(-1)
        return feats

    @torch.inference_mode()
    def hidden_states(
        self,
        input_ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        layers: tuple[int, ...] | None = None,
        final_norm: bool = False,
        boundaries: bool = True,
    ) -> dict[Any, torch.Tensor]:
        """Per-layer outputs ``{layer_id: [B, T, hidden]}`` (plus ``"final"``, normed, if asked).

        ``layers=None`` returns every layer. ``boundaries=False`` withholds the sequence
        boundaries of a packed row (positions still restart): the deliberately wrong forward
        that ``verify-packing --no-boundaries`` must reject. Layouts as in :meth:`features`.
        """
        from lenbatch_study.models import varlen

        segs = varlen.make_segments(
            input_ids, attention_mask=attention_mask, cu_seqlens=cu_seqlens, boundaries=boundaries, device=self.device
        )
        wanted = set(range(self.cfg.num_hidden_layers) if layers is None else layers)
        bad = [i for i in wanted if not 0 <= i < self.cfg.num_hidden_layers]
        if bad:
            raise ValueError(
                f"layer ids {sorted(bad)} are outside the model's 0..{self.cfg.num_hidden_layers - 1}; "
                "fix model.target_layers"
            )
        last = self.cfg.num_hidden_layers - 1 if final_norm else max(wanted)
        hidden = self.model.embed_tokens(input_ids.to(self.device))
        position_ids = segs.position_ids
        # the rotary takes multimodal (3, B, T) positions; text-only = three equal copies (transformers
        # 5.17, the GPU check machine's, requires the 3-D form; 5.24 expands a 2-D one the same way)
        pos_emb = self.model.rotary_emb(hidden, position_ids[None].expand(3, -1, -1))
        out: dict[Any, torch.Tensor] = {}
        for i, layer in enumerate(self.model.layers[: last + 1]):
            hidden = layer(
                hidden,
                position_embeddings=pos_emb,
                attention_mask=None,
                position_ids=position_ids,
                lenbatch_segments=segs,
            )
            if i in wanted:
                out[i] = hidden
        if final_norm:
            out["final"] = self.model.norm(hidden)
        return out

    @torch.inference_mode()
    def reference_hidden_states(self, input_ids: torch.Tensor) -> dict[Any, torch.Tensor]:
        """One sequence ``[1, L]`` through the unmodified Hugging Face ``Qwen3_5TextModel.forward``.

        Every decoder layer's output (forward hooks) plus ``"final"`` (the model's normed
        ``last_hidden_state``). No lenbatch code runs in it: the reference of verify-packing. Its
        Gated DeltaNet kernels are transformers' torch ones whatever is installed
        (:func:`lenbatch_study.models.varlen.torch_reference_kernels`).
        """
        if input_ids.ndim != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"reference_hidden_states takes one sequence [1, L], got {tuple(input_ids.shape)}")
        out: dict[Any, torch.Tensor] = {}
        from lenbatch_study.models.varlen import torch_reference_kernels

        hooks = [
            layer.register_forward_hook(lambda _m, _a, res, i=i: out.__setitem__(i, res))
            for i, layer in enumerate(self.model.layers)
        ]
        try:
            with torch_reference_kernels():  # transformers' torch kernels even where fla is installed
                res = self.model(input_ids=input_ids.to(self.device), use_cache=False)
        finally:
            for h in hooks:
                h.remove()
        out["final"] = res.last_hidden_state
        return out


def _build_hf_model(cfg: ModelConfig, device: torch.device) -> nn.Module:
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextModel, Qwen3_5TextRotaryEmbedding

    from lenbatch_study.models import varlen

    hf_cfg = hf_text_config(cfg)
    with torch.device("meta"):  # no memory, no RNG: every parameter is filled below, by name
        model = Qwen3_5TextModel(hf_cfg)
    model = _materialize(model, "model.", cfg.init_seed, DTYPES[cfg.dtype], device)
    with torch.device(device):  # buffers (RoPE inverse frequencies) are computed, not random
        model.rotary_emb = Qwen3_5TextRotaryEmbedding(hf_cfg)
    buffers = {n for n, _ in model.named_buffers()}
    assert buffers <= {"rotary_emb.inv_freq", "rotary_emb.original_inv_freq"}, buffers
    varlen.make_boundary_aware(model)
    return model


def build_heads(cfg: ModelConfig, *, device: str | torch.device = "cpu") -> tuple[nn.Embedding, nn.Linear]:
    """The target's ``embed_tokens`` and ``lm_head`` alone: bit-identical to ``build_target``'s, frozen.

    With ``cfg.pretrained`` only these two tensors are read from the checkpoint (the tied embedding
    when the checkpoint ties them). Cost: 2 * vocab * hidden parameters (2 x 31.8 M for the tiny
    default), no decoder layer.
    """
    _check_model_config(cfg)
    device = torch.device(device)
    dtype = DTYPES[cfg.dtype]
    with torch.device("meta"):
        embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
    if cfg.pretrained is not None:
        tied = bool(getattr(hf_text_config(cfg), "tie_word_embeddings", False))
        embed_w, head_w = _checkpoint_heads(Path(cfg.pretrained), tied=tied)
        embed = _filled(embed, embed_w, dtype, device)
        lm_head = _filled(lm_head, head_w, dtype, device)
        return embed.eval(), lm_head.eval()
    embed = _materialize(embed, "model.embed_tokens.", cfg.init_seed, dtype, device)
    lm_head = _materialize(lm_head, "lm_head.", cfg.init_seed, dtype, device)
    return embed.eval(), lm_head.eval()


def build_target(cfg: ModelConfig, *, device: str | torch.device = "cpu") -> Target:
    """Build the frozen target from ``params.model``: random weights seeded by ``cfg.init_seed``, or
    the checkpoint ``cfg.pretrained`` (see the module doc).

    Returns a :class:`Target` in eval mode, ``requires_grad=False`` everywhere, in
    ``cfg.dtype``, on ``device``. Deterministic: two processes get identical weights
    (same device type). Never downloads anything.
    """
    device = torch.device(device)
    if cfg.pretrained is not None:
        model, lm_head = _load_pretrained(cfg, device)
    else:
        model = _build_hf_model(cfg, device)
        _, lm_head = build_heads(cfg, device=device)
    target = Target(cfg, model, lm_head).to(device)
    target.requires_grad_(False)
    return target.eval()


# --------------------------------------------------------------------------- a local checkpoint


# Where a checkpoint keeps the text model: Qwen3_5ForCausalLM ("model."), the vision-language
# Qwen3_5ForConditionalGeneration ("model.language_model."), and its older layout.
_TEXT_PREFIXES = ("model.", "model.language_model.", "language_model.model.")
_HEAD_NAMES = ("lm_head.weight", "language_model.lm_head.weight")


def _load_pretrained(cfg: ModelConfig, device: torch.device) -> tuple[nn.Module, nn.Linear]:
    """``Qwen3_5ForCausalLM.from_pretrained`` of the checkpoint (local files only) -> its text model,
    boundary aware, and lm_head; refuses missing or mis-shaped weights, logs the tensors left unused."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    from lenbatch_study.models import varlen

    path = checkpoint_dir(cfg)
    hf_cfg = hf_text_config(cfg)
    lm, info = Qwen3_5ForCausalLM.from_pretrained(
        str(path),
        config=hf_cfg,
        local_files_only=True,
        dtype=DTYPES[cfg.dtype],
        device_map={"": str(device)},
        attn_implementation=varlen.ATTN_IMPLEMENTATION,
        output_loading_info=True,
    )
    bad = sorted(info["missing_keys"]) + sorted(str(k) for k in info["mismatched_keys"])
    if bad or info.get("error_msgs"):
        raise ValueError(
            f"model.pretrained={cfg.pretrained!r}: the checkpoint lacks or mis-shapes {len(bad)} weight(s) "
            f"of the target ({', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}) "
            f"{info.get('error_msgs') or ''}; it must be a complete Qwen3.5 checkpoint of these shapes"
        )
    unused = sorted(info["unexpected_keys"])
    get_logger("lenbatch.target").info(
        "target: weights of %s (%d tensors in %s, %d of them unused: %s)",
        path,
        len(lm.state_dict()),
        DTYPES[cfg.dtype],
        len(unused),
        ", ".join(unused[:3]) + (", ..." if len(unused) > 3 else "") if unused else "none",
    )
    model = varlen.make_boundary_aware(lm.model)
    return model, lm.lm_head


def _checkpoint_heads(path: Path, *, tied: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The embedding and lm_head tensors of the checkpoint at ``path`` (safetensors, sharded or not),
    read without loading any other tensor."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.is_file():
        where = {name: path / file for name, file in json.loads(index.read_text())["weight_map"].items()}
    else:
        where = {}
        for file in sorted(path.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as fh:
                where.update({name: file for name in fh.keys()})

    def read(name: str) -> torch.Tensor:
        with safe_open(str(where[name]), framework="pt") as fh:
            return fh.get_tensor(name)

    embed = next((p + "embed_tokens.weight" for p in _TEXT_PREFIXES if p + "embed_tokens.weight" in where), None)
    head = next((n for n in _HEAD_NAMES if n in where), None)
    if embed is None or (head is None and not tied):
        raise ValueError(
            f"model.pretrained={str(path)!r}: no {'embed_tokens' if embed is None else 'lm_head'} weight "
            f"in its safetensors (looked for {[p + 'embed_tokens.weight' for p in _TEXT_PREFIXES]} and "
            f"{list(_HEAD_NAMES)}); it must be a Qwen3.5 causal-LM checkpoint"
        )
    embed_w = read(embed)
    return embed_w, (embed_w if head is None else read(head))


@torch.no_grad()
def _filled(module: nn.Module, weight: torch.Tensor, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """A meta-device ``module`` allocated on ``device`` in ``dtype`` holding ``weight`` (cast on copy), frozen."""
    module = module.to(dtype).to_empty(device=device)
    if tuple(module.weight.shape) != tuple(weight.shape):
        raise ValueError(
            f"the checkpoint's head weight has shape {tuple(weight.shape)}, the target needs "
            f"{tuple(module.weight.shape)}; model.vocab_size / hidden_size must match the checkpoint"
        )
    module.weight.copy_(weight)
    module.weight.requires_grad_(False)
    return module


__all__ = [
    "DTYPES",
    "INITIALIZER_RANGE",
    "SHAPE_KEYS",
    "Target",
    "build_heads",
    "build_target",
    "checkpoint_dir",
    "hf_text_config",
    "model_config_from_file",
    "pretrained_text_config",
]
