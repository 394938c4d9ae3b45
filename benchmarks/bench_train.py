"""Measured throughput of every batching strategy: the train stage under torchrun, same useful tokens.

Usage (the CPU default; a few minutes on 2 cores)::

    python benchmarks/bench_train.py [--params params.yaml] [--useful-tokens N] [--nproc 2]
                                     [--strategies sorted random ...] [--out-root /tmp/lenbatch-bench-train]

Runs ``python -m torch.distributed.run --standalone --nproc_per_node NPROC -m lenbatch_study train`` once per
strategy on ``results/tokenize`` (made with ``lenbatch tokenize`` if missing) with the bucket edges of
``results/boundaries/boundaries.json`` (made with ``lenbatch boundaries`` if missing), then prints one
table: measured padding efficiency, useful and computed tokens/s (post-warm-up pipeline throughput,
drafter side), the ratio to ``sorted``, the per-step split between the target rank and the drafter
rank (mean seconds per step, and the waits on both sides of the queue), the final loss and the wall
time of each run. Then, because a shared machine's load drifts between runs, a second table
measures the same thing in one process with the strategies *interleaved* batch by batch (the
first ``--interleaved-batches`` batches of each strategy's epoch-0 plan: target forward, then drafter
step), which no load drift can bias. It then checks the study's expectations (packed >= sorted, bucketed ~0.8-0.9 x
sorted, random the lowest) and prints what held and what did not: a check, not an assumption.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

STRATEGIES = ("sorted", "random", "bucketed", "sortish", "packed")


def _run(cmd: list[str], log: Path) -> float:
    t0 = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n--- {log} ---\n{log.read_text()[-3000:]}")
    return time.perf_counter() - t0


def interleaved(args: argparse.Namespace, bounds: Path) -> dict:
    """Target and drafter step times on the first batches of every plan, strategies interleaved."""
    import numpy as np
    import torch

    import lenbatch as lb
    from lenbatch.batching.strategy import layout_of
    from lenbatch.loading.collate import collate
    from lenbatch_study.core.config import load_params
    from lenbatch_study.runtime.runner import StepRunner
    from lenbatch_study.pipeline.artifacts.tokenized import read_dataset

    params = load_params(*args.params)
    torch.set_num_threads(params.train.threads)
    b = params.batching
    lengths = np.load(Path(args.data) / "lengths.npy").astype(np.int64)
    edges = json.loads(bounds.read_text())["edges"]
    data = read_dataset(Path(args.data), lengths)
    runner = StepRunner(params)
    n = args.interleaved_batches
    plans = {
        s: lb.plan_epoch(
            lengths,
            strategy=s,
            epoch=0,
            seed=b.seed,
            token_budget=b.token_budget,
            max_batch_size=b.max_batch_size,
            edges=edges if s == "bucketed" else None,
            packed_window=b.packed_window,
            rank=0,
            world_size=1,
        )[:n]
        for s in args.strategies
    }
    acc = {s: {"target_s": 0.0, "drafter_s": 0.0, "computed": 0, "useful": 0} for s in plans}
    warm = collate(
        data.samples(plans[args.strategies[0]][0]),
        layout=layout_of(args.strategies[0]),
        token_budget=b.token_budget,
        max_batch_size=b.max_batch_size,
    )
    runner.drafter_step(warm, runner.target_step(warm)[0])  # untimed warm-up
    for i in range(n):
        for s, batches in plans.items():
            if i >= len(batches):
                continue
            batch = collate(
                data.samples(batches[i]),
                layout=layout_of(s),
                token_budget=b.token_budget,
                max_batch_size=b.max_batch_size,
                indices=batches[i],
            )
            feats, t_s = runner.target_step(batch)
            _, d_s = runner.drafter_step(batch, feats)
            a = acc[s]
            a["target_s"] += t_s
            a["drafter_s"] += d_s
            a["computed"] += batch.computed_tokens
            a["useful"] += batch.useful_tokens
    base = acc.get("sorted")
    print(
        f"\ninterleaved, one process, first {n} batches of each epoch-0 plan (throughput of the target step, "
        "the pipeline's bottleneck when drafter/target < 1):"
    )
    print(
        "| strategy | useful tokens | padding eff. | target useful tok/s | vs sorted | target computed tok/s "
        "| drafter s / target s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    out = {}
    for s, a in acc.items():
        ups = a["useful"] / a["target_s"]
        ratio = ups / (base["useful"] / base["target_s"]) if base else float("nan")
        out[s] = {**a, "useful_tokens_per_s": ups, "ratio_to_sorted": ratio}
        print(
            f"| {s} | {a['useful']:,} | {a['useful'] / a['computed']:.3f} | {ups:,.0f} | {ratio:.2f} | "
            f"{a['computed'] / a['target_s']:,.0f} | {a['drafter_s'] / a['target_s']:.2f} |"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", nargs="+", default=["params.yaml"])
    ap.add_argument("--data", default="results/tokenize")
    ap.add_argument("--boundaries", default="results/boundaries/boundaries.json")
    ap.add_argument("--useful-tokens", type=int, default=None, help="override train.useful_tokens")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    ap.add_argument("--out-root", default="/tmp/lenbatch-bench-train")
    ap.add_argument(
        "--interleaved-batches",
        type=int,
        default=8,
        help="batches per strategy in the interleaved single-process table (0: skip it)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per strategy, in alternating order (forward, "
        "backward, ...) so that a drifting machine load biases no strategy; the table shows the mean "
        "and the min-max of useful tok/s",
    )
    args = ap.parse_args()
    root = Path(args.out_root)
    root.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    data, bounds = Path(args.data), Path(args.boundaries)
    if not (data / "lengths.npy").exists():
        print(f"{data} missing: tokenizing", flush=True)
        _run(
            [py, "-m", "lenbatch_study", "tokenize", "--params", *args.params, "--no-progress", "--out", str(data)],
            root / "tokenize.log",
        )
    if not bounds.exists():
        print(f"{bounds} missing: computing boundaries", flush=True)
        _run(
            [
                py,
                "-m",
                "lenbatch_study",
                "boundaries",
                "--params",
                *args.params,
                "--lengths",
                str(data / "lengths.npy"),
                "--out",
                str(bounds.parent),
            ],
            root / "boundaries.log",
        )
    extra = ["--useful-tokens", str(args.useful_tokens)] if args.useful_tokens else []
    nproc_json = json.dumps({"train": {"nproc": args.nproc}})
    rows: dict[str, dict] = {}
    runs: dict[str, list[float]] = {s: [] for s in args.strategies}
    for rep in range(args.repeats):
        order = list(args.strategies) if rep % 2 == 0 else list(reversed(args.strategies))
        for s in order:
            out = root / (s if args.repeats == 1 else f"{s}_{rep}")
            cmd = [
                py,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                str(args.nproc),
                "-m",
                "lenbatch_study",
                "train",
                "--params",
                *args.params,
                "--params-json",
                nproc_json,
                "--strategy",
                s,
                "--data",
                str(data),
                "--boundaries",
                str(bounds),
                "--out",
                str(out),
                *extra,
            ]
            print(f"{s} (repeat {rep + 1}/{args.repeats}): running ({' '.join(cmd[1:])})", flush=True)
            wall = _run(cmd, root / f"{out.name}.log")
            summary = json.loads((out / "summary.json").read_text())
            summary["run_wall_s"] = wall
            runs[s].append(summary["useful_tokens_per_s"])
            if s not in rows:
                rows[s] = summary
            else:  # average the measured numbers over repeats (plan-derived numbers are identical)
                for k in (
                    "useful_tokens_per_s",
                    "computed_tokens_per_s",
                    "target_s_mean",
                    "drafter_s_mean",
                    "queue_wait_s_mean",
                    "credit_wait_s_mean",
                    "run_wall_s",
                ):
                    rows[s][k] = (rows[s][k] * rep + summary[k]) / (rep + 1)
            print(f"{s}: {summary['useful_tokens_per_s']:,.0f} useful tok/s, run {wall:.0f} s", flush=True)
    base = rows.get("sorted", {}).get("useful_tokens_per_s")
    any_row = next(iter(rows.values()))
    p = any_row["params"]
    print(
        f"\nuseful tokens per run: {p['train']['useful_tokens']:,} | budget {p['batching']['token_budget']:,} "
        f"tokens, max {p['batching']['max_batch_size']} seqs | {args.nproc} processes "
        f"({any_row['target_ranks']} target + 1 drafter) | drafter {p['drafter']['num_layers']} layer(s), "
        f"{p['drafter']['anchors_per_seq']} anchors/seq | warm-up {any_row['warmup_steps_excluded']} steps excluded"
    )
    head = (
        "| strategy | steps | padding eff. | useful tok/s | (min-max) | computed tok/s | vs sorted | target s/step "
        "| drafter s/step | drafter wait s/step | target credit wait s/step | final loss | run wall s |"
    )
    print(head)
    print("|---|" + "---:|" * (head.count("|") - 2))
    for s, r in rows.items():
        ratio = r["useful_tokens_per_s"] / base if base else float("nan")
        print(
            f"| {s} | {r['steps']} | {r['padding_efficiency']:.3f} | {r['useful_tokens_per_s']:,.0f} | "
            f"{min(runs[s]):,.0f}-{max(runs[s]):,.0f} | "
            f"{r['computed_tokens_per_s']:,.0f} | {ratio:.2f} | {r['target_s_mean']:.3f} | {r['drafter_s_mean']:.3f} | "
            f"{r['queue_wait_s_mean']:.3f} | {r['credit_wait_s_mean']:.3f} | {r['final_loss']:.3f} | "
            f"{r['run_wall_s']:.0f} |"
        )
    tps = {s: r["useful_tokens_per_s"] for s, r in rows.items()}
    checks = []
    if {"sorted", "packed"} <= tps.keys():
        checks.append(("packed >= sorted", tps["packed"] >= tps["sorted"], tps["packed"] / tps["sorted"]))
    if {"sorted", "bucketed"} <= tps.keys():
        r = tps["bucketed"] / tps["sorted"]
        checks.append(("bucketed 0.8-0.9 x sorted", 0.8 <= r <= 0.9, r))
    if "random" in tps and len(tps) > 1:
        checks.append(("random the lowest", tps["random"] == min(tps.values()), tps["random"] / max(tps.values())))
    for name, ok, value in checks:
        print(f"check {name}: {'holds' if ok else 'DOES NOT HOLD'} (ratio {value:.2f})")
    inter = interleaved(args, bounds) if args.interleaved_batches else {}
    (root / "bench_train.json").write_text(
        json.dumps(
            {
                s: {
                    **{k: v for k, v in r.items() if k not in ("params", "loss_curve")},
                    "useful_tokens_per_s_runs": runs[s],
                }
                for s, r in rows.items()
            }
            | {"interleaved": inter},
            indent=2,
        )
    )
    print(f"\nwrote {root / 'bench_train.json'}; per-run logs in {root}")


if __name__ == "__main__":
    main()
