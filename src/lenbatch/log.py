"""The library's logging, by Python's convention for libraries: every message goes to a logger under
``"lenbatch"`` (``lenbatch.sampler``, ``lenbatch.hf``, ``lenbatch.boundaries``, ...), which propagates to
the application's handlers; ``"lenbatch"`` itself holds only a ``NullHandler``. The library attaches no
other handler, sets no level and never stops propagation: the application decides where messages go
(``logging.basicConfig(level=logging.INFO)`` shows the library's INFO messages too)."""

from __future__ import annotations

import logging

ROOT = "lenbatch"
logging.getLogger(ROOT).addHandler(logging.NullHandler())


def get_logger(name: str) -> logging.Logger:
    """The library logger ``name`` (under ``"lenbatch"``): no handler of its own, propagating."""
    if name != ROOT and not name.startswith(ROOT + "."):
        raise ValueError(f"library logger {name!r} must be under {ROOT!r} ('{ROOT}.<module>')")
    return logging.getLogger(name)
