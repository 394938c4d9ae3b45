"""flash-linear-attention's Triton kernels on CPU, under Triton's interpreter (``TRITON_INTERPRET=1``).

The interpreter runs a ``@triton.jit`` kernel as Python over NumPy blocks, so fla's varlen
kernels (gated delta rule, causal conv with ``cu_seqlens``) can be checked in CI on machines
without a GPU: in fp32 and fp16, not bf16 (the interpreter computes bf16 on raw bits). Three things
in Triton, not in fla, stop it; :func:`patch_triton_for_interpreter` adjusts them, at run time and
only when interpreting (checked with Triton 3.6.0, the GPU check machine's, and 3.9.0):

1. ``triton.autotune`` times each candidate config through the GPU driver (none on CPU): the
   autotuner keeps the first config of the pruned list and times nothing (configs change speed,
   not results; Triton < 3.9 benchmarks even a single remaining config, so ``_bench`` returns 0).
2. The interpreter leaves ``for i in range(n)`` counters as Python ints, while fla calls
   ``i_t.to(tl.int64)``: the interpreter's AST rewrite gets one more rule that turns a ``range``
   / ``tl.range`` loop counter into a Triton scalar at the top of the loop body (what an
   assignment already does in the interpreter). ``tl.static_range`` counters stay Python ints
   (they index tuples at compile time).
3. Triton < 3.9's interpreter takes ``int()`` of a one-element block, which NumPy refuses for a
   1-D array (fla's ``range(2, min(BC, T - i_tc2))``): ``__index__`` reads the element.

On a GPU none applies. There, fp32 results depend on two settings. ``TRITON_F32_DEFAULT=ieee``
makes every ``tl.dot`` that leaves its precision to the default full fp32 (TF32 otherwise, a
10-bit mantissa). It does *not* reach fla 0.6.0's triangular solve
(``fla/ops/gated_delta_rule/chunk_fwd.py``, ``chunk_gated_delta_rule_fwd_kkt_solve_kernel``), which
passes ``input_precision=SOLVE_TRIL_DOT_PRECISION`` explicitly, ``'tf32'`` wherever TF32 exists
(NVIDIA sm >= 80: the H100/H200): :func:`force_ieee_solve` sets that module constant to ``'ieee'``
before the kernel is first compiled, so an fp32 check is IEEE end to end and its tolerance (1e-4
absolute on O(1) hidden states; the CPU interpreter's differences are ~5e-7) needs no TF32 slack.
bf16 runs keep fla's choice (their inputs are rounded to 8 bits anyway; judged by a relative
tolerance). Cost: interpreted kernels are slow (seconds for a few hundred tokens at tiny widths):
tests keep shapes tiny.
"""

from __future__ import annotations

import ast
import functools
import os
import sys

import torch

INTERPRET_ENV = "TRITON_INTERPRET"
F32_ENV = "TRITON_F32_DEFAULT"


def interpreting() -> bool:
    return os.environ.get(INTERPRET_ENV) == "1"


def prepare_environment(*, device: str, dtype: str) -> None:
    """Set what fla's kernels need before fla is imported: the interpreter on CPU; on CUDA, for a
    float32 run only, IEEE fp32 ``tl.dot`` (not TF32; ``setdefault``: a user's own choice wins).

    Not for bfloat16/float16: Triton puts ``TRITON_F32_DEFAULT`` in its compile and autotune keys, so
    a bf16 check under it would compile every kernel again under a key the bf16 trainings never use
    (about 75 autotune configs compiled a third time), and bf16 inputs gain nothing from it."""
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
    if device == "cpu":
        if "fla" in sys.modules and not interpreting():
            raise ValueError(
                "flash-linear-attention was imported before TRITON_INTERPRET=1 was set, so its "
                "kernels need a GPU; start python with TRITON_INTERPRET=1 to run them on CPU"
            )
        os.environ[INTERPRET_ENV] = "1"
    elif dtype == "float32":
        os.environ.setdefault(F32_ENV, "ieee")


SOLVE_MODULE = "fla.ops.gated_delta_rule.chunk_fwd"
SOLVE_CONSTANT = "SOLVE_TRIL_DOT_PRECISION"


def force_ieee_solve() -> str | None:
    """Make fla's triangular solve compute full fp32 (see the module doc); returns the precision it had
    ("tf32" on sm >= 80, "ieee" elsewhere), None when this fla has no such constant (nothing to force).
    Must run before that kernel's first compile in this process (Triton reads the constant then)."""
    import importlib

    import triton.language as tl

    mod = importlib.import_module(SOLVE_MODULE)
    before = getattr(mod, SOLVE_CONSTANT, None)
    if before is None:
        return None
    was = str(getattr(before, "value", before))
    setattr(mod, SOLVE_CONSTANT, tl.constexpr("ieee"))
    return was


def require_interpreter(dtype: torch.dtype) -> None:
    """``ValueError`` unless fla's kernels can run on CPU in ``dtype``."""
    if not interpreting():
        raise ValueError(
            "--backend fla on CPU runs fla's kernels under Triton's interpreter: set "
            "TRITON_INTERPRET=1 before python starts (lenbatch verify-packing --backend fla does)"
        )
    if dtype == torch.bfloat16:
        raise ValueError(
            "--backend fla on CPU: Triton's interpreter computes bfloat16 on raw bits; use "
            "--dtype float32 (bfloat16 needs a GPU)"
        )


class _CounterToTensor(ast.NodeTransformer):
    """``for i in range(...)`` -> the same loop with ``i = interpreter_semantic.to_tensor(i, False)``
    first in its body (applied after the interpreter's own rewrite of the loop)."""

    def __init__(self, inner: ast.NodeTransformer) -> None:
        self.inner = inner

    @staticmethod
    def _is_range(call: ast.expr) -> bool:
        if not isinstance(call, ast.Call):
            return False
        f = call.func
        return (isinstance(f, ast.Name) and f.id == "range") or (isinstance(f, ast.Attribute) and f.attr == "range")

    def visit_For(self, node: ast.For) -> ast.For:
        self.generic_visit(node)
        if self._is_range(node.iter) and isinstance(node.target, ast.Name):
            name = node.target.id
            convert = ast.Assign(
                targets=[ast.Name(id=name, ctx=ast.Store())],
                value=ast.Call(
                    func=ast.Attribute(
                        value=ast.Name(id="interpreter_semantic", ctx=ast.Load()), attr="to_tensor", ctx=ast.Load()
                    ),
                    args=[ast.Name(id=name, ctx=ast.Load()), ast.Constant(value=False)],
                    keywords=[],
                ),
            )
            node.body.insert(0, ast.copy_location(convert, node))
        return node

    def visit(self, node: ast.AST) -> ast.AST:  # type: ignore[override]
        if isinstance(node, ast.Module):  # the interpreter's rules first, then ours
            node = self.inner.visit(node)
            return self.generic_visit(node)
        return super().visit(node)


@functools.cache
def patch_triton_for_interpreter() -> None:
    """Apply the two adjustments of the module doc (idempotent; only under ``TRITON_INTERPRET=1``)."""
    assert interpreting(), "the Triton adjustments are for the interpreter only"
    from triton.runtime import autotuner, interpreter

    prune = autotuner.Autotuner.prune_configs

    def first_config(self, kwargs, *args, **kw):  # no driver to time candidates with
        return prune(self, kwargs, *args, **kw)[:1]

    def no_timing(self, *args, config, **meta):  # Triton < 3.9 times even a single remaining config
        return [0.0, 0.0, 0.0]

    patch_tensor = interpreter._patch_lang_tensor

    def index_of_one_element(tensor, scope):  # Triton < 3.9: int() of a 1-element block fails
        patch_tensor(tensor, scope)
        scope.set_attr(
            tensor,
            "__index__",
            lambda self: int(self.handle.data.reshape(-1)[0]) if self.handle.data.size == 1 else int(self.handle.data),
        )

    autotuner.Autotuner.prune_configs = first_config
    autotuner.Autotuner._bench = no_timing
    interpreter._patch_lang_tensor = index_of_one_element
    interpreter.FunctionRewriter.ast_transformer = _CounterToTensor(interpreter.FunctionRewriter.ast_transformer)
