"""The params edge of the command line: where a stage's params are read and checked, once.

A stage's params arrive in one of two forms (:func:`lenbatch_study.core.config.load_params`):

- ``--params FILE [FILE ...]`` (default ``params.yaml``): a complete params file, override files on top;
- ``--params-json JSON``: the workflow's form (every rule's shell line), exactly the keys the stage reads,
  resolved by Snakemake from params.yaml, any ``--configfile``/``--config`` and the ``settings:`` overlay.
  Given alone it is all that is read: no params file is opened (given after ``--params``, it is merged on
  top of the files).

plus the flags that override single settings (``--num-buckets``: :func:`add_override`), applied last and
blamed by name when bad. :func:`params_from_args` turns them into the one checked
:class:`~lenbatch_study.core.config.Params` that the stage gets (and a training's workers, as it is:
:mod:`lenbatch_study.runtime.launch`).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lenbatch_study.core.config import Params

DEFAULT_PARAMS = "params.yaml"


class _AppendInline(argparse.Action):
    """``--params-json X`` appends the inline mapping to the files ``--params`` gave; without ``--params`` it
    replaces the default file: the mapping alone is read."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        current = getattr(namespace, "params", None)
        given = [] if current is None or current is parser.get_default("params") else list(current)
        namespace.params = given + [values]


def add_params_argument(parser: argparse.ArgumentParser) -> None:
    """``--params FILE [FILE ...]`` and ``--params-json JSON`` (module doc)."""
    parser.add_argument(
        "--params",
        nargs="+",
        default=[DEFAULT_PARAMS],
        metavar="FILE",
        help="params.yaml, then override files merged on top in order",
    )
    parser.add_argument(
        "--params-json",
        action=_AppendInline,
        metavar="JSON",
        help="the stage's keys as an inline JSON mapping of sections, resolved already (the "
        "workflow's form): alone, no params file is read; after --params, merged on top of the files",
    )


def params_from_args(args: argparse.Namespace, *names: str) -> Params:
    """The stage's params, read and checked once: ``--params``/``--params-json``, then the flags of the
    settings ``names`` (``section.key``, :func:`add_override`) that were given."""
    from lenbatch_study.core.config import load_params

    overrides = overrides_of(args, *names)
    return load_params(*args.params, overrides=overrides or None)


def _setting(name: str) -> tuple[Any, tuple[Any, ...] | None, str]:
    """(type, choices, help) of the params setting ``name`` (``section.key``), read from its declaration in
    :mod:`lenbatch_study.core.sections`: a flag overriding a setting is described where the setting is."""
    import dataclasses
    import typing

    from lenbatch_study.core.config import Params

    section, key = name.split(".")
    cls = typing.get_type_hints(Params)[section]
    field_ = {f.name: f for f in dataclasses.fields(cls)}[key]
    hint = typing.get_type_hints(cls)[key]
    args = [a for a in typing.get_args(hint) if a is not type(None)]  # Optional[X] -> X
    if typing.get_origin(hint) is typing.Literal:
        return str, typing.get_args(hint), field_.metadata["help"]
    kind = args[0] if typing.get_origin(hint) is typing.Union else hint
    assert kind in (int, float, str), f"{name}: a flag can override only a scalar setting, not {hint}"
    return kind, None, field_.metadata["help"]


def add_override(parser: argparse.ArgumentParser, name: str, *, flag: str | None = None, note: str = "") -> None:
    """``--<key>`` (or ``flag``) overriding the params setting ``name`` (``section.key``): its type, choices and
    help come from the setting's declaration (:func:`_setting`); read back by :func:`overrides_of`."""
    kind, choices, help_ = _setting(name)
    section, key = name.split(".")
    parser.add_argument(
        flag or "--" + key.replace("_", "-"),
        dest=key,
        type=kind,
        choices=choices,
        help=f"{help_} (overrides {name}{'; ' + note if note else ''})",
    )


def overrides_of(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The settings of ``names`` (``section.key``) whose flags were given, as a params overrides mapping."""
    out: dict[str, Any] = {}
    for name in names:
        section, key = name.split(".")
        if getattr(args, key, None) is not None:
            out.setdefault(section, {})[key] = getattr(args, key)
    return out


BATCHING_FLAGS = ("batching.token_budget", "batching.max_batch_size", "batching.seed", "batching.packed_window")


def add_batching_arguments(parser: argparse.ArgumentParser, names: tuple[str, ...] = BATCHING_FLAGS) -> None:
    """``--token-budget`` etc.: flags overriding single ``batching`` keys (read back by :func:`batching_overrides`)."""
    for name in names:
        add_override(parser, name)


__all__ = [
    "BATCHING_FLAGS",
    "DEFAULT_PARAMS",
    "add_batching_arguments",
    "add_override",
    "add_params_argument",
    "overrides_of",
    "params_from_args",
]
