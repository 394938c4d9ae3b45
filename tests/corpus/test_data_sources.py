"""Record readers (lenbatch_study.corpus.sources): the cut-off tolerant JSON/JSONL stream parser, Parquet and
save_to_disk directories, and the errors for input that cannot be read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lenbatch_study.corpus.sources import SourceReport, iter_json_records, iter_records, resolve_source

REPO = Path(__file__).resolve().parents[2]

RECORDS = [
    {
        "id": "a_0",
        "conversations": [
            {"from": "human", "value": 'Hi "there" \\ caf\u00e9'},
            {"from": "gpt", "value": "Hello \U0001f600 \u4f60\u597d"},
        ],
    },
    {
        "id": "b_0",
        "conversations": [
            {"from": "system", "value": "be brief"},
            {"from": "human", "value": "2+2"},
            {"from": "gpt", "value": "4"},
        ],
        "score": 12.5,
    },
    {
        "id": "c_0",
        "messages": [
            {"role": "user", "content": "tab\there\nnewline"},
            {"role": "assistant", "content": "null true false 0"},
        ],
        "ok": True,
    },
    {"id": "d_0", "conversations": []},
]


def _array_bytes(ensure_ascii: bool) -> tuple[bytes, list[int]]:
    """A pretty-printed JSON array (like the ShareGPT file) and the byte offset where each record ends."""
    parts = [json.dumps(r, indent=2, ensure_ascii=ensure_ascii).replace("\n", "\n  ") for r in RECORDS]
    text = "[\n  "
    ends = []
    for i, p in enumerate(parts):
        text += p
        ends.append(len(text.encode()))
        text += ",\n  " if i < len(parts) - 1 else "\n"
    text += "]\n"
    return text.encode(), ends


def _jsonl_bytes() -> tuple[bytes, list[int]]:
    text, ends = "", []
    for r in RECORDS:
        text += json.dumps(r, ensure_ascii=False)
        ends.append(len(text.encode()))
        text += "\n"
    return text.encode(), ends


def _read(path, chunk_bytes, allow_truncated=True):
    report = SourceReport(str(path), "json")
    records = [r for _, r in iter_json_records(path, report, chunk_bytes=chunk_bytes, allow_truncated=allow_truncated)]
    return records, report


@pytest.mark.parametrize("kind", ["array_ascii", "array_utf8", "jsonl"])
def test_every_cut_recovers_exactly_the_complete_records(tmp_path, kind):
    """Cut the file at every byte: the complete records before the cut come back, nothing else, and
    bytes_left_over is the distance from the last complete record to the cut."""
    data, ends = _jsonl_bytes() if kind == "jsonl" else _array_bytes(kind == "array_ascii")
    path = tmp_path / "cut.json"
    start = 1 if kind == "jsonl" else 2  # a file of just "[" is cut before its first record
    for cut in range(start, len(data) + 1):
        path.write_bytes(data[:cut])
        complete = sum(e <= cut for e in ends)
        for chunk_bytes in (7, 1 << 20):  # tiny chunks split records, escapes and UTF-8 characters
            records, report = _read(path, chunk_bytes)
            assert records == RECORDS[:complete], (cut, chunk_bytes)
            assert report.records_read == 0  # counted by iter_records, not by the raw reader
            last = ends[complete - 1] if complete else (0 if kind == "jsonl" else 1)  # 1: after "["
            if kind == "jsonl":
                cut_off = data[last:cut].strip() != b""
            else:
                cut_off = cut < data.rindex(b"]") + 1  # the array's closing bracket is missing
            assert report.cut_off == cut_off, (cut, chunk_bytes)
            if report.cut_off:
                assert report.bytes_left_over == cut - last, (cut, chunk_bytes)
                # recovery is explicit: without allow_truncated a cut file is an error with the counts
                with pytest.raises(
                    ValueError,
                    match=rf"is cut off.*\({complete} complete records, {cut - last} "
                    r"bytes left over\); pass --allow-truncated",
                ):
                    _read(path, chunk_bytes, allow_truncated=False)
            else:
                assert report.bytes_left_over == 0
                assert _read(path, chunk_bytes, allow_truncated=False)[0] == records


def test_jsonl_cut_between_lines_is_complete_and_inside_a_line_is_cut(tmp_path):
    data, ends = _jsonl_bytes()
    path = tmp_path / "x.jsonl"
    path.write_bytes(data[: ends[1] + 1])
    records, report = _read(path, 1 << 20)
    assert records == RECORDS[:2] and not report.cut_off and report.bytes_left_over == 0
    path.write_bytes(data[: ends[1] + 5])
    records, report = _read(path, 1 << 20)
    assert records == RECORDS[:2] and report.cut_off and report.bytes_left_over == 5


def test_the_real_sharegpt_file_is_cut_off_and_every_complete_record_is_recovered():
    path, fmt = resolve_source("sharegpt")
    report = SourceReport(str(path), fmt)
    data = path.read_bytes()
    n = sum(1 for _ in iter_records(path, fmt, report, allow_truncated=True))
    assert report.format == "json_array" and report.read_to_end and report.cut_off
    assert n == report.records_read == report.to_dict()["records_recovered_from_cut_off_file"]
    # The bytes left over start right after a record's closing brace and hold no complete record.
    tail = data[len(data) - report.bytes_left_over :]
    assert data[len(data) - report.bytes_left_over - 1 :][:1] == b"}"
    assert tail.lstrip().startswith(b",") and tail.count(b'"id"') == 1
    # The file as a whole is not valid JSON; with the tail replaced by "]" it is, with the same records.
    with pytest.raises(json.JSONDecodeError):
        json.loads(data)
    assert len(json.loads(data[: len(data) - report.bytes_left_over] + b"]")) == n


@pytest.mark.parametrize("kind", ["array", "jsonl"])
def test_a_typo_in_the_last_record_of_a_closed_file_is_an_error_not_a_cut(tmp_path, kind):
    """Issue 11.5: the file ends with its closing bracket, so a bad last record is invalid JSON, not a cut
    (it used to be dropped as "file cut off, N bytes left over")."""
    data = _array_bytes(True)[0] if kind == "array" else _jsonl_bytes()[0]
    last = data.rindex(b'"ok"')
    broken = data[:last] + b'"ok" true' + data[last + len(b'"ok": true') :]  # missing ':' in the last record
    assert broken != data and broken.rstrip().endswith(b"]" if kind == "array" else b"}")
    path = tmp_path / "typo.json"
    path.write_bytes(broken)
    for allow in (False, True):
        with pytest.raises(ValueError, match=r"typo\.json: invalid JSON in record 3 \(starting at byte \d+\)"):
            _read(path, 1 << 20, allow_truncated=allow)
    # a cut right after an inner ']' is still a cut (the text ends where the parser wanted more)
    inner = data.index(b"]", data.index(b'"c_0"')) + 1
    path.write_bytes(data[:inner])
    records, report = _read(path, 1 << 20)
    assert records == RECORDS[:2] and report.cut_off


@pytest.mark.parametrize("kind", ["array", "jsonl"])
def test_a_closed_file_whose_last_record_breaks_at_its_end_is_an_error_naming_record_and_byte(tmp_path, kind):
    """Issue 19: record 3 lacks its closing brace, so the decoder fails on the array's closing ']' (for JSONL:
    on the next line's '{'), within the file's last bytes. That was reported as "cut off" and, with
    --allow-truncated, record 3 was dropped with exit 0. A closed file is never a cut: with or without the
    flag it is an error naming the record, where it starts and the byte where it breaks. (~1 s)"""
    if kind == "array":
        data, ends = _array_bytes(True)
    else:
        data, ends = _jsonl_bytes()
        data += b'{"id": "e_0", "conversations": []}\n'
    brace = ends[3] - 1
    assert data[brace : brace + 1] == b"}"
    broken = data[:brace] + data[brace + 1 :]
    record_start = data.rindex(b"{", 0, data.index(b'"d_0"'))
    breaks_at = len(broken.rstrip()) - 1 if kind == "array" else broken.rindex(b"{")
    path = tmp_path / "closed.json"
    path.write_bytes(broken)
    closing = "]" if kind == "array" else "}"
    for allow in (False, True):
        for chunk_bytes in (7, 1 << 20):  # tiny chunks: the buffer is rebased while the last record is decoded
            with pytest.raises(
                ValueError,
                match=rf"closed\.json: invalid JSON in record 4 \(starting at byte "
                rf"{record_start}\): .* at byte {breaks_at}; the file ends with its closing "
                rf"'\{closing}', so this is a malformed record, not a cut",
            ):
                _read(path, chunk_bytes, allow_truncated=allow)
    # through the command line with the flag: exit 2 with the same words, nothing written
    from lenbatch_study.cli import main as cli_main

    out = tmp_path / "out"
    assert (
        cli_main(
            [
                "tokenize",
                "--params",
                str(REPO / "params.yaml"),
                "--source",
                str(path),
                "--allow-truncated",
                "--no-progress",
                "--workers",
                "1",
                "--out",
                str(out),
            ]
        )
        == 2
    )
    assert not out.exists()


def test_the_real_sharegpt_file_needs_allow_truncated(tmp_path):
    path, fmt = resolve_source("sharegpt")
    with pytest.raises(
        ValueError,
        match=r"is cut off.*complete records, \d+ bytes left over\); pass "
        "--allow-truncated",
    ):
        sum(1 for _ in iter_records(path, fmt, SourceReport(str(path), fmt)))


def test_unreadable_and_deeply_nested_sources_are_one_line_errors(tmp_path):
    """Issue 11.7: RecursionError and OSError used to escape as tracebacks."""
    path = tmp_path / "deep.json"
    path.write_text("[" + json.dumps(RECORDS[0]) + ", " + "[" * 100_000 + "]" * 100_000 + "]")
    with pytest.raises(ValueError, match=r"deep\.json: record 2 \(starting at byte \d+\) is nested too deeply"):
        _read(path, 1 << 20)
    folder = tmp_path / "folder.json"
    folder.mkdir()
    with pytest.raises(ValueError, match=r"folder\.json cannot be read \(Is a directory\)"):
        _read(folder, 1 << 20)
    import os

    locked = tmp_path / "locked.jsonl"
    locked.write_text(json.dumps(RECORDS[0]) + "\n")
    locked.chmod(0)
    if os.geteuid() != 0:  # root reads it anyway
        with pytest.raises(ValueError, match=r"locked\.jsonl cannot be read \(Permission denied\)"):
            resolve_source(str(locked))


def test_limit_stops_early_without_claiming_a_cut(tmp_path):
    path, fmt = resolve_source("sharegpt")
    report = SourceReport(str(path), fmt)
    assert [i for i, _ in iter_records(path, fmt, report, limit=5)] == [0, 1, 2, 3, 4]
    assert report.records_read == 5 and not report.read_to_end and report.bytes_left_over is None
    assert not report.cut_off and "data.limit=5" in report.notes[0]


def test_invalid_json_before_the_end_names_record_and_byte(tmp_path):
    data, ends = _array_bytes(True)
    broken = data.replace(b'"from": "system"', b'"from" "system"')  # record 1 is corrupt, 2 and 3 follow
    assert broken != data
    path = tmp_path / "broken.json"
    path.write_bytes(broken)
    with pytest.raises(ValueError, match=r"broken\.json: invalid JSON in record 2 \(starting at byte \d+\)"):
        _read(path, 1 << 20)
    with pytest.raises(ValueError, match=r"invalid JSON in record 2"):
        _read(path, 7)
    path.write_bytes(data.replace(b"},\n  {", b"}\n  {", 1))
    with pytest.raises(ValueError, match=r"expected ',' or '\]' after record 1 at byte"):
        _read(path, 1 << 20)
    path.write_bytes(data + b"[]")
    with pytest.raises(ValueError, match=r"unexpected data after the closing '\]'"):
        _read(path, 1 << 20)


@pytest.mark.parametrize(
    "content, words",
    [
        (b"", "is empty"),
        (b"   \n", "is empty"),
        (b"hello, not json", "is not JSON or JSONL: it starts with 'hello"),
        (b"\x89PNG\r\n\x1a\n....", "is not JSON or JSONL"),
    ],
)
def test_not_json_at_all(tmp_path, content, words):
    path = tmp_path / "data.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=words):
        _read(path, 1 << 20)


def test_invalid_utf8_survives_to_the_record_as_undecodable_text(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"conversations": [{"from": "gpt", "value": "caf\xe9"}]}\n')
    (record,), report = _read(path, 3)
    value = record["conversations"][0]["value"]
    with pytest.raises(UnicodeEncodeError):
        value.encode("utf-8")  # lenbatch_study.corpus.chat reports this record as bad_text
    assert not report.cut_off


def test_missing_source_and_wrong_directories(tmp_path):
    with pytest.raises(ValueError, match=r"data.source '.*nope.json' does not exist"):
        resolve_source(str(tmp_path / "nope.json"))
    with pytest.raises(ValueError, match="not one written by datasets.save_to_disk"):
        resolve_source(str(tmp_path))
    import datasets

    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(RECORDS[:2])})
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ValueError, match=r"DatasetDict with splits \['train'\]; point it at one split"):
        resolve_source(str(tmp_path / "dd"))
    assert resolve_source(str(tmp_path / "dd" / "train"))[1] == "arrow_dir"


def test_parquet_and_save_to_disk_sources_give_the_records_back(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [RECORDS[0], RECORDS[1]]  # same schema (conversations with from/value)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "x.parquet")
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    for source in (tmp_path / "x.parquet", tmp_path / "ds"):
        path, fmt = resolve_source(str(source))
        report = SourceReport(str(path), fmt)
        got = [r for _, r in iter_records(path, fmt, report)]
        assert [r["conversations"] for r in got] == [r["conversations"] for r in rows]
        assert [r["id"] for r in got] == ["a_0", "b_0"]
        assert report.records_read == 2 and report.read_to_end and not report.cut_off
    (tmp_path / "fake.parquet").write_bytes(b"PAR1 not really")
    path, fmt = resolve_source(str(tmp_path / "fake.parquet"))
    with pytest.raises(ValueError, match="not a readable Parquet file"):
        list(iter_records(path, fmt, SourceReport(str(path), fmt)))
