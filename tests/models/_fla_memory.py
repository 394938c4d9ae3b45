"""Peak live bytes per token of one Gated DeltaNet layer's forward on fla's kernels, for tests/models/test_fla_cpu.py.

    TRITON_INTERPRET=1 python tests/models/_fla_memory.py  -> one JSON line

Every tensor torch allocates (our model's and fla's host code's, which allocates each kernel's outputs
with torch) is counted from its creation until its storage is freed; the kernels themselves are made
no-ops (their outputs stay uninitialised), since only the allocations are measured and the interpreter
would take minutes at these widths. Widths of the GPU check's model (hidden 2048, MLP 6144, 16 key /
48 value heads of 128), one linear-attention layer, fp16 (the bytes of bf16, which the interpreter
cannot run); the slope between 512 and 1024 tokens removes what does not grow with tokens.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from _live_bytes import LiveBytes

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

from lenbatch_study.core.config import load_params  # noqa: E402
from lenbatch_study.models import kernels, memory, varlen  # noqa: E402
from lenbatch_study.models.target import build_target  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check  # the check's model widths

    from triton.runtime import interpreter

    params = load_params(ROOT / "params.yaml", overrides={k: gpu_check.MID[k] for k in ("model", "batching")})
    m = params.model
    one = load_params(
        ROOT / "params.yaml",
        overrides={
            "model": {
                **gpu_check.MID["model"],
                "num_hidden_layers": 1,
                "layer_types": ["linear_attention"],
                "target_layers": [0],
                "dtype": "float32",
                "vocab_size": 512,
            }
        },
    ).model
    target = build_target(one).half()
    varlen.set_kernel_backend("fla")
    assert kernels._fla_chunk() is not None and kernels._fla_conv() is not None
    interpreter.InterpretedFunction.run = lambda self, *a, **k: None  # allocations only
    peaks = {}
    for n in (512, 1024):
        mode = LiveBytes()
        with mode:
            target.features(torch.zeros(1, n, dtype=torch.long), cu_seqlens=torch.tensor([0, n // 2, n]))
        peaks[n] = mode.peak
    # the estimate for the model measured: one layer, its own output the one target layer (at the check's
    # four target layers the estimate adds their retained outputs: tests/models/test_memory_capture.py)
    print(
        json.dumps(
            {
                "measured_bytes_per_token": (peaks[1024] - peaks[512]) / 512,
                "estimate_bytes_per_token": memory.BYTES[m.dtype] * memory.target_activation_elements(one),
                "old_estimate_bytes_per_token": memory.BYTES[m.dtype]
                * (
                    4 * m.hidden_size
                    + 3 * m.intermediate_size
                    + 2 * m.linear_num_key_heads * m.linear_key_head_dim
                    + 2 * m.linear_num_value_heads * m.linear_value_head_dim
                ),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
