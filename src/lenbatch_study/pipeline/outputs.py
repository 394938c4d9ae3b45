"""One writer per output folder (:func:`writer_lock`, an ``flock`` the kernel drops when its holder dies), and
stage outputs that appear whole or not at all (:func:`staged_output`: written beside ``--out``, swapped in with
one ``renameat2(RENAME_EXCHANGE)`` on success, marked as the stage's). What each guarantees, and its test:
docs/reliability.md. Train appends across ``--resume`` and takes only the lock.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import os
import pwd
import re
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Optional

from lenbatch_study.core.files import write_error, write_failure
from lenbatch_study.core.log import get_logger
from lenbatch_study.pipeline.artifacts.writing import MARKER, PARAMS

log = get_logger("outputs")

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def lock_path(out: str | Path) -> Path:
    out = Path(out).absolute()
    return out.parent / f".{out.name}.lock"


def _owner(path: Path) -> str:
    """The user who owns ``path`` (their name, or ``uid N``)."""
    try:
        uid = path.stat().st_uid
    except OSError:
        return "another user"
    with contextlib.suppress(KeyError):
        return f"user {pwd.getpwuid(uid).pw_name}"
    return f"uid {uid}"


@contextlib.contextmanager
def writer_lock(out: str | Path, *, stage: str) -> Iterator[Path]:
    """Hold the one-writer lock of ``out`` for the ``with`` body; ``ValueError`` if another process holds it."""
    out = Path(out)
    path = lock_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        try:
            # 0o666 less the umask, as every file the stage writes: a group that shares the outputs shares the lock
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError as err:
            if not path.exists():
                raise ValueError(
                    f"{out}: cannot create its lock file {path} ({err.strerror}): {path.parent} is not "
                    "writable by this user; fix its permissions or pass another --out"
                ) from None
            owner = _owner(path)
            raise ValueError(
                f"{out}: its lock file {path} belongs to {owner} and this user may not open it (left by "
                f"a run of theirs that was killed, or one still writing {out}); if no run of theirs "
                f"writes {out}, remove it (rm {path}) or ask them to; or pass another --out"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ValueError(
                f"{out} is being written by another run ({holder}); wait for it to finish or pass "
                f"another --out (lock: {path})"
            ) from None
        try:  # the holder before us may have removed the file after we opened it: lock the current one
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"lenbatch {stage}, pid {os.getpid()}".encode())
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths; False where the kernel or file system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _staging_dirs(out: Path) -> list[Path]:
    """Folders a killed writer of ``out`` left: exactly ``.<name>.staging-<pid>`` and ``.<name>.old-<pid>``.

    Compared as strings, never as a glob: a name such as ``run[1]`` is a pattern that matches other
    outputs' staging folders (``.run1.staging-*``), which may be live."""
    found = []
    for prefix in (f".{out.name}.staging-", f".{out.name}.old-"):
        for entry in os.scandir(out.parent):
            if entry.name.startswith(prefix) and entry.name[len(prefix) :].isdigit():
                found.append(out.parent / entry.name)
    return found


def _mount_points() -> list[Path]:
    """Mount points of this process's mount namespace (/proc/self/mountinfo; [] where there is none)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    # field 5 is the mount point, with space, tab, newline and backslash written as octal escapes
    return [Path(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])) for line in lines]


def check_out(out: str | Path, *, inputs: Sequence[str | Path] = (), stage: Optional[str] = None) -> Path:
    """The real folder (symlinks resolved: one lock per real folder) a stage may write for ``--out out``;
    ``ValueError`` naming the flag and the fix for an empty value, a dangling symlink, the current folder or
    a parent of it, a path under a file or an unwritable parent, a folder that is, lies inside or contains one
    of ``inputs``, one that is or holds a mount point (deleting the previous output would empty it) and, with
    ``stage``, :func:`check_replaceable`."""
    if not str(out).strip():
        raise ValueError("--out is empty; give the output folder (e.g. results/stats)")
    given = Path(out)
    if given.is_symlink() and not given.exists():
        raise ValueError(
            f"--out {out} is a symlink to {os.readlink(given)}, which does not exist; remove the link "
            "or create its target"
        )
    real = Path(os.path.realpath(given))
    for parent in real.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"--out {out} lies under {parent}, which is a file; pass another --out")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise ValueError(
                    f"--out {out}: {parent} is not writable by this user; fix its permissions or pass another --out"
                )
            break
    if real.exists() and not real.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder; remove it or pass another --out")
    for item in inputs:
        if not str(item).strip() or not Path(item).exists():
            continue
        inp = Path(os.path.realpath(item))
        if inp == real or real in inp.parents or inp in real.parents:
            how = "is" if inp == real else ("contains" if real in inp.parents else "lies inside")
            raise ValueError(
                f"--out {out} {how} the input {item} of this stage: writing it would replace "
                "that input; pass another --out"
            )
    mounts = [m for m in _mount_points() if m == real or real in m.parents]
    if mounts:
        raise ValueError(
            f"--out {out} is or contains the mount point {mounts[0]}: replacing the folder would "
            "empty that file system; pass another --out"
        )
    cwd = Path.cwd().resolve()
    if real == cwd or real in cwd.parents:
        where = "the current folder" if real == cwd else f"a parent of the current folder {cwd}"
        raise ValueError(
            f"--out {out} is {where}: the stage replaces its --out whole, which would swap away the folder "
            "this shell works in; pass a sub-folder as --out (e.g. --out results/<stage>)"
        )
    if stage is not None:
        check_replaceable(real, stage=stage)
    return real


def output_owner(folder: str | Path) -> Optional[str]:
    """The stage whose output ``folder`` is (its mark's ``stage``), None when it is no stage's."""
    try:
        stage = json.loads((Path(folder) / MARKER).read_text()).get("stage")
    except (OSError, ValueError, AttributeError):  # no mark, a torn one, or not a JSON object
        return None
    return stage if isinstance(stage, str) and stage else None


def check_replaceable(out: str | Path, *, stage: str) -> None:
    """Refuse (``ValueError``) an existing folder ``out`` holding more than hidden entries that is not
    ``stage``'s output (:func:`output_owner`); nothing is touched either way."""
    out = Path(out)
    if not out.is_dir():
        return
    try:
        visible = sorted(e.name for e in os.scandir(out) if not e.name.startswith("."))
    except OSError as err:
        raise ValueError(
            f"--out {out} cannot be listed ({err.strerror}); fix its permissions or pass another --out"
        ) from None
    if not visible:
        return
    owner = output_owner(out)
    if owner is None:
        shown = ", ".join(visible[:4]) + (", ..." if len(visible) > 4 else "")
        raise ValueError(
            f"--out {out} already holds files that no lenbatch stage wrote ({shown}; no {MARKER}): "
            f"lenbatch {stage} replaces its --out whole and would delete them, so nothing was "
            "written; pass a new or empty folder as --out (or, if they are an old output of this stage, delete "
            "the folder and rerun)"
        )
    if owner != stage:
        raise ValueError(
            f"--out {out} holds the output of lenbatch {owner} (its {MARKER}), not of lenbatch "
            f"{stage}: writing there would replace it, so nothing was written; pass another --out"
        )


def _mark(tmp: Path, stage: str) -> None:
    """Write ``tmp``'s mark: the stage and the sha256 of the ``params.json`` it wrote (same bytes for the same
    params, so a deterministic stage's output stays byte for byte the same)."""
    params = tmp / PARAMS
    digest = hashlib.sha256(params.read_bytes()).hexdigest() if params.is_file() else None
    (tmp / MARKER).write_text(json.dumps({"params_sha256": digest, "stage": stage}, indent=2) + "\n")


@contextlib.contextmanager
def staged_output(out: str | Path, *, stage: str) -> Iterator[Path]:
    """Lock ``out``, yield an empty staging directory, and put it in place of ``out`` when the body succeeds.

    On an exception the staging directory is removed and ``out`` is left untouched.
    """
    out = Path(out).absolute()
    with writer_lock(out, stage=stage):
        for stale in _staging_dirs(out):  # left by a killed writer; we hold the lock, so nobody uses them
            shutil.rmtree(stale, ignore_errors=True)
        check_replaceable(out, stage=stage)  # before the stage runs: a folder not ours is refused untouched
        tmp = out.parent / f".{out.name}.staging-{os.getpid()}"
        tmp.mkdir()
        try:
            yield tmp
        except BaseException as err:
            shutil.rmtree(tmp, ignore_errors=True)
            refused = write_failure(err, written=(tmp,))
            if refused is not None:
                raise write_error(
                    refused, path=tmp, then=f"{out} keeps its previous output; rerun the stage after that"
                ) from None
            raise
        _commit(tmp, out, stage=stage)


def _remove_previous(old: Path) -> None:
    """Delete the previous output's copy after a commit; what cannot be deleted (an immutable file, a
    read-only folder) stays, named in a warning: the new output is in place either way."""
    failed: list[str] = []

    def note(_fn: object, path: str, exc: tuple) -> None:
        if getattr(exc[1], "errno", None) != errno.ENOTEMPTY:  # a folder that kept what could not go
            failed.append(f"{path} ({getattr(exc[1], 'strerror', None) or exc[1]})")

    shutil.rmtree(old, onerror=note)
    if failed:
        log.warning(
            "the new output is in place, but the previous one's copy %s could not be deleted: %s; "
            "remove it by hand (lsattr/chattr -i for an immutable file, chmod u+w for a read-only folder)",
            old,
            "; ".join(failed[:3]),
        )


def commit_staged(tmp: Path, out: Path, *, stage: str, then: str = "rerun the stage after that") -> None:
    """Put the complete folder ``tmp`` in place of ``out`` as :func:`staged_output` does (caller holds the lock),
    marked as ``stage``'s output.

    A commit the file system refuses keeps ``tmp`` (it holds a complete run) and raises
    :func:`~lenbatch_study.core.files.write_error` ending in ``then`` (how the caller's rerun picks ``tmp`` up)."""
    _commit(Path(tmp).absolute(), Path(out).absolute(), stage=stage, keep=then)


def _commit(tmp: Path, out: Path, *, stage: str, keep: Optional[str] = None) -> None:
    """Mark ``tmp`` as ``stage``'s output and swap it in for ``out`` (module doc). A swap the file system
    refuses leaves ``out`` as it was and raises :func:`write_error`; ``tmp`` is removed unless ``keep`` says
    how a rerun uses it."""
    try:
        _mark(tmp, stage)
        if not out.exists():
            os.rename(tmp, out)
            return
        for entry in out.iterdir():  # hidden entries (DVC's .gitignore) carry over; nothing else of the previous run
            if entry.name.startswith(".") and not (tmp / entry.name).exists():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.copytree(entry, tmp / entry.name, symlinks=True)
                else:
                    shutil.copy2(entry, tmp / entry.name, follow_symlinks=False)
        old = tmp  # after the exchange it holds the previous output
        if not _exchange(tmp, out):
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.rename(out, old)
            try:
                os.rename(tmp, out)
            except OSError:
                os.rename(old, out)  # the previous output back in its place
                raise
    except OSError as err:
        if keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
        refused = write_failure(err, written=(tmp, out, out.parent))
        if refused is None:
            raise
        then = f"the new output stays in {tmp}; {keep}" if keep is not None else "rerun the stage after that"
        raise write_error(refused, path=out, then=f"{out} keeps its previous output; {then}") from None
    _remove_previous(old)


__all__ = [
    "check_out",
    "check_replaceable",
    "commit_staged",
    "lock_path",
    "output_owner",
    "staged_output",
    "writer_lock",
]
