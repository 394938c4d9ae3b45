"""Step time with and without ``train.reuse_host_memory``: what re-faulting freed tensors costs on the CPU.

Usage (the CPU default model; about a minute on 2 cores)::

    python benchmarks/bench_hostmem.py [--params params.yaml] [--steps 6] [--warmup 3]

For each setting, one fresh process (the allocator is per process) builds the target and the
drafter with ``train.threads`` intra-op threads and steps each shape below ``--warmup`` times
untimed, then ``--steps`` times timed. The shapes are the token budget's (16,384 tokens on
the default: 32 x 512 and 4 x 4,096 padded, one packed row of 32 sequences) and half of it.
Prints, per shape and role, the median seconds per step and the minor page faults per step
(a page touched for the first time: ~4 KiB mapped afresh), then the speed-up; then each
process's resident and peak host memory (Linux /proc), the setting's cost.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

WORKER = r"""
import json, resource, statistics, sys
from pathlib import Path
from lenbatch_study.core.config import load_params
from lenbatch_study.runtime.hostmem import minor_faults
from lenbatch_study.stages.profile import make_batch
from lenbatch_study.analysis.shapes import grid_shape
from lenbatch_study.runtime.runner import StepRunner, configure_process

params_path, reuse, steps, warmup = sys.argv[1], sys.argv[2] == "true", int(sys.argv[3]), int(sys.argv[4])
params = load_params(Path(params_path), overrides={"train": {"reuse_host_memory": reuse}})
configure_process(params)
runner = StepRunner(params, device="cpu")
budget = params.batching.token_budget
shapes = [("padded", budget // 512, 512), ("padded", budget // 1024, 512), ("padded", budget // 4096, 4096),
          ("packed", 32, budget)]
rows = []
for i, (layout, n, m) in enumerate(shapes):
    batch = make_batch(layout, grid_shape(layout, n, m, max_len=params.data.max_len), params, seed=i)
    t, d, tf, df = [], [], [], []
    for k in range(warmup + steps):
        f0 = minor_faults()
        feats, ts = runner.target_step(batch)
        f1 = minor_faults()
        _, ds = runner.drafter_step(batch, feats)
        f2 = minor_faults()
        if k >= warmup:
            t.append(ts); d.append(ds); tf.append(f1 - f0); df.append(f2 - f1)
    rows.append({"shape": f"{layout} {n} x {m}", "tokens": int(batch.input_ids.numel()),
                 "target_s": statistics.median(t), "drafter_s": statistics.median(d),
                 "target_faults": statistics.median(tf), "drafter_faults": statistics.median(df)})
rss = int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
print(json.dumps({"rows": rows, "rss_mb": rss, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def measure(params: Path, *, reuse: bool, steps: int, warmup: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, str(params), str(reuse).lower(), str(steps), str(warmup)],
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        sys.exit(f"worker failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--steps", type=int, default=6, help="timed steps per shape")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per shape first")
    args = ap.parse_args()
    off_run = measure(args.params, reuse=False, steps=args.steps, warmup=args.warmup)
    on_run = measure(args.params, reuse=True, steps=args.steps, warmup=args.warmup)
    off, on = off_run["rows"], on_run["rows"]
    print(f"median over {args.steps} steps after {args.warmup} warm-up steps, one process per setting\n")
    print(
        "| shape | tokens | role | system allocator: s/step | faults/step | reuse_host_memory: s/step "
        "| faults/step | speed-up |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for a, b in zip(off, on):
        for role in ("target", "drafter"):
            print(
                f"| {a['shape']} | {a['tokens']:,} | {role} | {a[f'{role}_s']:.3f} | {a[f'{role}_faults']:,.0f} "
                f"| {b[f'{role}_s']:.3f} | {b[f'{role}_faults']:,.0f} | {a[f'{role}_s'] / b[f'{role}_s']:.2f}x |"
            )
    print(
        f"\nhost memory after the last step (resident) / peak: system allocator {off_run['rss_mb']:,.0f} / "
        f"{off_run['peak_mb']:,.0f} MiB, reuse_host_memory {on_run['rss_mb']:,.0f} / {on_run['peak_mb']:,.0f} MiB "
        "(kept memory stays resident; fragmentation can hold it above the system allocator's peak)"
    )


if __name__ == "__main__":
    main()
