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

import math
from pathlib import Path
from typing import Any, Optional, Sequence

from lenbatch_study.pipeline.artifacts.reading import read_json, refuse, require_keys, rerun_hint
from lenbatch_study.pipeline.artifacts.reading import read_params as read_params_of

WRITER = "interleave"
TIMINGS = "interleave.json"
STRATEGY_KEYS = ("steps", "epochs", "step_useful_tokens", "seconds", "useful_tokens")
ROLE_KEYS = ("target_seconds", "drafter_seconds")


def rerun(folder: Path) -> str:
    return rerun_hint(WRITER, f"results/{WRITER}/{TIMINGS}", folder)


def read_timings(
    folder: str | Path, *, per_role: bool = True, strategies: Optional[Sequence[str]] = None
) -> dict[str, Any]:
    """``interleave.json`` of the interleave output folder ``folder``, every strategy's record checked: the
    keys present, as many steps as epochs and useful tokens, as many seconds (in all and, with ``per_role``,
    per role) as useful tokens (one per round); every number what it must be (:func:`check_numbers`); and
    every strategy of ``strategies`` present (default: the ``train.strategies`` of the ``params.json`` it was
    timed with, which compare requires equal to its own), so none silently loses its interleaved row.
    ``per_role=False`` reads a measurement taken before the stage recorded each role's seconds
    (``benchmarks/bench_interleaved_fit.py`` scores such history)."""
    keys = STRATEGY_KEYS + (ROLE_KEYS if per_role else ())
    d = Path(folder)
    p = d / TIMINGS
    doc = read_json(p, rerun=rerun(d))
    require_keys(p, doc, ("machine", "rounds", "strategies"), rerun=rerun(d))
    if not isinstance(doc["strategies"], dict) or not doc["strategies"]:
        raise refuse(p, "holds no strategies", rerun=rerun(d))
    for s, rec in doc["strategies"].items():
        require_keys(p, rec, keys, rerun=rerun(d), what=f" for strategy {s}")
        if (
            not all(isinstance(rec[k], list) for k in rec if k in keys or k.endswith("seconds"))
            or not len(rec["steps"]) == len(rec["epochs"]) == len(rec["step_useful_tokens"]) >= 1
            or len({len(rec[k]) for k in keys if k.endswith("seconds")} | {len(rec["useful_tokens"])}) != 1
        ):
            raise refuse(p, f"holds mismatched lists for strategy {s} (a partial write?)", rerun=rerun(d))
    check_numbers(p, doc, rerun=rerun(d))
    if strategies is None:
        train = (read_params(d) or {}).get("train")
        strategies = (train.get("strategies") or ()) if isinstance(train, dict) else ()
    missing = [s for s in strategies if s not in doc["strategies"]]
    if missing:
        raise refuse(
            p,
            f"lacks strategy {', '.join(missing)} (it holds {', '.join(doc['strategies'])}; "
            f"train.strategies lists {', '.join(strategies)}): a partial or edited file",
            rerun=rerun(d),
        )
    return doc


def _count(x: Any, *, least: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= least


def check_numbers(path: Path, doc: dict[str, Any], *, rerun: str) -> None:
    """:func:`refuse` naming every value that cannot be what it measures: ``rounds`` a count >= 1; per strategy
    every seconds a finite number > 0 (NaN, inf, 0 or a negative time put NaN and Infinity into compare's
    metrics and report), useful tokens whole numbers > 0, steps, epochs and positions whole numbers >= 0.
    O(rounds x strategies)."""

    def seconds_ok(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0

    bad = [] if _count(doc["rounds"], least=1) else [f"rounds={doc['rounds']!r}"]
    for s, rec in doc["strategies"].items():
        for key, values in rec.items():
            if not isinstance(values, list):
                continue
            if key.endswith("seconds"):
                ok, what = seconds_ok, "finite seconds > 0"
            elif key in ("useful_tokens", "step_useful_tokens"):
                ok, what = (lambda x: _count(x, least=1)), "token counts > 0"
            elif key in ("steps", "epochs", "position"):
                ok, what = (lambda x: _count(x, least=0)), "whole numbers >= 0"
            else:
                continue
            bad.extend(f"{s} {key}[{j}]={x!r} (not {what})" for j, x in enumerate(values) if not ok(x))
    if bad:
        more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
        raise refuse(
            path,
            f"holds numbers that cannot be measured ones: {'; '.join(bad[:4])}{more} (a failed or "
            "interrupted measurement, or an edited file)",
            rerun=rerun,
        )


def read_params(folder: str | Path) -> dict[str, Any] | None:
    """The resolved params the segments were timed with (``params.json``), None when the folder has none."""
    return read_params_of(folder, rerun=rerun(Path(folder)))


__all__ = ["TIMINGS", "check_numbers", "read_params", "read_timings"]
