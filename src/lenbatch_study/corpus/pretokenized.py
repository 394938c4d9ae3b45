"""A pre-tokenized dataset as the workflow's input: the tokenize stage without a tokenizer.

``data.source`` pointing at a ``datasets.save_to_disk`` folder or a Parquet file *with an
``input_ids`` column* (list of token ids) is pre-tokenized (:func:`detect`); one without that column
holds chat records and is tokenized as before (:mod:`lenbatch_study.corpus.tokenizing`). Either way the
stage writes the same ``dataset/``, ``lengths.npy`` and ``stats.json``; ``stats.json["input"]`` says
which path was taken.

Loss mask: the first of these columns the source has, aligned with ``input_ids`` row by row
(:data:`MASK_COLUMNS`): ``loss_mask`` (this project's, also the study's ``tokenized_completions``),
``assistant_masks`` (transformers' ``apply_chat_template(return_assistant_tokens_mask=True)``),
``completion_mask`` (TRL) -- a token is trained where the value is non-zero --, or ``labels``
(trained where != -100). Without one, every token is trained (mask all 1), and ``stats.json`` says so.

The rules of the text path apply and are counted the same way (``records_read = samples +
sum(dropped)``): an empty ``input_ids`` row is ``dropped.empty_conversation``; a row whose mask is all
0 is ``dropped.no_assistant_turn``; a row longer than ``data.max_len`` is cut to its first
``max_len`` ids (``truncated``; ``dropped.no_assistant_tokens_after_truncation`` when the cut leaves
no trained token), dropped (``overflow: drop``, ``dropped.too_long``) or an error (``overflow:
error``). Null rows, negative or > int32 ids and a mask whose row lengths differ from ``input_ids``'
are errors naming the count and the first row.

Cost: one pass over the record batches (memory-mapped Arrow files, or Parquet decoded 8,192 rows at
a time), vectorised per batch from the list offsets (no Python object per token or row); memory a
few batches, the rows streamed to ``spill_path``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lenbatch.loading.arrow import arrow_dir_files, open_arrow_file
from lenbatch_study.corpus.sources import SourceReport, resolve_source

TOKEN_COLUMN = "input_ids"
MASK_COLUMNS = ("loss_mask", "assistant_masks", "completion_mask", "labels")
DROP_REASONS = ("empty_conversation", "no_assistant_turn", "too_long", "no_assistant_tokens_after_truncation")
BATCH_ROWS = 8192


def _schema_names(path: Path, fmt: str) -> list[str]:
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return list(pq.read_schema(str(path)).names)
        except (pa.ArrowInvalid, OSError) as err:
            raise ValueError(
                f"data.source {path} is not a readable Parquet file ({err}); give a Parquet, JSON or JSONL file"
            ) from None
    return list(open_arrow_file(arrow_dir_files(path)[0]).schema.names)


def detect(source: str) -> tuple[Path, str, str | None] | None:
    """``(path, format, mask column or None)`` when ``data.source`` is a pre-tokenized save_to_disk
    folder or Parquet file (it has an ``input_ids`` column), else None (chat records, or JSON)."""
    path, fmt = resolve_source(source)
    if fmt not in ("parquet", "arrow_dir"):
        return None
    names = _schema_names(path, fmt)
    if TOKEN_COLUMN not in names:
        return None
    return path, fmt, next((c for c in MASK_COLUMNS if c in names), None)


def _batches(path: Path, fmt: str, columns: list[str]) -> Iterator[Any]:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        yield from pq.ParquetFile(str(path)).iter_batches(batch_size=BATCH_ROWS, columns=columns)
        return
    for f in arrow_dir_files(path):
        table = open_arrow_file(f).select(columns)
        yield from table.to_batches(max_chunksize=BATCH_ROWS)


def _list_parts(col: Any, name: str, first_row: int) -> tuple[np.ndarray, np.ndarray]:
    """(row lengths, flat values) of one batch's list column; nulls refused."""
    import pyarrow.types as pt

    if col.null_count:
        bad = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(
            f"column {name!r} has {col.null_count} null row(s) in rows {first_row}..{first_row + len(col) - 1} "
            f"(first at row {first_row + bad}); a null is not a sample: drop or fill them"
        )
    if not (pt.is_list(col.type) or pt.is_large_list(col.type)):
        raise ValueError(
            f"column {name!r} has type {col.type}; a pre-tokenized source needs a list of token ids per row"
        )
    off = col.offsets.to_numpy().astype(np.int64)
    return np.diff(off), col.flatten().to_numpy(zero_copy_only=False)


def _segments(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Positions of the segments [starts[r], starts[r] + sizes[r]) concatenated."""
    total = int(sizes.sum())
    return np.repeat(starts - (np.cumsum(sizes) - sizes), sizes) + np.arange(total)


def tokenize_pretokenized(
    *,
    path: Path,
    fmt: str,
    mask_column: str | None,
    max_len: int,
    overflow: str,
    limit: int | None = None,
    spill_path: str | Path | None = None,
) -> Any:
    """The :class:`lenbatch_study.corpus.tokenizing.Tokenized` of a pre-tokenized source (rules: module doc)."""
    import pyarrow as pa

    from lenbatch_study.corpus.tokenizing import ARROW_SCHEMA, ContentHash, Tokenized

    if overflow not in ("truncate", "drop", "error"):
        raise ValueError(f"data.overflow is {overflow!r}; choose truncate, drop or error")
    if max_len < 2 or (limit is not None and limit < 1):
        raise ValueError(f"data.max_len ({max_len}) must be >= 2 and data.limit ({limit}) >= 1 or null")
    t0 = time.perf_counter()
    report = SourceReport(path=str(path), format=fmt)
    dropped = dict.fromkeys(DROP_REASONS, 0)
    columns = [TOKEN_COLUMN] + ([mask_column] if mask_column else [])
    spill = Path(spill_path) if spill_path is not None else None
    writer = sink = None
    kept_batches: list[Any] = []
    if spill is not None:
        spill.parent.mkdir(parents=True, exist_ok=True)
        sink = pa.OSFile(str(spill), "wb")
        writer = pa.ipc.new_stream(sink, ARROW_SCHEMA)
    lengths_parts: list[np.ndarray] = []
    truncated = tokens_before = kept_tokens = trained_tokens = 0
    row0 = 0
    content = ContentHash()  # the same digest tokenizing gives the same rows (state.json's fingerprint)
    failed = True
    try:
        for batch in _batches(path, fmt, columns):
            if limit is not None and row0 >= limit:
                break
            if limit is not None and row0 + batch.num_rows > limit:
                batch = batch.slice(0, limit - row0)
            n = batch.num_rows
            lens, ids = _list_parts(batch.column(TOKEN_COLUMN), TOKEN_COLUMN, row0)
            if ids.size and (ids.min() < 0 or ids.max() >= 2**31):
                raise ValueError(
                    f"column {TOKEN_COLUMN!r} holds token ids outside 0..2**31-1 (min {ids.min()}, max "
                    f"{ids.max()}) in rows {row0}..{row0 + n - 1}; padding or -100 labels do not belong "
                    "in input_ids"
                )
            if mask_column:
                mlens, mvals = _list_parts(batch.column(mask_column), mask_column, row0)
                bad = np.flatnonzero(mlens != lens)
                if bad.size:
                    raise ValueError(
                        f"column {mask_column!r} has {bad.size} row(s) whose length differs from "
                        f"{TOKEN_COLUMN!r} (first at row {row0 + int(bad[0])}: {int(mlens[bad[0]])} vs "
                        f"{int(lens[bad[0]])}); the mask must have one value per token"
                    )
                mask = (mvals != -100) if mask_column == "labels" else (mvals != 0)
            else:
                mask = np.ones(ids.size, dtype=bool)
            starts = np.cumsum(lens) - lens
            csum = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])
            trained_full = csum[starts + lens] - csum[starts]
            keep_len = np.minimum(lens, max_len)
            trained_kept = csum[starts + keep_len] - csum[starts]
            empty = lens == 0
            no_train = ~empty & (trained_full == 0)
            long = ~empty & ~no_train & (lens > max_len)
            if overflow == "error" and long.any():
                r = int(np.flatnonzero(long)[0])
                raise ValueError(
                    f"row {row0 + r} has {int(lens[r])} tokens > data.max_len={max_len} (overflow: error, "
                    f"{int(long.sum())} such rows in rows {row0}..{row0 + n - 1}); raise data.max_len or "
                    "set data.overflow: truncate or drop"
                )
            too_long = long if overflow == "drop" else np.zeros(n, dtype=bool)
            cut_away = long & ~too_long & (trained_kept == 0)
            keep = ~(empty | no_train | too_long | cut_away)
            dropped["empty_conversation"] += int(empty.sum())
            dropped["no_assistant_turn"] += int(no_train.sum())
            dropped["too_long"] += int(too_long.sum())
            dropped["no_assistant_tokens_after_truncation"] += int(cut_away.sum())
            truncated += int((long & keep).sum())
            tokens_before += int(lens[keep].sum())
            rows = np.flatnonzero(keep)
            new_len = keep_len[rows]
            pos = _segments(starts[rows], new_len)
            out_off = np.concatenate([[0], np.cumsum(new_len)]).astype(np.int32)
            rb = pa.RecordBatch.from_arrays(
                [
                    pa.ListArray.from_arrays(pa.array(out_off), pa.array(ids[pos].astype(np.int32))),
                    pa.ListArray.from_arrays(pa.array(out_off), pa.array(mask[pos].astype(np.int8))),
                    pa.array(new_len.astype(np.int32)),
                    pa.array((row0 + rows).astype(np.int64)),
                ],
                schema=ARROW_SCHEMA,
            )
            content.update({"ids": ids[pos], "mask": mask[pos], "lengths": new_len, "source_index": row0 + rows})
            (writer.write_batch(rb) if writer is not None else kept_batches.append(rb))
            lengths_parts.append(new_len.astype(np.int32))
            kept_tokens += int(new_len.sum())
            trained_tokens += int(trained_kept[rows].sum())
            row0 += n
        failed = False
    finally:
        if writer is not None:
            writer.close()
            sink.close()
            if failed:
                spill.unlink(missing_ok=True)
    report.records_read = row0
    report.read_to_end = limit is None or row0 < limit
    report.bytes_left_over = 0 if report.read_to_end else None
    if not report.read_to_end:
        report.notes.append(f"stopped after data.limit={limit} records; the rest of the source (if any) was not read")
    lengths = np.concatenate(lengths_parts) if lengths_parts else np.zeros(0, np.int32)
    assert lengths.size + sum(dropped.values()) == row0, (lengths.size, dropped, row0)
    if lengths.size == 0:
        if spill is not None:
            spill.unlink(missing_ok=True)
        raise ValueError(f"no samples left from {path}: {row0} rows read, dropped {dropped}; check data.source")
    rule = (
        f"column {mask_column!r}: trained where != -100"
        if mask_column == "labels"
        else f"column {mask_column!r}: trained where non-zero"
        if mask_column
        else "no loss-mask column (loss_mask, assistant_masks, completion_mask or labels): every token is trained"
    )
    stats: dict[str, Any] = {
        "input": "pre-tokenized",
        "token_column": TOKEN_COLUMN,
        "loss_mask": {"column": mask_column, "rule": rule},
        "source": report.to_dict(),
        "tokenizer": None,  # data.tokenizer is not used: the ids come from the source
        "records_read": row0,
        "cut_off": False,
        "records_recovered_from_cut_off_file": None,
        "bytes_left_over": report.bytes_left_over,
        "samples": int(lengths.size),
        "skipped": {},
        "skipped_examples": [],
        "dropped": dropped,
        "max_len": max_len,
        "overflow": overflow,
        "on_bad_record": None,
        "truncated": truncated,
        "tokens_before_truncation": tokens_before,
        "total_tokens": kept_tokens,
        "assistant_tokens": trained_tokens,
        "length": {"min": int(lengths.min()), "max": int(lengths.max()), "mean": float(lengths.mean())},
        "workers": 1,
        "content_sha256": content.hexdigest(),
    }
    # seconds go to timings.json (write_outputs), not stats.json: the same rows give the same bytes
    return Tokenized(
        lengths=lengths,
        stats=stats,
        batches=kept_batches,
        arrow_path=spill,
        seconds={"read_and_encode": round(time.perf_counter() - t0, 3)},
    )
