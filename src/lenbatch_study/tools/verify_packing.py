"""``lenbatch verify-packing``: a packed forward equals the per-sequence Hugging Face forwards.

The check itself is :func:`lenbatch_study.models.verify.verify_packing`; this stage builds the target
from the params (or a Hugging Face ``config.json``), runs it and prints one line per layer type,
exiting 1 above the tolerance. Cost: one packed forward plus one forward per sequence.
"""

from __future__ import annotations

import os

import torch

from lenbatch_study.models import fla_cpu
from lenbatch_study.models.varlen import LAYER_TYPES, set_kernel_backend
from lenbatch_study.models.verify import verify_packing

# bfloat16: two kernels' bf16 roundings (8 significant bits, unit roundoff u = 2**-8) part by up to this
# share of the layer's largest value
BF16_RTOL = 3e-2
# float32 with TF32 dots (``--tf32``): the same kernels and the same chain of dots, but only the dots'
# inputs are rounded, to TF32's 11 significant bits (u = 2**-11), and everything between them stays fp32,
# so the error is at most bf16's scaled by the ratio of the unit roundoffs: 3e-2 * 2**-3 = 3.75e-3
TF32_RTOL = BF16_RTOL * 2.0**-11 / 2.0**-8


def parse_lengths(text: str) -> list[int]:
    """'5,17,300' -> [5, 17, 300]; ``ValueError`` for anything but positive integers."""
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    try:
        values = [int(t) for t in items]
    except ValueError:
        values = []
    if not items or len(values) != len(items) or any(v <= 0 for v in values):
        raise ValueError(
            f"--lengths must be comma-separated positive integers, got {text!r}; e.g. --lengths 5,17,300,64"
        )
    return values


def run(
    *,
    params: list[str],
    lengths: str = "5,17,300,64",
    model_config: str | None = None,
    device: str = "cpu",
    backend: str = "auto",
    dtype: str | None = None,
    seed: int = 0,
    atol: float | None = None,
    rtol: float | None = None,
    boundaries: bool = True,
    tf32: bool = False,
) -> int:
    """``lenbatch verify-packing``: :func:`verify_packing` of a target built from ``params`` (files or
    inline JSON; ``model_config`` on top) on sequences of the comma-separated ``lengths``; prints a
    line per layer type and exits 1 when a difference exceeds the tolerance (``atol``, or ``rtol``
    relative in bfloat16, :data:`BF16_RTOL` by default). ``tf32``: a float32 check whose fla kernels
    multiply in TF32 on a GPU (``TRITON_F32_DEFAULT=tf32``, fla's own TF32 triangular solve kept), judged
    relative to :data:`TF32_RTOL`: it compiles in a quarter of the IEEE check's time (benchmarks/gpu_check.py)."""
    import dataclasses

    from lenbatch_study.core.config import ModelConfig, load_params
    from lenbatch_study.core.log import get_logger
    from lenbatch_study.models.target import build_target, model_config_from_file

    log = get_logger("lenbatch.verify-packing")
    sizes = parse_lengths(lengths)
    set_kernel_backend(backend)
    if model_config and params == ["params.yaml"] and not os.path.exists("params.yaml"):
        cfg = ModelConfig()  # a user's own setup: the HF config.json alone is enough
    else:
        cfg = load_params(*params).model
    if model_config:
        cfg = model_config_from_file(model_config, base=cfg)
    if dtype:
        cfg = dataclasses.replace(cfg, dtype=dtype)
    if tf32:
        if cfg.dtype != "float32":
            raise ValueError(
                f"--tf32 is a float32 check (TF32 dots on fp32 data), got dtype {cfg.dtype}; "
                "add --dtype float32 or drop --tf32"
            )
        os.environ[fla_cpu.F32_ENV] = "tf32"  # before fla's import; prepare_environment keeps a set value
    if backend == "fla":
        # before fla is imported (nothing above imports it): the interpreter on CPU; full fp32 (not
        # TF32) tl.dot on a GPU for a float32 check only
        fla_cpu.prepare_environment(device=device, dtype=cfg.dtype)
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda but torch sees no CUDA device; use --device cpu")
    if backend == "fla" and device == "cpu":
        from lenbatch_study.models.target import DTYPES

        fla_cpu.require_interpreter(DTYPES[cfg.dtype])  # refused before the target is built (and fla imported)
    relative = atol is None and (cfg.dtype != "float32" or tf32)
    tol = (
        (rtol if rtol is not None else TF32_RTOL if tf32 else BF16_RTOL)
        if relative
        else (atol if atol is not None else 1e-4)
    )
    solve = None
    if backend == "fla" and device == "cuda" and cfg.dtype == "float32" and not tf32:
        # fla's triangular solve passes tf32 explicitly on sm >= 80, past TRITON_F32_DEFAULT: an fp32
        # check held to 1e-4 must be IEEE there too (lenbatch_study.models.fla_cpu)
        solve = fla_cpu.force_ieee_solve()
    log.info(
        "building the target: %d layers, hidden %d, %s on %s", cfg.num_hidden_layers, cfg.hidden_size, cfg.dtype, device
    )
    target = build_target(cfg, device=device)
    result = verify_packing(target, sizes, seed=seed, boundaries=boundaries)
    worst, rel = result["max_abs_diff"], result["max_rel_diff"]
    print(
        f"verify-packing: {len(sizes)} sequences, {result['tokens']} tokens, {cfg.dtype}"
        f"{' (TF32 dots)' if tf32 else ''} on {device}, "
        f"gated-delta-rule backend {result['backend']}, conv backend {result['conv_backend']}, boundaries "
        f"{'given' if result['boundaries'] else 'WITHHELD'}"
    )
    print(f"  target weights: {target.weights}")
    if solve is not None:
        print(f"  fla triangular solve: ieee (forced; fla chose {solve})")
    print(
        f"  packed forward {result['packed_seconds']:.3f} s, per-sequence forwards {result['reference_seconds']:.3f} s"
    )
    ok = True
    for kind in (*LAYER_TYPES, "final"):
        if kind != "final" and kind not in cfg.layer_types:
            continue
        bad = not (rel[kind] if relative else worst[kind]) <= tol
        ok &= not bad
        label = "final hidden" if kind == "final" else kind
        print(
            f"  {label:<17} max |packed - per-sequence| = {worst[kind]:.3e} (relative {rel[kind]:.1e})  "
            f"{'FAIL' if bad else 'ok'}"
        )
    print(f"verify-packing: {'PASS' if ok else 'FAIL'} ({'relative' if relative else 'absolute'} tolerance {tol:g})")
    return 0 if ok else 1
