"""lenbatch_study.pipeline.outputs: one writer per output directory, and outputs replaced whole (issue 11.3, 11.4)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lenbatch_study.cli import main
from lenbatch_study.pipeline.outputs import staged_output, writer_lock

REPO = Path(__file__).resolve().parents[2]
HOLD = ("import sys; from lenbatch_study.pipeline.outputs import writer_lock\n"
        "with writer_lock(sys.argv[1], stage='test'):\n"
        "    print('locked', flush=True); sys.stdin.read()\n")


def _holder(out: Path) -> subprocess.Popen:
    """Another process that holds the writer lock of ``out`` until its stdin closes."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_writer_of_a_stage_directory_is_refused_and_the_first_output_survives(tmp_path, capsys):
    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.random.default_rng(0).integers(10, 2000, size=500).astype(np.int32))
    out = tmp_path / "boundaries"
    args = ["boundaries", "--params", str(REPO / "params.yaml"), "--lengths", str(lengths), "--sweep-max-buckets",
            "3", "--out", str(out)]
    assert main([*args, "--num-buckets", "3"]) == 0
    first = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    holder = _holder(out)
    try:
        capsys.readouterr()
        assert main([*args, "--num-buckets", "5"]) == 2
        err = capsys.readouterr().err
        assert f"{out} is being written by another run (lenbatch test, pid {holder.pid})" in err
        assert "another --out" in err and len(err.strip().splitlines()) == 1
        assert main(["tokenize", "--params", str(REPO / "params.yaml"), "--out", str(out)]) == 2
    finally:
        holder.stdin.close()
        holder.wait()
    # boundaries.json, by-strategy/ and params.json agree (K=3)
    assert {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()} == first
    assert json.loads((out / "params.json").read_text())["boundaries"]["num_buckets"] == 3
    assert main([*args, "--num-buckets", "5"]) == 0  # the lock went with its holder
    assert json.loads((out / "boundaries.json").read_text())["num_buckets"] == 5
    assert json.loads((out / "params.json").read_text())["boundaries"]["num_buckets"] == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["boundaries", "lengths.npy"]  # no lock or staging left


def test_staged_output_replaces_whole_keeps_hidden_files_and_survives_failure(tmp_path):
    out = tmp_path / "stage"
    with staged_output(out, stage="test") as tmp:
        (tmp / "a.json").write_text("1")
        (tmp / "b.json").write_text("1")
    (out / ".gitignore").write_text("/big\n")  # e.g. written by dvc
    with pytest.raises(RuntimeError):
        with staged_output(out, stage="test") as tmp:
            (tmp / "a.json").write_text("2")
            raise RuntimeError("killed half-way")
    assert {p.name: p.read_text() for p in out.iterdir()} == {"a.json": "1", "b.json": "1", ".gitignore": "/big\n"}
    (tmp_path / ".stage.staging-1").mkdir()  # left by a killed writer
    with staged_output(out, stage="test") as tmp:
        (tmp / "a.json").write_text("3")
    # what the new run did not write is carried over (hard links), not lost
    assert {p.name: p.read_text() for p in out.iterdir()} == {"a.json": "3", "b.json": "1", ".gitignore": "/big\n"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stage"]


def test_a_directory_that_is_not_a_stage_output_is_never_swapped_away(tmp_path, monkeypatch):
    mine = tmp_path / "work"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    (mine / "stats.json").write_text("old")
    with staged_output(mine, stage="test") as tmp:  # e.g. --out work, a folder of the user's
        (tmp / "stats.json").write_text("new")
        (tmp / "params.json").write_text("{}")
    assert {p.name: p.read_text() for p in mine.iterdir()} == {"notes.txt": "keep me", "stats.json": "new",
                                                               "params.json": "{}"}
    monkeypatch.chdir(mine)
    with staged_output(".", stage="test") as tmp:  # --out . : the current directory stays where it is
        (tmp / "stats.json").write_text("newer")
    assert Path.cwd().samefile(mine) and (mine / "stats.json").read_text() == "newer"
    assert (mine / "notes.txt").read_text() == "keep me"


def test_writer_lock_is_exclusive_across_processes_and_released_on_death(tmp_path):
    out = tmp_path / "run"
    holder = _holder(out)
    try:
        with pytest.raises(ValueError, match=rf"being written by another run \(lenbatch test, pid {holder.pid}\)"):
            with writer_lock(out, stage="train"):
                pass
    finally:
        holder.kill()  # SIGKILL: no clean release, the kernel drops the lock
        holder.wait()
    with writer_lock(out, stage="train"):
        pass
