"""The flags and glue of the stages whose parsers do not live in :mod:`lenbatch.cli` itself.

Part of the one CLI layer (cli.py dispatches; this module declares flags): each ``_<stage>_flags``
adds a stage's arguments and sets ``func``, a callable ``args -> int`` that turns the parsed
arguments into keyword arguments of the stage module's plain function (``lenbatch.stats.run``).
Stage modules are reached through importlib, never an ``import`` statement: cli.py (and so this
module) is part of every stage's code dependencies (lenbatch.deps), and an import here would make
every stage depend on every other.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any


def _stage(module: str) -> Any:
    return importlib.import_module(f"lenbatch.{module}")


def _params_flag(parser: argparse.ArgumentParser) -> None:
    from lenbatch.config import add_params_argument

    add_params_argument(parser)


def _lengths_input(args: argparse.Namespace) -> dict[str, Any]:
    """``--lengths`` / ``--seed-profile`` / ``--seed-profile-size`` as the stages' keyword arguments."""
    return {"lengths": args.lengths, "seed_profile": args.seed_profile, "seed_profile_size": args.seed_profile_size}


# --------------------------------------------------------------------------- dvc-yaml, plots, params


def _dvc_yaml_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="dvc.yaml", help="where to write dvc.yaml ('-': stdout)")
    parser.add_argument("--check", action="store_true", help="exit 1 if OUT differs from what would be written")
    parser.set_defaults(func=lambda args: _stage("deps").run(out=args.out, check=args.check))


def _plots_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("revisions", nargs="*", help="revisions or experiments to compare (dvc plots diff)")
    parser.add_argument("--out", default="dvc_plots", help="output folder (index.html)")
    parser.set_defaults(func=lambda args: _stage("dvcplots").run(revisions=args.revisions, out=args.out))


def _params_stage_flags(parser: argparse.ArgumentParser) -> None:
    _params_flag(parser)
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--schema", action="store_true", help="print the JSON schema (YAML) of params files")
    what.add_argument("--show", action="store_true", help="print the resolved params as JSON")
    parser.set_defaults(func=lambda args: _stage("config").run(params=args.params, schema=args.schema,
                                                                show=args.show))


# --------------------------------------------------------------------------- stats


def _stats_flags(parser: argparse.ArgumentParser) -> None:
    from lenbatch.lengths import add_lengths_arguments

    _params_flag(parser)
    add_lengths_arguments(parser)
    parser.add_argument("--bins", type=int, default=None, help="histogram bins (count; overrides stats.histogram_bins)")
    parser.add_argument("--edges", type=int, nargs="+", default=None, metavar="TOKENS",
                        help="optional bucket edges (tokens) for counts per bucket")
    parser.add_argument("--out", required=True, help="output directory (stats.json, histogram.json, histogram.png)")
    parser.set_defaults(func=_stats)


def _stats(args: argparse.Namespace) -> int:
    from lenbatch.config import load_params

    overrides = {"stats": {"histogram_bins": args.bins}} if args.bins is not None else None
    return _stage("stats").run(params=load_params(*args.params, overrides=overrides), out=args.out,
                               edges=args.edges, **_lengths_input(args))


FLAGS: dict[str, Any] = {"stats": _stats_flags, "params": _params_stage_flags, "plots": _plots_flags,
                         "dvc-yaml": _dvc_yaml_flags}
