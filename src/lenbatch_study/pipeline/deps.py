"""What each stage depends on, for the Snakemake rules and ``dvc.yaml`` alike, derived from the stage table
(:data:`lenbatch_study.pipeline.registry.STAGES`), so the two tools cannot drift: its params (declared in
the table) and its code, the import closure of ``lenbatch_study.stages.<stage>`` inside ``src/`` by
:mod:`ast` (DESIGN.md, "What reruns on an edit"). The facade ``lenbatch/__init__.py`` is followed only where
a module reads a name through it (else editing ``boundaries.py`` would retokenize).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import typing
from pathlib import Path

from lenbatch.batching.strategy import STRATEGIES as ALL_STRATEGIES
from lenbatch_study.core.config import SECTIONS
from lenbatch_study.corpus.sources import source_deps
from lenbatch_study.models.target_config import checkpoint_files
from lenbatch_study.pipeline.registry import COMMANDS, STAGES, Output, input_paths, output_path

# The two packages whose modules are code: the library and the study beside it (both under src/).
LIBRARY = "lenbatch"
STUDY = "lenbatch_study"
PACKAGES = (LIBRARY, STUDY)
SRC_ROOT = Path(__file__).resolve().parents[2]  # src/
SRC = SRC_ROOT / STUDY


def _module_file(name: str) -> Path | None:
    """The source file of module ``name`` (a package's ``__init__.py``), None outside :data:`PACKAGES`."""
    top, *parts = name.split(".")
    if top not in PACKAGES:
        return None
    base = SRC_ROOT / top
    if not parts:
        return base / "__init__.py"
    path = base.joinpath(*parts[:-1], parts[-1] + ".py")
    if path.exists():
        return path
    init = base.joinpath(*parts, "__init__.py")
    return init if init.exists() else None


@functools.lru_cache(maxsize=None)
def direct_imports(module: str) -> tuple[str, ...]:
    """The ``lenbatch`` modules ``module`` imports anywhere in its source (sorted), by :mod:`ast`."""
    path = _module_file(module)
    assert path is not None, f"no source file for {module}"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: relative import; use absolute lenbatch.* imports so deps can follow them")
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)  # ``import lenbatch`` uses the facade: followed
        elif isinstance(node, ast.ImportFrom) and node.module:
            mod, names = node.module, [a.name for a in node.names]
            subs = {name for name in names if _module_file(f"{mod}.{name}") is not None}
            # ``from lenbatch import stepmodel`` imports the submodule lenbatch_study.analysis.stepmodel (not the facade)
            found.update(f"{mod}.{name}" for name in subs)
            if mod not in PACKAGES or len(subs) < len(names):
                found.add(mod)
    return tuple(sorted(m for m in found if _module_file(m) is not None))


def is_subpackage(name: str) -> bool:
    """``lenbatch.<pkg>`` / ``lenbatch_study.<pkg>`` of a subpackage (its ``__init__.py`` holds only a docstring)."""
    path = _module_file(name)
    return name not in PACKAGES and path is not None and path.name == "__init__.py"


def import_closure(module: str) -> list[str]:
    """``module`` plus every ``lenbatch`` module it imports, transitively (sorted)."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen or is_subpackage(name):
            continue
        seen.add(name)
        todo.extend(direct_imports(name))
    return sorted(seen)


def stage_modules(stage: str) -> list[str]:
    """The modules ``lenbatch <stage>`` runs: the import closure of its stage module."""
    return import_closure(COMMANDS[stage].module)


def stage_code(stage: str, *, root: str = "src") -> list[str]:
    """The source files ``stage`` runs, library's and study's, as paths under ``root`` (sorted)."""
    files = []
    for mod in stage_modules(stage):
        path = _module_file(mod)
        assert path is not None
        files.append(f"{root}/{path.relative_to(SRC_ROOT).as_posix()}")
    return sorted(files)


def section_keys(section: str) -> list[str]:
    return [f.name for f in dataclasses.fields(SECTIONS[section])]


def stage_param_keys(stage: str) -> list[str]:
    """Every ``section.key`` the stage reads, expanded from its declaration (in params order)."""
    spec = STAGES[stage]
    keys: list[str] = []
    for item in spec.params:
        section, _, key = item.partition(".")
        assert section in SECTIONS, f"stage {stage}: unknown params section {section!r}"
        if key:
            assert key in section_keys(section), f"stage {stage}: unknown params key {item!r}"
            keys.append(item)
        else:
            keys.extend(f"{section}.{k}" for k in section_keys(section) if f"{section}.{k}" not in spec.exclude)
    order = [f"{s}.{k}" for s in SECTIONS for k in section_keys(s)]
    return sorted(set(keys), key=order.index)


def stage_params_compact(stage: str) -> list[str]:
    """:func:`stage_param_keys` with whole sections written as the section name (DVC's ``params:``)."""
    keys = stage_param_keys(stage)
    out: list[str] = []
    for section in SECTIONS:
        mine = [k for k in keys if k.split(".", 1)[0] == section]
        if mine and len(mine) == len(section_keys(section)):
            out.append(section)
        else:
            out.extend(mine)
    return out


def stage_payload(stage: str, config: typing.Mapping[str, typing.Any]) -> dict[str, dict[str, typing.Any]]:
    """The values of the keys ``stage`` reads, as ``{section: {key: value}}`` (its ``--params-json``)."""
    payload: dict[str, dict[str, typing.Any]] = {}
    for item in stage_param_keys(stage):
        section, key = item.split(".", 1)
        payload.setdefault(section, {})[key] = config[section][key]
    return payload


HEADER = """\
# GENERATED by `lenbatch dvc-yaml` from the stage table (src/lenbatch_study/pipeline/registry.py) and each
# stage's import closure (pipeline/deps.py); do not edit (tests/pipeline/test_workflow.py fails when it is
# stale). Each stage's command runs its one Snakemake rule. Why each choice: DESIGN.md, "The stage graph".
"""


def _dvc_stage(
    stage: str, *, results: str, strategy: str | None, pretrained: str | None = None, source: str | None = None
) -> dict[str, typing.Any]:
    st = STAGES[stage]

    def listed(name: str, o: Output) -> dict[str, typing.Any]:
        path = output_path(stage, name, results=results, strategy=strategy)
        return {path: {"cache": o.cache, "persist": True, **dict(o.plot or {})}}

    if st.always_changed:  # machine, source: the command runs every time and rewrites only a changed file
        reads = " --params params.yaml" if st.params else ""  # source: data.source (after any -S)
        outs = [listed(n, o) for n, o in st.outputs.items()]
        return {"cmd": f"lenbatch {stage}{reads} --out {results}/{stage}", "always_changed": True, "outs": outs}
    ins = input_paths(stage, results=results, strategies=ALL_STRATEGIES, strategy=strategy)
    deps: list[str] = []
    for i in st.inputs:
        if STAGES[i.stage].per_strategy and not st.per_strategy:
            # a stage over every strategy's runs (compare): DVC cannot list the runs of a list param, so it
            # depends on their folder (results/train); .dvcignore keeps checkpoints and marks out of it
            folder = f"{results}/{i.stage}"
            if folder not in deps:
                deps.append(folder)
        elif i.gate is not None:  # see Input.gate: one foreach body for every strategy
            deps.append(f"{output_path(i.stage, i.gate, results=results)}/{strategy}.json")
        else:
            deps += ins.get(i.output, [])
    checkpoint = checkpoint_files(pretrained) if stage in pretrained_stages() else []
    data = source_deps(source) if any(i.stage == "source" for i in st.inputs) else []
    # the file the command asks Snakemake for: the stage's first declared output that is a file
    target = next(n for n, o in st.outputs.items() if o.declared and not o.directory)
    entry: dict[str, typing.Any] = {
        "cmd": f"snakemake --cores all --allowed-rules {stage} --forcerun {stage} -- "
        + output_path(stage, target, results=results, strategy=strategy),
        # the settings overlay params.yaml names (core/settings.py) and its file: DVC resolves ${settings} on
        # every run, so `-S settings=tiny` and an edit of configs/tiny.yaml rerun what they change
        "params": stage_params_compact(stage) + ["settings"],
        "deps": deps + data + checkpoint + ["configs/${settings}.yaml"] + stage_code(stage),
    }
    for kind in ("outs", "metrics", "plots"):
        if mine := [listed(n, o) for n, o in st.outputs.items() if o.kind == kind]:
            entry[kind] = mine
    return entry


def dvc_stages(
    results: str = "results", *, pretrained: str | None = None, source: str | None = None
) -> dict[str, typing.Any]:
    """The ``stages:`` mapping of ``dvc.yaml``: one DVC stage per stage, a per-strategy one ``foreach:
    ${train.strategies}``; ``pretrained`` (``model.pretrained``) and ``source`` (``data.source``) add their
    files to the deps of the stages that read them."""
    out: dict[str, typing.Any] = {}
    for stage, st in STAGES.items():
        item = "${item}" if st.per_strategy else None
        body = _dvc_stage(stage, results=results, strategy=item, pretrained=pretrained, source=source)
        out[stage] = {"foreach": "${train.strategies}", "do": body} if st.per_strategy else body
    return out


def dvc_yaml(results: str = "results", *, pretrained: str | None = None, source: str | None = None) -> str:
    import yaml

    body = yaml.safe_dump(
        {"stages": dvc_stages(results, pretrained=pretrained, source=source)}, sort_keys=False, width=120
    )
    return HEADER + "\n" + body


TARGET_MODULE = "lenbatch_study.models.target"


def pretrained_stages() -> tuple[str, ...]:
    """The stages whose code imports :data:`TARGET_MODULE`: with model.pretrained set, the checkpoint's files
    are inputs of their rules and deps of their DVC stages, so a changed checkpoint reruns them alone."""
    return tuple(s for s in STAGES if TARGET_MODULE in stage_modules(s))
