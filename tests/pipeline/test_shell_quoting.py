"""No config value reaches a shell unquoted (issue 48.2): a ``results_dir`` holding a space split the rules'
arguments (a stray file created or truncated at the prefix), and one holding ``;touch …;`` ran the command.
Real Snakemake: every rule's shell line printed by a dry run parses back to the exact paths, and the first
rules run for real under such a folder name."""

from __future__ import annotations

import shlex

import pytest
import yaml

from lenbatch_study.pipeline import registry
from test_workflow import copy_workflow, run

# a space, the shell's separators and a quote: each broke or hijacked the unquoted command line
HOSTILE = "out dir;touch pwned;'x"


def _shell_lines(dry_run: str) -> list[str]:
    """The shell commands `snakemake -n -p` prints (``Shell command: …`` in each job's block)."""
    lines = [line.split("Shell command: ", 1)[1].strip() for line in dry_run.splitlines() if "Shell command: " in line]
    return [line for line in lines if line != "None"]  # rule all runs no shell


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    work = copy_workflow(tmp_path_factory.mktemp("quoting"))
    (work / "hostile.yaml").write_text(yaml.safe_dump({"results_dir": HOSTILE}))
    return work


def test_every_rule_line_parses_back_to_the_configured_folder(hostile):
    proc = run(["snakemake", "-n", "-p", "--configfile", "configs/tiny.yaml", "hostile.yaml"], cwd=hostile)
    lines = _shell_lines(proc.stdout)
    rules = {shlex.split(line)[1] for line in lines if line.startswith("lenbatch ")}
    assert rules == {s for s, st in registry.STAGES.items() if not st.always_changed}, lines
    assert sum(line.startswith("lenbatch train ") for line in lines) == 5  # the five trainings
    for line in lines:
        words = shlex.split(line)
        # every path flag's value is one word under the configured folder, the log one word too
        for flag in (
            "--out",
            "--data",
            "--lengths",
            "--boundaries",
            "--stats",
            "--plans",
            "--profile",
            "--train",
            "--quality",
            "--interleave",
        ):
            if flag in words:
                assert words[words.index(flag) + 1].startswith(f"{HOSTILE}/"), (flag, line)
        assert words[words.index(">") + 1].startswith(f"{HOSTILE}/logs/"), line


@pytest.mark.slow
def test_the_first_rules_run_for_real_under_a_hostile_folder_name(hostile):
    """tokenize and stats for real (configs/tiny.yaml: 60 conversations): the outputs land in the folder
    named, and nothing runs or is written outside it."""
    before = {p.name for p in hostile.iterdir()}
    run(
        [
            "snakemake",
            "--cores",
            "1",
            "--configfile",
            "configs/tiny.yaml",
            "hostile.yaml",
            "--",
            f"{HOSTILE}/stats/stats.json",
        ],
        cwd=hostile,
        timeout=600,
    )
    assert (hostile / HOSTILE / "stats" / "stats.json").is_file()
    assert (hostile / HOSTILE / "tokenize" / "lengths.npy").is_file()
    assert not list(hostile.rglob("pwned"))  # the `;touch pwned;` in the name never ran
    assert {p.name for p in hostile.iterdir()} - before <= {HOSTILE, ".snakemake"}


# values that reach a shell quoted already (cfg: shlex.quote of the JSON; boundaries: the flag and its
# shlex-quoted path) or that the params loader types as integers
PRE_QUOTED = {"params.cfg", "params.boundaries"}


def test_no_rule_formats_a_value_into_its_shell_without_quoting():
    """The rule for rules to come: every {params.x}, {input.x}, {output.x}, {log} and {wildcards.x} in a shell
    line carries :q, unless it is quoted where it is built (PRE_QUOTED)."""
    import re

    from test_workflow import ROOT

    bare = []
    for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        for n, line in enumerate(smk.read_text().splitlines(), 1):
            if line.lstrip().startswith("#"):
                continue
            for m in re.finditer(
                r"(?<!\{)\{((?:params|input|output|log|wildcards|resources)(?:\.\w+)?)(:[^}]*)?\}(?!\})", line
            ):
                if m.group(2) != ":q" and m.group(1) not in PRE_QUOTED:
                    bare.append(f"{smk.name}:{n} {m.group(0)}")
    assert not bare, f"unquoted in a shell line (use {{x:q}}): {bare}"
