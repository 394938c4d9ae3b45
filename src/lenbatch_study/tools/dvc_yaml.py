"""``lenbatch dvc-yaml``: write ``dvc.yaml`` from the stages' derived dependencies
(:func:`lenbatch_study.pipeline.deps.dvc_yaml`), and into ``params.yaml`` the defaults of every section and
key it lacks (:func:`fill_params`), so that a new section declared in
:mod:`lenbatch_study.core.sections` reaches both tools through this one command."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from lenbatch_study.core.files import write_atomic
from lenbatch_study.pipeline.deps import dvc_yaml

PARAMS_FILE = "params.yaml"


def run(*, out: str, check: bool = False) -> int:
    """``lenbatch dvc-yaml``: fill in ``params.yaml`` and write :func:`dvc_yaml` to ``out`` ('-': stdout,
    ``params.yaml`` left as it is); with ``check``, exit 1 when ``params.yaml`` lacks a section or key, or
    ``out`` differs from what would be written, instead of writing."""
    params = Path(PARAMS_FILE)
    text = params.read_text() if params.exists() else ""
    filled = fill_params(text)
    if check and filled != text:
        missing = ", ".join(missing_keys(yaml.safe_load(text) or {}))
        print(f"{params} lacks {missing}: write their defaults with `lenbatch dvc-yaml`", file=sys.stderr)
        return 1
    if out != "-" and filled != text:
        write_atomic(params, filled)  # whole or not at all: params.yaml is what every stage reads
    text = dvc_yaml(**_tracked_inputs(PARAMS_FILE))
    if out == "-":
        sys.stdout.write(text)
        return 0
    path = Path(out)
    if check:
        if not path.exists() or path.read_text() != text:
            print(f"{path} is stale: regenerate it with `lenbatch dvc-yaml`", file=sys.stderr)
            return 1
        return 0
    write_atomic(path, text)
    return 0


def missing_keys(raw: dict[str, Any]) -> list[str]:
    """The sections (``name``) and keys (``name.key``) of :class:`~lenbatch_study.core.config.Params` that the
    params mapping ``raw`` lacks, in declaration order."""
    from lenbatch_study.core.config import SECTIONS

    out: list[str] = []
    for name, cls in SECTIONS.items():
        given = raw.get(name)
        if not isinstance(given, dict):
            out.append(name)
        else:
            out.extend(f"{name}.{f.name}" for f in dataclasses.fields(cls) if f.name not in given)
    return out


def fill_params(text: str) -> str:
    """``text`` (a params file) with the default of every section and key it lacks written in as text: a
    missing section appended at the end, a missing key at the end of its section, each with its help as the
    comment (the form of the shipped ``params.yaml``). Nothing already there changes, comments and order
    included; a section written in one line (``name: {...}``) cannot take a line, so it is refused."""
    from lenbatch_study.core.config import SECTION_HELP, SECTIONS, Params

    raw = yaml.safe_load(text) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{PARAMS_FILE} must be a YAML mapping of sections, got {type(raw).__name__}")
    missing = set(missing_keys(raw))
    if not missing:
        return text
    defaults = Params().to_dict()
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    appended: list[str] = []
    for name, cls in SECTIONS.items():
        keys = [f for f in dataclasses.fields(cls) if name in missing or f"{name}.{f.name}" in missing]
        if not keys:
            continue
        if name not in raw:
            appended += ["\n", f"{name}:  # {SECTION_HELP[name]}\n"]
            appended += [_key_line("  ", f, defaults[name][f.name]) for f in keys]
            continue
        end, indent = _section_block(lines, name)
        lines[end:end] = [_key_line(indent, f, defaults[name][f.name]) for f in keys]
    return "".join(lines + appended).lstrip("\n")


def _key_line(indent: str, field: dataclasses.Field, value: Any) -> str:
    shown = yaml.safe_dump(value, default_flow_style=True, width=10**9).splitlines()[0]
    return f"{indent}{field.name}: {shown}  # {field.metadata.get('help', '')}\n"


def _section_block(lines: list[str], name: str) -> tuple[int, str]:
    """The line of ``lines`` a key appended to section ``name`` goes before (after its last indented line),
    and the indent of its keys."""
    start = next((i for i, line in enumerate(lines) if re.match(rf"{re.escape(name)}:(\s|$)", line)), None)
    head = lines[start].split("#", 1)[0].split(":", 1)[1].strip() if start is not None else ""
    if start is None or head not in ("", "{}"):
        raise ValueError(
            f"{PARAMS_FILE}: section '{name}' is not written as a block ('{name}:' on its own line, one key a "
            f"line); write it so, then rerun `lenbatch dvc-yaml` to add its missing keys"
        )
    if head == "{}":
        lines[start] = lines[start].replace("{}", "", 1)
    end, indent = start + 1, None
    for i in range(start + 1, len(lines)):
        if re.match(r"\S", lines[i]) and not lines[i].startswith("#"):
            break  # the next top-level key
        if lines[i].strip() and lines[i][0].isspace():
            end = i + 1  # after its last line, a block-style list's items included
            key = re.match(r"(\s+)[\w-]+:", lines[i])
            indent = indent or (key.group(1) if key else None)
    return end, indent or "  "


def _tracked_inputs(params: str) -> dict[str, str | None]:
    """``model.pretrained`` (its checkpoint files become deps) and ``data.source`` (a user's file becomes a dep
    of tokenize) of the params file DVC tracks, read once; None each without one."""
    from lenbatch_study.core.config import load_params

    if not Path(params).exists():
        return {"pretrained": None, "source": None}
    loaded = load_params(params)
    return {"pretrained": loaded.model.pretrained, "source": loaded.data.source}
