"""Logging that speaks only on rank 0 (all ranks when LENBATCH_LOG_ALL_RANKS=1)."""

from __future__ import annotations

import logging
import os
import sys


def rank() -> int:
    """This process's global rank from torchrun's environment (0 outside torchrun)."""
    return int(os.environ.get("RANK", "0"))


def get_logger(name: str) -> logging.Logger:
    """A logger that prints ``HH:MM:SS stage message`` on rank 0 and stays silent elsewhere."""
    logger = logging.getLogger(name)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S"))
        logger.addHandler(handler)
        logger.propagate = False
        quiet = rank() != 0 and os.environ.get("LENBATCH_LOG_ALL_RANKS") != "1"
        logger.setLevel(logging.WARNING if quiet else logging.INFO)
    return logger
