"""``lenbatch verify-packing``: a packed forward equals the per-sequence Hugging Face forwards.

The check of :mod:`lenbatch_study.models.varlen` (the variable-length kernels): one row of several random
sequences goes through the boundary-aware path, each sequence alone through the unmodified
Hugging Face modules (no lenbatch code in the reference); the largest |difference| per layer
type is compared with a tolerance. Cost: one packed forward plus one forward per sequence.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from lenbatch_study.models.varlen import _fla_conv, backend_name


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
    return {
        "max_abs_diff": worst,
        "max_rel_diff": rel,
        "lengths": list(lengths),
        "tokens": int(sum(lengths)),
        "boundaries": boundaries,
        "backend": result_backend,
        "conv_backend": "fla" if result_backend == "fla" and _fla_conv() is not None else "torch",
        "packed_seconds": t_packed,
        "reference_seconds": t_ref,
    }
