"""Bytes of tensor storage alive while a dispatch mode is on, and their peak: the measured side of the
memory estimates' tests (tests/models/_fla_memory.py, tests/models/test_memory_capture.py)."""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class LiveBytes(TorchDispatchMode):
    """Bytes of tensor storage alive, and their peak, while the mode is on."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key, n = st.data_ptr(), st.nbytes()
            if n == 0 or key in self.seen:  # a view of a storage already counted
                continue
            self.seen.add(key)
            self.live += n
            self.peak = max(self.peak, self.live)

            def gone(n=n, key=key):
                self.live -= n
                self.seen.discard(key)

            weakref.finalize(st, gone)
        return out
