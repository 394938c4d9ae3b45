"""The answer: which strategy to use, decided on the ratios measured in turns. Pure.

The trainings run one after another, so a machine whose speed moves 10-60% within minutes moves their
ratios to ``sorted`` as much (they still give loss, composition effects and absolute tokens/s). The
interleave stage times every strategy's steps in turns in one process, so a drift falls on all alike and
each ratio to ``sorted`` carries a 95% interval (:func:`lenbatch_study.analysis.interleaved.judge`). The
answer is decided on those intervals alone:

* candidates: the strategies whose batches change between epochs (composition repeat at most
  ``compare.max_composition_repeat``; ``sorted`` keeps its batches forever and is the baseline);
* **use X** when X's interval lies wholly above every other candidate's;
* **tie** when the top candidate's interval overlaps others' and every one of them reached the interval
  target (±2%, :data:`lenbatch_study.core.intervals.INTERVAL_TARGET`): their throughput is the same within
  what the measurement resolves, and what else separates them (composition repeat, held-out loss) is said;
* **not settled** when an overlapping interval is still wider than the target after
  ``interleave.max_rounds``, when the prediction of a strategy in contention (the top one or one whose
  interval overlaps it) misses beyond the measured noise (the predicted ratio outside its 95% interval and
  more than :data:`lenbatch_study.analysis.interleaved.PREDICTION_TARGET` off: the step model and the
  measurement disagree about the very strategies being decided between), or when nothing was measured in
  turns. A miss on a strategy out of contention is named beside the answer (``missed``), not a veto: the
  measurement already separates it from the top;
* **not settled** also when the timed steps of a strategy in contention do not stand for its run
  (``unrepresentative``): the step model, tested on those steps, gives a ratio over its whole run more than
  :data:`lenbatch_study.analysis.interleaved.PREDICTION_TARGET` away from the one over the timed steps
  (``steps_gap``), so the measured ratio describes a few batches, not the training; the fix is more steps
  per segment (``interleave.segment_steps``).

Cost: O(strategies^2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from lenbatch_study.analysis.interleaved import BASELINE, PREDICTION_TARGET
from lenbatch_study.core.intervals import INTERVAL_TARGET

USE, TIE, NOT_SETTLED = "use", "tie", "not settled"


@dataclass(frozen=True)
class Verdict:
    """``kind``: :data:`USE`, :data:`TIE` or :data:`NOT_SETTLED`; ``top``: the candidates in contention, the
    highest measured ratio first (one for ``use``; the tied ones for ``tie``; those whose intervals overlap for
    ``not settled`` by overlap); ``wide``: in-contention strategies whose interval is wider than the target;
    ``missed``: strategies whose prediction missed beyond the measured noise (a veto only for those in
    ``top``); ``unrepresentative``: strategies whose timed steps do not stand for their run (a veto only for
    those in ``top``); ``candidates``: every strategy
    that could be recommended, highest ratio first."""

    kind: str
    top: tuple[str, ...] = ()
    candidates: tuple[str, ...] = ()
    wide: tuple[str, ...] = ()
    missed: tuple[str, ...] = ()
    unrepresentative: tuple[str, ...] = ()
    measured: bool = True
    rounds: int | None = None

    @property
    def settled(self) -> bool:
        return self.kind != NOT_SETTLED

    @property
    def strategy(self) -> str | None:
        """The strategy to use; None for a tie or when not settled."""
        return self.top[0] if self.kind == USE else None


def missed_beyond_noise(row: Mapping[str, object]) -> bool:
    """A predicted ratio outside its measured 95% interval and more than ``PREDICTION_TARGET`` off it."""
    lo, hi = row["ci95"]  # type: ignore[misc]
    pred = float(row["predicted_ratio"])  # type: ignore[arg-type]
    return not lo <= pred <= hi and abs(float(row["prediction_error"])) > PREDICTION_TARGET  # type: ignore[arg-type]


def decide(
    table: Mapping[str, Mapping[str, object]] | None,
    composition_repeat: Mapping[str, float],
    *,
    max_composition_repeat: float,
    interval_target: float = INTERVAL_TARGET,
) -> Verdict:
    """The verdict (module doc) from :func:`lenbatch_study.analysis.interleaved.judge`'s ``table`` and each
    strategy's composition repeat (its simulated plan's). ``ValueError`` when no strategy can be recommended."""
    ok = [s for s, r in composition_repeat.items() if s != BASELINE and r <= max_composition_repeat]
    if not ok:
        raise ValueError(
            f"no strategy but {BASELINE} was trained, or none has composition repeat <= "
            f"compare.max_composition_repeat ({max_composition_repeat}); add a shuffling strategy to "
            "train.strategies or raise compare.max_composition_repeat"
        )
    if not table:
        return Verdict(NOT_SETTLED, candidates=tuple(ok), measured=False)
    absent = [s for s in ok if s not in table]
    if absent:
        raise ValueError(
            f"the interleaved measurement lacks {', '.join(absent)}: rerun the interleave stage "
            "with every trained strategy"
        )

    def ratio(s: str) -> float:
        return float(table[s]["ratio_to_sorted"])  # type: ignore[arg-type]

    def ci(s: str) -> tuple[float, float]:
        lo, hi = table[s]["ci95"]  # type: ignore[misc]
        return float(lo), float(hi)

    cands = tuple(sorted(ok, key=ratio, reverse=True))
    best = cands[0]
    overlap = tuple(s for s in cands[1:] if ci(s)[1] >= ci(best)[0])
    top = (best, *overlap)
    wide = tuple(s for s in top if float(table[s]["half_width"]) > interval_target)  # type: ignore[arg-type]
    missed = tuple(s for s in table if s != BASELINE and missed_beyond_noise(table[s]))
    apart = tuple(s for s in table if s != BASELINE and abs(float(table[s].get("steps_gap", 0.0))) > PREDICTION_TARGET)  # type: ignore[arg-type]
    rounds = int(table[best]["rounds"])  # type: ignore[arg-type]
    if set(missed) & set(top) or set(apart) & set(top) or (overlap and wide):
        return Verdict(
            NOT_SETTLED,
            top=top,
            candidates=cands,
            wide=wide if overlap else (),
            missed=missed,
            unrepresentative=apart,
            rounds=rounds,
        )
    return Verdict(
        TIE if overlap else USE, top=top, candidates=cands, missed=missed, unrepresentative=apart, rounds=rounds
    )


__all__ = ["NOT_SETTLED", "TIE", "USE", "Verdict", "decide", "missed_beyond_noise"]
