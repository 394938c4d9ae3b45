"""``lenbatch reruns [MODULE ...]``: which stages of the workflow an edit of each module reruns, derived from the
code (the import closure of every stage module, :func:`lenbatch_study.pipeline.deps.stage_code`), the same list
DVC's ``dvc.yaml`` and Snakemake's ``input.code`` hold. The one home of that fact: no table of it is kept by
hand (``tests/pipeline/test_reruns.py`` checks the rules it must follow, e.g. the prediction fit reruns
compare alone)."""

from __future__ import annotations

import sys
from lenbatch_study.pipeline import deps


def reruns() -> dict[str, list[str]]:
    """``{module under src/ (lenbatch/... or lenbatch_study/...): the stages an edit of it reruns, DAG order}``
    for every module of the library and the study. The always-run stages (machine, source) are left out:
    DVC runs them every time and their outputs' bytes, not their code, decide what follows."""
    code = {s: set(deps.stage_code(s)) for s, st in deps.STAGES.items() if not st.always_changed}
    mods = sorted(
        p.relative_to(deps.SRC_ROOT).as_posix()
        for package in deps.PACKAGES
        for p in (deps.SRC_ROOT / package).rglob("*.py")
    )
    return {m: [s for s, files in code.items() if f"src/{m}" in files] for m in mods}


def _key(name: str) -> str:
    """A module as given (``src/lenbatch/batching/scan.py``, ``lenbatch/batching/scan.py``, or dotted
    ``lenbatch.batching.scan``) -> the key of :func:`reruns`."""
    name = name.removeprefix("./").removeprefix("src/")
    if not name.endswith(".py"):
        name = name.replace(".", "/") + ".py"
    return name


def run(*, modules: list[str]) -> int:
    """Print ``<module>: <stages>`` (``nothing`` for none) for each of ``modules``, every module when none is
    given; an unknown module is named and exits 2."""
    table = reruns()
    keys = [_key(m) for m in modules] or list(table)
    unknown = [m for m, k in zip(modules, keys) if k not in table]
    if unknown:
        print(
            f"not a module under src/: {', '.join(unknown)} (give e.g. src/lenbatch_study/analysis/stepmodel.py "
            "or lenbatch_study.analysis.stepmodel)",
            file=sys.stderr,
        )
        return 2
    for k in keys:
        print(f"{k}: {', '.join(table[k]) or 'nothing'}")
    return 0


__all__ = ["reruns", "run"]
