"""When each step of a pipelined run ends: the simulation the step-time model's prediction runs on.

A pipelined run (target ranks -> bounded queue -> drafter rank) is simulated step by step
(:func:`pipeline_ends`), so a step costs about ``max(target, drafter)`` in steady state, not the sum;
across ``nodes`` nodes the drafters' all-reduce joins each cluster step (:func:`pipeline_timeline`);
:func:`blended_pipeline` prices the overlap of the two roles on one machine and :func:`throughput` reads
useful tokens per second off the step ends.

Separate from :mod:`lenbatch_study.analysis.stepmodel` (which fits step seconds on the profile grid and
re-exports these names): the fit says what one step costs, this module what a sequence of such steps
takes once the roles overlap. Pure functions on numpy arrays; cost O(steps) (the blend: a few passes).
"""

from __future__ import annotations

import numpy as np


# --------------------------------------------------------------------------- pipeline


def pipeline_ends(
    target_s: np.ndarray,
    drafter_s: np.ndarray | None = None,
    *,
    queue_size: int = 1,
    target_ranks: int = 1,
    ack_every: int | None = None,
    overhead_s: float = 0.0,
    nodes: int = 1,
    allreduce_s: float = 0.0,
    transport_s: np.ndarray | None = None,
) -> np.ndarray:
    """Time at which the run finishes each step, for target ranks feeding one drafter rank.

    Step i is computed by target rank ``i mod R`` (round-robin, R = ``target_ranks``); a
    target rank sends its k-th batch only once the drafter has taken its (k - q)-th (credits,
    q = ``queue_size``), i.e. global step i - q R; the drafter takes the steps in order:

        done_i = free_r + t_i;   put_i = max(done_i, take_{i - qR});   free_r = put_i
        take_i = max(put_i, resume);   end_i = take_i + x_i + d_i + overhead;   resume = end_i

    ``x_i`` = ``transport_s`` (0 without): the drafter rank receiving step i's batch and features once it
    takes the step (:mod:`lenbatch_study.runtime.transport`; gloo moves the bytes when the receive is posted),
    on the drafter's critical path; the credit that frees the target rank's slot goes out once it is received,
    so with transport ``put_i = max(done_i, take_{i - qR} + x_{i - qR})``. Only the separate (multi-process)
    trainings move features; one process (``drafter_s`` None) has no transport.

    ``ack_every`` (the train stage's protocol: the drafter acknowledges each batch with a
    non-blocking send and, once more than ``ack_every`` are outstanding, waits for all of
    them): a target rank receives the acknowledgement of step i only when it needs the
    credit, right after computing the features of its step i + qR (or, past its last step,
    when it drains), so after step i the drafter resumes at max(end_i, done_{i+qR}).

    ``nodes`` > 1: ``target_ranks`` counts every node's (``target_ranks / nodes`` per node), and the
    drafters step together (:func:`pipeline_timeline`), each cluster step plus ``allreduce_s``.

    Without ``drafter_s`` (one process does both) the steps simply add up:
    end_i = sum_{j<=i} t_j + overhead. Cost O(steps).
    """
    t = np.asarray(target_s, dtype=np.float64)
    if drafter_s is None:
        return np.cumsum(t + overhead_s)
    return pipeline_timeline(
        t,
        drafter_s,
        queue_size=queue_size,
        target_ranks=target_ranks,
        ack_every=ack_every,
        overhead_s=overhead_s,
        nodes=nodes,
        allreduce_s=allreduce_s,
        transport_s=transport_s,
    )["end"]


def pipeline_timeline(
    target_s: np.ndarray,
    drafter_s: np.ndarray,
    *,
    queue_size: int = 1,
    target_ranks: int = 1,
    ack_every: int | None = None,
    overhead_s: float = 0.0,
    nodes: int = 1,
    allreduce_s: float = 0.0,
    transport_s: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """The pipelined run's timeline (see :func:`pipeline_ends`): per step, when its target
    forward starts and ends (``target_start``, ``target_end``), when the drafter takes it
    (``drafter_start``: its receive starts), when its drafter step starts (``compute_start``: the
    batch received, ``drafter_start + transport_s``) and when the step ends (``end``).

    ``nodes`` > 1 (``m = target_ranks / nodes`` target ranks per node; step ``i``'s target rank
    ``r = i mod R`` is on node ``r // m``): the targets' timeline and credits are as above, and cluster step
    ``c`` = the steps ``S_c`` that are the c-th of their node (one per node, fewer once a node's steps ran out):

        take_i = max(put_i, resume)  for i in S_c;   end_c = max_{i in S_c} (take_i + x_i + d_i) + allreduce_s + overhead
        end_i = end_c  for i in S_c;   resume = end_c

    Cost O(steps)."""
    t = np.asarray(target_s, dtype=np.float64)
    d = np.asarray(drafter_s, dtype=np.float64)
    x = np.zeros_like(d) if transport_s is None else np.broadcast_to(np.asarray(transport_s, dtype=np.float64), d.shape)
    assert t.shape == d.shape
    q, R = int(queue_size), int(target_ranks)
    if q < 1 or R < 1:
        raise ValueError(f"queue_size and target_ranks must be >= 1, got {queue_size}, {target_ranks}")
    if nodes > 1:
        return _cluster_timeline(
            t,
            d,
            x,
            queue_size=q,
            target_ranks=R,
            nodes=int(nodes),
            overhead_s=overhead_s,
            allreduce_s=allreduce_s,
            ack_every=ack_every,
        )
    n, qR = t.size, q * R
    done, put, take, end = (np.zeros(n) for _ in range(4))
    free = np.zeros(R)  # when each target rank can start its next forward
    scheduled = 0  # target steps 0..scheduled-1 have done/put times

    def schedule(upto: int) -> None:
        """Target timeline up to step ``upto``; every credit it needs (take_{k-qR}) is known by then."""
        nonlocal scheduled
        while scheduled <= min(upto, n - 1):
            k, r = scheduled, scheduled % R
            done[k] = free[r] + t[k]
            put[k] = max(done[k], take[k - qR] + x[k - qR]) if k >= qR else done[k]  # credited once received
            free[r] = put[k]
            scheduled += 1

    resume, pending = 0.0, 0
    for i in range(n):
        schedule(i)
        take[i] = max(put[i], resume)
        end[i] = take[i] + x[i] + d[i] + overhead_s
        resume = end[i]
        pending += 1
        if ack_every is not None and pending > ack_every:
            j = i + qR
            if j < n:
                schedule(j)
                resume = max(resume, done[j])
            else:  # the target rank drains its acknowledgements after its last send
                last = i % R + R * ((n - 1 - i % R) // R)
                schedule(last)
                resume = max(resume, put[last])
            pending = 0
    return {"target_start": done - t, "target_end": done, "drafter_start": take, "compute_start": take + x, "end": end}


def _cluster_timeline(
    t: np.ndarray,
    d: np.ndarray,
    x: np.ndarray,
    *,
    queue_size: int,
    target_ranks: int,
    nodes: int,
    overhead_s: float,
    allreduce_s: float,
    ack_every: int | None,
) -> dict[str, np.ndarray]:
    """:func:`pipeline_timeline` of ``nodes`` > 1 nodes (its docstring). Cost O(steps)."""
    q, R = queue_size, target_ranks
    if R % nodes:
        raise ValueError(f"target_ranks={R} is not a multiple of nodes={nodes}: each node has train.nproc - 1")
    if ack_every is not None:
        raise ValueError("ack_every is not modelled across nodes; pass ack_every=None")
    m, n, qR = R // nodes, t.size, q * R
    done, put, take, end = (np.zeros(n) for _ in range(4))
    free = np.zeros(R)
    per_node: list[list[int]] = [[] for _ in range(nodes)]
    for i in range(n):
        per_node[(i % R) // m].append(i)
    scheduled = 0
    resume = 0.0
    for c in range(max(len(p) for p in per_node) if n else 0):
        steps = [p[c] for p in per_node if c < len(p)]
        # every credit the targets need up to here is a take of an earlier cluster step (q >= 1)
        while scheduled <= max(steps):
            k, r = scheduled, scheduled % R
            done[k] = free[r] + t[k]
            put[k] = max(done[k], take[k - qR] + x[k - qR]) if k >= qR else done[k]  # credited once received
            free[r] = put[k]
            scheduled += 1
        take[steps] = np.maximum(put[steps], resume)
        resume = float(np.max(take[steps] + x[steps] + d[steps])) + allreduce_s + overhead_s
        end[steps] = resume
    return {"target_start": done - t, "target_end": done, "drafter_start": take, "compute_start": take + x, "end": end}


def busy_share(starts: np.ndarray, ends: np.ndarray, busy_starts: np.ndarray, busy_ends: np.ndarray) -> np.ndarray:
    """Share of each interval [starts_k, ends_k] during which at least one busy interval runs.

    The busy intervals are merged into a disjoint union; with B(x) the busy time before x
    (prefix sums over the union), interval k's share is (B(ends_k) - B(starts_k)) / its
    length (0 for an empty interval). Cost O((n + m) log m).
    """
    starts, ends = np.asarray(starts, dtype=np.float64), np.asarray(ends, dtype=np.float64)
    bs, be = np.asarray(busy_starts, dtype=np.float64), np.asarray(busy_ends, dtype=np.float64)
    if bs.size == 0:
        return np.zeros_like(starts)
    order = np.argsort(bs, kind="stable")
    bs, be = bs[order], be[order]
    reach = np.maximum.accumulate(be)
    new = np.concatenate([[True], bs[1:] > reach[:-1]])  # a gap before this interval opens a new union piece
    ms = bs[new]
    me = reach[np.concatenate([np.flatnonzero(new)[1:] - 1, [bs.size - 1]])]
    cum = np.concatenate([[0.0], np.cumsum(me - ms)])

    def before(x: np.ndarray) -> np.ndarray:
        j = np.searchsorted(ms, x, side="right")  # union pieces starting at or before x
        last = np.maximum(j - 1, 0)
        part = np.where(j > 0, np.clip(x - ms[last], 0.0, me[last] - ms[last]), 0.0)
        return cum[last] + part

    length = ends - starts
    return np.where(length > 0, (before(ends) - before(starts)) / np.where(length > 0, length, 1.0), 0.0)


def blended_pipeline(
    target_alone: np.ndarray,
    target_busy: np.ndarray,
    drafter_alone: np.ndarray,
    drafter_busy: np.ndarray,
    *,
    queue_size: int = 1,
    target_ranks: int = 1,
    ack_every: int | None = None,
    overhead_s: float = 0.0,
    iterations: int = 30,
    tol: float = 1e-6,
    nodes: int = 1,
    allreduce_s: float = 0.0,
    transport_s: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Pipelined run whose step times depend on whether the other role is working meanwhile.

    On one machine the target and the drafter share cores, caches and memory bandwidth: a
    step timed alone (``*_alone``) runs faster than one timed with the other role busy
    (``*_busy``). Each step gets the time

        t_k = t_alone_k + (t_busy_k - t_alone_k) * o_k

    with o_k the share of its forward during which the drafter works (and likewise for the
    drafter step, against the union of the target ranks' forwards), read off the pipeline
    timeline (:func:`pipeline_timeline`, :func:`busy_share`). The overlaps depend on the
    times, so this is a fixed point: start from o = 1 (always busy), then average old and
    new times until they move less than ``tol`` (relative). Returns the timeline plus
    ``target_s``, ``drafter_s`` (the blended times) and ``target_overlap``,
    ``drafter_overlap``. Cost O(iterations x steps log steps), a few iterations in practice.
    """
    ta, tb = np.asarray(target_alone, dtype=np.float64), np.asarray(target_busy, dtype=np.float64)
    da, db = np.asarray(drafter_alone, dtype=np.float64), np.asarray(drafter_busy, dtype=np.float64)
    assert ta.shape == tb.shape == da.shape == db.shape

    def timeline(t: np.ndarray, d: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """The timeline of these step times and each step's overlap with the other role's work."""
        tl = pipeline_timeline(
            t,
            d,
            queue_size=queue_size,
            target_ranks=target_ranks,
            ack_every=ack_every,
            overhead_s=overhead_s,
            nodes=nodes,
            allreduce_s=allreduce_s,
            transport_s=transport_s,
        )
        d_end = tl["compute_start"] + d  # the drafter step proper: after its batch is received
        return (
            tl,
            busy_share(tl["target_start"], tl["target_end"], tl["compute_start"], d_end),
            busy_share(tl["compute_start"], d_end, tl["target_start"], tl["target_end"]),
        )

    t, d = tb.copy(), db.copy()
    for _ in range(max(int(iterations), 1)):
        _, o_t, o_d = timeline(t, d)
        t_new = 0.5 * (t + ta + (tb - ta) * o_t)
        d_new = 0.5 * (d + da + (db - da) * o_d)
        moved = max(
            float(np.max(np.abs(t_new - t) / np.maximum(t, 1e-12), initial=0.0)),
            float(np.max(np.abs(d_new - d) / np.maximum(d, 1e-12), initial=0.0)),
        )
        t, d = t_new, d_new
        if moved < tol:
            break
    tl, o_t, o_d = timeline(t, d)
    return {**tl, "target_s": t, "drafter_s": d, "target_overlap": o_t, "drafter_overlap": o_d}


def throughput(useful_tokens: np.ndarray, ends: np.ndarray, *, warmup_steps: int) -> float:
    """Useful tokens per second over steps ``warmup_steps..``: tokens of those steps over the
    time from the end of the last warm-up step (0 without warm-up) to the end of the last step."""
    useful_tokens = np.asarray(useful_tokens, dtype=np.float64)
    n = useful_tokens.size
    w = int(warmup_steps)
    if n <= w:
        raise ValueError(
            f"plan has {n} steps, not more than train.warmup_steps={w}; lower warmup_steps or raise train.useful_tokens"
        )
    start = ends[w - 1] if w > 0 else 0.0
    return float(useful_tokens[w:].sum() / (ends[-1] - start))
