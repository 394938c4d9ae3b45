"""Lengths of a tokenized dataset: ``lenbatch.lengths_of`` (Arrow list offsets) vs the Python row loop.

    python benchmarks/bench_lengths.py [--rows 5000000] [--loop-rows 200000] [--divide 32] [--dir DIR]

Builds a ``datasets`` dataset of ``--rows`` rows whose ``input_ids`` (list<int32>) lengths are the
seed profile's divided by ``--divide`` (mean ~65 tokens at 32, so 5 M rows are ~1.3 GB on disk; the
offsets, all that lengths_of reads, do not depend on it), saves it with ``save_to_disk`` under
``--dir`` (default: a temporary folder) and times, each best of 3:

* ``lengths_of(folder)``: the Arrow files memory-mapped, no ``datasets`` import on the path;
* ``lengths_of(load_from_disk(folder))`` (the load timed apart) and of a ``.shuffle()``d view
  (an indices mapping: one more gather);
* the row loop users write, ``[len(r) for r in ds["input_ids"]]`` over the first ``--loop-rows`` rows
  (it materialises Python lists: minutes at 5 M), extrapolated linearly to ``--rows`` and said so.

The machine may be shared: the load average is printed with the numbers.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from lenbatch_study.corpus.seed_profile import SEED_COUNT, seed_profile


def best_of(fn, reps: int = 3) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def build(rows: int, divide: int, folder: Path) -> np.ndarray:
    import datasets
    import pyarrow as pa
    from datasets.table import InMemoryTable

    reps = -(-rows // SEED_COUNT)
    lengths = np.maximum(np.tile(seed_profile(), reps)[:rows] // divide, 1).astype(np.int32)
    offsets = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = pa.array(np.arange(offsets[-1], dtype=np.int32) % 151_000)
    ids = pa.ListArray.from_arrays(pa.array(offsets), values)
    datasets.disable_progress_bars()
    datasets.Dataset(InMemoryTable(pa.table({"input_ids": ids}))).save_to_disk(str(folder), max_shard_size="1GB")
    return lengths


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--loop-rows", type=int, default=200_000)
    ap.add_argument("--divide", type=int, default=32)
    ap.add_argument("--dir", help="where to build the dataset (default: a temporary folder, removed after)")
    args = ap.parse_args()
    import datasets

    import lenbatch as lb

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp) / "ds"
        t0 = time.perf_counter()
        want = build(args.rows, args.divide, folder)
        print(
            f"built {args.rows:,} rows, {int(want.sum()):,} tokens, {len(list(folder.glob('*.arrow')))} Arrow "
            f"file(s) in {time.perf_counter() - t0:.1f} s"
        )
        t_dir, got = best_of(lambda: lb.lengths_of(folder))
        assert np.array_equal(got, want)
        t_load, ds = best_of(lambda: datasets.load_from_disk(str(folder)))
        t_ds, got = best_of(lambda: lb.lengths_of(ds))
        assert np.array_equal(got, want)
        shuffled = ds.shuffle(seed=0)
        t_sh, got = best_of(lambda: lb.lengths_of(shuffled))
        assert np.array_equal(got, want[np.asarray(shuffled._indices.column(0))])
        head = ds.select(range(min(args.loop_rows, args.rows)))
        t_loop, loop = best_of(lambda: [len(r) for r in head["input_ids"]], reps=1)
        assert loop == want[: len(loop)].tolist()
        per_row = t_loop / len(loop)
    load = os.getloadavg()[0]
    print(f"\n{args.rows:,} rows (load average {load:.2f}):\n")
    print("| method | seconds |")
    print("|---|---|")
    print(f"| lengths_of(save_to_disk folder) | {t_dir:.3f} |")
    print(f"| datasets.load_from_disk (not lengths_of: the load users do anyway) | {t_load:.3f} |")
    print(f"| lengths_of(Dataset) | {t_ds:.3f} |")
    print(f"| lengths_of(Dataset.shuffle()) (indices mapping) | {t_sh:.3f} |")
    print(
        f"| row loop [len(r) for r in ds['input_ids']], {len(loop):,} rows measured | {t_loop:.2f} "
        f"(extrapolated to {args.rows:,} rows: {per_row * args.rows:.0f} s) |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
