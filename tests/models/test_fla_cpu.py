"""flash-linear-attention's varlen kernels on CPU under Triton's interpreter (issue 15), and the
torch reference that must not change when fla is installed.

The kernel tests run in subprocesses under a Python with fla and triton (this one, or the
Makefile's ``.venv-fla``: flash-linear-attention==0.6.0, triton==3.9.0, layered on the main venv);
they are skipped, with that reason, where there is none.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lenbatch_study.models import fla_cpu, varlen

HERE = Path(__file__).parent


def _fla_python() -> str | None:
    """A Python that imports fla and triton: this one, else $LENBATCH_FLA_PYTHON or the Makefile's
    .venv-fla (layered on the main venv), else None."""
    if importlib.util.find_spec("fla") is not None and importlib.util.find_spec("triton") is not None:
        return sys.executable
    cand = os.environ.get("LENBATCH_FLA_PYTHON") or str(HERE.parents[1] / ".venv-fla" / "bin" / "python")
    if Path(cand).exists():
        ok = subprocess.run([cand, "-c", "import fla, triton, lenbatch"], capture_output=True, timeout=300)
        if ok.returncode == 0:
            return cand
    return None


FLA_PYTHON = _fla_python()
needs_fla = pytest.mark.skipif(
    FLA_PYTHON is None,
    reason="flash-linear-attention + triton not installed "
    "(make install builds .venv-fla: flash-linear-attention==0.6.0, triton==3.9.0)",
)
ENV = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_F32_DEFAULT")}
ENV |= {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


# --------------------------------------------------------------------------- without fla


def test_reference_kernels_are_transformers_own_torch_functions_inside_the_block():
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    before = {n: getattr(hf, n) for n in varlen.HF_KERNEL_NAMES}
    with varlen.torch_reference_kernels():
        for name in varlen.HF_KERNEL_NAMES:
            fn = getattr(hf, name)
            assert not hasattr(fn, "__wrapped__") and fn.__code__.co_filename == hf.__file__
            assert fn is inspect.unwrap(before[name])
    assert {n: getattr(hf, n) for n in varlen.HF_KERNEL_NAMES} == before  # restored


def test_backend_choice_is_validated():
    with pytest.raises(ValueError, match="--backend must be one of auto, torch, fla"):
        varlen.set_kernel_backend("triton")
    varlen.set_kernel_backend("torch")
    try:
        assert not varlen.use_fla(torch.zeros(1))
    finally:
        varlen.set_kernel_backend("auto")


def test_fla_on_cpu_needs_the_interpreter_and_not_bfloat16(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        fla_cpu.require_interpreter(torch.float32)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    fla_cpu.require_interpreter(torch.float32)
    with pytest.raises(ValueError, match="--dtype float32"):
        fla_cpu.require_interpreter(torch.bfloat16)
    monkeypatch.delenv("TRITON_F32_DEFAULT", raising=False)
    # bf16 on a GPU: no TRITON_F32_DEFAULT, which Triton keys compiles on (the trainings run without it)
    for dtype in ("bfloat16", "float16"):
        fla_cpu.prepare_environment(device="cuda", dtype=dtype)
        assert "TRITON_F32_DEFAULT" not in os.environ
    fla_cpu.prepare_environment(device="cuda", dtype="float32")  # GPU fp32 checks: full-precision tl.dot, not TF32
    assert os.environ["TRITON_F32_DEFAULT"] == "ieee"
    with pytest.raises(ValueError, match="dtype must be float32, bfloat16 or float16"):
        fla_cpu.prepare_environment(device="cuda", dtype="fp8")


def test_range_counters_become_triton_scalars_and_static_range_ones_do_not():
    src = (
        "def k(n):\n    for i in range(n):\n        x = i\n"
        "    for j in tl.range(0, n):\n        y = j\n    for s in tl.static_range(3):\n        z = s\n"
    )
    tree = fla_cpu._CounterToTensor(ast.NodeTransformer()).visit(ast.parse(src))
    loops = [n for n in ast.walk(tree) if isinstance(n, ast.For)]
    firsts = [ast.unparse(loop.body[0]) for loop in loops]
    assert firsts[0] == "i = interpreter_semantic.to_tensor(i, False)"
    assert firsts[1] == "j = interpreter_semantic.to_tensor(j, False)"
    assert firsts[2] == "z = s"


# --------------------------------------------------------------------------- fla under the interpreter


@pytest.fixture(scope="module")
def fla_results():
    proc = subprocess.run(
        [FLA_PYTHON, str(HERE / "_fla_checks.py")],
        env={**ENV, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_fla
def test_fla_gated_delta_rule_keeps_sequences_apart_with_grouped_value_heads(fla_results):
    r = fla_results
    assert r["fla_packed_vs_fla_alone"] == 0.0  # packed = each sequence alone, bit for bit
    assert r["fla_int64_vs_torch"] < 1e-6 and r["fla_int32_vs_torch"] < 1e-6  # 2 key heads, 6 value heads
    assert r["lenbatch_fla_vs_torch"] < 1e-6  # lenbatch's call (no head repeat) = the torch path
    assert r["fla_without_boundaries_vs_torch"] > 1e-2  # the negative control leaks


@needs_fla
def test_fla_causal_conv_stops_at_sequence_starts(fla_results):
    r = fla_results
    assert r["conv_backend"] == "fla"
    assert r["conv_fla_vs_torch"] < 1e-5 and r["conv_fla_int32_vs_torch"] < 1e-5
    assert r["conv_fla_without_boundaries_vs_torch"] > 1e-2


@needs_fla
def test_packed_model_forward_with_fla_equals_per_sequence_forwards(fla_results):
    r = fla_results
    assert r["model_backend"] == "fla"
    for kind in ("linear_attention", "full_attention", "final"):
        assert r[f"model_{kind}"] < 1e-5, (kind, r)


@needs_fla
def test_the_drafter_role_never_imports_fla_and_the_target_reports_its_kernels(fla_results):
    r = fla_results
    assert not r["roles_fla_before"] and r["drafter_kernels"] is None and not r["drafter_imported_fla"]
    assert r["target_imported_fla"]  # the same process, once the target is built: the check can fail
    kb = r["target_report"]
    assert (kb["requested"], kb["gated_delta_rule"], kb["conv"], kb["fla_version"]) == ("fla", "fla", "fla", "0.6.0")
    assert kb["warmup_compile_s"] == 0.0 and kb["compile_meter"] is False  # interpreted: nothing compiles


@needs_fla
def test_the_plans_batches_compile_and_autotune_nothing_the_warm_up_did_not(fla_results):
    """Every Triton launch of a real plan's batches (padded and packed) has a compile and autotune key
    the runner's warm-up already had; fla's l2norm (keyed on a token bucket) never runs in our forward,
    and the recorder sees its second bucket when it does run (the negative control)."""
    r = fla_results
    assert len(r["plan_shapes"]) == 3 and r["keys_autotuned_warm"] >= 5
    assert r["keys_new_in_plan"] == [], r["keys_new_in_plan"]
    assert "chunk_local_cumsum_scalar_kernel" in r["warm_kernels"]
    assert not any("l2norm" in k for k in r["warm_kernels"]), r["warm_kernels"]
    assert len(r["l2norm_autotune_keys"]) == 2  # NB = 1 and NB = 2: seen, so a new bucket cannot hide


@needs_fla
def test_fla_autotunes_at_the_budgets_token_counts_and_the_plan_reuses_those_choices(fla_results):
    """The runner warms at the budget's token counts (256 and 255 at budget 256: a multiple of 16 and
    not), not at a toy size; fla's autotuner chose a config for each key there, and the plan's batches
    reuse exactly those choices (its keys hold no token count, so a choice made at 128 tokens would
    have served every batch)."""
    r = fla_results
    assert r["warmup_tokens"] == [256, 255]
    chosen = r["autotune_choices_warm"]
    print(json.dumps(chosen, indent=1))  # the configs chosen, for the record
    assert chosen and all(v for v in chosen.values())
    assert any("chunk_local_cumsum" in k for k in chosen), sorted(chosen)
    assert r["autotune_choices_plan"] == chosen  # nothing chosen anew in the plan's batches


@needs_fla
def test_the_target_memory_estimate_is_within_15_percent_of_flas_allocations():
    """At the GPU check's widths (hidden 2048, 16 key / 48 value heads of 128), the target rank's
    activations per token (models.memory) against the peak live bytes per token that a Gated DeltaNet
    layer's forward allocates through fla (tests/models/_fla_memory.py; kernels no-ops, allocations
    real): within 15%. The estimate before fla's working set was counted (~86 KB of ~139) is not."""
    proc = subprocess.run(
        [FLA_PYTHON, str(HERE / "_fla_memory.py")],
        env={**ENV, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    measured = r["measured_bytes_per_token"]
    assert abs(r["estimate_bytes_per_token"] / measured - 1) < 0.15, r
    assert r["old_estimate_bytes_per_token"] / measured < 0.85, r  # the negative control: it would fail


def _verify(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [
        FLA_PYTHON,
        "-m",
        "lenbatch_study",
        "verify-packing",
        "--params",
        "params.yaml",
        "configs/tiny.yaml",
        "--lengths",
        "5,17,30",
        *args,
    ]
    return subprocess.run(cmd, env=env or ENV, capture_output=True, text=True, timeout=300)


@needs_fla
def test_verify_packing_backend_fla_passes_on_cpu_and_fails_without_boundaries():
    ok = _verify("--backend", "fla")  # sets TRITON_INTERPRET itself
    assert ok.returncode == 0, ok.stdout + ok.stderr[-2000:]
    assert "gated-delta-rule backend fla, conv backend fla" in ok.stdout and "PASS" in ok.stdout
    bad = _verify("--backend", "fla", "--no-boundaries")
    assert bad.returncode == 1 and "FAIL" in bad.stdout


@needs_fla
def test_reference_stays_torch_where_fla_is_installed_and_no_gpu():
    # transformers swaps fla in at import; without the pin the reference crashed ("0 active drivers")
    ok = _verify()
    assert ok.returncode == 0 and "backend torch" in ok.stdout and "PASS" in ok.stdout, ok.stderr[-2000:]
    bf16 = _verify("--backend", "fla", "--dtype", "bfloat16")
    assert bf16.returncode == 2 and "--dtype float32" in bf16.stderr
    assert "building the target" not in bf16.stderr + bf16.stdout  # refused first: no model, no fla import
