"""The interleave stage's output: ``interleave.json``, every strategy's segment timed in turns, round by
round, and ``params.json``, the params it was measured with. Written by :mod:`lenbatch_study.stages.interleave`
(with the names here); read by compare
(:func:`read_timings`, :func:`read_params`).

``interleave.json``: ``{"machine", "rounds", "strategies": {strategy: {"steps", "epochs",
"step_useful_tokens", "seconds", "useful_tokens", "position", "target_seconds", "drafter_seconds"}}, ...}``
(see the stage's module doc).
Cost: one file read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lenbatch_study.pipeline.artifacts.reading import read_json, refuse, require_keys, rerun_hint
from lenbatch_study.pipeline.artifacts.reading import read_params as read_params_of

WRITER = "interleave"
TIMINGS = "interleave.json"
STRATEGY_KEYS = ("steps", "epochs", "step_useful_tokens", "seconds", "useful_tokens")
ROLE_KEYS = ("target_seconds", "drafter_seconds")


def rerun(folder: Path) -> str:
    return rerun_hint(WRITER, f"results/{WRITER}/{TIMINGS}", folder)


def read_timings(folder: str | Path, *, per_role: bool = True) -> dict[str, Any]:
    """``interleave.json`` of the interleave output folder ``folder``, every strategy's record checked: the
    keys present, as many steps as epochs and useful tokens, as many seconds (in all and, with ``per_role``,
    per role) as useful tokens (one per round). ``per_role=False`` reads a measurement taken before the stage
    recorded each role's seconds (``benchmarks/bench_interleaved_fit.py`` scores such history)."""
    keys = STRATEGY_KEYS + (ROLE_KEYS if per_role else ())
    d = Path(folder)
    p = d / TIMINGS
    doc = read_json(p, rerun=rerun(d))
    require_keys(p, doc, ("machine", "rounds", "strategies"), rerun=rerun(d))
    if not isinstance(doc["strategies"], dict) or not doc["strategies"]:
        raise refuse(p, "holds no strategies", rerun=rerun(d))
    for s, rec in doc["strategies"].items():
        require_keys(p, rec, keys, rerun=rerun(d), what=f" for strategy {s}")
        if not len(rec["steps"]) == len(rec["epochs"]) == len(rec["step_useful_tokens"]) >= 1 or \
                len({len(rec[k]) for k in keys if k.endswith("seconds")} | {len(rec["useful_tokens"])}) != 1:
            raise refuse(p, f"holds mismatched lists for strategy {s} (a partial write?)", rerun=rerun(d))
    return doc


def read_params(folder: str | Path) -> dict[str, Any] | None:
    """The resolved params the segments were timed with (``params.json``), None when the folder has none."""
    return read_params_of(folder, rerun=rerun(Path(folder)))


__all__ = ["TIMINGS", "read_params", "read_timings"]
