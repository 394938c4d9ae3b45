"""Target forward throughput, padded vs packed, on the same sequences (CPU; quote the output).

    python benchmarks/bench_packing.py [--params params.yaml] [--lengths results/tokenize/lengths.npy]
                                       [--sequences 16] [--threads 1 2] [--repeats 3] [--out FILE.json]

Draws ``--sequences`` lengths from the real distribution (the tokenized data's
``lengths.npy`` when present, else the study's seed profile truncated to data.max_len),
then times ``Target.features`` over all of them in four layouts with the same useful
tokens:

* ``packed``        first-fit rows of at most batching.token_budget tokens (boundary-aware path)
* ``padded-random`` greedy token-budget padded batches in draw order (the ``random`` strategy)
* ``padded-sorted`` the same, sorted by length (the ``sorted`` strategy: least padding)
* ``hf-padded-random`` transformers' own padded forward (``Qwen3_5TextModel``, torch fallback)
  on the padded-random batches: the reference implementation's per-token cost, for context

and a parity row: ``n`` sequences of exactly 4096 tokens as one packed row vs one padded
[n, 4096] batch (no padding in either): equal computed tokens, so the time ratio measures
the implementation difference between the two layouts (should be ~1).
Reported per layout: seconds (median of repeats, whole set), useful and computed tokens/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from lenbatch_study.core.config import load_params
from lenbatch_study.models.target import build_target
from lenbatch_study.corpus.seed_profile import seed_profile


def draw_lengths(path: str | None, n: int, max_len: int, seed: int) -> tuple[np.ndarray, str]:
    rng = np.random.default_rng(seed)
    if path and Path(path).exists():
        pool = np.load(path)
        source = f"{path} ({len(pool)} samples)"
    else:
        pool = np.minimum(seed_profile(200_000, seed=seed), max_len)
        source = f"seed profile truncated to {max_len}"
    return rng.choice(pool, size=n, replace=False).astype(np.int64), source


def padded_batches(lengths: np.ndarray, order: np.ndarray, budget: int, max_bs: int) -> list[list[int]]:
    """Greedy along ``order``: grow while (n+1) * max(m, next) <= budget and n < max_bs."""
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        m = max(longest, int(lengths[i]))
        if cur and ((len(cur) + 1) * m > budget or len(cur) >= max_bs):
            batches.append(cur)
            cur, m = [], int(lengths[i])
        cur.append(int(i))
        longest = m
    batches.append(cur)
    return batches


def packed_rows(lengths: np.ndarray, budget: int) -> list[list[int]]:
    rows: list[list[int]] = []
    fill: list[int] = []
    for i, n in enumerate(lengths):
        for r, used in enumerate(fill):
            if used + n <= budget:
                rows[r].append(i)
                fill[r] += int(n)
                break
        else:
            rows.append([i])
            fill.append(int(n))
    return rows


def make_inputs(layout: str, groups: list[list[int]], seqs: list[torch.Tensor]) -> list[dict]:
    out = []
    for g in groups:
        if layout == "packed":
            ids = torch.cat([seqs[i] for i in g]).unsqueeze(0)
            cu = torch.tensor([0, *np.cumsum([len(seqs[i]) for i in g]).tolist()], dtype=torch.int32)
            out.append({"input_ids": ids, "cu_seqlens": cu, "computed": ids.shape[1]})
        else:
            width = max(len(seqs[i]) for i in g)
            ids = torch.zeros(len(g), width, dtype=torch.long)
            mask = torch.zeros(len(g), width, dtype=torch.long)
            for r, i in enumerate(g):
                ids[r, : len(seqs[i])] = seqs[i]
                mask[r, : len(seqs[i])] = 1
            out.append({"input_ids": ids, "attention_mask": mask, "computed": len(g) * width})
    return out


def time_set(fn, inputs: list[dict], repeats: int) -> tuple[float, float]:
    """(median wall seconds, median process CPU seconds) of one pass over ``inputs``.

    CPU seconds (all threads of this process) are reported too: on a shared machine the
    wall time includes waiting for a core, the CPU time does not.
    """
    fn(inputs[0])  # warm-up (allocator, oneDNN primitives)
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        for x in inputs:
            fn(x)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", nargs="+", default=["params.yaml"])
    ap.add_argument("--lengths", default="results/tokenize/lengths.npy", help="lengths.npy (else the seed profile)")
    ap.add_argument("--sequences", type=int, default=16)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="also write the rows as JSON")
    args = ap.parse_args(argv)

    params = load_params(*args.params)
    budget, max_bs = params.batching.token_budget, params.batching.max_batch_size
    lengths, source = draw_lengths(args.lengths, args.sequences, params.data.max_len, args.seed)
    target = build_target(params.model)
    gen = torch.Generator().manual_seed(args.seed)
    seqs = [torch.randint(0, params.model.vocab_size, (int(n),), generator=gen) for n in lengths]
    useful = int(lengths.sum())
    layouts = {
        "packed": make_inputs("packed", packed_rows(lengths, budget), seqs),
        "padded-random": make_inputs("padded", padded_batches(lengths, np.arange(len(lengths)), budget, max_bs), seqs),
        "padded-sorted": make_inputs(
            "padded", padded_batches(lengths, np.argsort(lengths, kind="stable"), budget, max_bs), seqs
        ),
    }
    layouts["hf-padded-random"] = layouts["padded-random"]
    n_par = max(1, budget // 4096)
    par_seqs = [torch.randint(0, params.model.vocab_size, (4096,), generator=gen) for _ in range(n_par)]
    parity = {
        "parity-packed": make_inputs("packed", [list(range(n_par))], par_seqs),
        "parity-padded": make_inputs("padded", [list(range(n_par))], par_seqs),
    }

    def ours(x: dict) -> None:
        target.features(x["input_ids"], attention_mask=x.get("attention_mask"), cu_seqlens=x.get("cu_seqlens"))

    def hf(x: dict) -> None:
        from lenbatch_study.models.varlen import torch_reference_kernels

        # transformers' torch kernels, as on a CPU box without fla (fla, if installed, needs a GPU)
        with torch.inference_mode(), torch_reference_kernels():
            target.model(input_ids=x["input_ids"], attention_mask=x["attention_mask"], use_cache=False)

    print(
        f"bench_packing: torch {torch.__version__}, {args.sequences} sequences from {source}; "
        f"useful {useful} tokens, budget {budget}, model hidden {params.model.hidden_size} x "
        f"{params.model.num_hidden_layers} layers {list(params.model.layer_types)}, {params.model.dtype}"
    )
    print(f"lengths: {sorted(lengths.tolist())}")
    rows = []
    header = (
        f"{'threads':>7} {'layout':<17} {'steps':>5} {'computed':>9} {'pad.eff':>7} {'seconds':>8} "
        f"{'cpu s':>7} {'useful tok/s':>12} {'computed tok/s':>14}"
    )
    print(header)
    for threads in args.threads:
        torch.set_num_threads(threads)
        for name, inputs in {**layouts, **parity}.items():
            fn = hf if name.startswith("hf-") else ours
            secs, cpu = time_set(fn, inputs, args.repeats)
            computed = sum(x["computed"] for x in inputs)
            use = n_par * 4096 if name.startswith("parity") else useful
            row = {
                "threads": threads,
                "layout": name,
                "steps": len(inputs),
                "computed_tokens": computed,
                "useful_tokens": use,
                "padding_efficiency": use / computed,
                "seconds": secs,
                "cpu_seconds": cpu,
                "useful_tokens_per_s": use / secs,
                "computed_tokens_per_s": computed / secs,
            }
            rows.append(row)
            print(
                f"{threads:>7} {name:<17} {len(inputs):>5} {computed:>9} {use / computed:>7.3f} {secs:>8.3f} "
                f"{cpu:>7.3f} "
                f"{use / secs:>12.0f} {computed / secs:>14.0f}",
                flush=True,
            )
        by = {r["layout"]: r for r in rows if r["threads"] == threads}
        for clock in ("seconds", "cpu_seconds"):  # useful tok/s ratio = inverse time ratio (same useful tokens)
            print(
                f"{threads:>7} ratios by {clock:<11}: packed/padded-sorted useful tok/s "
                f"{by['padded-sorted'][clock] / by['packed'][clock]:.2f}, packed/padded-random "
                f"{by['padded-random'][clock] / by['packed'][clock]:.2f}, parity packed/padded time "
                f"{by['parity-packed'][clock] / by['parity-padded'][clock]:.2f}, HF/ours padded time "
                f"{by['hf-padded-random'][clock] / by['padded-random'][clock]:.2f}"
            )
    if args.out:
        Path(args.out).write_text(json.dumps({"source": source, "lengths": lengths.tolist(), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
