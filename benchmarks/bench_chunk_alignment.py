"""Benchmark: does the target's step time follow the tokens or the Gated DeltaNet's chunks?

The CPU Gated DeltaNet (:mod:`lenbatch_study.models.varlen`) pads every sequence to a multiple of its
chunk (``CHUNK_SIZE`` tokens), so a padded batch of ``n`` rows of ``L + 1`` tokens computes as many
chunk tokens as one of ``L + C``. The profile grid's padded lengths are multiples of 128, the plans'
are not (the CPU default's interleaved ``sorted`` step: 20 rows of 802 tokens, 832 in chunks), so a
step model on computed tokens would miss exactly this. For each ``L`` (a multiple of the chunk) the
benchmark times the target's forward on ``n x L``, ``n x (L + 1)`` and ``n x (L + C)`` in turns (one
process, rounds rotate nothing: every shape once per round, so a slow round slows all alike) and prints,
per ``L``, the step ``(L + 1) / L`` (one token more, one chunk more per row) and the slope
``(L + C) / (L + 1)`` (C - 1 tokens more, the same chunks), each beside the ratios of tokens and of
chunk tokens. Time following chunk tokens: the step is about the chunk-token ratio and the slope about
1; following tokens: the step is about 1 and the slope about the token ratio. Medians over rounds of
per-round ratios, with the range of the middle half.

    python benchmarks/bench_chunk_alignment.py [--rows 8] [--lengths 256 512 768 1024] [--rounds 20]

Cost: rounds x 3 x len(lengths) target forwards; about 2 minutes on this project's 2-core VM with the
defaults (single thread, as training runs).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from lenbatch_study.core.config import load_params  # noqa: E402
from lenbatch_study.models.varlen import CHUNK_SIZE  # noqa: E402
from lenbatch_study.runtime.runner import StepRunner, configure_process, resolve_device  # noqa: E402
from lenbatch_study.stages.profile import make_batch  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=8, help="rows per batch")
    ap.add_argument(
        "--lengths", type=int, nargs="+", default=[256, 512, 768, 1024], help="row lengths L (multiples of the chunk)"
    )
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--params", nargs="+", default=["params.yaml"])
    a = ap.parse_args()
    if any(L % CHUNK_SIZE for L in a.lengths):
        raise SystemExit(f"--lengths must be multiples of the chunk ({CHUNK_SIZE} tokens)")
    params = load_params(*a.params)
    configure_process(params)
    runner = StepRunner(params, device=resolve_device("cpu", 0), role="target")
    shapes = [m for L in a.lengths for m in (L, L + 1, L + CHUNK_SIZE)]
    if a.rows * max(shapes) > params.batching.token_budget:
        raise SystemExit(
            f"{a.rows} x {max(shapes)} exceeds batching.token_budget={params.batching.token_budget}: "
            "lower --rows or --lengths"
        )
    batches = {m: make_batch("padded", [m] * a.rows, params, seed=params.batching.seed) for m in shapes}
    secs: dict[int, list[float]] = {m: [] for m in shapes}
    t0 = time.perf_counter()
    for k in range(a.rounds + 1):  # round 0 warms every shape up, untimed
        for m in shapes:
            runner.target_step(batches[m])
            if k:
                secs[m].append(runner.last_cpu_s)
        if k and k % 5 == 0:
            print(f"round {k}/{a.rounds}, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)

    def cell(num: int, den: int) -> str:
        r = np.asarray(secs[num]) / np.asarray(secs[den])
        lo, hi = np.percentile(r, [25, 75])
        return f"{np.median(r):.3f} [{lo:.3f}, {hi:.3f}]"

    def chunks(m: int) -> int:
        return -(-m // CHUNK_SIZE) * CHUNK_SIZE

    print(f"target forward, {a.rows} rows, chunk {CHUNK_SIZE} tokens, {a.rounds} rounds, process CPU seconds")
    print("| L | seconds at L | step (L+1)/L | tokens, chunk tokens | slope (L+C)/(L+1) | tokens, chunk tokens |")
    print("|---|---|---|---|---|---|")
    for L in a.lengths:
        up, far = L + 1, L + CHUNK_SIZE
        print(
            f"| {L} | {np.median(secs[L]):.3f} | {cell(up, L)} | {up / L:.3f}, {chunks(up) / chunks(L):.3f} | "
            f"{cell(far, up)} | {far / up:.3f}, {chunks(far) / chunks(up):.3f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
