"""The runner's warm-up runs at the budget's token counts, so fla's autotune choices, which its keys
serve at every later token count, are made at the shapes the plan's batches have (issue 47, item 4).
fla's chosen configs at those counts: tests/models/test_fla_cpu.py (the fla venv)."""

from __future__ import annotations

import torch

from lenbatch_study.core.config import load_params
from lenbatch_study.models import varlen
from lenbatch_study.models.target import build_target
from lenbatch_study.runtime.runner import WARMUP_TOKENS, StepRunner, warm_target, warmup_tokens


def test_warm_up_token_counts_are_the_budgets_two_integer_specialisations():
    # the check's mid budget, the study's, the CPU default's and a budget that is not a multiple of 16
    assert [warmup_tokens(b) for b in (16384, 49152, 8192, 1000, 20)] == [
        (16384, 16383),
        (49152, 49151),
        (8192, 8191),
        (992, 991),
        (16, 15),
    ]
    assert all(
        a % 16 == 0 and b % 16 and a <= max(16, budget) for budget in range(1, 2000) for a, b in [warmup_tokens(budget)]
    )
    assert WARMUP_TOKENS == (128, 129)  # the toy size the warm-up used before: fla autotuned there


def test_the_warm_up_forwards_run_at_those_counts_as_one_packed_row_of_two_sequences():
    params = load_params("params.yaml", "configs/tiny.yaml")
    varlen.set_kernel_backend("torch")
    target = build_target(params.model)
    seen = []
    hook = target.model.embed_tokens.register_forward_pre_hook(lambda m, args: seen.append(tuple(args[0].shape)))
    try:
        warm_target(target, torch.device("cpu"), warmup_tokens(params.batching.token_budget))
    finally:
        hook.remove()
    m = params.batching.token_budget - params.batching.token_budget % 16
    assert seen == [(1, m), (1, m - 1)]
    # on CPU nothing is warmed (no Triton compile), and the report says so
    report = StepRunner(params, device="cpu", role="target").kernel_report()
    assert report["warmup_tokens"] is None and report["autotune_choices"] is None
