"""The frozen target: a ``transformers`` Qwen3.5/3.6 text model with seeded random weights.

API (stable; the drafter, the collation and the train stage rely on it)::

    from lenbatch.models.target import build_target, build_heads
    target = build_target(params.model, device="cpu")       # frozen, eval, params.model.dtype
    feats = target.features(input_ids, attention_mask=mask)  # padded   [B, T] -> [B, T, F]
    feats = target.features(row_ids, cu_seqlens=cu)          # packed   [1, N] -> [1, N, F]
    target.embed_tokens, target.lm_head                      # frozen nn.Embedding / nn.Linear
    target.feature_dim                                       # F = len(target_layers) * hidden_size
    embed, lm_head = build_heads(params.model)               # the same two modules, bit-identical, alone

The model is the real ``Qwen3_5TextModel`` (``transformers.models.qwen3_5``) plus an
``lm_head`` Linear(hidden -> vocab). Its Gated DeltaNet and full-attention modules are
made sequence-boundary aware by :mod:`lenbatch.models.varlen` (same weights, same module
names, the Hugging Face forward is untouched when no boundaries are passed).

Determinism: every parameter is drawn from its own generator seeded by
``(init_seed, parameter name)`` (``_param_seed``), with the distributions Hugging Face's
``_init_weights`` uses (normal(0, 0.02) for Linear/Embedding/Conv1d, zeros for the
1-centred RMSNorm, ones for the gated norm and ``dt_bias``, log U(0.01, 16) for
``A_log``). So two processes get bit-identical weights on the same device type without
any transfer, independently of construction order, and :func:`build_heads` can build
``embed_tokens`` and ``lm_head`` alone (the drafter rank never builds the whole target).
Nothing is downloaded.

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

from lenbatch.core.config import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
INITIALIZER_RANGE = 0.02  # std of the normal init (Hugging Face Qwen3_5TextConfig default)


def hf_text_config(cfg: ModelConfig) -> Any:
    """``ModelConfig`` -> ``transformers.Qwen3_5TextConfig`` (attention routed through lenbatch)."""
    from transformers import Qwen3_5TextConfig

    from lenbatch.models import varlen

    _check_model_config(cfg)
    varlen.register_attention()
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
        rope_parameters={"rope_type": "default", "rope_theta": float(cfg.rope_theta),
                         "partial_rotary_factor": 0.25},
        initializer_range=INITIALIZER_RANGE,
        tie_word_embeddings=False,
        use_cache=False,
    )
    # Plain HF calls (no boundaries) behave exactly like "sdpa"; with boundaries the
    # attention is computed per sequence (lenbatch.models.varlen.varlen_attention).
    hf._attn_implementation = varlen.ATTN_IMPLEMENTATION
    return hf


def _check_model_config(cfg: ModelConfig) -> None:
    """Shape rules the dataclass cannot see; ``ValueError`` names the key and the fix."""
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ValueError(f"model.num_attention_heads ({cfg.num_attention_heads}) must be a multiple of "
                         f"model.num_key_value_heads ({cfg.num_key_value_heads}); change one of them")
    if cfg.linear_num_value_heads % cfg.linear_num_key_heads:
        raise ValueError(f"model.linear_num_value_heads ({cfg.linear_num_value_heads}) must be a multiple of "
                         f"model.linear_num_key_heads ({cfg.linear_num_key_heads}); change one of them")
    if cfg.head_dim % 8:
        raise ValueError(f"model.head_dim ({cfg.head_dim}) must be a multiple of 8 (a quarter of it is rotated "
                         "by RoPE in pairs); use e.g. 32, 64, 128 or 256")
    outside = [i for i in cfg.target_layers if not 0 <= i < cfg.num_hidden_layers]
    if outside or not cfg.target_layers:
        raise ValueError(f"model.target_layers {list(cfg.target_layers)} must be non-empty layer ids in "
                         f"0..{cfg.num_hidden_layers - 1}; pick layers the model has")
    bad = [t for t in cfg.layer_types if t not in ("linear_attention", "full_attention")]
    if bad or len(cfg.layer_types) != cfg.num_hidden_layers:
        raise ValueError(f"model.layer_types {list(cfg.layer_types)} must give one of linear_attention / "
                         f"full_attention for each of the {cfg.num_hidden_layers} layers")


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
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq

    if isinstance(module, (nn.Linear, nn.Embedding, nn.Conv1d)) and pname == "weight":
        return "normal"
    if isinstance(module, mq.Qwen3_5RMSNorm):
        return "zeros"  # this RMSNorm multiplies by (1 + weight)
    if isinstance(module, mq.Qwen3_5RMSNormGated):
        return "ones"
    if isinstance(module, mq.Qwen3_5GatedDeltaNet) and pname == "dt_bias":
        return "ones"
    if isinstance(module, mq.Qwen3_5GatedDeltaNet) and pname == "A_log":
        return "a_log"
    raise AssertionError(f"no init rule for {type(module).__name__}.{pname}; transformers changed the model")


def _materialize(root: nn.Module, prefix: str, init_seed: int, dtype: torch.dtype,
                 device: torch.device) -> nn.Module:
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
    def features(self, input_ids: torch.Tensor, *, attention_mask: torch.Tensor | None = None,
                 cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
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
        outs = self.hidden_states(input_ids, attention_mask=attention_mask, cu_seqlens=cu_seqlens,
                                  layers=self.target_layers)
        feats = torch.cat([outs[i] for i in self.target_layers], dim=-1)
        if attention_mask is not None:
            feats = feats * attention_mask.to(device=feats.device, dtype=feats.dtype).unsqueeze(-1)
        return feats

    @torch.inference_mode()
    def hidden_states(self, input_ids: torch.Tensor, *, attention_mask: torch.Tensor | None = None,
                      cu_seqlens: torch.Tensor | None = None, layers: tuple[int, ...] | None = None,
                      final_norm: bool = False, boundaries: bool = True) -> dict[Any, torch.Tensor]:
        """Per-layer outputs ``{layer_id: [B, T, hidden]}`` (plus ``"final"``, normed, if asked).

        ``layers=None`` returns every layer. ``boundaries=False`` withholds the sequence
        boundaries of a packed row (positions still restart): the deliberately wrong forward
        that ``verify-packing --no-boundaries`` must reject. Layouts as in :meth:`features`.
        """
        from lenbatch.models import varlen

        segs = varlen.make_segments(input_ids, attention_mask=attention_mask, cu_seqlens=cu_seqlens,
                                     boundaries=boundaries, device=self.device)
        wanted = set(range(self.cfg.num_hidden_layers) if layers is None else layers)
        bad = [i for i in wanted if not 0 <= i < self.cfg.num_hidden_layers]
        if bad:
            raise ValueError(f"layer ids {sorted(bad)} are outside the model's 0..{self.cfg.num_hidden_layers - 1}; "
                             "fix model.target_layers")
        last = self.cfg.num_hidden_layers - 1 if final_norm else max(wanted)
        hidden = self.model.embed_tokens(input_ids.to(self.device))
        position_ids = segs.position_ids
        # the rotary takes multimodal (3, B, T) positions; text-only = three equal copies (transformers
        # 5.17, the GPU check machine's, requires the 3-D form; 5.24 expands a 2-D one the same way)
        pos_emb = self.model.rotary_emb(hidden, position_ids[None].expand(3, -1, -1))
        out: dict[Any, torch.Tensor] = {}
        for i, layer in enumerate(self.model.layers[: last + 1]):
            hidden = layer(hidden, position_embeddings=pos_emb, attention_mask=None, position_ids=position_ids,
                           lenbatch_segments=segs)
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
        (:func:`lenbatch.models.varlen.torch_reference_kernels`).
        """
        if input_ids.ndim != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"reference_hidden_states takes one sequence [1, L], got {tuple(input_ids.shape)}")
        out: dict[Any, torch.Tensor] = {}
        from lenbatch.models.varlen import torch_reference_kernels

        hooks = [layer.register_forward_hook(lambda _m, _a, res, i=i: out.__setitem__(i, res))
                 for i, layer in enumerate(self.model.layers)]
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

    from lenbatch.models import varlen

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

    Cost: 2 * vocab * hidden parameters (2 x 31.8 M for the tiny default), no decoder layer.
    """
    _check_model_config(cfg)
    device = torch.device(device)
    dtype = DTYPES[cfg.dtype]
    with torch.device("meta"):
        embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
    embed = _materialize(embed, "model.embed_tokens.", cfg.init_seed, dtype, device)
    lm_head = _materialize(lm_head, "lm_head.", cfg.init_seed, dtype, device)
    return embed.eval(), lm_head.eval()


def build_target(cfg: ModelConfig, *, device: str | torch.device = "cpu") -> Target:
    """Build the frozen target from ``params.model`` (random weights seeded by ``cfg.init_seed``).

    Returns a :class:`Target` in eval mode, ``requires_grad=False`` everywhere, in
    ``cfg.dtype``, on ``device``. Deterministic: two processes get identical weights
    (same device type). Never downloads anything.
    """
    device = torch.device(device)
    model = _build_hf_model(cfg, device)
    _, lm_head = build_heads(cfg, device=device)
    target = Target(cfg, model, lm_head).to(device)
    target.requires_grad_(False)
    return target.eval()


# --------------------------------------------------------------------------- config files


_HF_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
            "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim")


def model_config_from_file(path: str | Path, *, base: ModelConfig | None = None) -> ModelConfig:
    """A ``ModelConfig`` from a YAML/JSON file holding a ``model`` section, or from a Hugging Face
    ``config.json`` of a Qwen3.5-architecture model (``text_config`` nested or not).

    Keys the file does not give keep ``base``'s values (default: the params defaults);
    ``target_layers`` not in range of a smaller/larger model are reset to its last layer.
    """
    import dataclasses

    import yaml

    from lenbatch.core.config import _section_from_dict

    path = Path(path)
    if not path.exists():
        raise ValueError(f"--model-config {path} does not exist; pass a params-style YAML with a 'model' section "
                         "or a Hugging Face config.json")
    raw = yaml.safe_load(path.read_text()) if path.suffix in (".yaml", ".yml") else json.loads(path.read_text())
    base = base or ModelConfig()
    if isinstance(raw, dict) and "model" in raw and isinstance(raw["model"], dict):
        merged = {**_plain(base), **raw["model"]}
        return _section_from_dict("model", ModelConfig, merged, str(path))
    if not isinstance(raw, dict):
        raise ValueError(f"{path} must be a mapping (a 'model' section or a Hugging Face config.json)")
    text = raw.get("text_config", raw)
    model_type = text.get("model_type", "")
    if model_type and model_type not in ("qwen3_5_text", "qwen3_5", "qwen3_next"):
        raise ValueError(f"{path} is a '{model_type}' config; verify-packing needs a Qwen3.5-architecture text "
                         "model (model_type qwen3_5_text / qwen3_5)")
    values: dict[str, Any] = {k: text[k] for k in _HF_KEYS if k in text}
    n = int(values.get("num_hidden_layers", base.num_hidden_layers))
    if "layer_types" in text:
        values["layer_types"] = tuple(text["layer_types"])
    else:
        interval = int(text.get("full_attention_interval", 4))
        values["layer_types"] = tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention"
                                      for i in range(n))
    rope = text.get("rope_parameters") or {}
    theta = rope.get("rope_theta", text.get("rope_theta"))
    if theta is not None:
        values["rope_theta"] = float(theta)
    if "head_dim" not in values and "hidden_size" in values and "num_attention_heads" in values:
        values["head_dim"] = int(values["hidden_size"]) // int(values["num_attention_heads"])
    targets = tuple(i for i in base.target_layers if i < n) or (n - 1,)
    return dataclasses.replace(base, **{**values, "target_layers": targets})


def _plain(cfg: ModelConfig) -> dict[str, Any]:
    import dataclasses

    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(cfg).items()}


__all__ = ["DTYPES", "INITIALIZER_RANGE", "Target", "build_heads", "build_target", "hf_text_config",
           "model_config_from_file"]
