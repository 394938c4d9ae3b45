"""A pre-tokenized dataset as the workflow's input (issue 21): the real tokenize command on a
save_to_disk folder and a Parquet file with ``input_ids`` (with and without a loss mask) gives the
same dataset/, lengths.npy and stats.json contract as for text, with truncation and drops counted;
a chat-records Parquet file is still tokenized. ~6 s (the chat case loads the real tokenizer)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lenbatch_study.cli import main as cli_main

REPO = Path(__file__).resolve().parents[2]
PARAMS = str(REPO / "params.yaml")

IDS = [list(range(5, 25)), [7, 8, 9], [], list(range(100, 160)), [3, 4, 5, 6]]
MASK = [[0] * 10 + [1] * 10, [0, 1, 1], [], [0] * 60, [1, 1, 0, 0]]  # row 3: nothing to train
LONG_MASK_AT_END = [0] * 16 + [1] * 4  # row 0 with max_len 16: every trained token cut away


def _tokenize(capsys, source: Path, out: Path, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = cli_main(["tokenize", "--params", PARAMS, "--no-progress", "--source", str(source), "--out", str(out), *args])
    return rc, capsys.readouterr().err


def _outputs(out: Path) -> tuple[datasets.Dataset, np.ndarray, dict]:
    return (
        datasets.load_from_disk(str(out / "dataset")),
        np.load(out / "lengths.npy"),
        json.loads((out / "stats.json").read_text()),
    )


def test_a_save_to_disk_folder_with_input_ids_and_loss_mask_skips_the_tokenizer(tmp_path, capsys):
    datasets.Dataset.from_dict({"input_ids": IDS, "loss_mask": MASK, "text": ["x"] * 5}).save_to_disk(
        str(tmp_path / "src")
    )
    rc, err = _tokenize(capsys, tmp_path / "src", tmp_path / "out", "--max-len", "16")
    assert rc == 0, err
    ds, lengths, stats = _outputs(tmp_path / "out")
    assert stats["input"] == "pre-tokenized" and stats["loss_mask"]["column"] == "loss_mask"
    assert stats["tokenizer"] is None
    # row 0 cut to 16 (its trained tokens 10..15 survive), row 2 empty, row 3 untrainable
    assert stats["dropped"] == {
        "empty_conversation": 1,
        "no_assistant_turn": 1,
        "too_long": 0,
        "no_assistant_tokens_after_truncation": 0,
    }
    assert stats["truncated"] == 1 and stats["records_read"] == 5 and stats["samples"] == 3
    assert ds["input_ids"] == [IDS[0][:16], IDS[1], IDS[4]]
    assert ds["loss_mask"] == [MASK[0][:16], MASK[1], MASK[4]]
    assert ds["source_index"] == [0, 1, 4] and ds["length"] == [16, 3, 4]
    assert lengths.dtype == np.int32 and lengths.tolist() == [16, 3, 4]
    assert stats["total_tokens"] == 23 and stats["assistant_tokens"] == 6 + 2 + 2
    # overflow: drop and error follow data.overflow like text does
    rc, _ = _tokenize(capsys, tmp_path / "src", tmp_path / "drop", "--max-len", "16", "--overflow", "drop")
    assert rc == 0 and _outputs(tmp_path / "drop")[2]["dropped"]["too_long"] == 1
    rc, err = _tokenize(capsys, tmp_path / "src", tmp_path / "err", "--max-len", "16", "--overflow", "error")
    assert rc != 0 and "row 0 has 20 tokens > data.max_len=16" in err
    # deterministic bytes (issue 19): a second run into another folder gives the same files, the dataset's
    # fingerprint is its content hash, and the seconds are in timings.json, not stats.json
    rc, _ = _tokenize(capsys, tmp_path / "src", tmp_path / "again", "--max-len", "16")
    assert rc == 0
    for a in sorted(p for p in (tmp_path / "out").rglob("*") if p.is_file() and p.name != "timings.json"):
        assert a.read_bytes() == (tmp_path / "again" / a.relative_to(tmp_path / "out")).read_bytes(), a
    state = json.loads((tmp_path / "out" / "dataset" / "state.json").read_text())
    assert state["_fingerprint"] == stats["content_sha256"][:16] and "seconds" not in stats


def test_parquet_without_a_mask_trains_every_token_and_labels_work_as_a_mask(tmp_path, capsys):
    keep = [r for r in IDS if r]
    pq.write_table(
        pa.table({"input_ids": pa.array(keep, type=pa.list_(pa.int64()))}), tmp_path / "ids.parquet", row_group_size=2
    )
    rc, err = _tokenize(capsys, tmp_path / "ids.parquet", tmp_path / "out", "--max-len", "4096")
    assert rc == 0, err
    ds, lengths, stats = _outputs(tmp_path / "out")
    assert stats["loss_mask"]["column"] is None and "every token is trained" in stats["loss_mask"]["rule"]
    assert ds["input_ids"] == keep and ds["loss_mask"] == [[1] * len(r) for r in keep]
    assert lengths.tolist() == [len(r) for r in keep] and stats["truncated"] == 0
    # -100 labels: trained where != -100; a row with every trained token past max_len is dropped as such
    labels = [[-100] * 16 + [1] * 4, [-100, 8, 9]]
    pq.write_table(pa.table({"input_ids": [IDS[0], IDS[1]], "labels": labels}), tmp_path / "lab.parquet")
    rc, err = _tokenize(capsys, tmp_path / "lab.parquet", tmp_path / "lab", "--max-len", "16")
    assert rc == 0, err
    ds, _, stats = _outputs(tmp_path / "lab")
    assert stats["dropped"]["no_assistant_tokens_after_truncation"] == 1 and ds["loss_mask"] == [[0, 1, 1]]


def test_bad_pretokenized_rows_are_refused_with_the_row(tmp_path, capsys):
    pq.write_table(pa.table({"input_ids": [[1, 2], None, [3]]}), tmp_path / "null.parquet")
    rc, err = _tokenize(capsys, tmp_path / "null.parquet", tmp_path / "o1")
    assert rc != 0 and re.search(r"1 null row.*first at row 1", err), err
    pq.write_table(pa.table({"input_ids": [[1, 2], [3]], "loss_mask": [[1, 1], [1, 0]]}), tmp_path / "mis.parquet")
    rc, err = _tokenize(capsys, tmp_path / "mis.parquet", tmp_path / "o2")
    assert rc != 0 and re.search(r"1 row\(s\) whose length differs.*first at row 1", err), err
    pq.write_table(pa.table({"input_ids": [[1, -100]]}), tmp_path / "neg.parquet")
    rc, err = _tokenize(capsys, tmp_path / "neg.parquet", tmp_path / "o3")
    assert rc != 0 and "outside 0" in err and not (tmp_path / "o3" / "lengths.npy").exists()


def test_a_parquet_of_chat_records_is_still_tokenized_and_says_so(tmp_path, capsys):
    rows = [{"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."}]}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "chat.parquet")
    rc, err = _tokenize(capsys, tmp_path / "chat.parquet", tmp_path / "out")
    assert rc == 0, err
    ds, lengths, stats = _outputs(tmp_path / "out")
    assert stats["input"] == "chat records" and stats["tokenizer"] and stats["samples"] == 1
    assert lengths[0] == len(ds["input_ids"][0]) > 5
