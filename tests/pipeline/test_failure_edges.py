"""Failures at the edges: a write the file system refuses (disk full, file too large, an immutable or read-only
entry) and a checkpoint or summary that cannot be used. Each ends with an exit code and one line naming the
path and the way out (or, where the run can go on, a log line and a complete run), never a traceback, and
never costs the previous complete output.

The refused writes are real: ``RLIMIT_FSIZE`` in the child (writes past it fail with EFBIG; any user), a
small tmpfs in a private mount namespace (ENOSPC; root and ``unshare``), ``chattr +i`` (root, a file system
with the flag), and a read-only folder written by an unprivileged user.
"""

from __future__ import annotations

import errno
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from lenbatch_study.cli import main
from lenbatch_study.stages.train import partial_dir

from _runs import tiny_tokenized
from _tiny import ENV, TINY_DATA, TINY_MODEL

REPO = Path(__file__).resolve().parents[2]
TINY = {
    "data": TINY_DATA,
    "model": TINY_MODEL,
    "drafter": {"num_layers": 1, "num_heads": 2, "anchors_per_seq": 1},
    "batching": {"token_budget": 2048, "max_batch_size": 8},
    "train": {
        "nproc": 1,
        "useful_tokens": 20000,
        "warmup_steps": 1,
        "threads": 1,
        "device": "cpu",
        "checkpoint_every": 2,
    },
}
# below the tiny run's checkpoint (~180 KB), above every other file a train or stats run writes
CHECKPOINT_LIMIT = 64 * 1024
STATS_LIMIT = 8 * 1024  # below stats' histogram.png (~22 KB)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("edges")
    params, data = tiny_tokenized(root, TINY)
    return {"root": root, "params": params, "data": data}


def _params(tiny) -> list[str]:
    return ["--params", str(REPO / "params.yaml"), str(tiny["params"])]


def _train(tiny, out: Path, *extra: str) -> list[str]:
    return ["train", *_params(tiny), "--strategy", "random", "--data", str(tiny["data"]), "--out", str(out), *extra]


def _stats(tiny, out: Path, *extra: str) -> list[str]:
    return ["stats", *_params(tiny), "--lengths", str(tiny["data"] / "lengths.npy"), "--out", str(out), *extra]


def _limit_file_size(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def _cli(
    args: list[str], *, fsize: int | None = None, user: int | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``lenbatch <args>`` in a child, its files limited to ``fsize`` bytes (EFBIG past it: Python ignores
    SIGXFSZ), run as ``user`` (root only: setpriv), with ``env`` added to the tests' environment."""
    as_user = ["setpriv", "--reuid", str(user), "--regid", str(user), "--clear-groups"] if user is not None else []
    return subprocess.run(
        [*as_user, sys.executable, "-m", "lenbatch_study", *args],
        env={**ENV, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=_limit_file_size(fsize) if fsize is not None else None,
    )


def _error_line(proc: subprocess.CompletedProcess, stage: str) -> str:
    """The one error line of a failed run (no traceback anywhere in its output)."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith(f"lenbatch {stage}: error: ")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _set_aside(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f"{out.name}.set-aside-*.pt"))


def _steps(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]


def _said(capsys, caplog) -> str:
    text = capsys.readouterr().err + "\n" + caplog.text
    caplog.clear()
    assert "Traceback" not in text
    return text


# --------------------------------------------------------------------------- a refused checkpoint write


@pytest.mark.slow
def test_a_refused_checkpoint_write_keeps_the_previous_checkpoint_and_the_run_resumes(tiny):
    """Disk full during train used to leave checkpoint.pt.tmp and no checkpoint (a RuntimeError traceback
    from torch.save), so --resume was impossible. Here the file size limit refuses every checkpoint write."""
    root = tiny["root"]
    out = root / "fsize"
    partial = partial_dir(out)
    assert main(_train(tiny, out, "--max-steps", "4")) == 0  # the previous complete output
    before = _files(out)

    # the run's first checkpoint refused: nothing of it to resume, the previous output as it was
    proc = _cli(_train(tiny, out, "--max-steps", "6"), fsize=CHECKPOINT_LIMIT)
    err = _error_line(proc, "train")
    assert proc.returncode == 2
    assert f"could not write the checkpoint of step 2 to {partial / 'checkpoint.pt.tmp'} (File too large)" in err
    assert "no earlier checkpoint of this run" in err and "raise the file size limit (ulimit -f), then rerun" in err
    assert _files(out) == before and not (partial / "checkpoint.pt.tmp").exists()

    # a later checkpoint refused: the one before it is kept and --resume continues from it. The partial
    # folder is what a fresh run killed after its step-2 checkpoint leaves (that run's checkpoint and log)
    seed = root / "fsize_seed"
    assert main(_train(tiny, seed, "--max-steps", "2")) == 0
    shutil.rmtree(partial)
    partial.mkdir()
    for name in ("checkpoint.pt", "steps.jsonl"):
        shutil.copy2(seed / name, partial / name)
    kept = (partial / "checkpoint.pt").read_bytes()
    proc = _cli(_train(tiny, out, "--max-steps", "6", "--resume"), fsize=CHECKPOINT_LIMIT)
    err = _error_line(proc, "train")
    assert proc.returncode == 2
    assert f"could not write the checkpoint of step 4 to {partial / 'checkpoint.pt.tmp'} (File too large)" in err
    assert f"the previous checkpoint {partial / 'checkpoint.pt'} is kept: raise the file size limit" in err
    assert "then rerun with --resume to continue from it" in err
    assert (partial / "checkpoint.pt").read_bytes() == kept and not (partial / "checkpoint.pt.tmp").exists()
    assert _files(out) == before

    # space again: --resume continues from step 2 to a complete output, swapped in whole
    assert main(_train(tiny, out, "--max-steps", "6", "--resume")) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] == 2 and summary["steps"] == 6 and summary["useful_tokens_per_s"]
    assert [s["step"] for s in _steps(out)] == list(range(6)) and not partial.exists()


@pytest.mark.slow
def test_a_refused_log_write_is_one_line_and_keeps_the_previous_output(tiny):
    """steps.jsonl grows past the file size limit before any checkpoint (train.checkpoint_every 0): the OSError
    of the log's write used to be a traceback."""
    out = tiny["root"] / "fsize_log"
    assert main(_train(tiny, out, "--max-steps", "2")) == 0
    before = _files(out)
    proc = _cli(
        _train(tiny, out, "--max-steps", "6", "--params-json", '{"train": {"checkpoint_every": 0}}'), fsize=1024
    )
    err = _error_line(proc, "train")
    assert proc.returncode == 2
    assert f"could not write into {partial_dir(out)} (File too large)" in err
    assert f"{out} is as it was; after that rerun (this run saved no checkpoint to resume)" in err
    assert _files(out) == before


DISK_FULL_DRIVER = r"""
import json, os, subprocess, sys
mnt, result, *train = sys.argv[1:]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mnt], check=True)
out = os.path.join(mnt, "run")
partial = os.path.join(mnt, ".run.partial")

def run(*extra):
    p = subprocess.run([sys.executable, "-m", "lenbatch_study", *train, "--out", out, *extra], capture_output=True,
                       text=True)
    return {"rc": p.returncode, "stderr": p.stderr}

def files(folder):
    return {n: open(os.path.join(folder, n), "rb").read().hex() for n in sorted(os.listdir(folder))} \
        if os.path.isdir(folder) else None

res = {"previous": run("--max-steps", "4")}
res["before"] = files(out)
ck = os.path.getsize(os.path.join(out, "checkpoint.pt"))
st = os.statvfs(mnt)
filler = os.path.join(mnt, "filler")
with open(filler, "wb") as fh:  # room for one more checkpoint and its log, not for two
    fh.write(b"\0" * (st.f_bavail * st.f_frsize - int(1.5 * ck)))
res["full"] = run("--max-steps", "8")
res["after"] = files(out)
res["partial"] = files(partial)
os.unlink(filler)
res["resumed"] = run("--max-steps", "8", "--resume")
res["final"] = {"summary": json.load(open(os.path.join(out, "summary.json"))),
                "steps": [json.loads(l)["step"] for l in open(os.path.join(out, "steps.jsonl"))],
                "partial_left": os.path.exists(partial)}
json.dump(res, open(result, "w"))
"""


def _private_tmpfs_works(tmp: Path) -> str:
    """'' when this process may mount a tmpfs in a private mount namespace, else why not."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    if shutil.which("unshare") is None:
        return "no unshare command"
    (tmp / "probe").mkdir()
    proc = subprocess.run(
        ["unshare", "--mount", "mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(tmp / "probe")],
        capture_output=True,
        text=True,
    )
    return "" if proc.returncode == 0 else f"unshare --mount cannot mount a tmpfs here: {proc.stderr.strip()[:200]}"


@pytest.mark.slow
def test_a_full_disk_during_train_keeps_the_last_checkpoint_and_the_run_resumes(tiny, tmp_path):
    """The real thing: a tmpfs in a private mount namespace (nothing outside the test sees it) with room for one
    checkpoint more than the previous output: the periodic checkpoint at step 4 finds the disk full."""
    why = _private_tmpfs_works(tmp_path)
    if why:
        pytest.skip(why)
    (tmp_path / "mnt").mkdir()
    driver = tmp_path / "driver.py"
    driver.write_text(DISK_FULL_DRIVER)
    result = tmp_path / "result.json"
    train = _train(tiny, Path("unused"))[:-2]  # the args before --out
    subprocess.run(
        ["unshare", "--mount", sys.executable, str(driver), str(tmp_path / "mnt"), str(result), *train],
        check=True,
        env=ENV,
        timeout=900,
    )
    res = json.loads(result.read_text())
    partial = tmp_path / "mnt" / ".run.partial"
    assert res["previous"]["rc"] == 0, res["previous"]["stderr"][-2000:]
    full = res["full"]
    assert full["rc"] == 2 and "Traceback" not in full["stderr"], full["stderr"][-3000:]
    assert (
        f"could not write the checkpoint of step 4 to {partial / 'checkpoint.pt.tmp'} (No space left on device)"
        in full["stderr"]
    )
    assert (
        f"the previous checkpoint {partial / 'checkpoint.pt'} is kept: free space, then rerun with --resume"
        in full["stderr"]
    )
    assert res["after"] == res["before"]  # the previous complete output, byte for byte
    assert sorted(res["partial"]) == ["checkpoint.pt", "steps.jsonl"]  # the step-2 checkpoint, no temp file
    assert res["resumed"]["rc"] == 0, res["resumed"]["stderr"][-3000:]
    final = res["final"]
    assert final["summary"]["resumed_from_step"] == 2 and final["summary"]["steps"] == 8
    assert final["steps"] == list(range(8)) and not final["partial_left"]


def test_a_file_written_atomically_is_whole_or_as_it_was(tmp_path):
    """train's summary.json: a refused write leaves the previous file and no temp file."""
    path = tmp_path / "summary.json"
    path.write_text("previous\n")
    code = (
        "import sys; from lenbatch_study.core.files import write_atomic\n"
        "try:\n    write_atomic(sys.argv[1], 'x' * 8192)\n"
        "except OSError as err:\n    print(err.errno); raise SystemExit(3)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        env=ENV,
        capture_output=True,
        text=True,
        preexec_fn=_limit_file_size(1024),
    )
    assert proc.returncode == 3 and proc.stdout.strip() == str(errno.EFBIG), proc.stderr
    assert path.read_text() == "previous\n" and sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


@pytest.mark.slow
def test_a_staged_stage_whose_write_is_refused_keeps_its_previous_output(tiny):
    out = tiny["root"] / "stats_fsize"
    assert main(_stats(tiny, out)) == 0
    before = _files(out)
    proc = _cli(_stats(tiny, out, "--params-json", '{"stats": {"histogram_bins": 9}}'), fsize=STATS_LIMIT)
    err = _error_line(proc, "stats")
    assert proc.returncode == 2
    assert re.search(
        rf"could not write into {re.escape(str(out.parent))}/\.stats_fsize\.staging-\d+ \(File too "
        r"large\): .*ulimit -f",
        err,
    ), err
    assert f"{out} keeps its previous output" in err
    assert _files(out) == before and not list(out.parent.glob(".stats_fsize.staging-*"))


# --------------------------------------------------------------------------- checkpoints and summaries


@pytest.mark.slow
def test_a_checkpoint_whose_tensors_do_not_fit_is_set_aside_and_training_starts_from_fresh_weights(
    tiny, capsys, caplog
):
    """Same params (the fingerprint matches), tensors of another drafter: load_state_dict's size mismatch used
    to be a RuntimeError traceback on every --resume. Checked before anything is loaded, so the afresh run
    trains exactly as a fresh run does."""
    import torch

    out = tiny["root"] / "shape"
    assert main(_train(tiny, out, "--max-steps", "2")) == 0
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    name = next(k for k, v in state["drafter"].items() if v.dim() == 2)
    rows, cols = state["drafter"][name].shape
    state["drafter"][name] = torch.zeros(rows + 1, cols)
    torch.save(state, out / "checkpoint.pt")
    bad = (out / "checkpoint.pt").read_bytes()
    capsys.readouterr()
    caplog.clear()
    assert main(_train(tiny, out, "--max-steps", "3", "--resume")) == 0
    said = _said(capsys, caplog)
    assert f"checkpoint {out / 'checkpoint.pt'} does not fit this drafter ({name} is ({rows + 1}, {cols})" in said
    assert "training afresh" in said and [p.read_bytes() for p in _set_aside(out)] == [bad]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] is None and summary["steps"] == 3 and summary["useful_tokens_per_s"]
    fresh = tiny["root"] / "shape_fresh"
    assert main(_train(tiny, fresh, "--max-steps", "3")) == 0
    assert [s["loss"] for s in _steps(out)] == [s["loss"] for s in _steps(fresh)]


@pytest.mark.slow
def test_a_torn_summary_beside_a_finished_checkpoint_is_set_aside_not_read(tiny, capsys, caplog):
    """--resume of a finished run read its summary.json with json.loads: a torn one was a JSONDecodeError
    naming no file, on every rerun. Now it counts as missing: the checkpoint is set aside, the run retrains."""
    out = tiny["root"] / "torn"
    assert main(_train(tiny, out, "--max-steps", "2")) == 0
    text = (out / "summary.json").read_text()
    (out / "summary.json").write_text(text[: len(text) // 2])
    ck = (out / "checkpoint.pt").read_bytes()
    capsys.readouterr()
    caplog.clear()
    assert main(_train(tiny, out, "--max-steps", "2", "--resume")) == 0
    said = _said(capsys, caplog)
    assert f"{out / 'summary.json'} is not valid JSON" in said and "training afresh" in said
    assert [p.read_bytes() for p in _set_aside(out)] == [ck]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["useful_tokens_per_s"] and summary["resumed_from_step"] is None


# --------------------------------------------------------------------------- entries the file system protects


def _immutable(path: Path) -> str:
    """'' after ``chattr +i path``, else why it cannot be set."""
    if os.geteuid() != 0:
        return "chattr +i needs root"
    if shutil.which("chattr") is None:
        return "no chattr command"
    proc = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    return "" if proc.returncode == 0 else f"chattr +i is not supported here: {proc.stderr.strip()[:200]}"


def _mutable(folder: Path) -> None:
    """Lift every immutable flag beside and under ``folder`` (hidden entries included) so pytest can clean up."""
    for p in [folder.parent, *folder.parent.rglob("*")]:
        if not p.is_symlink():
            subprocess.run(["chattr", "-i", str(p)], capture_output=True)


@pytest.mark.slow
def test_an_immutable_file_inside_the_previous_output_never_costs_the_new_one(tiny, capsys, caplog, tmp_path):
    """The swap renames the folder (allowed); deleting the previous copy then fails on the immutable file. It
    used to be a PermissionError traceback (exit 1) after the new output was in place; now the new output
    stands (exit 0) and a warning names the copy left behind."""
    out = tmp_path / "st"
    assert main(_stats(tiny, out)) == 0
    try:
        why = _immutable(out / "stats.json")
        if why:
            pytest.skip(why)
        capsys.readouterr()
        caplog.clear()
        assert main(_stats(tiny, out, "--params-json", '{"stats": {"histogram_bins": 9}}')) == 0
        said = _said(capsys, caplog)
        assert json.loads((out / "params.json").read_text())["stats"]["histogram_bins"] == 9
        left = [p for p in tmp_path.iterdir() if p.name.startswith(".st.staging-")]
        assert len(left) == 1 and (left[0] / "stats.json").exists()
        assert (
            f"the previous one's copy {left[0]} could not be deleted: {left[0] / 'stats.json'} (Operation not "
            "permitted)"
        ) in said and "chattr -i" in said
    finally:
        _mutable(out)


@pytest.mark.slow
def test_an_immutable_output_folder_is_one_line_and_keeps_the_previous_output(tiny, capsys, tmp_path):
    """The swap itself is refused (renameat2: EPERM): it used to be a PermissionError traceback with the staging
    folder left behind."""
    out = tmp_path / "st"
    assert main(_stats(tiny, out)) == 0
    before = _files(out)
    try:
        why = _immutable(out)
        if why:
            pytest.skip(why)
        capsys.readouterr()
        assert main(_stats(tiny, out, "--params-json", '{"stats": {"histogram_bins": 9}}')) == 2
        err = capsys.readouterr().err.strip()
        assert "Traceback" not in err and len(err.splitlines()) == 1
        assert err.startswith(f"lenbatch stats: error: could not write {out} (Operation not permitted)")
        assert "chattr -i" in err and f"{out} keeps its previous output" in err
        assert _files(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["st"]
    finally:
        _mutable(out)


@pytest.mark.slow
def test_a_read_only_folder_inside_the_previous_output_as_an_unprivileged_user(tiny):
    """chmod stops no write of root's, so this runs as nobody when the tests run as root: the swap renames the
    folder (the parent is writable); the previous copy's read-only folder cannot be emptied, so it stays,
    named in a warning, and the new output stands."""
    user = None
    if os.geteuid() == 0:
        import pwd

        try:
            user = pwd.getpwnam("nobody").pw_uid
        except KeyError:
            pytest.skip("no user 'nobody' to run as")
        if shutil.which("setpriv") is None:
            pytest.skip("no setpriv command to run as nobody")
    work = Path(tempfile.mkdtemp(prefix="lenbatch-ro-"))
    try:
        os.chmod(work, 0o755)
        for name in ("tiny.yaml",):
            shutil.copy2(tiny["params"], work / name)
        shutil.copy2(tiny["data"] / "lengths.npy", work / "lengths.npy")
        if user is not None:
            os.chown(work, user, user)
            for p in work.iterdir():
                os.chown(p, user, user)
        out = work / "st"
        args = [
            "stats",
            "--params",
            str(REPO / "params.yaml"),
            str(work / "tiny.yaml"),
            "--lengths",
            str(work / "lengths.npy"),
            "--out",
            str(out),
        ]
        mpl = {"MPLCONFIGDIR": str(work / ".matplotlib")}  # a folder the user may write
        first = _cli(args, user=user, env=mpl)
        if first.returncode and user is not None and "Traceback" in first.stderr and "Permission" in first.stderr:
            pytest.skip(f"nobody cannot run this Python or read the project here: {first.stderr[-300:]!r}")
        assert first.returncode == 0, first.stderr[-2000:]
        (out / "notes").mkdir()
        (out / "notes" / "n.txt").write_text("mine\n")
        if user is not None:
            for p in (out / "notes", out / "notes" / "n.txt"):
                os.chown(p, user, user)
        os.chmod(out / "notes", 0o555)
        proc = _cli([*args, "--params-json", '{"stats": {"histogram_bins": 9}}'], user=user, env=mpl)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert json.loads((out / "params.json").read_text())["stats"]["histogram_bins"] == 9
        left = [p for p in work.iterdir() if p.name.startswith(".st.staging-")]
        assert len(left) == 1 and (left[0] / "notes" / "n.txt").read_text() == "mine\n"
        assert f"could not be deleted: {left[0] / 'notes' / 'n.txt'} (Permission denied)" in proc.stderr
    finally:
        for p in work.rglob("*"):
            if p.is_dir():
                os.chmod(p, 0o755)
        shutil.rmtree(work)


# --------------------------------------------------------------------------- inputs


def test_a_garbage_parquet_source_given_to_tokenize_names_the_file(tiny, tmp_path, capsys):
    """The workflow refuses it when it starts (corpus/sources.py's check_source); ``lenbatch tokenize --source`` read its
    schema first and said only pyarrow's "Parquet magic bytes not found in footer", naming no file."""
    garbage = tmp_path / "chats.parquet"
    garbage.write_bytes(b"PAR1 this is not parquet")
    out = tmp_path / "tok"
    shutil.copytree(tiny["data"], out)  # a previous tokenize output
    before = _files(out)
    capsys.readouterr()
    assert (
        main(["tokenize", *_params(tiny), "--source", str(garbage), "--limit", "4", "--no-progress", "--out", str(out)])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert f"data.source {garbage} is not a readable Parquet file" in err and "give a Parquet, JSON or JSONL" in err
    assert _files(out) == before
