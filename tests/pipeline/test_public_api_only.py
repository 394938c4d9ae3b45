"""The workflow stands on Snakemake's and DVC's public ground only (issue 46, item 1): no private attribute of
theirs (``workflow.persistence._read_record``, ``snakemake.jobs._x``, ``dvc.repo._y``), no import of a private
name or module of theirs, and no parsing of the text their logs print. A renamed private attribute in a
patch release would otherwise change silently what the workflow reruns; a reworded log line would change
what it decides. Scans the package, the rules, the Snakefile, the tools and the benchmarks, and the tests'
helper modules. (<1 s)"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

TOOLS = ("snakemake", "dvc")
# objects of theirs a Snakefile or a plugin reaches by name: the workflow object, its persistence
ROOTS = ("snakemake", "dvc", "workflow", "persistence")
# lines their logs print that code once read to decide something (Snakemake's restore note, its job table,
# its "nothing to do", its incomplete and removal notes; DVC's stage lines); reading them back is parsing
LOG_PHRASES = (
    "Restored previous version",
    "updating job failed",
    "Job stats:",
    "Nothing to be done",
    "Removing output files of failed job",
    "IncompleteFilesException",
    "Running stage '",
    "Stage '",
    "didn't change, skipping",
    "Building DAG of jobs",
    "Select jobs to execute",
    "Finished jobid",
    "Using shell:",
    "Provided cores",
)

_PRIVATE = r"_(?!_)\w*"  # _name, not a dunder (__file__, __version__ are public)
_IMPORT_PRIVATE_MODULE = re.compile(rf"^\s*(?:from|import)\s+(?:{'|'.join(TOOLS)})(?:\.\w+)*\.{_PRIVATE}", re.M)
_FROM_IMPORT = re.compile(rf"^\s*from\s+((?:{'|'.join(TOOLS)})(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n]*)", re.M)
_ALIAS = re.compile(rf"(?<![\w.])(\w+)\s*=\s*(?:{'|'.join(ROOTS)})\b")


def sources() -> list[Path]:
    """The files that make up the workflow and its tools: every .py and .smk under src/, workflow/, tools/,
    benchmarks/, the Snakefile, and the tests' helper modules (conftest.py, _*.py)."""
    files = [REPO / "Snakefile"]
    for top in ("src", "workflow", "tools", "benchmarks"):
        files += sorted(p for p in (REPO / top).rglob("*") if p.suffix in (".py", ".smk") and p.is_file())
    files += sorted(p for p in (REPO / "tests").rglob("*.py") if p.name == "conftest.py" or p.name.startswith("_"))
    return [p for p in files if ".venv" not in p.parts]


def _strings(text: str) -> list[str]:
    """The string literals of ``text`` (quoted runs on one line; enough to find a log phrase)."""
    return re.findall(r"'''[\s\S]*?'''|\"\"\"[\s\S]*?\"\"\"|\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'", text)


def violations(text: str, where: str = "<text>") -> list[str]:
    """Every use of a private name of Snakemake or DVC in ``text`` (Python or a Snakefile), and every string
    literal quoting a line of their logs: ``<where>:<line>: <what>``."""
    found = []

    def line_of(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    for m in _IMPORT_PRIVATE_MODULE.finditer(text):
        found.append(f"{where}:{line_of(m.start())}: import of a private module: {m.group(0).strip()}")
    imported = set()
    for m in _FROM_IMPORT.finditer(text):
        for part in m.group(2).strip("()").split(","):
            name = part.strip().split(" as ")
            if not name[0] or name[0].startswith("#"):
                continue
            if re.fullmatch(_PRIVATE, name[0]):
                found.append(f"{where}:{line_of(m.start())}: private name {name[0]} imported from {m.group(1)}")
            imported.add(name[-1].strip())
    roots = set(ROOTS) | imported | {m.group(1) for m in _ALIAS.finditer(text)}
    attr = re.compile(rf"(?<![\w.])((?:{'|'.join(map(re.escape, sorted(roots)))})(?:\.\w+)*)\.({_PRIVATE})\b")
    for m in attr.finditer(text):
        found.append(f"{where}:{line_of(m.start())}: private attribute {m.group(2)} of {m.group(1)}")
    for lit in _strings(text):
        for phrase in LOG_PHRASES:
            if phrase in lit:
                found.append(f"{where}:{line_of(text.index(lit))}: reads their log text ({phrase!r})")
    return found


def test_the_detector_catches_each_kind_of_private_use():
    planted = {
        "persistence = workflow.persistence\nrecord = persistence._read_record(f)\n": "private attribute _read_record",
        "workflow.persistence._write_record(f, r)\n": "private attribute _write_record of workflow.persistence",
        "x = snakemake.jobs._helper\n": "private attribute _helper of snakemake.jobs",
        "p = workflow._persistence\n": "private attribute _persistence of workflow",
        "from snakemake.persistence import _Record\n": "private name _Record imported",
        "from dvc.repo._internal import thing\n": "import of a private module",
        "import dvc._debug\n": "import of a private module",
        "from dvc.repo import Repo\nRepo._reset(r)\n": "private attribute _reset of Repo",
        "ws = dvc.repo\nws._lock\n": "private attribute _lock of ws",
        "re.findall(r'Restored previous version of (\\S+)', text)\n": "reads their log text",
        "if 'Job stats:' in out:\n    pass\n": "reads their log text",
    }
    for text, what in planted.items():
        got = violations(text)
        assert any(what in v for v in got), (text, got)
    clean = (
        "from snakemake.utils import min_version, validate\nimport snakemake\n"
        "path = snakemake.__file__\nworkflow.is_main_process\nworkflow.configfiles\n"
        "self._jobs = {}\nouts._private = 1\nfrom dvc.rwlock import rwlock\n"
    )
    assert violations(clean) == [], violations(clean)


def test_no_private_attribute_of_snakemake_or_dvc_and_no_parsing_of_their_logs():
    """Where this fails: use the tool's public feature instead (docs/reliability.md says what the workflow gave
    up for that, e.g. after a failed job); the line it names is the one to change."""
    found = []
    for path in sources():
        if path == Path(__file__).resolve():
            continue
        found += violations(path.read_text(encoding="utf8"), str(path.relative_to(REPO)))
    assert not found, "private Snakemake/DVC use (issue 46, item 1):\n" + "\n".join(found)
