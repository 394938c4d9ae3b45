"""Interleave stage: every strategy's training steps timed in turns in one process, for ratios to sorted
that a drifting machine cannot move.

The trainings run one after another, each minutes long; on a shared machine the speed moves by ~13%
from one minute to the next, more than the few percent a prediction of their throughput ratios must
be judged by. This stage times every strategy in one process, in short segments, round robin
(:func:`lenbatch_study.runtime.interleave.measure_interleaved`), so a slow minute slows one round of
every strategy alike; compare turns the rounds into each strategy's throughput ratio to sorted with a
95% interval and sets the step model's predicted ratio of the same steps beside it
(:mod:`lenbatch_study.analysis.interleaved`). The separate trainings stay: loss, quality and absolute
tokens/s are theirs.

Why a stage of its own: it needs the tokenized dataset, the training plans and the bucket edges, which
the profile does not read (profile would rerun on every data or boundaries change); and compare must
stay a pure function of measurements (it measures nothing, so a report edit never re-times anything).
As a stage it reruns only when what it measures changes: the model, the batching, the strategies, its
own ``interleave`` section, the machine.

What is timed: each strategy's segment is ``interleave.segment_steps`` steps of its training plan (the
train stage's schedule, :func:`lenbatch_study.runtime.schedule.build_schedule`, with (``train.nproc - 1``) x
``train.nodes`` target ranks, so they are batches its training run trains), the quantiles of that run's
post-warm-up steps ordered by mean sequence length (:func:`segment_steps`), timed in turns of one step with the other strategies'
(:func:`lenbatch_study.runtime.interleave.measure_interleaved`). Four steps (the default) sample a
strategy's shapes across the run, where one step was one batch: one `bucketed` batch measured 0.57 of
sorted's throughput and four 0.86, as its training's 0.89. One
:class:`lenbatch_study.runtime.runner.StepRunner` on ``train.device``, single process (target forward then
drafter step: the pipelined contention of the trainings is theirs), with the anchors of each step's own
(epoch, step). A segment's seconds are the runner's timed target and drafter seconds, as the profile grid
times them, so the step model predicts exactly what is measured; batches are collated once, before any
timing. Which seconds
(``interleave.clock``, :func:`resolve_clock`): on a CPU device with one thread, by default the process's
CPU seconds. A shared machine's other tenants take the cores in time slices of milliseconds to seconds,
far shorter than a round (on this project's 2-core VM under a load of 7, one 1-step segment took 3.6 s in
one round and 34 s in another), so no pairing by round cancels them from wall time; CPU seconds leave
them out, and on a quiet machine they equal the wall seconds (the profile grid, which the prediction is
fitted on, records both: its CPU share tells how far they differ). On a GPU, wall seconds.

How many rounds: at least ``interleave.rounds``; then one more at a time until
:func:`lenbatch_study.core.intervals.stop_reason` gives a reason (every 95% interval within +-2% of its
ratio; or the ranking resolved, no two intervals overlapping and each within +-3%, the width at which a
prediction miss reads the same as at +-2%), up to ``interleave.max_rounds``. A quiet machine stops early;
a busy one spends the rounds it is allowed and the report shows the width it reached.

``interleave.json``: ``{"machine", "rounds" (as run), "min_rounds", "max_rounds", "stopped" (why),
"segment_steps", "warmup", "clock" (resolved), "order" (the
rounds as run), "seconds" (the stage's wall time), "strategies": {strategy: {"steps", "epochs",
"step_useful_tokens" (the segment's global steps, their epochs and useful tokens), "seconds" (the
clock's), "useful_tokens", "position", "wall_seconds", "cpu_seconds", "target_seconds", "drafter_seconds"
(per round; the last two the clock's seconds of each role, which add up to "seconds")}}}``, and ``params.json``.
Per-role seconds let compare tell which role's prediction a missed ratio comes from.

Progress, resuming and reuse (docs/prediction.md, "Which rounds"): after each round one log line ``round k/N``
with every interval's width and the time left from the measured rounds (:func:`projected_rounds`); the rounds
are saved beside the output as they end and a rerun of the same inputs continues from them; a new run times
every strategy again, since ratios are drift-proof only between steps timed in the same turns.

Cost: ``(warmup + rounds) x segment_steps`` steps per strategy plus building the models, rounds between
``interleave.rounds`` and ``max_rounds``; on the CPU default (4-step segments of ~7 s, 1 warm-up pass, five
strategies) 34-47 s per round on this project's 2-core VM: 4-5 minutes at 6 rounds, 23-31 at 40; a quiet
VM there reached +-2% after 10 rounds (6.5 minutes; with 1-step segments it took 40-60 rounds of 10 s), a
busier one after 32 rounds (25 minutes), where the ranking was resolved within +-3% after 20.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from lenbatch_study.runtime.schedule import build_schedule
from lenbatch.loading.collate import collate
from lenbatch_study.core.log import get_logger
from lenbatch_study.core.intervals import (
    INTERVAL_TARGET,
    PREDICTION_TARGET,
    half_width,
    ratio_intervals,
    stop_reason,
    t_quantile,
    width_to_reach,
)
from lenbatch_study.core.config import Params
from lenbatch_study.core.machine import fingerprint
from lenbatch_study.pipeline.artifacts.bucket_edges import edges_for
from lenbatch_study.pipeline.artifacts.interleave_timings import TIMINGS
from lenbatch_study.pipeline.artifacts.writing import write_resolved
from lenbatch_study.pipeline.artifacts.tokenized import read_dataset, read_lengths
from lenbatch_study.runtime.interleave import measure_interleaved, round_orders

log = get_logger("interleave")
PARTIAL_DIR = ".interleave.partial"  # beside the output folder (git-ignored: .*.partial/)
PARTIAL = "rounds.json"
TARGETS = (INTERVAL_TARGET, PREDICTION_TARGET)  # the widths the rounds stop at (core.intervals.stop_reason)


def segment_steps(total: int, *, skip: int, count: int, key: Optional[Sequence[float]] = None) -> list[int]:
    """The global steps of a segment, ascending: of a run's post-warm-up steps ``skip .. total - 1`` ordered by
    ``key`` (one number per step of the plan; None: the steps' own order), the middles of ``count`` equal parts,
    i.e. positions ``floor((j + 1/2) (total - skip) / count)`` for j < count; every step of that range when it
    holds fewer than ``count``; steps ``0 .. total - 1`` likewise when the run has no step after its warm-up.

    Why a key: the ratio of a segment stands for the run's only as far as its steps do. ``sorted``'s batches
    each hold one length class in a shuffled order, and a step's tokens/s depends on its lengths (a fixed cost
    per sequence, attention's quadratic term): four steps evenly spaced in time are four random length
    classes, and on 3,300 chats of a tiny model they made sortish 1.92 of sorted where the run's prediction
    was 1.24. Ordered by the step's mean sequence length (:func:`mean_lengths`), the picks are its quantiles,
    a stratified sample of the run's lengths. Ties keep the steps' order. Pure, O(total log total)."""
    if total < 1 or count < 1:
        raise ValueError(f"a segment needs a plan of >= 1 step and >= 1 step to time, got {total}, {count}")
    lo = skip if total > skip else 0
    n = total - lo
    if n <= count:
        return list(range(lo, total))
    steps = np.arange(lo, total)
    if key is not None:
        k = np.asarray(key, dtype=float)
        assert k.shape == (total,), (k.shape, total)
        steps = steps[np.argsort(k[lo:], kind="stable")]
    return sorted(int(steps[int((j + 0.5) * n / count)]) for j in range(count))


def mean_lengths(lengths: np.ndarray, batches: Sequence[np.ndarray]) -> np.ndarray:
    """Each step's mean sequence length (tokens per sample): :func:`segment_steps`' key. O(samples)."""
    return np.array([float(lengths[np.asarray(b, dtype=np.int64)].mean()) for b in batches])


def resolve_clock(clock: str, *, device_type: str, threads: int) -> str:
    """``interleave.clock`` resolved: ``auto`` is ``cpu`` on a CPU device with one thread per process (a
    single-threaded step's process CPU seconds are its work, whatever other processes take of the cores)
    and ``wall`` otherwise (a GPU step's CPU seconds are not its time; with more threads CPU seconds add
    up over threads). ``ValueError`` for ``cpu`` where it does not apply."""
    cpu_ok = device_type == "cpu" and threads == 1
    if clock == "cpu" and not cpu_ok:
        raise ValueError(
            f"interleave.clock: cpu needs a CPU device and train.threads: 1 (got {device_type}, "
            f"{threads} threads); set interleave.clock: wall (or auto)"
        )
    return clock if clock != "auto" else ("cpu" if cpu_ok else "wall")


def projected_rounds(
    k: int, intervals: Optional[Mapping[str, Mapping[str, Any]]], *, rounds: int, max_rounds: int
) -> int:
    """The rounds the run will take, judged after ``k`` rounds with these 95% intervals
    (:func:`lenbatch_study.core.intervals.ratio_intervals`; None before round 2): each log-ratio's interval is
    mean +- t_{K-1} s / sqrt(K), so s = half sqrt(k) / t_{k-1}; keeping every mean and s, the run ends at the
    first K whose intervals give :func:`lenbatch_study.core.intervals.stop_reason` one (every one within +-2%,
    or none overlapping and each within +-3%). At least ``rounds`` and ``k`` (``k`` itself once it stops), at
    most ``max_rounds``. Student's t matters early: after 3 rounds t is 4.3 where it tends to 2. Pure,
    O(max_rounds x S log S)."""
    if intervals is None or k < 2:
        return max_rounds
    if k >= rounds and stop_reason(intervals) is not None:
        return k
    t_k = t_quantile(0.975, k - 1)
    logs = {
        s: (
            math.log(float(v["ratio_to_sorted"])),
            (math.log(v["ci95"][1]) - math.log(v["ci95"][0])) / 2 * math.sqrt(k) / t_k,
        )
        for s, v in intervals.items()
    }
    for n in range(max(k + 1, rounds), max_rounds + 1):
        half = {s: t_quantile(0.975, n - 1) * sd / math.sqrt(n) for s, (_, sd) in logs.items()}
        ahead = {
            s: {"ratio_to_sorted": math.exp(m), "ci95": [math.exp(m - half[s]), math.exp(m + half[s])]}
            for s, (m, _) in logs.items()
        }
        if stop_reason(ahead) is not None:
            return n
    return max_rounds


def _inputs_key(params: Params, lengths: np.ndarray, edges: Any, clock: str) -> str:
    """What rounds measured by an interrupted run must share with this one to be continued: the params, the
    lengths, the edges, the clock, the machine and the code (every lenbatch module loaded)."""
    code = hashlib.sha256()
    for name in sorted(m for m in sys.modules if m.split(".")[0] in ("lenbatch", "lenbatch_study")):
        path = getattr(sys.modules[name], "__file__", None)
        if path and path.endswith(".py"):
            code.update(name.encode() + b"\0" + Path(path).read_bytes())
    doc = {
        "params": params.to_dict(),
        "lengths": hashlib.sha256(np.ascontiguousarray(lengths, np.int64)).hexdigest(),
        "edges": list(map(int, edges)) if edges is not None else None,
        "clock": clock,
        "machine": fingerprint(threads=params.train.threads)["id"],
        "code": code.hexdigest(),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _load_partial(path: Optional[Path], key: str) -> Optional[dict[str, Any]]:
    """The rounds an interrupted run of the same inputs saved at ``path``, None when there are none (or they are
    another run's: set aside, named in the log)."""
    if path is None or not path.exists():
        return None
    try:
        saved = json.loads(path.read_text())
        if saved.get("key") == key and saved.get("rounds") and saved.get("steps"):
            return saved
        why = "other inputs (params, data, edges, machine or code)"
    except (OSError, ValueError):
        why = "unreadable"
    log.info("%s holds rounds of %s: not continued, starting from round 1", path, why)
    path.unlink(missing_ok=True)
    return None


def measure(
    params: Params, *, data: str | Path, boundaries: Optional[str | Path] = None, partial: Optional[str | Path] = None
) -> dict[str, Any]:
    """Time every strategy of ``train.strategies`` in turns (module doc); returns ``interleave.json``'s
    document. ``partial``: where the rounds are saved as they end, and continued from after an interruption
    (the same inputs only). ``ValueError`` when ``sorted`` (the baseline) is not among the strategies or
    ``bucketed`` runs without its edges."""
    from lenbatch_study.runtime.runner import StepRunner, configure_process, resolve_device

    strategies = list(params.train.strategies)
    if "sorted" not in strategies:
        raise ValueError(
            "train.strategies lacks 'sorted', the baseline every interleaved ratio is taken to; "
            "add it to train.strategies"
        )
    il = params.interleave
    lengths = read_lengths(data)
    edges = edges_for(boundaries, strategies)
    # the training runs' plan: sharded over every node's target ranks (one target rank when nproc is 1)
    target_ranks = max(params.train.nproc - 1, 1) * params.train.nodes
    dataset = read_dataset(data, lengths)
    plan: dict[str, dict[str, Any]] = {}
    for s in strategies:
        sched = build_schedule(
            lengths,
            strategy=s,
            params=params,
            edges=edges if s == "bucketed" else None,
            target_ranks=target_ranks,
            useful_tokens=params.train.useful_tokens,
        )
        picked = [
            sched[i]
            for i in segment_steps(
                len(sched),
                skip=params.train.warmup_steps,
                count=il.segment_steps,
                key=mean_lengths(lengths, [st.indices for st in sched]),
            )
        ]
        batches = [
            collate(dataset.samples(st.indices), layout=sched.plan_strategy, spec=sched.spec, indices=st.indices)
            for st in picked
        ]
        plan[s] = {"steps": picked, "batches": batches}
    configure_process(params)
    device = resolve_device(params.train.device, 0)
    if device.type == "cuda":  # refuse before loading anything a setting whose one process cannot fit
        import torch

        from lenbatch_study.models.memory import check_fits, plan_memory_shape

        check_fits(
            params,
            device_bytes=torch.cuda.get_device_properties(device).total_memory,
            single_process=True,
            **plan_memory_shape(params, lengths, [st.indices for p in plan.values() for st in p["steps"]]),
        )
    clock = resolve_clock(il.clock, device_type=device.type, threads=params.train.threads)
    runner = StepRunner(params, device=device)
    partial = Path(partial) if partial is not None else None
    key = _inputs_key(params, lengths, edges, clock)
    saved = _load_partial(partial, key)
    timed = [0.0]  # the chosen clock's seconds of the runner's timed steps so far: what segments are read on
    # every timed step's (target wall, drafter wall, target cpu, drafter cpu) seconds (this process's warm-up left out)
    both: dict[str, list[tuple[float, float, float, float]]] = {s: [] for s in strategies}
    calls = dict.fromkeys(strategies, 0)
    if saved is not None:
        both = {s: [tuple(r) for r in saved["steps"][s]] for s in strategies}
        log.info(
            "continuing from round %d: %d rounds of an interrupted run of the same inputs (%s)",
            len(saved["rounds"]["_order"]) + 1,
            len(saved["rounds"]["_order"]),
            partial,
        )

    def step(s: str, j: int) -> int:
        st, batch = plan[s]["steps"][j], plan[s]["batches"][j]
        feats, t_s = runner.target_step(batch)
        t_cpu = runner.last_cpu_s
        _, d_s = runner.drafter_step(batch, feats, step=st.step, epoch=st.epoch)
        d_cpu = runner.last_cpu_s
        calls[s] += 1
        if calls[s] > il.warmup * len(plan[s]["steps"]):  # this process's warm-up passes come first
            both[s].append((t_s, d_s, t_cpu, d_cpu))
        timed[0] += t_cpu + d_cpu if clock == "cpu" else t_s + d_s
        return int(batch.useful_tokens)

    longest = max(len(p["steps"]) for p in plan.values())
    short = [s for s in strategies if len(plan[s]["steps"]) < longest]
    if short:  # a plan shorter than the segment: all its steps are timed, the rest of its segment is empty
        log.info(
            "%s plan(s) fewer steps than interleave.segment_steps=%d: all of them are timed",
            ", ".join(short),
            il.segment_steps,
        )
    # The rounds of an earlier, complete run are never reused, not even for the strategies whose plans did not
    # change: a ratio is drift-proof only between steps timed in the same turns, so every strategy is timed
    # again beside sorted (docs/prediction.md, "Which rounds").
    log.info(
        "timing %d strategies x %d steps in turns: %d warm-up pass(es), then %d to %d rounds, until every "
        "95%% interval is within +-%g%% (or +-%g%% once no two overlap)%s; every strategy is timed again, also "
        "one whose plan did not change: a ratio is drift-proof only between steps timed in the same turns",
        len(strategies),
        longest,
        il.warmup,
        il.rounds,
        il.max_rounds,
        100 * TARGETS[0],
        100 * TARGETS[1],
        "" if saved is None else " (continuing)",
    )
    t0 = time.perf_counter()
    ends: list[float] = []  # when each round of this process ended

    def intervals(res: dict[str, dict[str, list]]) -> Optional[dict[str, dict[str, Any]]]:
        if len(res["sorted"]["seconds"]) < 2:
            return None
        return ratio_intervals(
            {s: res[s]["seconds"] for s in strategies}, {s: res[s]["useful_tokens"] for s in strategies}
        )

    def widths(res: dict[str, dict[str, list]]) -> dict[str, float]:
        iv = intervals(res)
        if iv is None:
            return {s: math.inf for s in strategies if s != "sorted"}
        return {s: half_width(v["ratio_to_sorted"], v["ci95"]) for s, v in iv.items() if s != "sorted"}

    def enough(res: dict[str, dict[str, list]]) -> bool:
        iv = intervals(res)
        return iv is not None and stop_reason(iv) is not None

    def on_round(k: int, res: dict[str, dict[str, list]]) -> None:
        now = time.perf_counter()
        ends.append(now)
        if partial is not None:  # the rounds so far, for a rerun after an interruption (written whole)
            partial.parent.mkdir(parents=True, exist_ok=True)
            tmp = partial.with_name(f".{partial.name}.{os.getpid()}")
            tmp.write_text(
                json.dumps(
                    {
                        "key": key,
                        "rounds": {**{s: res[s] for s in strategies}, "_order": round_orders(strategies, k + 1)},
                        "steps": both,
                    }
                )
            )
            os.replace(tmp, partial)
        w = widths(res)
        widest = max(w.values(), default=0.0)
        iv = intervals(res)
        target = width_to_reach(iv) if iv is not None else TARGETS[0]
        total = projected_rounds(k + 1, iv, rounds=il.rounds, max_rounds=il.max_rounds)
        # seconds per round: the measured rounds of this process (the median of their durations), else this
        # round's timed seconds; never a guess from a first step
        durations = np.diff([t0, *ends]) if len(ends) > 1 else []
        per = (
            float(np.median(durations[1:]))
            if len(durations) > 1
            else float(sum(sum(r[0] + r[1] for r in both[s][-len(plan[s]["steps"]) :]) for s in strategies))
        )
        if not math.isfinite(widest):  # no interval yet: no "k/N" count, whose N would be a guess
            log.info(
                "round %d of %d to %d: 95%% intervals from round 2; %.0f s per round",
                k + 1,
                il.rounds,
                il.max_rounds,
                per,
            )
            return
        shown = ", ".join(f"{s} +-{v:.1%}" for s, v in sorted(w.items(), key=lambda x: -x[1]))
        log.info(
            "round %d/%d (at most %d): 95%% intervals %s (target +-%g%%%s); %.0f s per round, about %s left",
            k + 1,
            total,
            il.max_rounds,
            shown,
            100 * target,
            ": the ranking is resolved" if target > TARGETS[0] else "",
            per,
            _duration(per * (total - k - 1)),
        )

    res = measure_interleaved(
        lambda s, j: step(s, j) if j < len(plan[s]["steps"]) else 0,
        strategies,
        rounds=il.rounds,
        max_rounds=il.max_rounds,
        enough=enough,
        segment_steps=longest,
        warmup=il.warmup,
        clock=lambda: timed[0],
        on_round=on_round,
        done=None if saved is None else saved["rounds"],
    )
    seconds = time.perf_counter() - t0
    rounds = len(res["_order"])
    reason = stop_reason(intervals(res)) if rounds >= 2 else None
    out: dict[str, Any] = {
        "machine": fingerprint(threads=params.train.threads),
        "rounds": rounds,
        "min_rounds": il.rounds,
        "max_rounds": il.max_rounds,
        "stopped": (
            reason
            if rounds >= il.rounds and reason is not None
            else "interleave.max_rounds reached"
            if rounds == il.max_rounds > il.rounds
            else "interleave.rounds reached"
        ),
        "segment_steps": il.segment_steps,
        "warmup": il.warmup,
        "clock": clock,
        "order": res["_order"],
        "seconds": round(seconds, 3),
        "strategies": {},
    }
    for s in strategies:
        steps = plan[s]["steps"]
        per_round = np.asarray(both[s], dtype=float)
        per_round = per_round.reshape(rounds, len(steps), 4).sum(axis=1)  # per round: the four seconds above
        role = per_round[:, 2:] if clock == "cpu" else per_round[:, :2]
        out["strategies"][s] = {
            "steps": [int(st.step) for st in steps],
            "epochs": [int(st.epoch) for st in steps],
            "step_useful_tokens": [int(st.useful) for st in steps],
            **res[s],
            "wall_seconds": (per_round[:, 0] + per_round[:, 1]).tolist(),
            "cpu_seconds": (per_round[:, 2] + per_round[:, 3]).tolist(),
            "target_seconds": role[:, 0].tolist(),
            "drafter_seconds": role[:, 1].tolist(),
        }
    return out


def run(*, params: Params, data: str | Path, boundaries: Optional[str | Path], out: str | Path) -> int:
    """``lenbatch interleave``: measure (:func:`measure`) and write ``out/interleave.json`` and the resolved
    params. Returns the exit code."""
    # the rounds so far, beside the output (a staging folder while the stage runs) and outside it: a Ctrl-C or
    # a kill leaves them for the rerun, which continues from the next round when its inputs are the same
    partial = Path(out).parent / PARTIAL_DIR / PARTIAL
    doc = measure(params, data=data, boundaries=boundaries, partial=partial)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / TIMINGS).write_text(json.dumps(doc, indent=1) + "\n")
    write_resolved(params, out)
    partial.unlink(missing_ok=True)
    st = doc["strategies"]
    for s, v in st.items():  # the ratios and their intervals are compare's (analysis.interleaved)
        log.info(
            "%-9s steps %s: %d rounds, %.2f s per segment (median), %.0f useful tokens/s (median)",
            s,
            v["steps"],
            len(v["seconds"]),
            float(np.median(v["seconds"])),
            float(np.median(np.asarray(v["useful_tokens"]) / np.asarray(v["seconds"]))),
        )
    log.info(
        "timed %d strategies in %d rounds in %.1f s; wrote %s", len(st), doc["rounds"], doc["seconds"], out / TIMINGS
    )
    return 0


def _duration(seconds: float) -> str:
    """42 s, 3 min 05 s."""
    s = int(round(max(seconds, 0.0)))
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60:02d} s"
