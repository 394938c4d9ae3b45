"""Which Gated DeltaNet kernels a process runs: flash-linear-attention's or :mod:`lenbatch_study.models.varlen`'s torch ones.

* :func:`select_kernels` applies ``train.kernels`` (auto | torch | fla) for a run on (device, dtype),
  refuses a CUDA run that would fall back to the torch kernels unasked, and returns what runs (the
  run summary's and the profile rows' ``kernel_backend``);
* :func:`_fla_chunk` / :func:`_fla_conv` import fla's varlen kernels once, keeping *why* they are not
  usable (:func:`fla_problem`: absent vs. installed-but-broken);
* :func:`_fla_gated_delta_rule` feeds every layout to fla as one row with ``cu_seqlens`` (no kernel
  is autotuned per padded batch size) and normalises q/k itself (:func:`qk_l2norm`: fla's l2norm
  kernel is autotuned per token bucket), so no kernel's autotune key depends on a batch's shape;
* :class:`CompileMeter` counts the seconds Triton spends compiling (``jit_cache_hook`` ->
  ``jit_post_compile_hook``), so a run can report compile time apart from its step times.

Cost: the selection is a few dict lookups after the one-off import of fla (seconds).
"""

from __future__ import annotations

import functools
import inspect
import os
import time
from typing import Any

import torch


FLA_MIN_VERSION = (0, 5)  # first release that indexes key heads as i_h // (HV // H) (grouped value heads)
KERNEL_BACKENDS = ("auto", "torch", "fla")
_kernel_backend = ["auto"]


def set_kernel_backend(name: str) -> None:
    """Which kernels the boundary-aware Gated DeltaNet runs: ``auto`` (fla on CUDA in bf16/fp16
    when installed, else torch), ``torch`` (always this module's), ``fla`` (always fla: on CPU
    under Triton's interpreter, which needs ``TRITON_INTERPRET=1`` before fla is imported)."""
    if name not in KERNEL_BACKENDS:
        raise ValueError(f"--backend must be one of {', '.join(KERNEL_BACKENDS)}, got {name!r}")
    _kernel_backend[0] = name


def use_fla(x: torch.Tensor) -> bool:
    """Whether the kernels for ``x`` are fla's (see :func:`set_kernel_backend`)."""
    backend = _kernel_backend[0]
    if backend == "torch":
        return False
    if backend == "auto":
        return x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and _fla_chunk() is not None
    if _fla_chunk() is None:
        raise ValueError(
            f"--backend fla (train.kernels: fla) but flash-linear-attention >= 0.5 is not usable "
            f"({fla_problem()}); pip install 'lenbatch-study[gpu]' (or use --backend torch)"
        )
    if not x.is_cuda:
        from lenbatch_study.models import fla_cpu

        fla_cpu.require_interpreter(x.dtype)
    return True


def _fla_version() -> tuple[int, ...]:
    from importlib.metadata import version

    parts = []
    for p in version("flash-linear-attention").split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


_FLA_PROBLEMS: dict[str, str] = {}  # why fla's kernel is not used: "absent: ..." or "broken: ..."


def _import_fla(name: str, module: str, attr: str) -> Any:
    """``module.attr`` of flash-linear-attention, or None with the reason kept in :data:`_FLA_PROBLEMS`:
    no ``fla`` package on the path is "absent"; an installed one that fails to import (triton missing or
    too old, no driver, a missing submodule) is "broken", never silently the same as absent."""
    if os.environ.get("LENBATCH_NO_FLA"):
        _FLA_PROBLEMS[name] = "absent: LENBATCH_NO_FLA is set"
        return None
    try:
        if os.environ.get("TRITON_INTERPRET") == "1":
            from lenbatch_study.models import fla_cpu

            fla_cpu.patch_triton_for_interpreter()
        mod = __import__(module, fromlist=[attr])
        return getattr(mod, attr)
    except Exception as err:  # not installed, or installed and cannot import (no triton, no driver, ...)
        import importlib.util

        installed = importlib.util.find_spec("fla") is not None
        _FLA_PROBLEMS[name] = f"{'broken' if installed else 'absent'}: {type(err).__name__}: {err}"
        return None


def fla_problem() -> str | None:
    """Why fla's gated delta rule is not usable here ("absent: ..." / "broken: ..."), None when it is."""
    return None if _fla_chunk() is not None else _FLA_PROBLEMS.get("chunk", "absent")


@functools.cache
def _fla_chunk() -> Any:
    """fla's ``chunk_gated_delta_rule`` if installed (>= 0.5) and it takes ``cu_seqlens``; else None
    (the reason in :func:`fla_problem`).

    ``ValueError`` for fla < 0.5: those releases take equal key and value heads without checking,
    so a grouped-value-head model (Qwen3.5/3.6: 16 key, 48 value heads) would compute garbage.
    """
    fn = _import_fla("chunk", "fla.ops.gated_delta_rule", "chunk_gated_delta_rule")
    if fn is None:
        return None
    found = _fla_version()
    if found[:2] < FLA_MIN_VERSION:
        raise ValueError(
            f"flash-linear-attention {'.'.join(map(str, found))} is installed but lenbatch needs "
            ">= 0.5 (grouped value heads); pip install 'lenbatch-study[gpu]' or uninstall it"
        )
    params = inspect.signature(fn).parameters
    if not {"cu_seqlens", "use_qk_l2norm_in_kernel", "g", "beta"} <= set(params):
        _FLA_PROBLEMS["chunk"] = "broken: its chunk_gated_delta_rule takes no cu_seqlens / use_qk_l2norm_in_kernel"
        return None
    return fn


@functools.cache
def _fla_conv() -> Any:
    """fla's seq-first varlen ``causal_conv1d`` ([B, T, D], weight [D, K], cu_seqlens); else None.

    Older fla releases took head-first [B, D, T] without ``residual``: those are refused
    (the shift conv is used), so a layout mismatch cannot pass silently.
    """
    fn = _import_fla("conv", "fla.modules.convolution", "causal_conv1d")
    if fn is None:
        return None
    params = list(inspect.signature(fn).parameters)
    return fn if params[:1] == ["x"] and {"weight", "residual", "activation", "cu_seqlens"} <= set(params) else None


FLA_L2NORM_EPS = 1e-6  # fla's l2norm_fwd default, the one use_qk_l2norm_in_kernel=True applies


def qk_l2norm(x: torch.Tensor, eps: float = FLA_L2NORM_EPS) -> torch.Tensor:
    """fla's in-kernel q/k normalisation in torch: ``y = x / sqrt(sum_d x_d^2 + eps)`` over the last
    dimension, computed in fp32 and rounded once to ``x``'s dtype (as ``fla.modules.norm.l2norm_fwd``).

    Torch's elementwise kernels and reduction compile nothing, whatever the token count (fla's own
    kernel keys its autotune on a token bucket). Cost: one read of ``x`` and one write, plus a
    transient fp32 copy of ``x`` (4 bytes per element)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().sum(dim=-1, keepdim=True) + eps)).to(x.dtype)


def _fla_gated_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, segs: Any
) -> torch.Tensor:
    """fla's gated delta rule over the sequences of ``segs`` (a :class:`lenbatch_study.models.varlen.Segments`);
    shapes as :func:`lenbatch_study.models.varlen.chunk_gated_delta_rule`."""
    fn = _fla_chunk()
    # grouped value heads (hv > hk) go in as they are: fla >= 0.5 reads key head i_h // (hv // hk),
    # the mapping of the torch path's repeat_interleave, without the repeated copies (about 1.2 GB
    # per layer at 49,152 tokens and 16 -> 48 heads).
    # Every layout goes in as ONE row with cu_seqlens (a padded [B, T] batch: B sequences of T tokens,
    # boundaries at multiples of T): fla autotunes some kernels (chunk_local_cumsum) with the batch
    # size B as a key, so B rows would compile and benchmark anew for each padded batch size a plan
    # uses -- inside measured steps, against the padded strategies only (packed rows are B = 1).
    batch, seq_len = q.shape[:2]

    def row(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(1, batch * seq_len, *x.shape[2:]).contiguous()

    # q and k are L2-normalised here, not by fla (use_qk_l2norm_in_kernel=False): fla's l2norm kernel is
    # autotuned with NB = cdiv(tokens * key heads, 65536) as a key, so each new token bucket a plan reaches
    # (NB 1..12 up to 49,152 tokens at 16 key heads) would compile and autotune 25 configs inside a
    # measured step; no other forward kernel of fla keys on the token count (see qk_l2norm).
    out, _ = fn(
        q=qk_l2norm(row(q)),
        k=qk_l2norm(row(k)),
        v=row(v),
        g=row(g.float()),
        beta=row(beta.to(q.dtype)),
        initial_state=None,
        output_final_state=False,
        use_qk_l2norm_in_kernel=False,
        cu_seqlens=segs.cu_seqlens(),
    )
    return out.reshape(batch, seq_len, *out.shape[2:]).to(v.dtype)


def backend_name(device: torch.device | str, dtype: torch.dtype) -> str:
    """Which gated-delta-rule kernel a forward on (device, dtype) uses: 'fla' or 'torch'."""
    return (
        "fla"
        if use_fla(torch.empty(0, dtype=dtype, device="meta" if torch.device(device).type != "cuda" else device))
        else "torch"
    )


def _uses_fla(device: torch.device, dtype: torch.dtype) -> bool:
    """:func:`use_fla` decided from (device, dtype) alone, so a CUDA decision is made (and tested)
    without touching a GPU."""
    backend = _kernel_backend[0]
    if backend == "torch":
        return False
    if backend == "auto":
        return device.type == "cuda" and dtype in (torch.bfloat16, torch.float16) and _fla_chunk() is not None
    return use_fla(torch.empty(0, dtype=dtype, device="meta" if device.type != "cuda" else device))


def select_kernels(requested: str, *, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
    """Set the process's kernels from ``train.kernels`` (auto | torch | fla) for a run on (device, dtype)
    and say which run: ``{"requested", "gated_delta_rule", "conv", "fla_version", "fla_problem"}``.

    A CUDA run whose ``auto`` choice falls back to this module's torch Gated DeltaNet (fla absent or
    broken, or an fp32 model) is refused with ``ValueError`` naming ``train.kernels``: on a GPU the
    fallback is many times slower and keeps ``[chunks, heads, C, C]`` intermediates (about 15 GB per
    layer at 49,152 tokens), so it must be asked for (``train.kernels: torch``), never happen silently.
    """
    device = torch.device(device)
    if requested not in KERNEL_BACKENDS:
        raise ValueError(f"train.kernels must be one of {', '.join(KERNEL_BACKENDS)}, got {requested!r}")
    set_kernel_backend(requested)
    fla = _uses_fla(device, dtype)
    if device.type == "cuda" and requested == "auto" and not fla:
        why = fla_problem() or f"model.dtype is {str(dtype).removeprefix('torch.')} (fla runs bf16/fp16)"
        raise ValueError(
            f"this CUDA run would use the torch Gated DeltaNet fallback ({why}): many times slower "
            "than flash-linear-attention and ~15 GB per layer at 49,152 tokens. Install it (pip install "
            "'lenbatch-study[gpu]'; without an index: make gpu-wheels), or set train.kernels: torch to run "
            "the fallback deliberately (train.kernels: fla forces fla)"
        )
    conv = "fla" if fla and _fla_conv() is not None else "torch"
    version = None
    if _fla_chunk() is not None:
        version = ".".join(map(str, _fla_version()))
    return {
        "requested": requested,
        "gated_delta_rule": "fla" if fla else "torch",
        "conv": conv,
        "fla_version": version,
        "fla_problem": fla_problem(),
    }


class CompileMeter:
    """Seconds this process spent preparing Triton kernels: JIT compiles (``knobs.runtime.jit_cache_hook``
    -> ``jit_post_compile_hook``, disk-cache loads included) and autotuning benchmarks
    (``Autotuner._bench``, the compiles inside it counted once). ``seconds`` only grows; a step's share
    is the difference across it. Installed once per process by :func:`compile_meter`; without Triton's
    hooks (no triton, Triton < 3.4, the interpreter: nothing compiles) it stays at 0 with ``active=False``.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.compiles = 0
        self.active = False
        self._depth = 0  # > 0 inside an autotuning benchmark (its compiles are in its time)
        self._t0 = 0.0

    def install(self) -> None:
        try:
            from triton import knobs
            from triton.runtime import autotuner
        except Exception:  # no triton, or one without knobs: nothing to meter
            return
        runtime = knobs.runtime
        if not hasattr(runtime, "jit_post_compile_hook"):
            return
        prev_pre, prev_post = runtime.jit_cache_hook, runtime.jit_post_compile_hook

        def pre(*args: Any, **kwargs: Any) -> Any:
            self._t0 = time.perf_counter()
            return prev_pre(*args, **kwargs) if prev_pre else None

        def post(*args: Any, **kwargs: Any) -> Any:
            self.compiles += 1
            if self._depth == 0:
                self.seconds += time.perf_counter() - self._t0
            return prev_post(*args, **kwargs) if prev_post else None

        bench = autotuner.Autotuner._bench

        def timed_bench(tuner: Any, *args: Any, **kwargs: Any) -> Any:
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return bench(tuner, *args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.seconds += time.perf_counter() - t0

        runtime.jit_cache_hook, runtime.jit_post_compile_hook = pre, post
        autotuner.Autotuner._bench = timed_bench
        self.active = True


def autotune_choices() -> dict[str, dict[str, str]]:
    """The config fla's autotuner chose for each key it has met in this process: ``{kernel: {key: config}}``
    (every autotuned kernel of the imported ``fla`` modules, decorators such as ``triton.heuristics``
    unwrapped; a kernel not yet run is left out). Cost: one pass over fla's module attributes."""
    import sys

    try:
        from triton.runtime.autotuner import Autotuner
    except Exception:  # no triton: nothing was autotuned
        return {}
    out: dict[str, dict[str, str]] = {}
    for name, mod in list(sys.modules.items()):
        if not (name == "fla" or name.startswith("fla.")) or mod is None:
            continue
        for attr, obj in list(vars(mod).items()):
            for _ in range(4):  # through the decorators stacked on the autotuner
                if isinstance(obj, Autotuner) or not hasattr(obj, "fn"):
                    break
                obj = obj.fn
            if isinstance(obj, Autotuner) and obj.cache:
                out[f"{name}.{attr}"] = {repr(k): str(c) for k, c in obj.cache.items()}
    return dict(sorted(out.items()))


@functools.cache
def compile_meter() -> CompileMeter:
    """This process's :class:`CompileMeter` (installed on first call; call it before the first kernel runs)."""
    meter = CompileMeter()
    if _kernel_backend[0] != "torch" and os.environ.get("TRITON_INTERPRET") != "1":  # interpreted: nothing compiles
        meter.install()
    return meter
