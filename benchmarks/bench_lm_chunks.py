"""The drafter's lm_head cost per chunk beside its cost per row: time
:class:`lenbatch_study.models.drafter.ChunkedLinearCrossEntropy` (forward, which also computes the input
gradient) on ``N`` trained positions around multiples of ``CE_CHUNK_ROWS`` and fit
``t = a + b * N + c * ceil(N / CE_CHUNK_ROWS)`` by least squares.

A ``c`` well above zero is the reason the step-time model has an ``lm_chunks`` feature
(:data:`lenbatch_study.analysis.stepmodel.CANDIDATES`): a step of 129 positions costs a whole chunk more
than one of 128, which a model linear in positions spreads over every step.

    python benchmarks/bench_lm_chunks.py [--hidden 128] [--vocab 248320] [--repeats 7] [--threads 1]

Times are process CPU seconds (one thread by default, as the workflow's steps run), the median of
``--repeats`` calls per ``N``, the ``N`` visited in an interleaved order so a drift of the machine falls on
every ``N`` alike. Cost: about 80 s at the defaults (one call is 0.3-1.2 s).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from lenbatch_study.models.drafter import CE_CHUNK_ROWS, ChunkedLinearCrossEntropy  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=128, help="drafter width H (the CPU default's)")
    ap.add_argument("--vocab", type=int, default=248_320, help="lm_head rows V (Qwen3.5/3.6's vocabulary)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(a.vocab, a.hidden, generator=g) * a.hidden**-0.5
    c = CE_CHUNK_ROWS
    sizes = [n for k in (1, 2, 3) for n in (k * c - 16, k * c, k * c + 1, k * c + 16)]
    inputs = {
        n: (
            torch.randn(n, a.hidden, generator=g, requires_grad=True),
            torch.randint(0, a.vocab, (n,), generator=g),
            torch.ones(n),
        )
        for n in sizes
    }
    secs: dict[int, list[float]] = {n: [] for n in sizes}
    for r in range(a.repeats + 1):  # the first pass warms allocations up and is not kept
        order = sizes[r % len(sizes) :] + sizes[: r % len(sizes)]
        for n in order:
            h, tgt, w = inputs[n]
            t0 = time.process_time()
            ChunkedLinearCrossEntropy.apply(h, weight, tgt, w)
            if r:
                secs[n].append(time.process_time() - t0)
    med = np.array([np.median(secs[n]) for n in sizes])
    N = np.array(sizes, dtype=np.float64)
    X = np.stack([np.ones_like(N), N, np.ceil(N / c)], 1)
    (a0, b, cc), *_ = np.linalg.lstsq(X, med, rcond=None)
    lin = np.linalg.lstsq(X[:, :2], med, rcond=None)[0]
    print(
        f"ChunkedLinearCrossEntropy, H={a.hidden}, V={a.vocab:,}, chunks of {c} rows, {a.threads} thread(s), "
        f"median of {a.repeats} CPU-second timings"
    )
    print("| positions N | chunks | seconds | fit with chunks | error | fit linear in N | error |")
    print("|---|---|---|---|---|---|---|")
    for n, t, x in zip(sizes, med, X):
        f, fl = float(x @ (a0, b, cc)), float(x[:2] @ lin)
        print(
            f"| {n} | {int(x[2])} | {t:.4f} | {f:.4f} | {100 * (f / t - 1):+.1f}% | {fl:.4f} | {100 * (fl / t - 1):+.1f}% |"
        )
    print(
        f"\nfit: t = {a0 * 1e3:.1f} ms + {b * 1e3:.3f} ms x N + {cc * 1e3:.1f} ms x chunks "
        f"(mean error {np.mean(np.abs(X @ (a0, b, cc) / med - 1)):.1%}; linear in N alone "
        f"{np.mean(np.abs(X[:, :2] @ lin / med - 1)):.1%})"
    )
    print(
        f"one chunk more (N = {c} -> {c + 1}): {1e3 * (med[sizes.index(c + 1)] - med[sizes.index(c)]):.1f} ms "
        f"measured; one row more within a chunk ({c - 16} -> {c}): "
        f"{1e3 * (med[sizes.index(c)] - med[sizes.index(c - 16)]) / 16:.2f} ms per row"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
