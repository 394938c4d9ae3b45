"""One list each: the stages live in one table (lenbatch_study.pipeline.registry) and the strategies in one
(lenbatch.batching.strategy); everything else reads them. These tests fail when a second list appears:
a rule the table lacks, a hand-written input or output path in a rule, a literal list of stage or
strategy names in the package, or a stage that reads an artifact it does not declare. No tool runs here
(parsing only, under a second)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

from lenbatch.batching.strategy import STRATEGIES
from lenbatch_study.pipeline import deps, registry

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "workflow" / "rules"


def _rule_blocks() -> dict[str, str]:
    text = "\n".join(p.read_text() for p in sorted(RULES.glob("*.smk")))
    return {m.group(1): m.group(2) for m in re.finditer(r"^rule (\w+):\n((?:[ \t]+.*\n|\n)*)", text + "\n", re.M)}


def _directive(block: str, name: str) -> str:
    m = re.search(rf"^    {name}:\n((?:        .*\n|\s*\n)*)", block, re.M)
    return m.group(1) if m else ""


def test_registry_deps_rules_dvc_and_cli_name_the_same_stages():
    stages = list(registry.STAGES)
    assert list(deps.STAGES) == stages
    # the other stages' rules are generated (workflow/rules/stages.smk); test_workflow.py lists the rules
    # Snakemake itself sees
    assert set(_rule_blocks()) < set(stages), "a rule in workflow/rules/*.smk that the stage table lacks"
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert list(dvc) == stages  # the trainings: one foreach stage over train.strategies
    assert dvc["train"]["foreach"] == "${train.strategies}" and "foreach" not in dvc["compare"]
    assert list(registry.COMMANDS) == stages  # the tools are the CLI's own list (cli/commands.py)
    from lenbatch_study.cli.commands import COMMANDS, TOOLS
    from lenbatch_study.cli.flags import FLAGS

    assert set(FLAGS) == set(COMMANDS) == set(stages) | {t.name for t in TOOLS}
    assert not any(t.stage for t in TOOLS)
    snakefile = (ROOT / "Snakefile").read_text()
    assert "all_outputs()" in snakefile and "rules." not in snakefile.split("rule all:")[1]


def test_every_rule_reads_its_inputs_outputs_and_params_from_the_table():
    """A rule's input and output are exactly ``**inputs("<rule>")`` / ``**outputs("<rule>")`` and its params
    ``cfg("<rule>")``: no path of another stage's output is written by hand in a rule."""
    for name, block in _rule_blocks().items():
        for directive, helper in (("input", "inputs"), ("output", "outputs")):
            lines = [
                ln.strip()
                for ln in _directive(block, directive).splitlines()
                if ln.strip() and not ln.strip().startswith("#")
            ]
            assert lines == [f'**{helper}("{name}"),'], f"rule {name} {directive}: {lines}"
        assert f'cfg=cfg("{name}")' in _directive(block, "params"), name
    text = "".join(p.read_text() for p in RULES.glob("*.smk"))
    assert "rules." not in text, "a rule reads another rule's output by name: take it from the table"


def _producers() -> dict[str, str]:
    """``{artifact module: the stage that writes its files}`` (each module's ``WRITER``)."""
    producer = {}
    for p in (deps.SRC / "pipeline" / "artifacts").glob("*.py"):
        tree = ast.parse(p.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "WRITER" for t in node.targets):
                producer[f"lenbatch_study.pipeline.artifacts.{p.stem}"] = node.value.value
    return producer


# the shared wording, the JSON writer and every output folder's params.json
SHARED = {"lenbatch_study.pipeline.artifacts.reading", "lenbatch_study.pipeline.artifacts.writing"}


def test_the_table_declares_what_the_stages_read():
    """A stage's code reaches the artifact module of each input it declares and of its own outputs (it
    writes them with that module's names), and no other artifact module but the shared wording and
    writer: the reads in the code and the table's inputs are one list."""
    producer = _producers()
    assert sorted(producer.values()) == sorted(registry.STAGES), "one artifact module per stage"
    for stage, st in registry.STAGES.items():
        used = {m for m in deps.stage_modules(stage) if m.startswith("lenbatch_study.pipeline.artifacts.")} - SHARED
        declared = {i.stage for i in st.inputs if not i.trigger_only}  # the machine: a dependency, never read
        assert {producer[m] for m in used} == declared | {stage}, (stage, sorted(used), sorted(declared))


def test_a_rules_threads_come_from_a_key_its_stage_reads():
    """The generated rules take their threads from the params key the table names (tokenize's
    data.workers): a key of the stage's own, so changing it reruns the stage under both tools."""
    assert registry.STAGES["tokenize"].threads == "data.workers"
    for stage, st in registry.STAGES.items():
        assert st.threads is None or st.threads in deps.stage_param_keys(stage), stage


def _artifact_modules() -> dict[str, object]:
    import importlib

    return {m: importlib.import_module(m) for m in [*_producers(), *sorted(SHARED)]}


def _file_names(module: object) -> set[str]:
    """The file and folder names an artifact module defines: its upper-case string constants that name a
    file (``x.json``) or, for a name in the stage table's outputs, a folder (``dataset``)."""
    declared = {o.file for st in registry.STAGES.values() for o in st.outputs.values()}
    return {
        v
        for k, v in vars(module).items()
        if k.isupper() and isinstance(v, str) and (v in declared or re.fullmatch(r"[\w-]+\.\w+", v))
    }


def test_outputs_come_from_the_artifact_modules():
    """Every output in the table has its file name from its stage's artifact module (``params.json``,
    which every output folder holds, from the shared writer), and the table spells no file name itself."""
    from lenbatch_study.pipeline.artifacts import writing

    owner = {mod.WRITER: mod for m, mod in _artifact_modules().items() if m not in SHARED}
    for stage, st in registry.STAGES.items():
        for name, out in st.outputs.items():
            assert out.file in _file_names(owner[stage]) | {writing.PARAMS}, (stage, name, out.file)
    calls = [
        n
        for n in ast.walk(ast.parse((deps.SRC / "pipeline" / "registry.py").read_text()))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "Output"
    ]
    assert len(calls) == sum(len(st.outputs) for st in registry.STAGES.values())
    spelled = [ast.unparse(c) for c in calls if isinstance(c.args[0], ast.Constant)]
    assert not spelled, f"a file name written in the table, not taken from its artifact module: {spelled}"


def _docstrings(tree: ast.AST) -> set[int]:
    return {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }


def _spelled_names(path: Path, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every string literal in ``path`` (docstrings aside; an f-string's literal parts
    included) that spells a name of ``names`` as a path: the name itself, a path ending in ``/<name>``
    or one starting ``<name>/``. A name inside a sentence (an error's wording, a help string) is prose."""
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            text = node.value.strip()
            found += [
                (node.lineno, n)
                for n in sorted(names)
                if text == n or text.endswith("/" + n) or text.startswith(n + "/")
            ]
    return sorted(found)


def test_each_file_name_is_spelled_only_in_its_artifact_module():
    """Every file name of the stage table's outputs and of the artifact modules (``timings.json``,
    ``checkpoint.pt`` ...) is spelled as a path only in the artifact module(s) that define it: the stages,
    corpus, runtime and analysis take the names (or the paths) from there. The table names its files by
    these modules' constants (:func:`test_outputs_come_from_the_artifact_modules`)."""
    owners: dict[str, set[Path]] = {}
    for mod in _artifact_modules().values():
        for name in _file_names(mod):
            owners.setdefault(name, set()).add(Path(mod.__file__).resolve())
    declared = {o.file for st in registry.STAGES.values() for o in st.outputs.values()}
    assert declared <= set(owners), sorted(declared - set(owners))
    assert {"timings.json", "checkpoint.pt", "params.json"} <= set(owners)
    registry_file = (deps.SRC / "pipeline" / "registry.py").resolve()
    bad = []
    for p in sorted(deps.SRC.rglob("*.py")):
        if p.resolve() != registry_file:
            bad += [
                f"{p.relative_to(deps.SRC)}:{line} {name}"
                for line, name in _spelled_names(p, set(owners))
                if p.resolve() not in owners[name]
            ]
    assert not bad, f"a file name spelled outside its artifact module: {bad}"


def test_the_file_name_scan_finds_a_spelled_name(tmp_path):
    """The scan above can fail: a name as a literal, at the end of a path and of an f-string, and a folder
    at the start of one are found; a docstring and a sentence that mention a name are not."""
    p = tmp_path / "writer.py"
    p.write_text('''"""Writes ``summary.json``."""
import os
A = os.path.join("out", "summary.json")
B = f"{A}/grid.json"
C = "results/train/sorted/steps.jsonl"
D = "by-strategy/bucketed.json"
E = "the grid (an older grid.json) lacks it"


def f():
    """grid.json"""
''')
    names = {"summary.json", "grid.json", "steps.jsonl", "by-strategy"}
    assert _spelled_names(p, names) == [(3, "summary.json"), (4, "grid.json"), (5, "steps.jsonl"), (6, "by-strategy")]


def _literals(path: Path) -> list[tuple[int, list]]:
    """(line, constant values) of every list, tuple, set and dict (its keys) literal in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
            elts = node.keys if isinstance(node, ast.Dict) else node.elts
            if elts:
                found.append((node.lineno, [e.value if isinstance(e, ast.Constant) else None for e in elts]))
    return found


def _pure_name_literals(path: Path, names: set[str], least: int, literals: list | None = None) -> list[int]:
    """Lines of literals of ``least`` or more values, all of them in ``names``."""
    return [
        line
        for line, values in (literals if literals is not None else _literals(path))
        if len(values) >= least and all(isinstance(v, str) and v in names for v in values)
    ]


def test_no_second_list_of_stages_or_strategies_in_the_package():
    """No literal list, tuple, set or dict of stage names (4 or more) or of strategy names (3 or more)
    outside their table; the planner's name -> function map is checked equal to the list at import."""
    # the list itself; the planner's _FUNCS; the study's measurements, keyed by the three strategies it ran
    allowed = {
        ("lenbatch/batching/strategy.py", "strategies"),
        ("lenbatch/batching/strategies.py", "strategies"),
        ("lenbatch_study/analysis/study_replay.py", "strategies"),
    }
    stage_names = set(registry.COMMANDS)
    bad = []
    for p in sorted(p for package in deps.PACKAGES for p in (deps.SRC_ROOT / package).rglob("*.py")):
        rel = p.relative_to(deps.SRC_ROOT).as_posix()
        if rel == "lenbatch_study/pipeline/registry.py":
            continue
        literals = _literals(p)
        for kind, names, least in (("stages", stage_names, 4), ("strategies", set(STRATEGIES), 3)):
            if (rel, kind) not in allowed:
                bad += [f"{rel}:{line} ({kind})" for line in _pure_name_literals(p, names, least, literals)]
    for p in [ROOT / "Snakefile", *RULES.glob("*.smk")]:
        if any(f'"{s}"' in p.read_text() for s in STRATEGIES if s != "bucketed"):
            bad.append(f"{p.relative_to(ROOT)} (strategy names)")
    assert not bad, f"a second list: {bad}"


def test_the_checker_finds_a_second_list(tmp_path):
    p = tmp_path / "m.py"
    p.write_text('X = ("sorted", "random", "packed")\nY = ["tokenize", "stats", "plans", "compare"]\nZ = ("a", "b")\n')
    assert _pure_name_literals(p, set(STRATEGIES), 3) == [1]
    assert _pure_name_literals(p, set(registry.COMMANDS), 4) == [2]
