"""``settings:`` in params.yaml: a named overlay (``configs/<name>.yaml``) merged by the params loader, so a
whole setting (the tiny smoke test, the study's 8-GPU shapes) is one key: ``dvc exp run -S settings=tiny``.

DVC reads params.yaml only, so before this key a small run under DVC meant copying ~35 keys into it, and
``dvc exp show --only-changed`` then listed every one of them. With it the experiment changes one param,
``settings``, which every stage tracks (with the overlay file as a dependency, ``configs/${settings}.yaml``
in ``dvc.yaml``); each stage still gets the resolved values of exactly the keys it reads, so Snakemake
reruns by those and DVC records them in the stage's ``params.json``.

Precedence, per key: a value in params.yaml (or a ``-S``) that differs from the shipped default is the
user's and wins over the overlay; a key at its shipped default takes the overlay's value. So ``-S
settings=tiny -S data.limit=100`` runs the tiny setting on 100 conversations. (A key set back to exactly
its shipped default under an overlay that changes it takes the overlay's value: set it in an overlay of
your own instead.) An overlay's ``results_dir`` is for ``snakemake --configfile`` runs; under ``settings:``
results stay in ``results/``, what DVC tracks. ``settings: default`` (``configs/default.yaml``, empty)
is the shipped params as they are.

Pure dict work on the raw mapping, before validation (:func:`lenbatch_study.core.config.params_from_dict`
then checks the merged result): one loader for every entry point (``load_params``, the Snakefile).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

KEY = "settings"
DEFAULT = "default"
FOLDER = "configs"  # beside params.yaml
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_MISSING = object()


def overlay_path(name: str, root: str | Path) -> Path:
    return Path(root) / FOLDER / f"{name}.yaml"


def available(root: str | Path) -> list[str]:
    return sorted(p.stem for p in (Path(root) / FOLDER).glob("*.yaml"))


def apply_settings(
    raw: dict[str, Any],
    *,
    root: str | Path,
    defaults: dict[str, dict[str, Any]],
    read: Callable[[Path], dict[str, Any]],
) -> dict[str, Any]:
    """``raw`` (a params mapping) without its ``settings`` key and with that overlay merged in (module doc);
    ``defaults``: the shipped value of every key (``Params().to_dict()``); ``read``: the YAML reader.
    ``ValueError`` naming the setting and the fix for a name with no file or an overlay naming another."""
    name = raw.get(KEY, DEFAULT)
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items() if k != KEY}
    if name is None or name == DEFAULT:
        return out
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"settings is {name!r}; give the name of a file in {FOLDER}/ (without .yaml), e.g. "
            f"settings: tiny, or settings: {DEFAULT}"
        )
    path = overlay_path(name, root)
    if not path.is_file():
        raise ValueError(
            f"settings: {name!r} names no file {path}; choose from {available(root)} (or write "
            f"{FOLDER}/{name}.yaml: the keys it changes, grouped by section)"
        )
    overlay = read(path)
    if not isinstance(overlay, dict):
        raise ValueError(f"{path} must be a YAML mapping of sections, got {type(overlay).__name__}")
    if KEY in overlay:
        raise ValueError(f"{path} sets settings itself; an overlay cannot name another: merge the two files")
    for section, keys in overlay.items():
        if section == "results_dir":
            continue  # for --configfile runs only: DVC tracks results/
        if not isinstance(keys, dict) or not isinstance(out.get(section), dict) or section not in defaults:
            out[section] = keys  # not a known section of mappings: the params check names it
            continue
        for key, value in keys.items():
            mine = out[section].get(key, _MISSING)
            shipped = defaults[section].get(key, _MISSING)
            if mine is _MISSING or shipped is _MISSING or _plain(mine) == _plain(shipped):
                out[section][key] = value
    return out


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


__all__ = ["DEFAULT", "FOLDER", "KEY", "apply_settings", "available", "overlay_path"]
