"""``params.yaml`` as one frozen :class:`Params` (declared with its sections in
:mod:`lenbatch_study.core.sections`), and how a stage's params reach it: read and checked once, at the command line's edge.

``params.yaml`` is the single source of truth: Snakemake's ``configfile``, DVC's params file, and what
``lenbatch <stage> --params`` reads. Two forms reach a stage, and each is read once, by
:func:`load_params`:

- a params file (``--params params.yaml``, optionally override files on top): complete, every section and
  key, its ``settings:`` overlay merged in;
- the workflow's mapping (``--params-json``): exactly the keys the stage reads (the stage table's
  ``Stage.params``), resolved already by Snakemake (params.yaml, any ``--configfile``/``--config``, the
  ``settings:`` overlay) or, under DVC, from the params.yaml that ``dvc exp run -S`` edited. Nothing else is
  read; the keys it leaves out keep their shipped values (those of params.yaml: tests/core/test_config.py),
  which the stage never reads (tests/pipeline/test_workflow.py).

Either way the checks run once: types and bounds per key (the same bounds the generated JSON schema
states, ``lenbatch params --schema``), each section's own rules (its ``__post_init__``), and the rules that
join two sections (:func:`check_across`) wherever both keys are given. What the edge hands on (a training's
workers included: :mod:`lenbatch_study.runtime.launch`) is the checked object, never re-parsed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from lenbatch_study.core.sections import (  # noqa: F401 (the sections and Params, importable from here too)
    SECTION_HELP,
    BatchingConfig,
    BoundariesConfig,
    CompareConfig,
    DataConfig,
    DrafterConfig,
    InterleaveConfig,
    ModelConfig,
    Params as Params,
    PlansConfig,
    ProfileConfig,
    QualityConfig,
    StatsConfig,
    TrainConfig,
)
from lenbatch_study.core.settings import apply_settings


SECTIONS: dict[str, type] = {f.name: typing.get_type_hints(Params)[f.name] for f in dataclasses.fields(Params)}
# Top-level keys only the workflow reads (not a stage's params): configs/*.yaml set results_dir so
# their runs never overwrite the default's results/ (workflow/rules/common.smk).
WORKFLOW_KEYS = ("results_dir", "settings")  # settings: merged by resolve_settings before the check


def check_across(given: dict[str, Any]) -> None:
    """The rules that join two sections, each checked where ``given`` (a params mapping) holds both of its
    keys: a workflow mapping of one stage's keys leaves out what that stage does not read (the complete
    config was checked whole when the workflow started)."""
    batching, data = given.get("batching") or {}, given.get("data") or {}
    budget = batching.get("token_budget")
    if budget is None:
        return
    if batching.get("max_batch_size", 0) > budget:
        # a batch of n samples holds at least n tokens, so a larger cap is never reached; bounding it
        # keeps per-batch arrays sized by it (10**12 ended in a numpy MemoryError) within the budget
        raise ValueError(
            f"batching.max_batch_size ({batching['max_batch_size']}) exceeds batching.token_budget "
            f"({budget}): a batch holds at least one token per sample; set max_batch_size <= "
            "token_budget"
        )
    if data.get("max_len", 0) > budget:
        raise ValueError(
            f"data.max_len ({data['max_len']}) exceeds batching.token_budget ({budget}): a longest "
            "sample could not fit any batch; raise the budget or lower max_len"
        )


def _check_range(where: str, value: Any, meta: Any) -> None:
    """The field's ``minimum`` / ``maximum`` / ``exclusive_minimum`` (the same bounds the JSON schema states)."""
    if isinstance(value, tuple):
        if "item_minimum" in meta:
            for i, item in enumerate(value):
                if item < meta["item_minimum"]:
                    raise ValueError(
                        f"{where} has {item} at [{i}] but every entry must be >= {meta['item_minimum']}; "
                        "set it in range"
                    )
        return
    if value is None or isinstance(value, (str, bool)):
        return
    if "minimum" in meta and value < meta["minimum"]:
        raise ValueError(f"{where} is {value} but must be >= {meta['minimum']}; set it in range")
    if "maximum" in meta and value > meta["maximum"]:
        why = f" ({meta['why']})" if "why" in meta else ""
        raise ValueError(f"{where} is {value} but must be <= {meta['maximum']}{why}; set it in range")
    if "exclusive_minimum" in meta and value <= meta["exclusive_minimum"]:
        raise ValueError(f"{where} is {value} but must be > {meta['exclusive_minimum']}; set it in range")


def _check_type(where: str, value: Any, hint: Any) -> Any:
    """Return ``value`` coerced to ``hint`` (lists -> tuples, int -> float), or raise ValueError."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check_type(where, value, inner[0])
    if origin is Literal:
        if value not in args:
            raise ValueError(f"{where} is {value!r}; choose one of {list(args)}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where} must be a list, got {type(value).__name__} {value!r}")
        return tuple(_check_type(f"{where}[{i}]", v, args[0]) for i, v in enumerate(value))
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where} must be a number, got {type(value).__name__} {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{where} is {value!r}; give a finite number")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where} must be an integer, got {type(value).__name__} {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where} must be true or false, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{where} must be a string, got {type(value).__name__} {value!r}")
        return value
    raise AssertionError(f"unsupported type hint {hint} at {where}")


@functools.lru_cache(maxsize=None)  # one lookup per section class, not one per key checked
def _fields_of(cls: type) -> dict[str, tuple[Any, Any]]:
    """``{field name: (type hint, field metadata)}`` of a section dataclass."""
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], f.metadata) for f in dataclasses.fields(cls)}


def _check_value(where: str, value: Any, cls: type, key: str) -> Any:
    """``value`` of ``cls``'s field ``key`` coerced to its type and checked against its bounds; ``ValueError``
    naming ``where`` otherwise."""
    hint, metadata = _fields_of(cls)[key]
    value = _check_type(where, value, hint)
    _check_range(where, value, metadata)
    return value


def _section_from_dict(name: str, cls: type, raw: Any, source: str, *, complete: bool = True) -> Any:
    if not isinstance(raw, dict):
        raise ValueError(f"section '{name}' in {source} must be a mapping of keys, got {type(raw).__name__}")
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ValueError(
            f"unknown key(s) {', '.join(f'{name}.{k}' for k in unknown)} in {source}; "
            f"known keys of '{name}': {', '.join(known)}. Remove or rename them."
        )
    missing = [k for k in known if k not in raw]
    if complete and missing:
        raise ValueError(
            f"missing key(s) {', '.join(f'{name}.{k}' for k in missing)} in {source}; every key is "
            "set in the params file (no silent code defaults): write their defaults into params.yaml with "
            "`lenbatch dvc-yaml`, or copy them from the shipped params.yaml"
        )
    return cls(**{k: _check_value(f"{name}.{k} in {source}", v, cls, k) for k, v in raw.items()})


def params_from_dict(raw: Any, *, source: str = "params", require_all_sections: bool = True) -> Params:
    """Build :class:`Params` from a plain mapping; ``ValueError`` names the bad key and the fix.

    The one check every entry point shares (``load_params``, the workflow's config): unknown and (with
    ``require_all_sections``) missing sections and keys, types, the bounds the JSON schema states,
    non-finite numbers, each section's rules and :func:`check_across`. ``require_all_sections=False`` accepts
    a partial mapping (a stage's keys: only those are checked; the rest keep their shipped values).
    """
    if not isinstance(raw, dict):
        raise ValueError(f"{source} must be a YAML mapping of sections, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(SECTIONS) - set(WORKFLOW_KEYS))
    if unknown:
        raise ValueError(f"unknown section(s) {unknown} in {source}; known sections: {', '.join(SECTIONS)}")
    missing = [s for s in SECTIONS if s not in raw]
    if require_all_sections and missing:
        raise ValueError(
            f"missing section(s) {missing} in {source}; write their defaults into params.yaml with "
            "`lenbatch dvc-yaml`, or copy them from the shipped params.yaml"
        )
    sections = {
        name: _section_from_dict(name, SECTIONS[name], raw[name], source, complete=require_all_sections)
        for name in raw
        if name not in WORKFLOW_KEYS
    }
    check_across(raw)
    return Params(**sections)


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` on top of ``base``, section by section (how Snakemake merges --configfile)."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"inline params give key(s) {twice} twice; keep one")
    return dict(pairs)


def _check_overrides(overrides: dict[str, Any]) -> None:
    """Each setting a command-line flag gives, checked on its own first, so that a bad value is blamed on the
    flag that gave it rather than on the params file underneath."""
    for section, keys in overrides.items():
        cls = SECTIONS.get(section)
        if cls is None or not isinstance(keys, dict):
            continue  # reported with the merged params
        known = {f.name for f in dataclasses.fields(cls)}
        for key, value in keys.items():
            if key in known:
                _check_value(f"{section}.{key} given on the command line (--{key.replace('_', '-')})", value, cls, key)


def _is_inline(path: str | Path) -> bool:
    return isinstance(path, str) and path.lstrip().startswith("{")


def _inline(text: str) -> dict[str, Any]:
    try:
        inline = json.loads(text, object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"inline params {text[:60]!r} are not valid JSON ({err}); pass a mapping of "
            'sections, e.g. --params-json \'{"boundaries": {"num_buckets": 8}}\''
        ) from None
    if not isinstance(inline, dict):
        raise ValueError("inline params must be a JSON mapping of sections")
    return inline


def load_params(*paths: str | Path, overrides: dict[str, Any] | None = None) -> Params:
    """The params of ``paths`` (params files, and inline JSON mappings: ``--params-json``), merged in order,
    with ``overrides`` (what command-line flags set) last: read, merged and checked once (module doc).

    Given inline mappings alone (the workflow's form: a stage's keys, resolved by Snakemake), no file is read
    and only those keys are checked; with a file among them, the merged whole must be complete.
    """
    if not paths:
        raise ValueError("no params file given; pass --params params.yaml")
    merged: dict[str, Any] = {}
    for path in paths:
        if _is_inline(path):
            merged = deep_merge(merged, _inline(str(path)))
            continue
        path = Path(path)
        if not path.exists():
            raise ValueError(f"params file {path} does not exist; pass --params with the path to params.yaml")
        raw = read_yaml(path)
        if not isinstance(raw, dict):
            raise ValueError(f"{path} must be a YAML mapping of sections, got {type(raw).__name__}")
        merged = deep_merge(merged, raw)
    if overrides:
        _check_overrides(overrides)
        merged = deep_merge(merged, overrides)
    files = [Path(p) for p in paths if not _is_inline(p)]
    source = " + ".join("--params-json" if _is_inline(p) else str(p) for p in paths)
    return params_from_dict(
        resolve_settings(merged, root=files[0].parent if files else Path(".")),
        source=source,
        require_all_sections=bool(files),
    )


def resolve_settings(raw: dict[str, Any], *, root: str | Path) -> dict[str, Any]:
    """``raw`` with its ``settings:`` overlay (``<root>/configs/<name>.yaml``) merged in and the key dropped
    (:mod:`lenbatch_study.core.settings`); the Snakefile calls it on its config, :func:`load_params` on the files."""
    return apply_settings(raw, root=root, defaults=Params().to_dict(), read=read_yaml)


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses a key given twice in one mapping (PyYAML silently keeps the last)."""


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ValueError(
                f"key {key!r} is given twice (lines {seen[key] + 1} and {key_node.start_mark.line + 1}); keep one"
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A params YAML file as a mapping; duplicate keys, syntax errors and unreadable files are one-line errors."""
    path = Path(path)
    try:
        with path.open() as fh:
            raw = yaml.load(fh, Loader=_UniqueKeyLoader) or {}
    except OSError as err:
        raise ValueError(f"params file {path} cannot be read ({err.strerror}); check its permissions") from None
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"{path} is not valid YAML{where}: {problem}; fix the syntax there") from None
    return raw
