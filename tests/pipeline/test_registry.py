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
    assert stages == ["machine", "tokenize", "stats", "boundaries", "plans", "profile", "train", "quality", "interleave",
                      "compare"]
    assert list(deps.STAGES) == stages
    assert set(_rule_blocks()) == set(stages), "a rule in workflow/rules/*.smk that the stage table lacks (or back)"
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert list(dvc) == stages  # the trainings: one foreach stage over train.strategies
    assert dvc["train"]["foreach"] == "${train.strategies}" and "foreach" not in dvc["compare"]
    assert set(stages) <= set(registry.COMMANDS)
    from lenbatch_study.cli.flags import FLAGS

    assert set(FLAGS) == set(registry.COMMANDS)
    snakefile = (ROOT / "Snakefile").read_text()
    assert "all_outputs()" in snakefile and "rules." not in snakefile.split("rule all:")[1]


def test_every_rule_reads_its_inputs_outputs_and_params_from_the_table():
    """A rule's input and output are exactly ``**inputs("<rule>")`` / ``**outputs("<rule>")`` and its params
    ``cfg("<rule>")``: no path of another stage's output is written by hand in a rule."""
    for name, block in _rule_blocks().items():
        for directive, helper in (("input", "inputs"), ("output", "outputs")):
            lines = [ln.strip() for ln in _directive(block, directive).splitlines()
                     if ln.strip() and not ln.strip().startswith("#")]
            assert lines == [f'**{helper}("{name}"),'], f"rule {name} {directive}: {lines}"
        assert f'cfg=cfg("{name}")' in _directive(block, "params"), name
    text = "".join(p.read_text() for p in RULES.glob("*.smk"))
    assert "rules." not in text, "a rule reads another rule's output by name: take it from the table"


def test_the_table_declares_what_the_stages_read():
    """A stage imports the artifact module of each input it declares, and no other artifact module but
    the shared wording and writer: the reads in the code and the table's inputs are one list. (Writers
    never import their outputs' module: editing a reader must not rerun the stage that writes the file.)"""
    producer = {}
    for p in (deps.SRC / "pipeline" / "artifacts").glob("*.py"):
        tree = ast.parse(p.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "WRITER" for t in node.targets):
                producer[f"lenbatch_study.pipeline.artifacts.{p.stem}"] = node.value.value
    assert set(producer.values()) == set(registry.STAGES) - {"compare"}
    shared = {"lenbatch_study.pipeline.artifacts.reading", "lenbatch_study.pipeline.artifacts.writing"}
    for stage, st in registry.STAGES.items():
        read = {m for m in deps.stage_modules(stage) if m.startswith("lenbatch_study.pipeline.artifacts.")} - shared
        declared = {i.stage for i in st.inputs if not i.trigger_only}  # the machine: a dependency, never read
        assert {producer[m] for m in read} == declared, (stage, sorted(read), sorted(declared))
        assert stage not in {producer[m] for m in read}, f"{stage} imports the reader of its own outputs"


def test_outputs_come_from_the_artifact_modules():
    """Every output another stage reads has its file name from its artifact module (one owner of the path)."""
    from lenbatch_study.pipeline.artifacts import bucket_edges, length_stats, plan_metrics, profile_grid, quality_result
    from lenbatch_study.pipeline.artifacts import interleave_timings, machine_file, tokenized, train_runs

    read = {(i.stage, i.output) for st in registry.STAGES.values() for i in st.inputs}
    owner = {"machine": machine_file, "tokenize": tokenized, "stats": length_stats, "boundaries": bucket_edges, "plans": plan_metrics,
             "profile": profile_grid, "train": train_runs, "quality": quality_result, "interleave": interleave_timings}
    for stage, name in read:
        file = registry.STAGES[stage].outputs[name].file
        mod = owner[stage]
        assert mod.WRITER == stage and file in {v for k, v in vars(mod).items() if k.isupper() and isinstance(v, str)}


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
    return [line for line, values in (literals if literals is not None else _literals(path))
            if len(values) >= least and all(isinstance(v, str) and v in names for v in values)]


def test_no_second_list_of_stages_or_strategies_in_the_package():
    """No literal list, tuple, set or dict of stage names (4 or more) or of strategy names (3 or more)
    outside their table; the planner's name -> function map is checked equal to the list at import."""
    # the list itself; the planner's _FUNCS; the study's measurements, keyed by the three strategies it ran
    allowed = {("lenbatch/batching/strategy.py", "strategies"), ("lenbatch/batching/strategies.py", "strategies"),
               ("lenbatch_study/analysis/study_replay.py", "strategies")}
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
