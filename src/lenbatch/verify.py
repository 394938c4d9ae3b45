"""``lenbatch verify-packing``: a packed forward equals the per-sequence Hugging Face forwards.

The check of :mod:`lenbatch.varlen` (the variable-length kernels): one row of several random
sequences goes through the boundary-aware path, each sequence alone through the unmodified
Hugging Face modules (no lenbatch code in the reference); the largest |difference| per layer
type is compared with a tolerance. Cost: one packed forward plus one forward per sequence.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from typing import Any

import numpy as np
import torch

from lenbatch.varlen import KERNEL_BACKENDS, LAYER_TYPES, _fla_conv, backend_name, set_kernel_backend


def parse_lengths(text: str) -> list[int]:
    """'5,17,300' -> [5, 17, 300]; ``ValueError`` for anything but positive integers."""
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    try:
        values = [int(t) for t in items]
    except ValueError:
        values = []
    if not items or len(values) != len(items) or any(v <= 0 for v in values):
        raise ValueError(f"--lengths must be comma-separated positive integers, got {text!r}; "
                         "e.g. --lengths 5,17,300,64")
    return values


def verify_packing(target: Any, lengths: list[int], *, seed: int = 0, boundaries: bool = True) -> dict[str, Any]:
    """Packed forward vs per-sequence Hugging Face forwards: largest |difference| per layer type.

    The packed row goes through the boundary-aware path; each sequence alone goes through
    the unmodified Hugging Face modules (no lenbatch code in the reference). Returns
    {"max_abs_diff": {"linear_attention": x, "full_attention": y, "final": z}, ...}.
    """
    for length in lengths:
        if not isinstance(length, (int, np.integer)) or length <= 0:
            raise ValueError(f"lengths must be positive integers, got {lengths}; e.g. [5, 17, 300, 64]")
    cfg = target.cfg
    gen = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(0, cfg.vocab_size, (1, n), generator=gen) for n in lengths]
    row = torch.cat(seqs, dim=1).to(target.device)
    cu = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32)
    t0 = time.perf_counter()
    packed = target.hidden_states(row, cu_seqlens=cu, layers=None, final_norm=True, boundaries=boundaries)
    t_packed = time.perf_counter() - t0
    worst = {"linear_attention": 0.0, "full_attention": 0.0, "final": 0.0}
    scale = dict.fromkeys(worst, 0.0)  # largest |reference| per layer type, for the relative error
    t0 = time.perf_counter()
    for s, (ids, start) in enumerate(zip(seqs, cu[:-1].tolist())):
        ref = target.reference_hidden_states(ids.to(target.device))
        sl = slice(start, start + lengths[s])
        for key, ref_h in ref.items():
            kind = "final" if key == "final" else cfg.layer_types[key]
            diff = (packed[key][:, sl].float() - ref_h.float()).abs().max().item()
            worst[kind] = max(worst[kind], diff if math.isfinite(diff) else float("inf"))
            scale[kind] = max(scale[kind], ref_h.float().abs().max().item())
    t_ref = time.perf_counter() - t0
    result_backend = backend_name(target.device, target.dtype)
    rel = {k: worst[k] / scale[k] if scale[k] > 0 else worst[k] for k in worst}
    return {"max_abs_diff": worst, "max_rel_diff": rel, "lengths": list(lengths), "tokens": int(sum(lengths)),
            "boundaries": boundaries, "backend": result_backend,
            "conv_backend": "fla" if result_backend == "fla" and _fla_conv() is not None else "torch",
            "packed_seconds": t_packed, "reference_seconds": t_ref}


def register(parser: argparse.ArgumentParser) -> None:
    from lenbatch.config import add_params_argument

    add_params_argument(parser)
    parser.add_argument("--model-config", default=None, metavar="FILE",
                        help="YAML/JSON with a 'model' section, or a Hugging Face config.json of a "
                             "Qwen3.5-architecture text model (default: the params' model section)")
    parser.add_argument("--lengths", default="5,17,300,64", help="comma-separated sequence lengths (tokens)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--backend", default="auto", choices=KERNEL_BACKENDS,
                        help="kernels under test: fla (flash-linear-attention; on CPU under Triton's interpreter, "
                             "float32), torch (lenbatch's), auto (fla on CUDA in bfloat16 when installed). The "
                             "reference is transformers' torch forward in every case")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                        help="compute dtype (default: model.dtype)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random token ids")
    parser.add_argument("--atol", type=float, default=None,
                        help="largest allowed |difference| (default 1e-4 for float32; bfloat16 is judged by "
                             "--rtol instead)")
    parser.add_argument("--rtol", type=float, default=3e-2,
                        help="bfloat16 only: largest allowed |difference| / largest |reference value| per layer "
                             "type (two bf16 kernels round differently)")
    parser.add_argument("--no-boundaries", action="store_true",
                        help="withhold the sequence boundaries on purpose (positions still restart): must fail")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from lenbatch.config import ModelConfig, load_params
    from lenbatch.log import get_logger
    from lenbatch.model import build_target, model_config_from_file

    log = get_logger("lenbatch.verify-packing")
    lengths = parse_lengths(args.lengths)
    if args.backend == "fla":
        from lenbatch import fla_cpu

        # before fla is imported: the interpreter on CPU; full fp32 (not TF32) tl.dot on a GPU
        fla_cpu.prepare_environment(device=args.device)
    set_kernel_backend(args.backend)
    if args.model_config and args.params == ["params.yaml"] and not os.path.exists("params.yaml"):
        cfg = ModelConfig()  # a user's own setup: the HF config.json alone is enough
    else:
        cfg = load_params(*args.params).model
    if args.model_config:
        cfg = model_config_from_file(args.model_config, base=cfg)
    if args.dtype:
        cfg = dataclasses.replace(cfg, dtype=args.dtype)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda but torch sees no CUDA device; use --device cpu")
    relative = args.atol is None and cfg.dtype != "float32"
    tol = args.rtol if relative else (args.atol if args.atol is not None else 1e-4)
    log.info("building the target: %d layers, hidden %d, %s on %s", cfg.num_hidden_layers, cfg.hidden_size,
             cfg.dtype, args.device)
    target = build_target(cfg, device=args.device)
    result = verify_packing(target, lengths, seed=args.seed, boundaries=not args.no_boundaries)
    worst, rel = result["max_abs_diff"], result["max_rel_diff"]
    print(f"verify-packing: {len(lengths)} sequences, {result['tokens']} tokens, {cfg.dtype} on {args.device}, "
          f"gated-delta-rule backend {result['backend']}, conv backend {result['conv_backend']}, boundaries "
          f"{'given' if result['boundaries'] else 'WITHHELD'}")
    print(f"  packed forward {result['packed_seconds']:.3f} s, per-sequence forwards "
          f"{result['reference_seconds']:.3f} s")
    ok = True
    for kind in (*LAYER_TYPES, "final"):
        if kind != "final" and kind not in cfg.layer_types:
            continue
        bad = not (rel[kind] if relative else worst[kind]) <= tol
        ok &= not bad
        label = "final hidden" if kind == "final" else kind
        print(f"  {label:<17} max |packed - per-sequence| = {worst[kind]:.3e} (relative {rel[kind]:.1e})  "
              f"{'FAIL' if bad else 'ok'}")
    print(f"verify-packing: {'PASS' if ok else 'FAIL'} ({'relative' if relative else 'absolute'} tolerance {tol:g})")
    return 0 if ok else 1
