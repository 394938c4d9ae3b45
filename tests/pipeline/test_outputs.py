"""lenbatch_study.pipeline.outputs: one writer per output directory, and outputs replaced whole."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lenbatch_study.cli import main
from lenbatch_study.pipeline.outputs import check_out, output_owner, staged_output, writer_lock

REPO = Path(__file__).resolve().parents[2]
HOLD = (
    "import sys; from lenbatch_study.pipeline.outputs import writer_lock\n"
    "with writer_lock(sys.argv[1], stage='test'):\n"
    "    print('locked', flush=True); sys.stdin.read()\n"
)


def _holder(out: Path) -> subprocess.Popen:
    """Another process that holds the writer lock of ``out`` until its stdin closes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_writer_of_a_stage_directory_is_refused_and_the_first_output_survives(tmp_path, capsys):
    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.random.default_rng(0).integers(10, 2000, size=500).astype(np.int32))
    out = tmp_path / "boundaries"
    args = [
        "boundaries",
        "--params",
        str(REPO / "params.yaml"),
        "--lengths",
        str(lengths),
        "--sweep-max-buckets",
        "3",
        "--out",
        str(out),
    ]
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


def test_staged_output_replaces_whole_keeps_only_hidden_files_and_survives_failure(tmp_path):
    out = tmp_path / "stage"
    with staged_output(out, stage="test") as tmp:
        (tmp / "a.json").write_text("1")
        (tmp / "b.json").write_text("1")
        (tmp / "params.json").write_text("1")  # what every stage writes: a stage's output
    (out / ".gitignore").write_text("/big\n")  # e.g. written by dvc
    with pytest.raises(RuntimeError):
        with staged_output(out, stage="test") as tmp:
            (tmp / "a.json").write_text("2")
            raise RuntimeError("killed half-way")
    mark = (out / "lenbatch-output.json").read_text()
    assert json.loads(mark) == {
        "stage": "test",
        "params_sha256": "6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b",
    }
    assert {p.name: p.read_text() for p in out.iterdir()} == {
        "a.json": "1",
        "b.json": "1",
        "params.json": "1",
        ".gitignore": "/big\n",
        "lenbatch-output.json": mark,
    }
    (tmp_path / ".stage.staging-1").mkdir()  # left by a killed writer
    with staged_output(out, stage="test") as tmp:
        (tmp / "a.json").write_text("3")
        (tmp / "params.json").write_text("3")
    # hidden files the new run did not write are carried over (copied); the previous run's b.json is not:
    # the output holds only this run's files
    assert {p.name for p in out.iterdir()} == {"a.json", "params.json", ".gitignore", "lenbatch-output.json"}
    assert (out / "a.json").read_text() == "3" and (out / ".gitignore").read_text() == "/big\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stage"]


def test_a_folder_that_is_not_a_stage_output_is_refused_untouched(tmp_path, monkeypatch):
    mine = tmp_path / "work"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    (mine / "params.json").write_text('{"dim": 4096}')  # a common name is no mark of a stage's output
    ran = []
    with pytest.raises(
        ValueError,
        match=r"already holds files that no lenbatch stage wrote \(notes.txt, params.json; "
        r"no lenbatch-output.json\).*pass a new or empty folder as --out",
    ):
        with staged_output(mine, stage="test") as tmp:
            ran.append(tmp)
    assert not ran  # refused before the stage ran
    assert {p.name: p.read_text() for p in mine.iterdir()} == {"notes.txt": "keep me", "params.json": '{"dim": 4096}'}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]
    (mine / "notes.txt").unlink()
    (mine / "params.json").unlink()
    (mine / ".hidden").write_text("carried over")  # only hidden entries: nothing is lost, they carry over
    with staged_output(mine, stage="test") as tmp:
        (tmp / "stats.json").write_text("new")
    assert output_owner(mine) == "test" and (mine / ".hidden").read_text() == "carried over"
    with pytest.raises(
        ValueError,
        match=r"holds the output of lenbatch test \(its lenbatch-output.json\), not of "
        r"lenbatch other.*pass another --out",
    ):
        with staged_output(mine, stage="other"):
            pass
    # --out . or a parent of it: refused before the stage runs (the current folder cannot be swapped away)
    monkeypatch.chdir(mine)
    before = _snapshot(mine)
    for given, where in ((".", "the current folder"), ("..", "a parent of the current folder")):
        with pytest.raises(ValueError, match=rf"--out \{given} is {where}.*pass a sub-folder as --out"):
            check_out(given, stage="test")
    assert check_out("sub", stage="test") == mine.resolve() / "sub" and _snapshot(mine) == before


def test_a_checkpoint_folder_with_a_params_json_given_as_out_is_refused_and_keeps_its_weights(tmp_path, capsys):
    """The probe of issue 48: a Meta-Llama checkpoint folder (it ships a params.json) as a stage's --out was
    taken for an old output and replaced whole, exit 0, its weights deleted."""
    ckpt = tmp_path / "m"
    ckpt.mkdir()
    (ckpt / "params.json").write_text('{"dim": 4096, "n_layers": 32}')
    (ckpt / "consolidated.00.pth").write_bytes(np.random.default_rng(0).bytes(100_000))
    before = _snapshot(ckpt)
    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.arange(10, 400, dtype=np.int32))
    rc = main(["stats", "--params", str(REPO / "params.yaml"), "--lengths", str(lengths), "--out", str(ckpt)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert f"--out {ckpt} already holds files that no lenbatch stage wrote (consolidated.00.pth, params.json" in err
    assert "pass a new or empty folder as --out" in err
    assert _snapshot(ckpt) == before and sorted(p.name for p in tmp_path.iterdir()) == ["lengths.npy", "m"]
    # a stage's own output is replaced; another stage's is refused
    out = tmp_path / "stats"
    args = ["stats", "--params", str(REPO / "params.yaml"), "--lengths", str(lengths), "--out", str(out)]
    assert main(args) == 0 and main(args) == 0 and output_owner(out) == "stats"
    assert json.loads((out / "lenbatch-output.json").read_text())["stage"] == "stats"
    capsys.readouterr()
    assert (
        main(["boundaries", "--params", str(REPO / "params.yaml"), "--lengths", str(lengths), "--out", str(out)]) == 2
    )
    assert "holds the output of lenbatch stats" in capsys.readouterr().err


def test_the_committed_results_are_recognised_as_stage_outputs():
    """Every committed output folder carries its stage's mark, so `make run` replaces it; a folder without one
    is refused as any foreign folder is."""
    # quality writes its --out in place (no staged swap, no replace-check), so it carries no mark
    folders = [p.parent for p in (REPO / "results").rglob("params.json") if p.parent.name != "quality"]
    assert len(folders) >= 12  # tokenize, stats, boundaries, plans, profile, train (5), interleave, compare
    assert all(output_owner(f) is not None for f in folders), [f for f in folders if output_owner(f) is None]


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


def _boundaries_args(tmp_path: Path, out) -> list[str]:
    lengths = tmp_path / "lengths.npy"
    if not lengths.exists():
        np.save(lengths, np.random.default_rng(0).integers(10, 2000, size=300).astype(np.int32))
    return [
        "boundaries",
        "--params",
        str(REPO / "params.yaml"),
        "--lengths",
        str(lengths),
        "--num-buckets",
        "3",
        "--sweep-max-buckets",
        "2",
        "--out",
        str(out),
    ]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_out_that_is_contains_or_lies_inside_an_input_is_refused_and_changes_nothing(tmp_path, capsys):
    tok = tmp_path / "tokenize"  # a tokenize output: its stats.json and params.json must survive
    tok.mkdir()
    np.save(tok / "lengths.npy", np.arange(10, 400, dtype=np.int32))
    (tok / "stats.json").write_text('{"dropped": 3}')
    (tok / "params.json").write_text("{}")
    before = _snapshot(tmp_path)
    params = ["--params", str(REPO / "params.yaml")]
    for argv, how in (
        (["stats", *params, "--lengths", str(tok / "lengths.npy"), "--out", str(tok)], "contains"),
        (["train", *params, "--strategy", "random", "--data", str(tok), "--out", str(tok / "sub")], "lies inside"),
        (["train", *params, "--strategy", "random", "--data", str(tok), "--out", str(tok)], "is"),
    ):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"{how} the input" in err and "another --out" in err and len(err.strip().splitlines()) == 1, err
    assert _snapshot(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["tokenize"]


def test_empty_out_and_mount_points_are_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(_boundaries_args(tmp_path, "")) == 2
    assert "--out is empty" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lengths.npy"]  # nothing written into the current folder
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(_boundaries_args(tmp_path, ".")) == 2  # the current folder: refused before the stage runs
    assert "--out . is the current folder" in capsys.readouterr().err
    assert not list(here.iterdir()) and sorted(p.name for p in tmp_path.iterdir()) == ["here", "lengths.npy"]
    # /proc is a mount point on every Linux; / contains mount points (the swap would empty them)
    for path, words in (("/proc", "is or contains the mount point /proc"), ("/", "is or contains the mount point")):
        with pytest.raises(ValueError, match=re.escape(words)):
            check_out(path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="lies under .*file, which is a file"):
        check_out(tmp_path / "file" / "out")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="is a symlink to .*nowhere, which does not exist"):
        check_out(tmp_path / "dangling")


def test_stale_staging_clean_up_touches_only_its_exact_names(tmp_path):
    """`--out 'run[1]'`: the glob .run[1].staging-* matched another output's live .run1.staging-<pid>."""
    live = tmp_path / ".run1.staging-4242"
    live.mkdir()
    (live / "stats.json").write_text("being written")
    stale = tmp_path / ".run[1].staging-4243"  # a killed writer of run[1]: removed
    stale.mkdir()
    assert main(_boundaries_args(tmp_path, tmp_path / "run[1]")) == 0
    assert (live / "stats.json").read_text() == "being written"
    assert not stale.exists() and (tmp_path / "run[1]" / "boundaries.json").exists()


def test_symlinked_out_is_one_folder_one_lock_and_commits_cleanly(tmp_path, capsys):
    real = tmp_path / "real"
    assert main(_boundaries_args(tmp_path, real)) == 0
    alias = tmp_path / "alias"
    alias.symlink_to(real)
    holder = _holder(real)  # a run writing real/: a second writer through the alias is refused
    try:
        capsys.readouterr()
        assert main(_boundaries_args(tmp_path, alias)) == 2
        assert "is being written by another run" in capsys.readouterr().err
    finally:
        holder.stdin.close()
        holder.wait()
    args = _boundaries_args(tmp_path, alias)
    args[args.index("--num-buckets") + 1] = "2"
    assert main(args) == 0  # into a symlink to a previous output: the real folder gets the new output
    assert alias.is_symlink() and json.loads((real / "boundaries.json").read_text())["num_buckets"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alias", "lengths.npy", "real"]  # no staging left


def test_the_lock_file_follows_the_umask_and_another_users_stale_lock_is_one_clear_line(tmp_path):
    """Issue 48.6: the lock file was always 0644 while the outputs follow the umask, so another member of the
    group met a PermissionError traceback at a stale lock (left by a killed run of the first user's)."""
    import os
    import shutil
    import tempfile

    show = (
        "import os, sys; os.umask(0o002); from lenbatch_study.pipeline.outputs import writer_lock\n"
        "with writer_lock(sys.argv[1], stage='test') as p: print(oct(os.stat(p).st_mode & 0o777))"
    )
    proc = subprocess.run([sys.executable, "-c", show, str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "0o664", proc.stderr[-2000:]
    # a stale lock of another user's (root's 0644 file, met by nobody) or one this user may not open
    shared = Path(tempfile.mkdtemp(prefix="lenbatch-lock-"))
    try:
        os.chmod(shared, 0o777)
        lock = shared / ".out.lock"
        lock.write_text("lenbatch stats, pid 1")
        as_user: list[str] = []
        if os.geteuid() == 0:
            import pwd

            if shutil.which("setpriv") is None:
                pytest.skip("no setpriv command to run as nobody")
            try:
                nobody = pwd.getpwnam("nobody").pw_uid
            except KeyError:
                pytest.skip("no user 'nobody' to run as")
            os.chmod(lock, 0o644)
            as_user = ["setpriv", "--reuid", str(nobody), "--regid", str(nobody), "--clear-groups"]
        else:
            os.chmod(lock, 0o444)
        take = (
            "import sys; from lenbatch_study.pipeline.outputs import writer_lock\n"
            "try:\n    with writer_lock(sys.argv[1], stage='test'): pass\n"
            "except ValueError as err:\n    print(err); sys.exit(2)"
        )
        proc = subprocess.run(
            [*as_user, sys.executable, "-c", take, str(shared / "out")], capture_output=True, text=True
        )
        if proc.returncode not in (0, 2) and "Permission" in proc.stderr and "lenbatch_study" in proc.stderr:
            pytest.skip(f"that user cannot run this Python or read the project here: {proc.stderr[-300:]!r}")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
        assert f"its lock file {lock} belongs to user " in proc.stdout and f"rm {lock}" in proc.stdout, proc.stdout
        assert lock.read_text() == "lenbatch stats, pid 1"  # nothing touched
    finally:
        shutil.rmtree(shared, ignore_errors=True)
