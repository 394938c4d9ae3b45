"""The data source's identity (corpus/identity.py): by content, a folder by its files, the stat cache only a cache."""

from __future__ import annotations

import json
import os

import pytest

from lenbatch_study.corpus.identity import STAT_CACHE, source_identity, write_if_changed


def test_the_identity_follows_the_bytes_not_the_file_time(tmp_path):
    data = tmp_path / "chats.jsonl"
    data.write_text('{"messages": []}\n')
    out = tmp_path / "source" / "source.json"
    assert write_if_changed(str(data), out)
    first = out.read_bytes()
    os.utime(data, (1e9, 1e9))  # touched: rehashed (the stat changed), same bytes, file left alone
    assert not write_if_changed(str(data), out) and out.read_bytes() == first
    with data.open("a") as fh:
        fh.write('{"messages": []}\n')
    assert write_if_changed(str(data), out)
    assert json.loads(out.read_text())["bytes"] == data.stat().st_size
    # a stale cache entry is never trusted when the stat differs
    cache = json.loads((out.parent / STAT_CACHE).read_text())
    (out.parent / STAT_CACHE).write_text(json.dumps({**cache, "sha256": "0" * 64}))
    with data.open("a") as fh:
        fh.write("\n")
    assert source_identity(str(data), cache_dir=out.parent)["sha256"] != "0" * 64


def test_a_folder_counts_each_file_and_its_name(tmp_path):
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "state.json").write_text("{}")
    (folder / "data-00000.arrow").write_bytes(b"abc")
    one = source_identity(str(folder))
    assert one["files"] == 2 and one["bytes"] == 5 and one["format"] == "arrow_dir"
    (folder / "data-00000.arrow").rename(folder / "data-00001.arrow")
    assert source_identity(str(folder))["sha256"] != one["sha256"]


def test_a_missing_source_names_the_setting(tmp_path):
    with pytest.raises(ValueError, match="data.source"):
        source_identity(str(tmp_path / "nope.jsonl"))


def test_the_source_stage_says_how_a_temp_experiment_finds_the_file(tmp_path):
    """`lenbatch source` is the first stage of a `dvc exp run --temp`: a file neither git nor DVC holds is
    missing there, and the error names the `dvc add` that fixes it (exit 2, one line)."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lenbatch_study",
            "source",
            "--params",
            str(repo / "params.yaml"),
            '{"data": {"source": "data/absent.jsonl"}}',
            "--out",
            str(tmp_path / "source"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and "dvc add data/absent.jsonl" in proc.stderr, proc.stderr
    assert not (tmp_path / "source").exists()
