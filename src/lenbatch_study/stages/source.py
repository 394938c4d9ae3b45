"""``lenbatch source``: write the data source's identity (:mod:`lenbatch_study.corpus.identity`) to
``OUT/source.json``, only when it changed.

Meant as tokenize's dependency (DVC's ``source`` stage is ``always_changed``; the Snakefile writes the same
file as it is parsed): a source whose bytes are unchanged leaves the file and its time as they were, so
neither tool reruns anything; a changed one (records appended, another package's file) retokenizes.
Cost: :mod:`lenbatch_study.corpus.identity`'s.
"""

from __future__ import annotations

from pathlib import Path

from lenbatch_study.core.log import get_logger
from lenbatch_study.core.config import Params
from lenbatch_study.corpus.identity import write_if_changed
from lenbatch_study.pipeline.artifacts.source_file import SOURCE


def run(*, params: Params, out: str | Path) -> int:
    """``lenbatch source``: ``out/source.json`` rewritten only when ``data.source``'s identity differs from
    what it holds. Returns the exit code (0); ``ValueError`` (exit 2, one line) for a missing source."""
    path = Path(out) / SOURCE
    try:
        wrote = write_if_changed(params.data.source, path)
    except ValueError as err:
        # dvc exp run --temp/--queue runs in a fresh clone: a file git does not track is not there
        raise ValueError(
            f"{err}. Under `dvc exp run --temp` or `--queue`, track the file first: "
            f"`dvc add {params.data.source}` and commit the .dvc file (docs/experiments.md)"
        ) from None
    get_logger("source").info(
        "data.source %r %s %s", params.data.source, "changed: wrote" if wrote else "unchanged:", path
    )
    return 0
