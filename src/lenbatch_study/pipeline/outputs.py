"""One writer per output directory, and stage outputs that appear whole or not at all.

Two mechanisms every stage shares:

* :func:`writer_lock` -- an exclusive ``flock`` on ``.<name>.lock`` beside the output directory
  ``<name>``. A second ``lenbatch`` process writing the same directory is refused at once with a
  ``ValueError`` naming the directory and the holder's pid (no waiting: two runs into one directory
  is a mistake, not a queue). The kernel drops the lock when its holder dies, so a killed run never
  leaves a stale lock; the file itself is removed on a clean release.
* :func:`staged_output` -- the stage writes into a fresh sibling directory ``.<name>.staging-<pid>``;
  on success it is swapped with ``<name>`` in one ``renameat2(RENAME_EXCHANGE)`` (two renames
  where the file system lacks it), so a reader sees either the previous complete output or the new
  one, never a mix (e.g. a new ``dataset/`` beside old ``lengths.npy``). On failure or a kill the
  previous output stays as it was, with the ``params.json`` that produced it; a staging directory
  left by a kill is removed by the next writer. Entries of the previous directory that the new run
  does not write (``.gitignore`` written by DVC, say) are carried over by hard links. Cost: one
  directory rename; the old copy is deleted after. A directory that is not a previous stage output
  (no ``params.json`` but other files, or the current directory) is never swapped away: the new
  entries replace the old ones one by one instead.

The train stage appends to its directory across ``--resume`` and so takes only the lock
(see :mod:`lenbatch_study.runtime.checkpoint` for how a run owns its directory).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def lock_path(out: str | Path) -> Path:
    out = Path(out).absolute()
    return out.parent / f".{out.name}.lock"


@contextlib.contextmanager
def writer_lock(out: str | Path, *, stage: str) -> Iterator[Path]:
    """Hold the one-writer lock of ``out`` for the ``with`` body; ``ValueError`` if another process holds it."""
    out = Path(out)
    path = lock_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ValueError(f"{out} is being written by another run ({holder}); wait for it to finish or pass "
                             f"another --out (lock: {path})") from None
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
    return [p for p in out.parent.glob(f".{out.name}.staging-*")] + list(out.parent.glob(f".{out.name}.old-*"))


@contextlib.contextmanager
def staged_output(out: str | Path, *, stage: str) -> Iterator[Path]:
    """Lock ``out``, yield an empty staging directory, and put it in place of ``out`` when the body succeeds.

    On an exception the staging directory is removed and ``out`` is left untouched.
    """
    out = Path(out).absolute()
    with writer_lock(out, stage=stage):
        for stale in _staging_dirs(out):  # left by a killed writer; we hold the lock, so nobody uses them
            shutil.rmtree(stale, ignore_errors=True)
        tmp = out.parent / f".{out.name}.staging-{os.getpid()}"
        tmp.mkdir()
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _commit(tmp, out)


def _link_copy(src: Path, dst: Path) -> None:
    """Copy by hard links (no data copied; the original stays intact), symlinks as symlinks."""
    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:  # a file system without hard links: copy
            shutil.copy2(a, b)

    if src.is_dir() and not src.is_symlink():
        shutil.copytree(src, dst, symlinks=True, copy_function=link)
    elif src.is_symlink():
        os.symlink(os.readlink(src), dst)
    else:
        link(str(src), str(dst))


def _replace_entries(tmp: Path, out: Path) -> None:
    """Fallback for a directory that is not a stage's output: move each new entry over the old one."""
    for entry in sorted(tmp.iterdir()):
        dst = out / entry.name
        if dst.is_dir() and not dst.is_symlink():
            aside = out / f".{entry.name}.old-{os.getpid()}"
            os.rename(dst, aside)
            os.rename(entry, dst)
            shutil.rmtree(aside)
        else:
            os.replace(entry, dst)
    tmp.rmdir()


def _commit(tmp: Path, out: Path) -> None:
    if not out.exists():
        os.rename(tmp, out)
        return
    if not out.is_dir():
        shutil.rmtree(tmp, ignore_errors=True)
        raise ValueError(f"--out {out} is a file, not a directory; remove it or pass another --out")
    foreign = [e for e in out.iterdir() if not (tmp / e.name).exists()]
    cwd = Path.cwd().absolute()
    if (foreign and not (out / "params.json").exists()) or cwd == out or out in cwd.parents:
        # not a previous output of a stage (e.g. --out .): never swap such a directory away
        _replace_entries(tmp, out)
        return
    for entry in foreign:  # e.g. DVC's .gitignore, or files another tool keeps there: they stay
        _link_copy(entry, tmp / entry.name)
    if _exchange(tmp, out):
        shutil.rmtree(tmp)  # now holds the previous output
        return
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old)


__all__ = ["lock_path", "staged_output", "writer_lock"]
