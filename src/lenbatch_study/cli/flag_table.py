"""The CLI's table of flags: which function adds the flags of ``lenbatch <command>`` (:data:`FLAGS`,
filled by :func:`_flags_of` as :mod:`lenbatch_study.cli.flags` and :mod:`lenbatch_study.cli.model_flags`
import), and the helpers both of them use. Apart so that the two flag modules share it without importing
each other.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from lenbatch_study.cli.commands import COMMANDS


def _stage(name: str) -> Any:
    """The module of command ``name`` (:data:`lenbatch_study.cli.commands.COMMANDS`), imported on use."""
    return importlib.import_module(COMMANDS[name].module)


# command name -> the function adding its flags: each ``_<name>_flags`` registers itself with
# :func:`_flags_of`; tests/pipeline/test_layout.py checks that every command
# (lenbatch_study.cli.commands.COMMANDS) has one and no other name does.
FLAGS: dict[str, Any] = {}


def _flags_of(command: str) -> Any:
    """Register the decorated function as the flags of ``lenbatch <command>``."""

    def register(func: Any) -> Any:
        assert command in COMMANDS and command not in FLAGS, command
        FLAGS[command] = func
        return func

    return register


def add_lengths_arguments(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``--lengths FILE.npy`` or ``--seed-profile`` (the study's 902,087 lengths, generated)."""
    from lenbatch_study.corpus.seed_profile import SEED_COUNT

    src = parser.add_mutually_exclusive_group(required=required)
    src.add_argument("--lengths", metavar="NPY", help="lengths .npy (one int per sample, tokens)")
    src.add_argument(
        "--seed-profile",
        action="store_true",
        help=f"generate the study's length profile ({SEED_COUNT:,} samples, tokens) instead",
    )
    parser.add_argument(
        "--seed-profile-size",
        type=int,
        default=SEED_COUNT,
        metavar="N",
        help="samples in the generated seed profile (count)",
    )


def _lengths_input(args: argparse.Namespace) -> dict[str, Any]:
    """``--lengths`` / ``--seed-profile`` / ``--seed-profile-size`` as the stages' keyword arguments."""
    return {"lengths": args.lengths, "seed_profile": args.seed_profile, "seed_profile_size": args.seed_profile_size}


def _strategies() -> tuple[str, ...]:
    from lenbatch.batching.strategy import STRATEGIES

    return STRATEGIES


def _kernel_backends() -> tuple[str, ...]:
    from lenbatch_study.models.varlen import KERNEL_BACKENDS

    return KERNEL_BACKENDS
