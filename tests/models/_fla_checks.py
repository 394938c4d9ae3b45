"""fla's varlen kernels on CPU (Triton's interpreter), for tests/models/test_fla_cpu.py.

    TRITON_INTERPRET=1 python tests/models/_fla_checks.py  -> one JSON line of measured differences

Run in its own process: TRITON_INTERPRET must be set before fla is imported (transformers imports
it too), whatever the pytest process imported already. Tiny shapes (the interpreter runs each
kernel program as Python): 3 sequences of 37, 64 and 20 tokens (121 tokens; 64 = one fla chunk),
2 key heads and 6 value heads (grouped value heads), head dims 16, fp32.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import time

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

from lenbatch_study.models import varlen, verify  # noqa: E402

LENGTHS = [37, 64, 20]


def _inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    n, hk, hv, d = sum(LENGTHS), 2, 6, 16
    q = torch.randn(1, n, hk, d, generator=gen)
    k = torch.randn(1, n, hk, d, generator=gen)
    v = torch.randn(1, n, hv, d, generator=gen)
    g = -torch.rand(1, n, hv, generator=gen) * 0.5  # log decay <= 0
    beta = torch.rand(1, n, hv, generator=gen)
    return q, k, v, g, beta


def _segs(cu: torch.Tensor, n: int, *, boundaries: bool = True):
    return varlen.make_segments(torch.zeros(1, n, dtype=torch.int64), cu_seqlens=cu, boundaries=boundaries)


def _max(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def delta_rule() -> dict:
    q, k, v, g, beta = _inputs()
    n = q.shape[1]
    cu64 = torch.tensor([0, 37, 101, 121], dtype=torch.int64)
    starts = cu64[:-1].tolist()
    out = {}
    varlen.set_kernel_backend("torch")
    ref = varlen.chunk_gated_delta_rule(q, k, v, g, beta, _segs(cu64, n))
    varlen.set_kernel_backend("fla")
    fla = varlen._fla_chunk()
    for name, cu in (("int64", cu64), ("int32", cu64.to(torch.int32))):
        o, _ = fla(
            q=q,
            k=k,
            v=v,
            g=g,
            beta=beta,
            initial_state=None,
            output_final_state=False,
            use_qk_l2norm_in_kernel=True,
            cu_seqlens=cu,
        )
        out[f"fla_{name}_vs_torch"] = _max(o, ref)
        if name == "int64":
            packed = o
    alone = []
    for s, length in zip(starts, LENGTHS):
        sl = slice(s, s + length)
        o, _ = fla(
            q=q[:, sl],
            k=k[:, sl],
            v=v[:, sl],
            g=g[:, sl],
            beta=beta[:, sl],
            initial_state=None,
            output_final_state=False,
            use_qk_l2norm_in_kernel=True,
        )
        alone.append(o)
    out["fla_packed_vs_fla_alone"] = _max(packed, torch.cat(alone, 1))
    through = varlen.chunk_gated_delta_rule(q, k, v, g, beta, _segs(cu64, n))  # lenbatch's fla path
    out["lenbatch_fla_vs_torch"] = _max(through, ref)
    leaked = varlen.chunk_gated_delta_rule(q, k, v, g, beta, _segs(cu64, n, boundaries=False))
    out["fla_without_boundaries_vs_torch"] = _max(leaked, ref)
    varlen.set_kernel_backend("auto")
    return out


def conv() -> dict:
    gen = torch.Generator().manual_seed(1)
    n, c, kernel = sum(LENGTHS), 24, 4
    x = torch.randn(1, n, c, generator=gen)
    w = torch.randn(c, kernel, generator=gen)
    cu64 = torch.tensor([0, 37, 101, 121], dtype=torch.int64)
    varlen.set_kernel_backend("torch")
    ref = varlen.causal_conv(x, w, _segs(cu64, n))
    varlen.set_kernel_backend("fla")
    through = varlen.causal_conv(x, w, _segs(cu64, n))
    fn = varlen._fla_conv()
    y32 = fn(x=x, weight=w, bias=None, activation="silu", cu_seqlens=cu64.to(torch.int32))
    y32 = y32[0] if isinstance(y32, tuple) else y32
    leaked = varlen.causal_conv(x, w, _segs(cu64, n, boundaries=False))
    varlen.set_kernel_backend("auto")
    return {
        "conv_fla_vs_torch": _max(through, ref),
        "conv_fla_int32_vs_torch": _max(y32, ref),
        "conv_fla_without_boundaries_vs_torch": _max(leaked, ref),
        "conv_backend": "fla" if fn is not None else "torch",
    }


def model() -> dict:
    from lenbatch_study.core.config import ModelConfig
    from lenbatch_study.models.target import build_target

    cfg = ModelConfig(
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        layer_types=("linear_attention", "full_attention"),
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        target_layers=(0, 1),
    )
    target = build_target(cfg)
    varlen.set_kernel_backend("fla")
    res = verify.verify_packing(target, LENGTHS, seed=0)
    varlen.set_kernel_backend("auto")
    return {"model_" + k: v for k, v in res["max_abs_diff"].items()} | {"model_backend": res["backend"]}


def runner_roles() -> dict:
    """Which roles of a run import fla (first, while nothing has): the drafter runs no Gated DeltaNet
    and must not pay for importing fla and transformers' Qwen3.5 model (~7 CPU-s per process), neither
    for its step nor for the memory estimate it reports; the target must, and say so."""
    from pathlib import Path

    from lenbatch_study.core.config import load_params
    from lenbatch_study.models import memory
    from lenbatch_study.runtime.runner import StepRunner

    root = Path(__file__).resolve().parents[2]
    params = load_params(root / "params.yaml", root / "configs/tiny.yaml", overrides={"train": {"kernels": "fla"}})
    out = {"roles_fla_before": "fla" in sys.modules}
    drafter = StepRunner(params, role="drafter")
    memory.rank_memory(params)  # the estimate the drafter rank writes into the summary
    out |= {"drafter_kernels": drafter.kernels, "drafter_imported_fla": "fla" in sys.modules}
    target = StepRunner(params, role="target")
    out |= {"target_imported_fla": "fla" in sys.modules, "target_report": target.kernel_report()}
    return out


class LaunchKeys:
    """Every Triton launch's compile key (approximated as Triton forms it, which the interpreter does
    not) while installed: (kernel, constexpr values, int specialisations (== 1, % 16 == 0) of the other
    int arguments not in do_not_specialize, tensor dtypes), and every autotuned launch's autotune key
    (the key arguments' values plus the tensors' dtypes, as Autotuner.run forms it)."""

    def __init__(self) -> None:
        import triton.language as tl
        from triton.runtime import autotuner, interpreter

        self.keys: set = set()
        run, tune = interpreter.InterpretedFunction.run, autotuner.Autotuner.run
        keys = self.keys

        def constexpr(p) -> bool:
            a = p.annotation
            return a is tl.constexpr or "constexpr" in str(a)

        def launch(fn_self, *args, **kwargs):
            sig = inspect.signature(fn_self.fn).parameters
            vals = dict(zip(sig, args)) | kwargs
            skip = set(fn_self.kwargs.get("do_not_specialize") or ())
            const = tuple((k, v) for k, v in vals.items() if k in sig and constexpr(sig[k]))
            ints = tuple(
                (k, v == 1, v % 16 == 0)
                for k, v in vals.items()
                if k in sig and not constexpr(sig[k]) and k not in skip and type(v) is int
            )
            dtypes = tuple(str(v.dtype) for v in vals.values() if hasattr(v, "dtype"))
            keys.add(("jit", fn_self.fn.__name__, const, ints, dtypes))
            return run(fn_self, *args, **kwargs)

        def tuned(tuner, *args, **kwargs):
            named = dict(zip(tuner.arg_names, args)) | kwargs
            key = tuple(named[k] for k in tuner.keys if k in named)
            key += tuple(str(v.dtype) for k, v in named.items() if k in tuner.arg_names and hasattr(v, "dtype"))
            keys.add(("autotune", getattr(tuner, "base_fn", tuner.fn).__name__, key))
            return tune(tuner, *args, **kwargs)

        interpreter.InterpretedFunction.run = launch
        autotuner.Autotuner.run = tuned
        for sub in autotuner.Autotuner.__subclasses__():  # fla's CachedAutotuner overrides run
            if "run" in sub.__dict__:
                own = sub.run

                def sub_tuned(tuner, *args, _own=own, **kwargs):
                    named = dict(zip(tuner.arg_names, args)) | kwargs
                    key = tuple(named[k] for k in tuner.keys if k in named)
                    key += tuple(str(v.dtype) for k, v in named.items() if k in tuner.arg_names and hasattr(v, "dtype"))
                    keys.add(("autotune", getattr(tuner, "base_fn", tuner.fn).__name__, key))
                    return _own(tuner, *args, **kwargs)

                sub.run = sub_tuned

    def take(self) -> set:
        out = set(self.keys)
        self.keys.clear()
        return out


def compile_keys() -> dict:
    """Whether the plan's batches launch any kernel under a compile or autotune key that the runner's
    warm-up did not (each such key compiles, and autotunes, inside a measured step on a GPU). A real
    plan (lenbatch.plan_epoch, a padded and a packed strategy) over lengths up to 120 tokens; the tiny
    model with fla's kernels in fp32. Negative control: fla's own l2norm kernel (what
    use_qk_l2norm_in_kernel=True runs) at the key heads x tokens rows of 128 tokens and of 32,769 tokens
    at 2 key heads, i.e. NB = 1 and 2: a second autotune key, which the recorder must see."""
    import numpy as np

    import lenbatch as lb
    from lenbatch.loading.collate import collate_packed, collate_padded
    from lenbatch_study.models.target import build_target
    from lenbatch_study.models.kernels import autotune_choices
    from lenbatch_study.runtime.runner import warm_target, warmup_tokens

    target = build_target(_tiny_cfg())
    varlen.set_kernel_backend("fla")
    rec = LaunchKeys()
    warm_target(target, torch.device("cpu"), warmup_tokens(256))  # the runner's warm-up at the plan's budget
    warm = rec.take()
    chosen_warm = autotune_choices()
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 120, size=40)
    data = [{"input_ids": rng.integers(1, 500, size=int(n)).tolist()} for n in lengths]
    shapes, new = [], set()
    for strategy in ("sorted", "packed"):
        plan = lb.plan_epoch(lengths, strategy=strategy, token_budget=256, max_batch_size=4, seed=0)
        # the largest batch of each plan and the smallest padded one (the interpreter takes seconds
        # per forward)
        by_tokens = sorted(plan, key=lambda b: int(lengths[b].sum()))
        for idx in (by_tokens[0], by_tokens[-1]) if strategy == "sorted" else (by_tokens[-1],):
            rows = [data[i] for i in idx]
            if strategy == "packed":
                b = collate_packed(rows)
                target.features(b.input_ids, cu_seqlens=b.cu_seqlens)
            else:
                b = collate_padded(rows)
                target.features(b.input_ids, attention_mask=b.attention_mask)
            shapes.append([strategy, list(b.input_ids.shape)])
            new |= rec.take() - warm
    chosen_plan = autotune_choices()
    from fla.modules.norm.l2norm import l2norm_fwd

    hk, d = 2, 16
    for tokens in (128, 32769):
        l2norm_fwd(torch.randn(tokens * hk, d))
    control = rec.take()
    varlen.set_kernel_backend("auto")
    return {
        "keys_warm": len(warm),
        "keys_autotuned_warm": sum(k[0] == "autotune" for k in warm),
        "keys_new_in_plan": sorted(map(repr, new)),
        "plan_shapes": shapes,
        "l2norm_autotune_keys": sorted(repr(k[2]) for k in control if k[0] == "autotune"),
        "warm_kernels": sorted({k[1] for k in warm}),
        "warmup_tokens": list(warmup_tokens(256)),
        "autotune_choices_warm": chosen_warm,
        "autotune_choices_plan": chosen_plan,
    }


def _tiny_cfg():
    from lenbatch_study.core.config import ModelConfig

    return ModelConfig(
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        layer_types=("linear_attention", "full_attention"),
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        target_layers=(0, 1),
    )


def main() -> int:
    torch.set_num_threads(1)
    times = {}
    out: dict = {}
    for name, fn in (
        ("roles", runner_roles),
        ("delta_rule", delta_rule),
        ("conv", conv),
        ("model", model),
        ("compile_keys", compile_keys),
    ):
        t0 = time.perf_counter()
        out |= fn()
        times[name] = round(time.perf_counter() - t0, 2)
    out["seconds"] = times
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
