"""The study's console: ``HH:MM:SS name message`` on rank 0 (all ranks when LENBATCH_LOG_ALL_RANKS=1).

The study's commands are applications, so they configure their own output: a stderr handler on each study
logger (``train``, ``compare``, ...; those stop propagating, so a study process prints each line once), and
the same handler on the library's ``"lenbatch"`` logger, so that the library's messages (the sampler's
warnings, the boundary sweep) reach the study's console. The library's logger keeps propagating: a handler
on the root logger still receives its messages."""

from __future__ import annotations

import logging
import os
import sys

LIBRARY = "lenbatch"


def rank() -> int:
    """This process's global rank from torchrun's environment (0 outside torchrun)."""
    return int(os.environ.get("RANK", "0"))


def _console(logger: logging.Logger) -> None:
    if any(getattr(h, "_lenbatch_study_console", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S"))
    handler._lenbatch_study_console = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    quiet = rank() != 0 and os.environ.get("LENBATCH_LOG_ALL_RANKS") != "1"
    logger.setLevel(logging.WARNING if quiet else logging.INFO)


def get_logger(name: str) -> logging.Logger:
    """A logger that prints ``HH:MM:SS name message`` on rank 0 and stays silent elsewhere (warnings excepted).

    A name under ``"lenbatch"`` is printed through the library logger's console handler (installed here
    once, propagation left on); any other name gets its own handler and does not propagate."""
    _console(logging.getLogger(LIBRARY))
    logger = logging.getLogger(name)
    if name == LIBRARY or name.startswith(LIBRARY + "."):
        return logger
    _console(logger)
    logger.propagate = False
    return logger
