"""Batches of a stream whose lengths arrive one at a time: the pure planner behind
:class:`lenbatch.StreamingBatcher` (numpy only; it sees stream positions and lengths, never samples).

The in-memory planner (:mod:`lenbatch.batching.strategies`) needs every length up front. Here the
samples pass through a **shuffle buffer** of ``buffer_size``: once it is full, each new sample takes
the place of one drawn uniformly at random from it, and the drawn one goes on to the strategy (at the
end of the stream the buffer is drained in a random order). Along that order each strategy runs the
same rule as in memory:

* ``random``: greedy token-budget packing (a batch grows while ``(n+1)·max(m, next) <= token_budget``
  and ``n < max_batch_size``; the sample that does not fit starts the next batch);
* ``bucketed``: one open greedy batch per bucket (``edges[k] <= length < edges[k+1]``); without
  ``edges`` they are :func:`lenbatch.optimize_boundaries` of the first buffer's lengths (64 candidate
  edges), the last edge
  raised to ``token_budget + 1`` so that every later length is covered;
* ``sortish``: megabatches of ``min(50·max_batch_size, buffer_size)`` consecutive drawn samples (Hugging
  Face ``group_by_length``'s size), each sorted longest first (ties in draw order) and greedy-packed;
* ``packed``: first-fit rows of at most ``token_budget`` tokens with ``packed_window`` rows open (the
  fullest closed when a sequence fits none; a row whose free space is below the shortest length read so
  far closes at once); at the end the open rows' sequences are re-packed first-fit decreasing.

``sorted`` is refused: sorting a stream needs all of it, which is what the in-memory planner does.

**Ranks.** Every rank reads the whole stream and computes the same global sequence of batches; step s
is batches s·W .. s·W+W-1 (W = ``world_size``) and rank r keeps the r-th. A closed batch is *held back*
until the batches closed after it hold at least W - 1 samples more than they are batches: then,
whatever the rest of the stream, its last batches can always be split (the in-memory rule,
:func:`lenbatch.batching.epoch.split_to_multiple`: the costliest in two) into a multiple of W. So every
rank gets the same number of batches, every sample is in exactly one batch of one rank, and no rank
talks to another: they agree because they read the same stream.

**Determinism.** The batches are a function of (the stream's lengths, strategy, limits, buffer_size,
seed, epoch, world_size) alone: one ``numpy.random.Generator`` seeded with ``seed + epoch`` draws the
buffer's replacements (in blocks) and the final drain.

**Cost** (``cost=lenbatch.Cost(...)``, ``cost_budget=``; :mod:`lenbatch.batching.cost`): the greedy and
first-fit rules take the cost budget as one more bound (n·g(longest) padded, Σ g(n_i) packed, g(m) =
a·m + b·m²), and batches go out ``BALANCE_STEPS`` steps at a time, sorted by cost, so that each step's
ranks get batches of about equal cost (without a cost: step by step, in closing order).

**Memory.** Samples read and not yet handed out: at most ``buffer_size`` in the buffer, plus the
strategy's open batches (random: 1, bucketed: K, packed: ``packed_window`` rows, sortish: one megabatch;
each at most ``max_batch_size`` samples) plus the held-back batches (usually about one step; with a cost, ``BALANCE_STEPS`` steps).
:attr:`StreamPlanner.peak_held` reports the most held at once. Cost: O(1) Python work per sample
(O(``packed_window``) packed; O(megabatch log megabatch) per sortish megabatch).
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import Any

import numpy as np

from lenbatch.batching.cost import Cost, cost_limit
from lenbatch.batching.epoch import EpochBatches, split_to_multiple
from lenbatch.batching.scan import _first_fit_decreasing
from lenbatch.batching.spec import BatchSpec, check_int
from lenbatch.batching.strategy import STRATEGIES, Strategy, edges_tuple, layout_of

# every strategy but sorted, which needs the whole epoch's lengths before its first batch
STREAM_STRATEGIES = tuple(s for s in STRATEGIES if s != "sorted")
HASH_MOD = (1 << 61) - 1  # a running polynomial hash of the lengths read (the resume check)
EDGE_CANDIDATES = 64  # candidate edges searched when bucketed edges are estimated from the first buffer
DRAWS = 8192  # buffer replacement indices drawn per call to the generator
BALANCE_STEPS = 32  # steps released together and balanced by cost when a Cost is given


def check_stream_strategy(strategy: str) -> str:
    """``strategy`` if a stream can be planned with it; ``ValueError`` with the reason otherwise."""
    if strategy == "sorted":
        raise ValueError(
            "strategy 'sorted' needs every length before the first batch (it sorts the whole "
            "epoch), which a stream cannot give; use 'sortish' (sorts within megabatches of the "
            "buffer) or 'bucketed', or plan in memory with lenbatch.plan_epoch"
        )
    if strategy not in STREAM_STRATEGIES:
        raise ValueError(f"strategy {strategy!r} unknown for a stream; choose one of {list(STREAM_STRATEGIES)}")
    return strategy


def stream_strategy(strategy: "str | Strategy", edges: Any = None) -> tuple[str, tuple[int, ...] | None]:
    """(name, edges) of a stream's strategy: a :class:`Strategy` carries its edges (``edges=`` beside it is a
    ``ValueError``); a name takes ``edges=`` beside it, which only ``bucketed`` accepts, and ``bucketed``
    alone may go without (a stream estimates them from its first buffer)."""
    if isinstance(strategy, Strategy):
        s = Strategy.of(strategy, edges)
        return check_stream_strategy(s.name), s.edges
    name = check_stream_strategy(strategy)
    edges = edges_tuple(edges)
    if edges is not None:
        Strategy(name, edges)  # only bucketed takes edges
    return name, edges


class StreamPlanner:
    """The batches of one pass over a stream (module doc): :meth:`push` each length in stream order, then
    :meth:`finish`; :meth:`take_steps` hands out the released steps, each a list of ``world_size``
    batches, a batch a list of stream positions (0-based). ``ValueError`` naming the setting and the fix
    for a length over the budget or outside the edges."""

    def __init__(
        self,
        *,
        strategy: "str | Strategy",
        spec: BatchSpec,
        buffer_size: int,
        edges: Any = None,
        epoch: int = 0,
        world_size: int = 1,
        num_buckets: int = 6,
        cost: Cost | None = None,
        cost_budget: float | None = None,
    ) -> None:
        strategy, edges = stream_strategy(strategy, edges)
        self.strategy = strategy
        self.packed = layout_of(strategy) == "packed"
        # validated as the in-memory planner does (a length of 1 stands in for the stream's, unknown yet)
        cost_limit(
            np.ones(1, dtype=np.int64),
            token_budget=spec.token_budget,
            max_batch_size=spec.max_batch_size,
            cost=cost,
            cost_budget=cost_budget,
        )
        self.cost = cost
        self.cost_budget = None if cost_budget is None else float(cost_budget)
        self._a = 0.0 if cost is None else cost.per_token
        self._b = 0.0 if cost is None else cost.per_token_squared
        self.spec = spec
        self.buffer_size = check_int("buffer_size", buffer_size, minimum=1)
        self.world_size = check_int("world_size", world_size, minimum=1)
        self.num_buckets = check_int("num_buckets", num_buckets, minimum=1)
        self.rng = np.random.default_rng(spec.seed + check_int("epoch", epoch, minimum=0))
        self.read = 0  # samples pushed
        self.released = 0  # samples handed out in steps
        self.peak_held = 0
        self.hash = 0
        self.shortest = spec.token_budget + 1
        self.edges: tuple[int, ...] | None = edges
        self._buf_pos: list[int] = []
        self._buf_len: list[int] = []
        self._draws: list[int] = []
        self._pending: deque[tuple[list[int], list[int]]] = deque()  # closed, held back: (positions, lengths)
        self._pending_extra = 0  # sum over held-back batches of (samples - 1)
        self._steps: list[list[list[int]]] = []
        self._open: list[list[Any]] = []  # greedy: [positions, lengths, longest] per bucket; packed: rows
        self._mega: tuple[list[int], list[int]] = ([], [])
        self.finished = False
        if strategy in ("random", "sortish"):
            self._open = [[[], [], 0]]
        elif strategy == "bucketed" and self.edges is not None:
            self._open = [[[], [], 0] for _ in range(len(self.edges) - 1)]

    # ------------------------------------------------------------------ the stream side
    def push(self, length: int) -> None:
        """Read one sample of ``length`` tokens (the next stream position)."""
        L = int(length)
        if not 1 <= L <= self.spec.token_budget:
            raise ValueError(
                f"sample {self.read} of the stream has {L} tokens, outside 1..token_budget="
                f"{self.spec.token_budget}; raise token_budget, or truncate or drop such samples "
                "before the batcher (a stream cannot hold a sample back to split it)"
            )
        if self.cost_budget is not None and self._a * L + self._b * L * L > self.cost_budget:
            raise ValueError(
                f"sample {self.read} of the stream has {L} tokens and alone costs more than cost_budget="
                f"{self.cost_budget:g}; raise cost_budget, or truncate or drop such samples"
            )
        pos = self.read
        self.read = pos + 1
        self.hash = (self.hash * 1_000_003 + L) % HASH_MOD
        if L < self.shortest:
            self.shortest = L
        if len(self._buf_pos) < self.buffer_size:
            self._buf_pos.append(pos)
            self._buf_len.append(L)
            if len(self._buf_pos) == self.buffer_size and self.strategy == "bucketed" and self.edges is None:
                self._estimate_edges()
        else:
            if not self._draws:
                self._draws = self.rng.integers(0, self.buffer_size, size=DRAWS).tolist()
                self._draws.reverse()
            j = self._draws.pop()
            out_pos, out_len = self._buf_pos[j], self._buf_len[j]
            self._buf_pos[j] = pos
            self._buf_len[j] = L
            self._place(out_pos, out_len)
        held = self.read - self.released
        if held > self.peak_held:
            self.peak_held = held

    def finish(self) -> None:
        """The stream has ended: drain the buffer in a random order, close every open batch, and split the
        held-back batches into a multiple of ``world_size`` (``ValueError`` when the stream has fewer
        samples than the ranks need batches)."""
        if self.finished:
            return
        self.finished = True
        if self.strategy == "bucketed" and self.edges is None and self._buf_pos:
            self._estimate_edges()
        for j in self.rng.permutation(len(self._buf_pos)).tolist():
            self._place(self._buf_pos[j], self._buf_len[j])
        self._buf_pos, self._buf_len = [], []
        self._flush()
        self._split_tail()

    def take_steps(self) -> list[list[list[int]]]:
        """The steps released since the last call (each ``world_size`` batches of stream positions)."""
        out, self._steps = self._steps, []
        return out

    # ------------------------------------------------------------------ strategies
    def _estimate_edges(self) -> None:
        from lenbatch.batching.boundaries import optimize_boundaries

        x = np.asarray(self._buf_len, dtype=np.int64)
        k = max(1, min(self.num_buckets, np.unique(x).size))
        # 64 candidate edges instead of the default 290: 0.1 s instead of 1.2 s per pass on a buffer of a few
        # thousand, at a predicted efficiency 0.1 point lower (chat-like lengths)
        b = optimize_boundaries(
            x,
            k,
            num_candidates=EDGE_CANDIDATES,
            spec=BatchSpec(token_budget=self.spec.token_budget, max_batch_size=self.spec.max_batch_size),
        )
        self.edges = (*b.edges[:-1], self.spec.token_budget + 1)
        self._open = [[[], [], 0] for _ in range(len(self.edges) - 1)]

    def _place(self, p: int, L: int) -> None:
        s = self.strategy
        if s == "random":
            self._greedy(0, p, L)
        elif s == "bucketed":
            e = self.edges
            if L < e[0] or L >= e[-1]:
                raise ValueError(
                    f"sample {p} of the stream has {L} tokens, outside the edges {list(e)}; give "
                    f"edges from 0 to above the longest sample (e.g. ending at token_budget + 1 = "
                    f"{self.spec.token_budget + 1})"
                )
            self._greedy(bisect.bisect_right(e, L) - 1, p, L)
        elif s == "sortish":
            mp, ml = self._mega
            mp.append(p)
            ml.append(L)
            if len(mp) >= min(50 * self.spec.max_batch_size, self.buffer_size):
                self._sortish_megabatch()
        else:
            self._first_fit(p, L)

    def _greedy(self, k: int, p: int, L: int) -> None:
        ob = self._open[k]
        pos = ob[0]
        m = ob[2]
        mm = L if L > m else m
        if (
            len(pos) < self.spec.max_batch_size
            and (len(pos) + 1) * mm <= self.spec.token_budget
            and (self.cost_budget is None or (len(pos) + 1) * (self._a * mm + self._b * mm * mm) <= self.cost_budget)
        ):
            pos.append(p)
            ob[1].append(L)
            ob[2] = mm
        else:
            self._close(pos, ob[1])
            self._open[k] = [[p], [L], L]

    def _sortish_megabatch(self) -> None:
        mp, ml = self._mega
        self._mega = ([], [])
        if not mp:
            return
        order = sorted(range(len(mp)), key=lambda i: -ml[i])  # longest first, ties in draw order (stable)
        self._open = [[[], [], 0]]
        for i in order:
            self._greedy(0, mp[i], ml[i])
        ob = self._open[0]
        if ob[0]:
            self._close(ob[0], ob[1])
        self._open = [[[], [], 0]]

    def _first_fit(self, p: int, L: int) -> None:
        rows = self._open  # each [positions, lengths, free tokens, free cost]
        mbs = self.spec.max_batch_size
        g = self._a * L + self._b * L * L
        cb = self.cost_budget
        gs = self._a * self.shortest + self._b * self.shortest * self.shortest
        for k, row in enumerate(rows):
            if row[2] >= L and (cb is None or row[3] >= g):
                row[0].append(p)
                row[1].append(L)
                row[2] -= L
                row[3] -= g
                if row[2] < self.shortest or len(row[0]) >= mbs or (cb is not None and row[3] < gs):
                    self._close(row[0], row[1])
                    rows.pop(k)
                return
        if len(rows) >= self.spec.packed_window:
            k = min(range(len(rows)), key=lambda i: rows[i][2])  # the fullest (first of the least free)
            self._close(rows[k][0], rows[k][1])
            rows.pop(k)
        free = self.spec.token_budget - L
        free_cost = 0.0 if cb is None else cb - g
        if free < self.shortest or mbs == 1 or (cb is not None and free_cost < gs):
            self._close([p], [L])
        else:
            rows.append([[p], [L], free, free_cost])

    def _flush(self) -> None:
        if self.strategy == "sortish":
            self._sortish_megabatch()
        elif self.strategy == "packed":
            members = [p for row in self._open for p in row[0]]
            xs = {p: L for row in self._open for p, L in zip(row[0], row[1])}
            self._open = []
            if self.cost_budget is None:
                tail = _first_fit_decreasing(
                    members, xs_of=xs, token_budget=self.spec.token_budget, max_batch_size=self.spec.max_batch_size
                )
            else:  # first-fit decreasing under both budgets (the in-memory planner's tail rule)
                tail, free, free_cost = [], [], []
                for p in sorted(members, key=lambda q: (-xs[q], q)):
                    L = xs[p]
                    g = self._a * L + self._b * L * L
                    for k in range(len(free)):
                        if free[k] >= L and free_cost[k] >= g and len(tail[k]) < self.spec.max_batch_size:
                            tail[k].append(p)
                            free[k] -= L
                            free_cost[k] -= g
                            break
                    else:
                        tail.append([p])
                        free.append(self.spec.token_budget - L)
                        free_cost.append(self.cost_budget - g)
            for row in tail:
                self._close(row, [xs[p] for p in row])
        else:
            for ob in self._open:
                if ob[0]:
                    self._close(ob[0], ob[1])
            self._open = [[[], [], 0] for _ in self._open]

    # ------------------------------------------------------------------ ranks
    def _close(self, pos: list[int], lens: list[int]) -> None:
        self._pending.append((pos, lens))
        self._pending_extra += len(pos) - 1
        w = self.world_size
        # with a cost, BALANCE_STEPS steps go out at once, their batches sorted by cost: a step's ranks then
        # get batches of about equal cost (a DDP step waits for its costliest rank)
        group = w if self.cost is None or w == 1 else w * BALANCE_STEPS
        while len(self._pending) >= group:
            first = sum(len(self._pending[i][0]) - 1 for i in range(group))
            if self._pending_extra - first < w - 1:
                break
            self._pending_extra -= first
            self._release_group([self._pending.popleft() for _ in range(group)])

    def _batch_cost(self, lens: list[int]) -> float:
        a, b = self._a, self._b
        if self.packed:
            return sum(a * L + b * L * L for L in lens)
        m = max(lens)
        return len(lens) * (a * m + b * m * m)

    def _release_group(self, batches: list[tuple[list[int], list[int]]]) -> None:
        """Release ``batches`` (a multiple of world_size) as steps: in order, or sorted by cost (descending,
        ties in order) when there is a cost."""
        w = self.world_size
        if self.cost is not None and w > 1:
            costs = [self._batch_cost(lens) for _, lens in batches]
            batches = [batches[i] for i in sorted(range(len(batches)), key=lambda i: -costs[i])]
        for i in range(0, len(batches), w):
            self._release([pos for pos, _ in batches[i : i + w]])

    def _release(self, step: list[list[int]]) -> None:
        self._steps.append(step)
        self.released += sum(len(b) for b in step)

    def _split_tail(self) -> None:
        w = self.world_size
        pending = list(self._pending)
        self._pending.clear()
        if not pending:
            return
        if len(pending) % w:
            lens = np.asarray([L for _, ls in pending for L in ls], dtype=np.int64)
            pos = np.asarray([p for ps, _ in pending for p in ps], dtype=np.int64)
            sizes = np.asarray([len(ps) for ps, _ in pending], dtype=np.int64)
            end = np.cumsum(sizes)
            start = end - sizes
            packed = self.packed
            cost = np.asarray([sum(ls) if packed else len(ls) * max(ls) for _, ls in pending], dtype=np.int64)
            try:
                eb = split_to_multiple(EpochBatches(np.arange(lens.size), start, end, cost), lens, w, packed)
            except ValueError:
                raise ValueError(
                    f"world_size={w} needs {len(pending) + (-len(pending)) % w} batches at the end "
                    f"of the stream but its last batches hold only {lens.size} samples; use fewer "
                    "ranks or more data"
                ) from None
            pending = [
                (pos[eb.flat[s:e]].tolist(), lens[eb.flat[s:e]].tolist())
                for s, e in zip(eb.start.tolist(), eb.end.tolist())
            ]
        self._release_group(pending)


def plan_stream(
    lengths: Any,
    *,
    strategy: "str | Strategy",
    spec: BatchSpec,
    buffer_size: int,
    edges: Any = None,
    epoch: int = 0,
    world_size: int = 1,
    num_buckets: int = 6,
    cost: Cost | None = None,
    cost_budget: float | None = None,
) -> list[list[np.ndarray]]:
    """Every rank's batches of one pass over a stream with these ``lengths`` (in stream order): ``out[r]``
    is rank r's list of int64 position arrays, in order. The same batches as :class:`StreamPlanner`
    (and :class:`lenbatch.StreamingBatcher`) give; for tests and benchmarks. Cost: see the module doc."""
    planner = StreamPlanner(
        strategy=strategy,
        spec=spec,
        buffer_size=buffer_size,
        edges=edges,
        epoch=epoch,
        world_size=world_size,
        num_buckets=num_buckets,
        cost=cost,
        cost_budget=cost_budget,
    )
    push = planner.push
    for L in np.asarray(lengths).tolist():
        push(L)
    planner.finish()
    steps = planner.take_steps()
    return [[np.asarray(step[r], dtype=np.int64) for step in steps] for r in range(world_size)]


__all__ = ["STREAM_STRATEGIES", "StreamPlanner", "check_stream_strategy", "plan_stream", "stream_strategy"]
