"""Files written whole, and a refused write explained: :func:`write_atomic` puts a file in place whole or not
at all; :func:`write_failure` tells a write the file system refused (full, quota, size limit, read-only,
permissions, I/O) from a bug, and :func:`write_error` makes it one line saying what to do. What each
guarantees, and its test: docs/reliability.md."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

# errno -> what the user does about it (a write the file system refused, as opposed to a bug)
_WAY_OUT = {
    errno.ENOSPC: "the file system is full: free space on it",
    errno.EDQUOT: "the disk quota is used up: free space or raise the quota",
    errno.EFBIG: "the file is larger than the file system or this process's file size limit (ulimit -f) allows: "
    "raise the limit or write elsewhere",
    errno.EROFS: "the file system is read-only: pass another --out",
    errno.EACCES: "this user may not write there: fix the permissions or pass another --out",
    errno.EPERM: "the file system does not permit it (an immutable file or folder? lsattr shows it, chattr -i "
    "lifts it): fix that or pass another --out",
    errno.EIO: "the device reported an I/O error: check the disk",
}


# errnos only a write gets; the others (EACCES, EPERM, EIO) a read gets too
_WRITE_ONLY = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)


def write_failure(err: BaseException, *, written: Sequence[str | Path]) -> Optional[OSError]:
    """The ``OSError`` with one of the errnos above behind ``err`` (itself, or its cause or context: torch
    wraps a failed ``write`` in a ``RuntimeError``), or None when ``err`` is not a refused write. An errno a
    read gets too counts only when the error names a path at or under one of ``written`` (the folders the
    caller writes): an unreadable input stays the error it is."""
    roots = [os.path.abspath(w) for w in written]
    seen: set[int] = set()
    cur: Optional[BaseException] = err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in _WAY_OUT:
            if cur.errno in _WRITE_ONLY:
                return cur
            named = isinstance(cur.filename, (str, bytes, os.PathLike))
            name = os.path.abspath(os.fsdecode(cur.filename)) if named else None
            if name is not None and any(name == r or name.startswith(r.rstrip(os.sep) + os.sep) for r in roots):
                return cur
        cur = cur.__cause__ or cur.__context__
    return None


def write_error(err: OSError, *, then: str, path: str | Path | None = None) -> ValueError:
    """One line for a refused write: ``could not write <file> (<strerror>): <what to do>; <then>``.

    ``path``: the folder written into, named when ``err`` carries no file name (a failed ``write`` on an
    open file carries none); ``then``: what is kept and the rerun."""
    where = err.filename if err.filename is not None else f"into {path}"
    how = _WAY_OUT.get(err.errno if err.errno is not None else -1, "see the error")
    return ValueError(f"could not write {where} ({err.strerror or err}): {how}; {then}")


def write_atomic(path: str | Path, text: str) -> None:
    """``text`` at ``path`` whole or not at all: written to ``<path>.tmp``, fsynced, renamed over ``path``
    (then the folder fsynced, where the file system allows it, so the rename survives a crash). On any
    failure the temp file is removed, ``path`` is as it was and the error propagates. O(size) plus two fsyncs."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


__all__ = ["write_atomic", "write_error", "write_failure"]
