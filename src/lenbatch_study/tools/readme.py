"""``lenbatch readme``: README.md's results, copied from compare's report.

The README states no result by hand: between two marker lines it holds the first sentence of the
report's answer ("Use X", a named tie, or "Not settled", so the table never appears without its verdict)
and the "Every strategy" table of ``results/compare/report.md`` (written by compare from the committed
results). The README describes the embedded default, so the table is rewritten only from results made with
the default params (compare's ``params.json`` equal to :class:`lenbatch_study.core.config.Params`' defaults):
a user's own data or settings leave the README as it is, saying so. ``--check`` (the test suite runs it)
fails when the README's copy differs, so a results commit that forgets ``make run``'s last step is caught.
Cost: two small text files read.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lenbatch_study.core.config import Params
from lenbatch_study.pipeline.artifacts.writing import PARAMS

from lenbatch_study.pipeline.artifacts.compare_report import REPORT_PATH

BEGIN = f"<!-- results table: written by `lenbatch readme` from {REPORT_PATH}; do not edit -->"
END = "<!-- end of results table -->"
HEADING = "## Every strategy"
ANSWER = "## Answer"


def report_answer(report: str) -> str:
    """The first sentence of the report's :data:`ANSWER` section (up to its first ". " or the paragraph's end)."""
    if ANSWER not in report:
        raise ValueError(f"the report has no {ANSWER!r} section; run compare (make run) to write it")
    para = report[report.index(ANSWER) + len(ANSWER) :].strip().split("\n\n")[0].replace("\n", " ")
    cut = para.find(". ")
    return (para if cut < 0 else para[: cut + 1]) + "\n"


def report_table(report: str) -> str:
    """The first markdown table after :data:`HEADING` in ``report`` (its lines, ending in a newline)."""
    if HEADING not in report:
        raise ValueError(f"the report has no {HEADING!r} section; run compare (make run) to write it")
    rows = []
    for line in report[report.index(HEADING) :].splitlines()[1:]:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    if len(rows) < 3:
        raise ValueError(f"the report's {HEADING!r} section holds no table; run compare (make run) to write it")
    return "\n".join(rows) + "\n"


def with_table(readme: str, table: str) -> str:
    """``readme`` with ``table`` between the markers; ``ValueError`` naming them when either is missing."""
    if BEGIN not in readme or END not in readme or readme.index(END) < readme.index(BEGIN):
        raise ValueError(f"the README needs the two marker lines {BEGIN!r} and {END!r}, in that order")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}{END}{tail}"


def changed_params(report_path: Path) -> list[str]:
    """``section.key`` of every setting in which the report's resolved params (its folder's ``params.json``)
    differ from the default params; ``["params.json"]`` when the folder has none."""
    path = report_path.parent / PARAMS
    if not path.is_file():
        return [str(path)]
    resolved, default = json.loads(path.read_text()), Params().to_dict()
    return sorted(
        f"{sec}.{key}"
        for sec in set(resolved) | set(default)
        for key in set(resolved.get(sec) or {}) | set(default.get(sec) or {})
        if (resolved.get(sec) or {}).get(key) != (default.get(sec) or {}).get(key)
    )


def run(*, readme: str = "README.md", report: str = REPORT_PATH, check: bool = False) -> int:
    """Write (or with ``check``, compare) the README's results table; 1 when ``check`` finds it stale. Results of
    other than the default params leave the README as it is (it describes the embedded default)."""
    readme_path, report_path = Path(readme), Path(report)
    if not report_path.is_file():
        raise ValueError(f"{report_path} does not exist; run the workflow first (make run)")
    changed = changed_params(report_path)
    if changed and not check:
        print(
            f"{readme_path} left as it is: its results table describes the embedded default, and {report_path} "
            f"was made with other params ({', '.join(changed[:5])}{', ...' if len(changed) > 5 else ''}); your "
            f"answer is in {report_path}",
            file=sys.stderr,
        )
        return 0
    current = readme_path.read_text()
    text = report_path.read_text()
    wanted = with_table(current, report_answer(text) + "\n" + report_table(text))
    if check:
        if wanted != current:
            print(
                f"{readme_path}: its results table differs from {report_path}'s; run `lenbatch readme`", file=sys.stderr
            )
            return 1
        return 0
    if wanted != current:
        readme_path.write_text(wanted)
        print(f"wrote the results table of {readme_path} from {report_path}", file=sys.stderr)
    return 0
