"""What compare concludes beside its predictions: where a training's prediction error comes from (its
measured step times against the predicted ones, and replayed through the pipeline model:
:func:`diagnose`) and the answer with the K for bucketed (:func:`recommend`, decided on the ratios measured
in turns by :func:`lenbatch_study.analysis.verdict.decide`).

Separate from :mod:`lenbatch_study.stages.compare` (which builds the result and imports these names):
judging the predictions and measurements, apart from making the predictions. Cost: O(steps) per run;
O(strategies + K sweep) for the answer.
"""

from __future__ import annotations

import numpy as np

from lenbatch_study.analysis import stepmodel as sm, transport_model as tm
from lenbatch_study.analysis.report import Recommendation, StrategyRow
from lenbatch_study.analysis.step_prediction import ACK_EVERY
from lenbatch_study.analysis.verdict import decide
from lenbatch_study.core import cpu
from lenbatch_study.core.config import Params


def diagnose(steps: list[dict], pred: dict, *, params: Params, target_ranks: int, measured: float) -> dict:
    """Where a prediction error comes from: step times or the pipeline.

    target/drafter_step_ratio: measured over predicted seconds of the post-warm-up steps
    (1 = the profile grid timed the steps right; > 1 = the run's steps were slower, e.g.
    a busier machine than while profiling). pipeline_error: the measured step times
    replayed through the pipeline model, against the measured throughput (0 = the
    pipeline model and the per-step overheads it ignores are right). target/drafter_cpu_share:
    the share of its cores each role got in the run (:func:`lenbatch_study.core.cpu.cpu_share`).
    """
    rows = sorted(steps, key=lambda r: int(r["step"]))
    if not all("target_s" in r and "drafter_s" in r for r in rows):
        return {
            "target_step_ratio": float("nan"),
            "drafter_step_ratio": float("nan"),
            "pipeline_error": float("nan"),
            "target_cpu_share": float("nan"),
            "drafter_cpu_share": float("nan"),
        }
    w = params.train.warmup_steps
    t = np.array([float(r["target_s"]) for r in rows])
    d = np.array([float(r["drafter_s"]) for r in rows])
    useful = np.array([float(r["useful_tokens"]) for r in rows])
    if params.train.nproc == 1:
        ends = sm.pipeline_ends(t + d)
    else:
        x, st = tm.measured_transport(rows)  # receive on the drafter's path, staging on the target's
        ends = sm.pipeline_ends(
            t + st,
            d,
            queue_size=params.train.queue_size,
            target_ranks=target_ranks,
            ack_every=ACK_EVERY,
            nodes=params.train.nodes,
            transport_s=x,
            allreduce_s=float(np.mean([r.get("allreduce_s", 0.0) for r in rows])),
        )
    replay = sm.throughput(useful, ends, warmup_steps=w)
    share = {role: cpu.steps_cpu_share(rows[w:], role, threads=params.train.threads) for role in ("target", "drafter")}
    return {
        "target_step_ratio": float(t[w:].sum() / pred["target_s"][w:].sum()),
        "drafter_step_ratio": float(d[w:].sum() / pred["drafter_s"][w:].sum()),
        "pipeline_error": replay / measured - 1.0,
        **tm.transport_row(rows, pred, warmup_steps=w),
        "target_cpu_share": share["target"],
        "drafter_cpu_share": share["drafter"],
    }


def recommend(
    rows: dict[str, StrategyRow], ksweep: list[dict], interleaved: dict | None, *, params: Params
) -> Recommendation:
    """The answer and the K for bucketed.

    Strategy: decided on the ratios measured in turns (:func:`lenbatch_study.analysis.verdict.decide`) among
    strategies whose batches change between epochs (composition_repeat <= compare.max_composition_repeat);
    sorted keeps its batches forever and is the baseline, not a candidate. K: the smallest K whose predicted
    throughput is within compare.k_tolerance of the best K (fewer buckets mix lengths more, so ties go to the
    smaller K).
    """
    verdict = decide(
        interleaved,
        {s: r.composition_repeat for s, r in rows.items()},
        max_composition_repeat=params.compare.max_composition_repeat,
    )
    k_best = max(ksweep, key=lambda e: e["predicted_tok_s"]) if ksweep else None
    k_pick = None
    if k_best is not None:
        floor = (1 - params.compare.k_tolerance) * k_best["predicted_tok_s"]
        good = [e for e in ksweep if e["predicted_tok_s"] >= floor]
        k_pick = min(good, key=lambda e: e["num_buckets"])
    return Recommendation(
        verdict=verdict,
        num_buckets=k_pick["num_buckets"] if k_pick else None,
        k_best_throughput=k_best["num_buckets"] if k_best else None,
    )
