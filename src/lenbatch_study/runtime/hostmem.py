"""Keep freed host memory in the process, so CPU steps do not page-fault their tensors in again.

glibc's malloc serves every block above its mmap threshold (at most 32 MiB) with a fresh
``mmap`` and returns it with ``munmap`` when freed. A training step on the CPU allocates
and frees the same large activations every step, so each step faults them in again, page
by zeroed page. On the CPU default (token budget 16,384, one thread) that is 80,000 to
233,000 minor faults (0.3-0.9 GB) per step: a 32 x 512 target step takes 1.12-1.22 s
instead of 0.96-1.01 s, the drafter step on it 1.29-1.32 s instead of 0.92-0.95 s, and
step time grows faster than tokens (16 x 512 tokens: 0.48-0.51 s either way for the target).
``mallopt(M_MMAP_MAX, 0)`` serves large blocks from the heap instead and
``mallopt(M_TRIM_THRESHOLD, max)`` keeps freed heap memory in the process, so within the
first steps the allocator reuses pages already mapped. Cost: freed memory stays resident
and fragments: 1,570 MiB after the benchmark's steps, against the system allocator's peak
of 1,341 MiB (+17%).

Measured with ``python benchmarks/bench_hostmem.py``. Only glibc (Linux) has these knobs;
elsewhere :func:`reuse_freed_memory` changes nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import resource

log = logging.getLogger(__name__)

# glibc <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
_TRIM_MAX = 2**31 - 1  # mallopt takes an int: ~2 GiB of free heap top kept, beyond any step's churn


def reuse_freed_memory() -> bool:
    """Make glibc malloc keep and reuse freed memory for the rest of this process.

    Returns True when both settings took (glibc), False where there is no glibc
    ``mallopt`` (macOS, musl): steps then run with the system allocator as before.
    Cost: two library calls; affects only allocations made after it.
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        log.info("host memory: no glibc mallopt here; large tensors use the system allocator as is")
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, _TRIM_MAX))
    if not ok:
        log.warning(
            "host memory: mallopt refused M_MMAP_MAX / M_TRIM_THRESHOLD; large tensors are mapped "
            "afresh every step (slower CPU steps)"
        )
    return ok


def minor_faults() -> int:
    """Minor page faults of this process so far (a fresh page touched for the first time)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)


__all__ = ["reuse_freed_memory", "minor_faults"]
