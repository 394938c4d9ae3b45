"""``lenbatch study-replay`` (also ``lenbatch plans --study-replay``): the study's own setting replayed.

The seed profile of ``samples`` lengths, budget 49,152, at most 64 per batch, 7 target ranks, the
study's edges and dp edges, every strategy planned (:func:`lenbatch_study.analysis.study_replay.replay`),
beside what the study measured: ``replay.json`` and ``replay.md`` in ``out``. A stage of its own, so
the workflow's plans stage does not depend on the boundary optimizers it never runs. Cost: ~8 s at
902,087 lengths (one seed profile, one dp solve, six epoch plans).
"""

from __future__ import annotations

from pathlib import Path

from lenbatch_study.analysis import study_replay as sr
from lenbatch_study.corpus.seed_profile import SEED_COUNT
from lenbatch_study.core.log import get_logger
from lenbatch_study.pipeline.artifacts.writing import write_json


def run(*, out: str | Path, samples: int = SEED_COUNT) -> int:
    """Write ``replay.json`` and ``replay.md`` of :func:`lenbatch_study.analysis.study_replay.replay` into ``out``."""
    log = get_logger("lenbatch.study-replay")
    rep = sr.replay(samples=samples, log=log)  # the stand-in's own seed (0), like compare's
    write_json(Path(out) / "replay.json", rep)
    (Path(out) / "replay.md").write_text(sr.section(rep, level=1))
    log.info(
        "study replay in %.1f s: wrote %s and %s",
        sum(rep["seconds"].values()),
        Path(out) / "replay.json",
        Path(out) / "replay.md",
    )
    return 0
