"""``check_packing``: does this model keep packed sequences apart? Measured on the model itself.

A packed row (``collate_packed``, ``Batch.model_inputs()``) trains each sequence as if alone only when
every layer of the model honours the sequence boundaries the layout carries (``position_ids``
restarting per sequence, ``cu_seq_lens_q/k``). Many transformers causal LMs do (their sdpa/eager masks
are built from the packed ``position_ids``, their flash-attention path reads ``cu_seq_lens``); others
(OPT, BLOOM: positions or ALiBi biases from an attention mask that a packed row does not have) let
packed sequences attend to each other, and nothing fails: the loss is simply wrong. The check runs a few
random sequences packed and alone through the model and compares the logits; and, since half precision
rounds a small leak away in that comparison, it also runs the same row with the other sequences' tokens
redrawn: a sequence's logits must not move (same shapes, same kernels: the clean families measure exactly
0 in float32, bfloat16 and float16, OPT 0.067 and BLOOM 2e-3..4e-3).

Cost: three packed forwards of ``sum(lengths)`` tokens plus one forward per sequence, in eval mode
without gradients, on the model's device and dtype (under a second on CPU for a small model). torch only at call time; transformers is not imported (any module whose
forward takes the keyword arguments of ``model_inputs()`` and returns ``.logits`` or a tensor works).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Default largest |logit difference| accepted, by parameter dtype: float32 reductions in another order
# differ by ~1e-6 (the clean models measure 1e-7..1e-6); half precision rounds each logit by ~1e-2.
TOLERANCE = {"float64": 1e-6, "float32": 1e-4, "bfloat16": 5e-2, "float16": 2e-2}
# Largest change of a sequence's logits when the other sequences of its row change (same shapes, so no
# rounding difference is expected: measured 0 for every clean family in each dtype on CPU).
CROSS_TOLERANCE = {"float64": 1e-9, "float32": 1e-5, "bfloat16": 1e-3, "float16": 1e-3}


@dataclass(frozen=True)
class PackingCheck:
    """The outcome of :func:`check_packing`.

    ``ok``: every logit of every sequence, packed, is within ``tolerance`` of the same sequence alone,
    and moves by at most ``cross_tolerance`` when the other sequences of the row change.
    ``max_abs_diff``: the largest |packed - alone| (``inf`` when the packed forward failed, see ``error``);
    ``max_cross_diff``: the largest change caused by the other sequences. ``compared``: what ran, in words.
    """

    ok: bool
    max_abs_diff: float
    tolerance: float
    model_class: str
    lengths: tuple[int, ...]
    compared: str
    error: str | None = None
    max_cross_diff: float = 0.0
    cross_tolerance: float = 0.0

    def message(self) -> str:
        """One sentence: the model, the verdict, the numbers and (when not ok) the fix."""
        if self.ok:
            return (
                f"{self.model_class} keeps packed sequences apart: max |logit difference| "
                f"{self.max_abs_diff:.2g} <= {self.tolerance:g} against each sequence alone, "
                f"{self.max_cross_diff:.2g} when the other sequences change ({self.compared})"
            )
        why = (
            f"the packed forward failed ({self.error})"
            if self.error is not None
            else f"packed sequences attend to each other: max |logit difference| {self.max_abs_diff:.3g} against "
            f"each sequence alone (tolerance {self.tolerance:g}), {self.max_cross_diff:.3g} when the other "
            f"sequences of the row change (tolerance {self.cross_tolerance:g}) ({self.compared})"
        )
        return (
            f"{self.model_class} cannot train packed rows: {why}. Use the padded layout: a strategy other "
            "than 'packed' (e.g. strategy='sortish' with lb.collate_padded), or a model/attention "
            "implementation that reads position_ids or cu_seq_lens per sequence"
        )


def check_packing(
    model: Any,
    *,
    lengths: Sequence[int] = (7, 13, 5, 11),
    seed: int = 0,
    tolerance: float | None = None,
    seq_idx: bool = False,
    strict: bool = False,
) -> PackingCheck:
    """Run ``len(lengths)`` random sequences through ``model`` packed into one row and each alone; compare.

    The packed row is what training feeds: ``lb.collate_packed(samples).model_inputs(seq_idx=seq_idx)``
    (without ``labels``), moved to the model's device. Alone: ``model(input_ids=[1, n], use_cache=False)``.
    Token ids are drawn uniformly from 1..vocab_size-1 (``model.config.vocab_size``, else 2..1000) with
    ``seed``. Then the row again with every other sequence's tokens redrawn (twice: odd, then even
    sequences redrawn); the kept sequences' logits must move by at most ``CROSS_TOLERANCE[dtype]``.
    The model runs in eval mode (dropout off; its mode is restored after) under
    ``torch.no_grad()``. ``ok`` iff max |packed - alone| over every logit <= ``tolerance`` (default by
    dtype, :data:`TOLERANCE`; a half-precision model can hide a small leak under rounding: check a float32
    copy when in doubt). A forward that refuses the packed keywords counts as not ok (``error`` says why).

    ``strict=True`` raises ``ValueError`` (naming the model class and the fix) instead of returning a
    result that is not ok: the one-liner for loops lenbatch does not own (accelerate, Lightning, plain).
    Cost: 3 + len(lengths) forwards of at most ``sum(lengths)`` tokens.
    """
    import torch

    from lenbatch.loading.collate import collate_packed

    sizes = tuple(int(n) for n in lengths)
    if len(sizes) < 2 or min(sizes) < 2:
        raise ValueError(
            f"lengths={list(lengths)}: check_packing needs at least two sequences of at least 2 "
            "tokens each (a leak needs a sequence before another)"
        )
    param = next(iter(model.parameters()), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = str(param.dtype).replace("torch.", "") if param is not None else "float32"
    tol = float(TOLERANCE.get(dtype, 1e-4) if tolerance is None else tolerance)
    cross_tol = float(CROSS_TOLERANCE.get(dtype, 1e-5)) if tolerance is None else tol / 10
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or 1000)
    if vocab < 2:
        raise ValueError(f"model.config.vocab_size={vocab}: check_packing draws token ids 1..vocab_size-1")
    gen = torch.Generator().manual_seed(int(seed))
    samples = [{"input_ids": torch.randint(1, vocab, (n,), generator=gen)} for n in sizes]
    others = [{"input_ids": torch.randint(1, vocab, (n,), generator=gen)} for n in sizes]
    batch = collate_packed(samples).to(device)
    inputs = _packed_inputs(samples, device, seq_idx)
    compared = (
        f"{len(sizes)} random sequences of {list(sizes)} tokens, packed with collate_packed(...)."
        f"model_inputs() vs each alone; logits, eval mode, no grad, {dtype} on {device}"
    )
    was_training = bool(getattr(model, "training", False))
    model.eval()
    error = None
    diff = cross = math.inf
    try:
        with torch.no_grad():
            try:
                packed = _logits(model(**inputs))[0].float()
            except (TypeError, ValueError, RuntimeError) as err:
                error = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            else:
                diff = cross = 0.0
                starts = batch.cu_seqlens.tolist()
                for sample, a, b in zip(samples, starts, starts[1:]):
                    alone = _logits(model(input_ids=sample["input_ids"][None].to(device), use_cache=False))[0]
                    diff = max(diff, float((packed[a:b] - alone.float()).abs().max()))
                for keep in (0, 1):  # keep the even (then odd) sequences, redraw the others
                    row = [s if k % 2 == keep else o for k, (s, o) in enumerate(zip(samples, others))]
                    moved = _logits(model(**_packed_inputs(row, device, seq_idx)))[0].float()
                    for k, (a, b) in enumerate(zip(starts, starts[1:])):
                        if k % 2 == keep:
                            cross = max(cross, float((moved[a:b] - packed[a:b]).abs().max()))
    finally:
        model.train(was_training)
    ok = error is None and math.isfinite(diff) and diff <= tol and cross <= cross_tol
    result = PackingCheck(
        ok=ok,
        max_abs_diff=diff,
        tolerance=tol,
        model_class=type(model).__name__,
        lengths=sizes,
        compared=compared,
        error=error,
        max_cross_diff=cross,
        cross_tolerance=cross_tol,
    )
    if strict and not ok:
        raise ValueError(result.message())
    return result


def _packed_inputs(samples: list[dict[str, Any]], device: Any, seq_idx: bool) -> dict[str, Any]:
    from lenbatch.loading.collate import collate_packed

    inputs = collate_packed(samples).to(device).model_inputs(seq_idx=seq_idx)
    inputs.pop("labels")
    return inputs


def _logits(out: Any) -> Any:
    logits = getattr(out, "logits", None)
    if logits is None and isinstance(out, (tuple, list)):
        logits = out[0]
    return out if logits is None else logits
