"""The target's shapes read from files: a local checkpoint's ``config.json`` checked against the ``model``
section (:func:`pretrained_text_config`, every :data:`SHAPE_KEYS` key must agree), and a model config file
(a params-style YAML with a ``model`` section or a Hugging Face ``config.json``) read into a
``ModelConfig`` (:func:`model_config_from_file`, ``verify-packing --model-config``).

Separate from :mod:`lenbatch_study.models.target` (which builds the model and loads a checkpoint's weights,
and re-exports these names): this module reads configuration only, no weight and no module is built
here. Cost: one small JSON/YAML file read (the checkpoint's config through ``AutoConfig``, local files only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lenbatch_study.core.config import ModelConfig


# --------------------------------------------------------------------------- a local checkpoint's config


# The model keys a checkpoint's config.json must agree with (model_config_from_file reads them from it).
SHAPE_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "layer_types",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "rope_theta",
)


def checkpoint_dir(cfg: ModelConfig) -> Path:
    """``cfg.pretrained`` checked to be a local checkpoint folder (config.json + safetensors)."""
    assert cfg.pretrained is not None
    path = Path(cfg.pretrained)
    if not (path / "config.json").is_file():
        raise ValueError(
            f"model.pretrained={cfg.pretrained!r} has no config.json; point it at a local Hugging "
            "Face checkpoint folder (what save_pretrained writes: config.json + *.safetensors), "
            "or set model.pretrained: null for random weights"
        )
    if not sorted(path.glob("*.safetensors")):
        raise ValueError(
            f"model.pretrained={cfg.pretrained!r} has no *.safetensors weights (only safetensors "
            "are read); re-save the model there with save_pretrained(safe_serialization=True)"
        )
    return path


def pretrained_text_config(cfg: ModelConfig) -> Any:
    """The checkpoint's ``Qwen3_5TextConfig`` (``local_files_only``); ``ValueError`` naming every
    :data:`SHAPE_KEYS` key where the ``model`` section differs from it."""
    from transformers import AutoConfig

    path = checkpoint_dir(cfg)
    text = AutoConfig.from_pretrained(str(path), local_files_only=True).get_text_config()
    if getattr(text, "model_type", None) != "qwen3_5_text":
        raise ValueError(
            f"model.pretrained={cfg.pretrained!r} is a {getattr(text, 'model_type', '?')!r} model; the "
            "target must be a Qwen3.5/3.6-architecture text model (model_type qwen3_5_text/qwen3_5)"
        )
    ours = model_config_from_file(path / "config.json", base=cfg)
    diff = [
        f"model.{k}: params {_show(getattr(cfg, k))}, checkpoint {_show(getattr(ours, k))}"
        for k in SHAPE_KEYS
        if getattr(cfg, k) != getattr(ours, k)
    ]
    if diff:
        raise ValueError(
            f"model.pretrained={cfg.pretrained!r}: the model section differs from the checkpoint's "
            f"config.json in {len(diff)} key(s): " + "; ".join(diff) + ". Set them to the "
            "checkpoint's values in params.yaml (the shapes come from the checkpoint; the params must "
            "say what runs)"
        )
    text.use_cache = False
    return text


def _show(value: Any) -> str:
    return str(list(value)) if isinstance(value, tuple) else str(value)


# --------------------------------------------------------------------------- config files


_HF_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)


def model_config_from_file(path: str | Path, *, base: ModelConfig | None = None) -> ModelConfig:
    """A ``ModelConfig`` from a YAML/JSON file holding a ``model`` section, or from a Hugging Face
    ``config.json`` of a Qwen3.5-architecture model (``text_config`` nested or not).

    Keys the file does not give keep ``base``'s values (default: the params defaults);
    ``target_layers`` not in range of a smaller/larger model are reset to its last layer.
    """
    import dataclasses

    import yaml

    from lenbatch_study.core.config import _section_from_dict

    path = Path(path)
    if not path.exists():
        raise ValueError(
            f"--model-config {path} does not exist; pass a params-style YAML with a 'model' section "
            "or a Hugging Face config.json"
        )
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
        raise ValueError(
            f"{path} is a '{model_type}' config; verify-packing needs a Qwen3.5-architecture text "
            "model (model_type qwen3_5_text / qwen3_5)"
        )
    values: dict[str, Any] = {k: text[k] for k in _HF_KEYS if k in text}
    n = int(values.get("num_hidden_layers", base.num_hidden_layers))
    if "layer_types" in text:
        values["layer_types"] = tuple(text["layer_types"])
    else:
        interval = int(text.get("full_attention_interval", 4))
        values["layer_types"] = tuple(
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)
        )
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


def check_pretrained(pretrained: str | None) -> None:
    """``model.pretrained`` (when set) is a folder holding ``config.json``."""
    if pretrained is None:
        return
    root = Path(pretrained)
    if not root.is_dir() or not (root / "config.json").is_file():
        what = (
            "does not exist"
            if not root.exists()
            else ("is not a folder" if not root.is_dir() else "has no config.json")
        )
        raise ValueError(
            f"model.pretrained {pretrained!r} {what}; give a local Hugging Face checkpoint folder "
            "(config.json + *.safetensors), or null for random weights"
        )


def checkpoint_files(pretrained: str | None) -> list[str]:
    """The files of the checkpoint folder ``model.pretrained`` that the target reads: ``config.json``,
    ``*.safetensors`` and a shard index, sorted; ``[]`` when null. ``config.json`` is listed even when
    absent, so both tools report the missing input by name."""
    if not pretrained:
        return []
    root = Path(pretrained)
    files = {root / "config.json", *root.glob("*.safetensors"), *root.glob("*.safetensors.index.json")}
    return sorted(f.as_posix() for f in files)
