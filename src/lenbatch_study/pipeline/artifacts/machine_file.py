"""The machine stage's output: ``machine.json``, this machine's fingerprint (:mod:`lenbatch_study.core.machine`)
in canonical bytes, rewritten only when the fingerprint changes (:func:`lenbatch_study.core.machine.write_if_changed`).

No stage reads it: it is a *dependency* of the measuring stages (profile, every train job, quality), so a
clone on another machine, or after a library upgrade, reruns them (and compare, through their outputs),
while the machine that wrote it reruns nothing. Each measuring stage records its own fingerprint in its
outputs, and compare refuses a mix (:mod:`lenbatch_study.analysis.provenance`).

Who writes it: DVC's ``machine`` stage (``always_changed``: ``dvc repro`` runs ``lenbatch machine`` every
time; the bytes change only with the machine) and the Snakefile as it is parsed (``workflow/rules/common.smk``),
so ``snakemake`` sees the change of machine by the file's time. Cost: ~20 ms (no torch import on a CPU).
"""

from __future__ import annotations

WRITER = "machine"
MACHINE = "machine.json"

__all__ = ["MACHINE", "WRITER"]
