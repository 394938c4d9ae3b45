"""What each workflow stage depends on: its code files and its params keys, for Snakemake and DVC alike.

One table (:data:`STAGES`) names each stage's entry module and the params keys its code reads;
the code files are *derived*: the import closure of the entry module inside ``src/lenbatch``
(every ``import lenbatch.x`` / ``from lenbatch.x import y`` / ``from lenbatch import x``,
top-level or lazy inside a function, followed transitively with :mod:`ast`, no import executed).
``workflow/rules/common.smk`` asks this module for each rule's ``input.code`` and ``params``, and
``lenbatch dvc-yaml`` writes ``dvc.yaml`` from the same table, so the two tools cannot drift: a
new import adds a file to both, and a test fails if the committed ``dvc.yaml`` is stale.

Three deliberate exclusions, documented because they are the only hand-made choices:

- ``lenbatch/__init__.py`` (a facade that re-exports the public API) is followed only where a
  module uses it (``import lenbatch as lb``; ``from lenbatch import name`` of a non-module name):
  every ``lenbatch.x`` import executes it, but a stage that reads nothing through it does not
  depend on what it re-exports (else editing ``boundaries.py`` would retokenize the dataset).
- The subpackages' ``__init__.py`` (``lenbatch/batching/__init__.py`` ...) hold a docstring and
  nothing else (``tests/test_layout.py`` checks it), so they are no code dependency.
- The CLI layer (``lenbatch/cli/``) is no stage's dependency: it parses flags into the stage's
  keyword arguments and dispatches; no stage imports it, so editing a help string reruns nothing.
- Params are declared, not derived: a module several stages share (profile and train both run
  ``runner.StepRunner``) may read keys only one of them needs. The declaration is
  checked by ``tests/test_workflow.py``: every ``<x>.<section>.<key>`` read in a stage's own
  modules (its closure minus other stages' entry modules) must be declared.

To add a stage (e.g. ``quality``): a :class:`Stage` in :data:`STAGES` (entry module, params keys
it reads), its command and outputs in :func:`dvc_stages`, a rule in ``workflow/rules/*.smk``
using ``cfg("quality")`` and ``code("quality")`` with ``up()`` around its inputs, its outputs in
``rule all``; then ``lenbatch dvc-yaml``. A new module imported by an existing stage needs only
``lenbatch dvc-yaml``.

Cost: parsing the ~50 modules once, ~80 ms; cached per process.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import typing
from dataclasses import dataclass
from pathlib import Path

from lenbatch.core.config import SECTIONS, STRATEGY_NAMES

PACKAGE = "lenbatch"
SRC = Path(__file__).resolve().parent.parent
NOT_FOLLOWED = ("lenbatch.__main__",)  # `python -m lenbatch` entry: only imports cli


@dataclass(frozen=True)
class Stage:
    """One workflow stage: the module ``lenbatch <name>`` runs and the params keys its code reads.

    ``params`` items are whole sections (``"model"``) or single keys (``"data.max_len"``);
    ``exclude`` drops keys from whole sections (``"train.strategies"``).
    """

    module: str
    params: tuple[str, ...]
    exclude: tuple[str, ...] = ()


# The one table. Order is the order of the DAG.
STAGES: dict[str, Stage] = {
    "tokenize": Stage("lenbatch.stages.tokenize", ("data",)),
    "stats": Stage("lenbatch.stages.stats", ("stats", "batching.seed")),  # seed: lengths drawn from a profile
    "boundaries": Stage("lenbatch.stages.boundaries", ("boundaries", "batching", "plans", "data.max_len")),
    "plans": Stage("lenbatch.stages.plans", ("batching", "plans", "data.max_len")),
    # profile times the StepRunner (lenbatch.runtime.runner) that train runs, but never trains: no warmup_steps,
    # queue_size, checkpoint_every, useful_tokens or strategies.
    "profile": Stage("lenbatch.stages.profile", ("model", "drafter", "batching", "profile", "data.max_len", "train.nproc",
                                          "train.threads", "train.device", "train.kernels",
                                          "train.reuse_host_memory")),
    "train": Stage("lenbatch.stages.train", ("model", "drafter", "batching", "train", "data.max_len"),
                   exclude=("train.strategies",)),
    # quality has its own lr and anchors: the train stage's drafter.lr / anchors_per_seq never rerun it
    "quality": Stage("lenbatch.stages.quality", ("quality", "model", "drafter", "batching", "train.strategies",
                                          "train.device", "data.max_len"),
                     exclude=("drafter.lr", "drafter.anchors_per_seq")),
    "compare": Stage("lenbatch.stages.compare", ("model", "drafter", "batching", "train", "plans", "boundaries", "compare",
                                          "data.max_len")),
}


def strategies(config: typing.Mapping[str, typing.Any] | None = None) -> list[str]:
    """The strategies trained: ``train.strategies`` of ``config``, or every known strategy."""
    if config is None:
        return list(STRATEGY_NAMES)
    return list(config["train"]["strategies"])


def _module_file(name: str) -> Path | None:
    """The source file of module ``name`` (a package's ``__init__.py``), None outside ``lenbatch``."""
    if not (name == PACKAGE or name.startswith(PACKAGE + ".")):
        return None
    parts = name.split(".")[1:]
    if not parts:
        return SRC / "__init__.py"
    path = SRC.joinpath(*parts[:-1], parts[-1] + ".py")
    if path.exists():
        return path
    init = SRC.joinpath(*parts, "__init__.py")
    return init if init.exists() else None


@functools.lru_cache(maxsize=None)
def direct_imports(module: str) -> tuple[str, ...]:
    """The ``lenbatch`` modules ``module`` imports anywhere in its source (sorted), by :mod:`ast`."""
    path = _module_file(module)
    assert path is not None, f"no source file for {module}"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)  # ``import lenbatch`` uses the facade: followed
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {a.name for a in node.names if _module_file(f"{node.module}.{a.name}") is not None}
            # ``from lenbatch import stepmodel`` imports the submodule lenbatch.analysis.stepmodel (not the facade)
            found.update(f"{node.module}.{name}" for name in subs)
            if node.module != PACKAGE or len(subs) < len(node.names):
                found.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: relative import; use absolute lenbatch.* imports so deps can follow them")
    return tuple(sorted(m for m in found if _module_file(m) is not None))


def is_subpackage(name: str) -> bool:
    """``lenbatch.<pkg>`` of a subpackage (its ``__init__.py`` holds only a docstring)."""
    path = _module_file(name)
    return name != PACKAGE and path is not None and path.name == "__init__.py"


def import_closure(module: str) -> list[str]:
    """``module`` plus every ``lenbatch`` module it imports, transitively (sorted)."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen or name in NOT_FOLLOWED or is_subpackage(name):
            continue
        seen.add(name)
        todo.extend(direct_imports(name))
    return sorted(seen)


def stage_modules(stage: str) -> list[str]:
    return import_closure(STAGES[stage].module)


def stage_code(stage: str, *, root: str = "src/lenbatch") -> list[str]:
    """The source files ``stage`` runs, as paths under ``root`` (sorted)."""
    files = []
    for mod in stage_modules(stage):
        path = _module_file(mod)
        assert path is not None
        files.append(f"{root}/{path.relative_to(SRC).as_posix()}")
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


# --------------------------------------------------------------------------- dvc.yaml


HEADER = """\
# GENERATED by `lenbatch dvc-yaml` from src/lenbatch/deps.py: do not edit by hand
# (tests/test_workflow.py fails when this file differs from what the command writes).
#
# DVC decides what to rerun and records it; Snakemake executes. Each stage's command runs its one
# Snakemake rule (--forcerun: DVC already judged it stale; LENBATCH_STAGE_ONLY=1 makes every input
# ancient(), so Snakemake reruns nothing upstream even where file times are fresh-clone noise), so
# `dvc repro`, `dvc exp run` and `dvc exp run --temp/--queue` run exactly the stages DVC names,
# and Snakemake records the same jobs (params, code, mtimes), so `snakemake -n` agrees afterwards.
# Code deps are the import closure of each stage's entry module; params are the keys its code reads
# (both from deps.py, which workflow/rules/common.smk also uses).
# The tokenized dataset is in DVC's cache (restored in `--temp` workspaces); everything else under
# results/ is small and committed to git (cache: false). persist: DVC never deletes an output before a
# stage runs (the train rule resumes from its checkpoint after an interruption).
"""


def _snakemake(targets: list[str], rule: str) -> str:
    return (f"LENBATCH_STAGE_ONLY=1 snakemake --cores all --forcerun {rule} --rerun-triggers mtime -- "
            + " ".join(targets))


def _out(path: str, *, cache: bool = False, extra: dict | None = None) -> dict:
    return {path: {"cache": cache, "persist": True, **(extra or {})}}


def dvc_stages(results: str = "results") -> dict[str, typing.Any]:
    """The ``stages:`` mapping of ``dvc.yaml``: outputs mirror the Snakemake rules' outputs."""
    r = results
    code = {s: stage_code(s) for s in STAGES}
    st: dict[str, typing.Any] = {}
    st["tokenize"] = {
        "cmd": _snakemake([f"{r}/tokenize/lengths.npy"], "tokenize"),
        "params": stage_params_compact("tokenize"), "deps": code["tokenize"],
        "outs": [_out(f"{r}/tokenize/dataset", cache=True), _out(f"{r}/tokenize/lengths.npy"),
                 _out(f"{r}/tokenize/stats.json")]}
    st["stats"] = {
        "cmd": _snakemake([f"{r}/stats/stats.json"], "stats"),
        "params": stage_params_compact("stats"), "deps": [f"{r}/tokenize/lengths.npy", *code["stats"]],
        "outs": [_out(f"{r}/stats/stats.json"), _out(f"{r}/stats/histogram.png")],
        "plots": [_out(f"{r}/stats/histogram.json", extra={"x": "lo", "y": "count"})]}
    st["boundaries"] = {
        "cmd": _snakemake([f"{r}/boundaries/boundaries.json"], "boundaries"),
        "params": stage_params_compact("boundaries"),
        "deps": [f"{r}/tokenize/lengths.npy", *code["boundaries"]],
        "outs": [_out(f"{r}/boundaries/boundaries.json"), _out(f"{r}/boundaries/sweep.json")]}
    st["plans"] = {
        "cmd": _snakemake([f"{r}/plans/metrics.json"], "plans"),
        "params": stage_params_compact("plans"),
        "deps": [f"{r}/tokenize/lengths.npy", f"{r}/boundaries/boundaries.json", *code["plans"]],
        "outs": [_out(f"{r}/plans/metrics.json")]}
    st["profile"] = {
        "cmd": _snakemake([f"{r}/profile/grid.json"], "profile"),
        "params": stage_params_compact("profile"), "deps": code["profile"],
        "outs": [_out(f"{r}/profile/grid.json")]}
    # One stage per strategy (not foreach over a list): only bucketed reads the boundaries.
    for s in strategies():
        deps = [f"{r}/tokenize/dataset", f"{r}/tokenize/lengths.npy"]
        if s == "bucketed":
            deps.append(f"{r}/boundaries/boundaries.json")
        st[f"train-{s}"] = {
            "cmd": _snakemake([f"{r}/train/{s}/summary.json"], "train"),
            "params": stage_params_compact("train"), "deps": [*deps, *code["train"]],
            "outs": [_out(f"{r}/train/{s}/summary.json"), _out(f"{r}/train/{s}/steps.jsonl")]}
    st["quality"] = {
        "cmd": _snakemake([f"{r}/quality/quality.json"], "quality"),
        "params": stage_params_compact("quality"),
        "deps": [f"{r}/tokenize/dataset", f"{r}/tokenize/lengths.npy", f"{r}/boundaries/boundaries.json",
                 *code["quality"]],
        "outs": [_out(f"{r}/quality/{name}") for name in QUALITY_OUTS]}
    st["compare"] = {
        "cmd": _snakemake([f"{r}/compare/metrics.json"], "compare"),
        "params": stage_params_compact("compare"),
        "deps": [f"{r}/stats/stats.json", f"{r}/tokenize/dataset", f"{r}/tokenize/lengths.npy", f"{r}/boundaries/boundaries.json",
                 f"{r}/boundaries/sweep.json", f"{r}/plans/metrics.json", f"{r}/profile/grid.json",
                 *[f"{r}/train/{s}/summary.json" for s in strategies()], f"{r}/quality/quality.json",
                 *code["compare"]],
        "outs": [_out(f"{r}/compare/{name}") for name in COMPARE_OUTS if name not in COMPARE_METRICS + COMPARE_PLOTS],
        "metrics": [_out(f"{r}/compare/{name}") for name in COMPARE_METRICS],
        "plots": [_out(f"{r}/compare/frontier.json", extra={"x": "length_mixing", "y": "efficiency"}),
                  _out(f"{r}/compare/throughput.json", extra={"x": "strategy", "y": "measured_tok_s"}),
                  _out(f"{r}/compare/frontier.png"), _out(f"{r}/compare/throughput.png")]}
    return st


# The quality stage's files (compare turns its held-out loss into metrics users compare).
QUALITY_OUTS = ["quality.json", "metrics.json", "curves.json", "gradients.json", "quality.png"]

# The compare stage's files: metrics users compare, the plots, and the rest (diagnostics, report).
COMPARE_METRICS = ["metrics.json"]
COMPARE_PLOTS = ["frontier.json", "throughput.json", "frontier.png", "throughput.png"]
COMPARE_OUTS = ["metrics.json", "diagnostics.json", "report.md", "stepmodel.json", "histogram.png",
                "params.json", *COMPARE_PLOTS]


def dvc_yaml(results: str = "results") -> str:
    import yaml

    body = yaml.safe_dump({"stages": dvc_stages(results)}, sort_keys=False, width=120)
    return HEADER + "\n" + body
