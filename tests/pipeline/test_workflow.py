"""The workflow as users meet it: real Snakemake dry-runs, params refused before any rule, DVC on a fresh clone."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lenbatch_study.pipeline import registry

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
# the stages a run plans (machine and source: written as the Snakefile is parsed, so never planned)
STAGES = [s for s, st in registry.STAGES.items() if not st.always_changed]


def run(args, cwd=ROOT, timeout=300, check=True):
    proc = subprocess.run(args, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def job_counts(dry_run_output: str) -> dict[str, int]:
    """Parse Snakemake's 'Job stats' table of a dry-run."""
    table = dry_run_output.split("Job stats:")[1]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


def copy_workflow(dest: Path) -> Path:
    """A working copy of the workflow files in ``dest`` (results and logs left behind)."""
    for name in ("Snakefile", "params.yaml", "dvc.yaml", ".dvcignore"):
        shutil.copy2(ROOT / name, dest / name)
    for name in ("workflow", "profiles", "configs", "src"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return copy_workflow(tmp_path_factory.mktemp("wf"))


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--workflow-profile", "profiles/slurm"],
        ["--workflow-profile", "profiles/slurm", "--configfile", "configs/qwen3.6-27b-8gpu.yaml"],
        ["--configfile", "configs/qwen3.6-27b-8gpu.yaml"],
    ],
    ids=["default", "slurm", "slurm-27b-8gpu", "default-27b-8gpu"],
)
def test_dry_run_plans_every_stage_and_strategy(work, extra):
    # -p: the default profile prints no shell lines (printshellcmds: false); the asserts below read their params
    out = run(["snakemake", "-n", "-p", *extra], cwd=work).stdout
    counts = job_counts(out)
    for stage in STAGES:
        assert counts.get(stage, 0) >= 1, f"{stage} missing from the DAG: {counts}"
    # the machine fingerprint: written as the Snakefile is parsed (the measuring stages' dependency), not planned
    assert list(work.glob("results/**/machine/machine.json")) and "machine" not in counts, counts
    assert counts["train"] == 5
    # the training's processes per node: train.nproc in the rule's params (lenbatch train starts torchrun)
    if "configs/qwen3.6-27b-8gpu.yaml" in extra:
        assert re.search(r'"nproc": 8\b', out) and '"token_budget": 49152' in out
    else:
        assert re.search(r'"nproc": 2\b', out) and '"token_budget": 16384' in out
    if extra == ["--configfile", "configs/qwen3.6-27b-8gpu.yaml"]:
        # one machine (the default profile's gpu=1 limit): each GPU job takes the whole budget, one at a time
        assert re.search(r"rule train:(.|\n)*?resources: .*\bgpu=1, nodes=1", out)
    if "profiles/slurm" in extra:
        assert "slurm_partition=gpu" in out
        if "configs/qwen3.6-27b-8gpu.yaml" in extra:
            assert re.search(r"rule train:(.|\n)*?resources:.*gpu=8", out)


def test_snakemake_has_one_rule_per_stage_of_the_table(work):
    """Hand-written or generated (workflow/rules/stages.smk), Snakemake sees exactly the table's stages."""
    listed = run(["snakemake", "--list-rules"], cwd=work).stdout.split()
    assert sorted(listed) == sorted([*registry.STAGES, "all"]), listed


def test_every_rule_has_log_and_benchmark():
    text = "".join(p.read_text() for p in (ROOT / "workflow/rules").glob("*.smk"))
    rules = re.findall(r"^rule (\w+):", text, re.M)
    assert set(rules) <= set(registry.STAGES), rules
    # the generated rule (workflow/rules/stages.smk) has them too
    generated = text.split("    rule:\n")[1]
    assert all(f"\n        {d}:" in generated for d in ("log", "benchmark", "params")), generated
    for block in re.split(r"^rule ", text, flags=re.M)[1:]:
        name = block.split(":")[0]
        assert "\n    log:" in block, f"rule {name} has no log:"
        assert "\n    benchmark:" in block, f"rule {name} has no benchmark:"
        assert "\n    params:" in block, f"rule {name} takes no params:"


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"boundaries": {"num_bucket": 8}}, ["boundaries.num_bucket", "num_buckets"]),
        ({"batching": {"token_budget": "lots"}}, ["batching.token_budget", "integer"]),
        ({"train": {"strategies": ["sorted", "zigzag"]}}, ["train.strategies", "zigzag"]),
    ],
)
def test_bad_params_are_refused_before_any_rule_runs(work, tmp_path, bad, words):
    """A typo'd key, a wrong type, an unknown strategy: refused as Snakemake parses the workflow, by the one
    check (its message names the key and the fix), before any rule."""
    override = tmp_path / "bad.yaml"
    override.write_text(yaml.safe_dump(bad))
    proc = run(["snakemake", "-n", "--configfile", str(override)], cwd=work, check=False)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    for word in ["invalid params:", *words]:
        assert word in text, text
    assert "rule tokenize" not in text


def test_dvc_status_and_dry_repro_on_a_fresh_clone(tmp_path):
    """DVC reads the pipeline on a fresh clone: every stage is known, and a dry repro names them."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(ROOT), str(clone)])
    status = run(["dvc", "status"], cwd=clone)
    assert "ERROR" not in status.stdout + status.stderr
    # (not `dvc repro --dry`: it hashes the train stages' dataset dep, which a clone lacks until tokenize
    # runs or `dvc pull`/`dvc checkout` restores it from a cache)
    listed = run(["dvc", "stage", "list", "--name-only"], cwd=clone).stdout.split()
    for stage in [
        n for s in STAGES for n in ([f"{s}@sorted", f"{s}@packed"] if registry.STAGES[s].per_strategy else [s])
    ]:
        assert stage in listed, f"stage {stage} missing from dvc stage list: {listed}"
    dag = run(["dvc", "dag", "--dot"], cwd=clone).stdout
    assert '"train@bucketed" -> "compare"' in dag and '"train@sorted" -> "compare"' in dag, dag


def test_dvc_trains_exactly_the_strategies_params_yaml_lists(work, tmp_path):
    """dvc.yaml's trainings are a foreach over train.strategies: DVC resolves it from params.yaml (what
    `dvc exp run -S` edits), so two listed strategies are two training stages; each training depends on its
    own by-strategy file (bucketed's alone holds the edges), compare on the runs' folder, not on a list."""
    from _e2e import resolve_stage  # lazily: _e2e imports this module

    repo = copy_workflow(tmp_path)
    run(["git", "init", "-q"], cwd=repo)
    run(["dvc", "init", "-q"], cwd=repo)
    doc = yaml.safe_load((repo / "params.yaml").read_text())
    doc["train"]["strategies"] = ["sorted", "packed"]
    (repo / "params.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    listed = run(["dvc", "stage", "list", "--name-only"], cwd=repo).stdout.split()
    assert [s for s in listed if s.startswith("train")] == ["train@sorted", "train@packed"], listed
    dvc = yaml.safe_load((repo / "dvc.yaml").read_text())
    for strategy in ("sorted", "bucketed"):
        deps_ = resolve_stage(dvc, f"train@{strategy}")["deps"]
        assert f"results/boundaries/by-strategy/{strategy}.json" in deps_
        assert "results/boundaries/boundaries.json" not in deps_
    compare = resolve_stage(dvc, "compare")["deps"]
    assert "results/train" in compare and not any(d.startswith("results/train/") for d in compare), compare


# --------------------------------------------------------------------------- one dependency table


def test_committed_dvc_yaml_is_the_generated_one():
    """dvc.yaml is written by `lenbatch dvc-yaml` from deps.py (derived code deps, declared params): it
    fails here when an import or a declaration changed without regenerating it, or when params.yaml lacks a
    section or key core/sections.py declares (tests/pipeline/test_params_fill.py)."""
    proc = run([str(BIN / "lenbatch"), "dvc-yaml", "--check"], check=False)
    assert proc.returncode == 0, proc.stderr + "\nregenerate: lenbatch dvc-yaml"


def _import_targets(path: Path) -> set[str]:
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_code_deps_follow_every_import():
    """Every lenbatch module a stage's modules import (anywhere, lazily too) is one of its code deps,
    in the Snakemake rule and in dvc.yaml alike."""
    from lenbatch_study.pipeline import deps

    src = ROOT / "src/lenbatch"
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for stage in deps.STAGES:
        if deps.STAGES[stage].always_changed:  # the machine: DVC runs it every time, no deps
            assert "deps" not in dvc[stage] and dvc[stage]["always_changed"], stage
            continue
        files = set(deps.stage_code(stage))
        entry = "src/" + deps.COMMANDS[stage].module.replace(".", "/") + ".py"
        assert entry in files and not any(f.startswith("src/lenbatch_study/cli/") for f in files), stage
        for f in files:
            for name in _import_targets(ROOT / f):
                target = src.joinpath(*name.split(".")[1:]).with_suffix(".py")
                if name.startswith("lenbatch.") and target.exists():
                    assert f"src/{target.relative_to(ROOT / 'src').as_posix()}" in files, f"{stage}: {f} imports {name}"
        body = dvc[stage]["do"] if "foreach" in dvc[stage] else dvc[stage]
        assert files == {d for d in body["deps"] if d.startswith("src/")}, stage
    # the drift: train imports hostmem and the CPU-share helper (not the prediction fit), and
    # plans through the package (padding)
    train = set(deps.stage_code("train"))
    assert {
        "src/lenbatch_study/runtime/hostmem.py",
        "src/lenbatch_study/core/cpu.py",
        "src/lenbatch/batching/padding.py",
    } <= train
    assert "src/lenbatch_study/analysis/stepmodel.py" not in train
    assert {"src/lenbatch_study/corpus/sources.py", "src/lenbatch_study/corpus/chat.py"} <= set(
        deps.stage_code("tokenize")
    )


def _param_reads(path: Path) -> set[str]:
    """``<x>.<section>.<key>`` attribute reads in a module, for real params sections and keys."""
    import ast
    import dataclasses

    from lenbatch_study.core.config import SECTIONS

    fields = {s: {f.name for f in dataclasses.fields(c)} for s, c in SECTIONS.items()}
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr in fields
            and node.attr in fields[node.value.attr]
        ):
            found.add(f"{node.value.attr}.{node.attr}")
    return found


def test_each_stage_declares_every_params_key_its_own_code_reads():
    """A stage's declared params cover every ``params.<section>.<key>`` read in its modules (its import
    closure minus other stages' entry modules, whose keys it declares by hand: profile uses train's
    StepRunner but not its schedule), and profile does not depend on keys only training reads."""
    from lenbatch_study.pipeline import deps

    entries = {deps.COMMANDS[s].module for s in deps.STAGES}
    for stage in deps.STAGES:
        declared = set(deps.stage_param_keys(stage))
        for mod in deps.stage_modules(stage):
            if (
                mod in entries and mod != deps.COMMANDS[stage].module
            ) or mod == "lenbatch_study.core.config":  # config: the loader's checks
                continue
            path = (
                ROOT
                / "src"
                / (mod.replace(".", "/") + (".py" if mod not in ("lenbatch", "lenbatch_study") else "/__init__.py"))
            )
            missing = _param_reads(path) - declared
            assert not missing, (
                f"stage {stage}: {mod} reads {sorted(missing)}, not declared in the stage table (pipeline/registry.py)"
            )
    profile = set(deps.stage_param_keys("profile"))
    for key in (
        "train.warmup_steps",
        "train.queue_size",
        "train.checkpoint_every",
        "train.useful_tokens",
        "train.strategies",
    ):
        assert key not in profile


def test_rules_get_the_same_params_as_dvc(work):
    """The params each rule passes (its --params-json, the one form: no params file beside it) are the keys
    dvc.yaml tracks for its stage."""
    from lenbatch_study.pipeline import deps

    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    out = run(["snakemake", "-n", "-p", "--forceall"], cwd=work).stdout
    assert "--params " not in out  # a stage reads its keys from the rule alone, not params.yaml again
    for stage in deps.STAGES:
        if not deps.STAGES[stage].params:  # the machine: reads no params, and its command takes none
            assert "params" not in dvc[stage] and f"lenbatch {stage} --out " in out, stage
            continue
        m = re.search(rf"(?:lenbatch|-m lenbatch_study) {stage} --params-json '([^']*)'", out)
        assert m, f"no {stage} command in the dry-run"
        payload = json.loads(m.group(1))
        keys = {f"{s}.{k}" for s, kv in payload.items() for k in kv}
        assert keys == set(deps.stage_param_keys(stage)), stage
        if deps.STAGES[stage].always_changed:  # the source: DVC runs it every time, reading params.yaml itself
            assert "params" not in dvc[stage] and "--params params.yaml" in dvc[stage]["cmd"], stage
            continue
        tracked = (dvc[stage]["do"] if "foreach" in dvc[stage] else dvc[stage])["params"]
        assert tracked[-1] == "settings", stage  # the overlay (core/settings.py): resolved into the keys above
        tracked = tracked[:-1]
        expanded = {
            k for item in tracked for k in ([item] if "." in item else [f"{item}.{f}" for f in deps.section_keys(item)])
        }
        assert keys == expanded, stage


def test_slurm_dry_run_gives_every_gpu_job_one_node_and_its_gpus(work):
    out = run(
        ["snakemake", "-n", "--workflow-profile", "profiles/slurm", "--configfile", "configs/qwen3.6-27b-8gpu.yaml"],
        cwd=work,
    ).stdout
    jobs = re.findall(r"^rule (\w+):\n(?:.*\n)*?\s+resources: (.*)$", out, re.M)
    gpu_jobs = {name: res for name, res in jobs if re.search(r"\bgpu=", res)}
    assert sum(1 for name, _ in jobs if name == "train") == 5
    assert {name for name, _ in jobs if name in ("train", "profile")} <= set(gpu_jobs)
    for name, res in jobs:
        if name in ("train", "profile"):
            # profile times the drafter on cuda:<nproc-1> as training does: it needs all 8 visible
            assert "gpu=8" in res and "nodes=1" in res, (name, res)
    # lenbatch train builds torchrun's rendezvous from these at run time (tests/runtime/test_launch.py)
    shell = run(
        [
            "snakemake",
            "-n",
            "-p",
            "--workflow-profile",
            "profiles/slurm",
            "--configfile",
            "configs/qwen3.6-27b-8gpu.yaml",
        ],
        cwd=work,
    ).stdout
    trainings = [line for line in shell.splitlines() if "Shell command: lenbatch train " in line]
    assert len(trainings) == 5 and all(
        re.search(r'"nproc": 8\b', t) and re.search(r'"nodes": 1\b', t) for t in trainings
    ), trainings


def test_a_new_import_reaches_both_tools_or_the_check_fails(tmp_path):
    """Add an import to a stage's module: the committed dvc.yaml is then stale (the check fails), and
    regenerating it lists the new module for that stage and for no stage that does not import it."""
    work = copy_workflow(tmp_path)
    stats = work / "src/lenbatch_study/stages/stats.py"
    stats.write_text(
        stats.read_text() + "\n\ndef _late():\n    from lenbatch_study.runtime.hostmem import reuse_freed_memory\n"
        "    return reuse_freed_memory\n"
    )
    env = {**ENV, "PYTHONPATH": str(work / "src")}
    lenbatch = [sys.executable, "-m", "lenbatch_study", "dvc-yaml"]
    check = subprocess.run([*lenbatch, "--check"], cwd=work, env=env, capture_output=True, text=True)
    assert check.returncode == 1 and "lenbatch dvc-yaml" in check.stderr
    subprocess.run(lenbatch, cwd=work, env=env, check=True)
    stages = yaml.safe_load((work / "dvc.yaml").read_text())["stages"]
    assert "src/lenbatch_study/runtime/hostmem.py" in stages["stats"]["deps"]
    assert "src/lenbatch_study/runtime/hostmem.py" not in stages["tokenize"]["deps"]
    # and Snakemake's rule follows the same edit (its code inputs come from the same function)
    out = subprocess.run(
        ["snakemake", "-n", "--forceall", "results/stats/stats.json"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert re.search(r"rule stats:\n\s+input: .*src/lenbatch_study/runtime/hostmem\.py", out)


def test_a_configs_own_results_root_is_kept_out_of_git(tmp_path):
    """A user's config with results_dir: results/mine (its tokenized dataset tens of MB) is ignored by git
    from the first parse; the default's results/ stays committed."""
    work = copy_workflow(tmp_path)
    (work / "configs/mine.yaml").write_text("results_dir: results/mine\n")
    run(["git", "init", "-q"], cwd=work)
    shutil.copy2(ROOT / ".gitignore", work / ".gitignore")
    run(["snakemake", "-n", "--configfile", "configs/mine.yaml"], cwd=work)
    assert (work / "results/mine/machine/machine.json").exists()
    assert (
        run(
            ["git", "check-ignore", "-q", "results/mine/tokenize/dataset/data-00000-of-00001.arrow"],
            cwd=work,
            check=False,
        ).returncode
        == 0
    )
    assert run(["git", "check-ignore", "-q", "results/mine/compare/report.md"], cwd=work, check=False).returncode == 0
    assert "results/mine" not in run(["git", "status", "--porcelain", "-uall"], cwd=work).stdout
    run(["snakemake", "-n"], cwd=work)  # the default's root: nothing written to ignore it
    assert not (work / "results/.gitignore").exists()
    assert run(["git", "check-ignore", "-q", "results/compare/report.md"], cwd=work, check=False).returncode == 1


def test_a_timed_job_never_shares_the_machine(work):
    """profile, the trainings and interleave time seconds: each asks for the whole `machine` resource the
    default profile caps, every other job for 1 of it, so Snakemake starts a timed job only alone, whatever
    --cores allows (a 2-core run once timed interleave beside quality and plans)."""
    profile = yaml.safe_load((ROOT / "profiles/default/config.yaml").read_text())
    assert "machine=100" in profile["resources"] and "machine=1" in profile["default-resources"]
    out = run(["snakemake", "-n", "--cores", "16"], cwd=work).stdout
    asked = {}
    for rule, res in re.findall(r"^rule (\w+):\n(?:.*\n)*?\s+resources: (.*)$", out, re.M):
        asked.setdefault(rule, set()).add(int(re.search(r"\bmachine=(\d+)", res).group(1)))
    timed = {"profile", "train", "interleave"}
    assert {r: v for r, v in asked.items() if r in timed} == dict.fromkeys(timed, {100}), asked
    assert all(v == {1} for r, v in asked.items() if r not in timed), asked
