"""The library logs by Python's convention for libraries: loggers under "lenbatch", a NullHandler on
"lenbatch" and nothing else, propagation on; a user's handler on the root logger receives its messages."""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np

import lenbatch as lb


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_users_root_handler_receives_a_library_warning():
    root = logging.getLogger()
    handler = _Collect()
    root.addHandler(handler)
    try:
        sampler = lb.LengthBatchSampler(
            np.arange(1, 41), strategy="sorted", token_budget=64, max_batch_size=8, rank=0, world_size=1
        )
        list(sampler)
        list(sampler)  # a second pass over epoch 0 without set_epoch: the library warns
    finally:
        root.removeHandler(handler)
    hits = [r for r in handler.records if r.name.startswith("lenbatch") and "set_epoch" in r.getMessage()]
    assert hits and hits[0].levelno == logging.WARNING and hits[0].name == "lenbatch.sampler"


def test_the_library_attaches_only_a_null_handler_and_never_stops_propagation():
    code = (
        "import logging, lenbatch, lenbatch.loading.sampler, lenbatch.loading.collate, lenbatch.batching.boundaries\n"
        "import lenbatch.hf\n"
        "names = ['lenbatch'] + [n for n in logging.root.manager.loggerDict if n.startswith('lenbatch.')]\n"
        "bad = [(n, type(h).__name__) for n in names for h in getattr(logging.getLogger(n), 'handlers', [])\n"
        "       if not (n == 'lenbatch' and isinstance(h, logging.NullHandler))]\n"
        "stop = [n for n in names if not logging.getLogger(n).propagate]\n"
        "print(bad, stop, logging.getLogger('lenbatch').handlers)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] [] [<NullHandler (NOTSET)>]", out


def test_basic_config_shows_the_librarys_info_messages():
    """``logging.basicConfig(level=INFO)`` in the user's program is all it takes to see them (the boundary sweep
    logs each K at INFO)."""
    code = (
        "import logging, numpy as np, lenbatch as lb\n"
        "logging.basicConfig(level=logging.INFO, format='%(name)s %(levelname)s %(message)s')\n"
        "lb.sweep_num_buckets(np.arange(1, 200), 2, token_budget=512, max_batch_size=8)\n"
    )
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert "lenbatch.boundaries INFO sweep K=1" in err, err
