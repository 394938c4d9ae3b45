"""Length-bucket boundaries: ``geometric``, ``coordinate`` (the study's search) and ``dp`` (exact).

Every optimizer is a pure function lengths -> edges + predicted efficiency. Bucket k holds
``edges[k] <= length < edges[k+1]``; edges[0] = 0 and edges[-1] = max + 1 (as in the study:
[0, ..., 8192] for lengths up to 8191). Interior edges come from a *candidate grid*: every
distinct length above the minimum when there are at most ``num_candidates`` of them (then the
search covers every partition), else ``num_candidates`` length quantiles (distinct sample values).

Objective (``objective=``): minimise the expected computed tokens, summed over buckets.
- ``"greedy"`` (default): :func:`lenbatch.batching.padding.greedy_bucket_computed`, a renewal model of the
  real greedy bucketed plan (budget-limited batch sizes, the overflowing sample starting the next
  batch, the partial last batch). It predicts simulated plans within 0.1 pp on the seed profile
  and on ShareGPT lengths (tests/batching/test_boundaries.py, benchmarks/bench_core.py).
- an :class:`~lenbatch.batching.padding.Objective`: any other model of a bucket's computed tokens (the
  study's lives in ``lenbatch_study.core.objective``).

``dp`` computes the cost of every candidate bucket once (a (C+2)^2 matrix: vectorised per bucket
start, prefix sums over distinct values, one small matrix product per start; see
:func:`greedy_cost_matrix`) and then solves min over K-partitions exactly by dynamic programming,
O(K C^2): the global optimum of the objective on the grid. ``coordinate`` runs the study's
coordinate descent on the same matrix, ``geometric`` snaps min..max+1 in K equal ratios to the grid.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from lenbatch.batching.bucket_cost import (
    candidate_values as candidate_values,
    candidates_of_counts as candidates_of_counts,
    cost_matrix as cost_matrix,
    greedy_cost_matrix as greedy_cost_matrix,
    pairwise_cost_matrix as pairwise_cost_matrix,
)
from lenbatch.batching.padding import Objective, objective_of, predict_bucketed_counts, value_counts
from lenbatch.batching.lengths import check_lengths
from lenbatch.batching.spec import BatchSpec, spec_or_keywords
from lenbatch.batching.strategy import Strategy


METHODS = ("dp", "coordinate", "geometric")


@dataclasses.dataclass(frozen=True)
class Boundaries:
    """Result of a boundary optimizer."""

    method: str
    num_buckets: int
    edges: tuple[int, ...]  # K+1 ints, edges[0] <= min, edges[-1] > max
    predicted_efficiency: float  # useful / predicted computed tokens under ``objective``
    objective: str
    token_budget: int
    max_batch_size: int
    num_candidates: int  # distinct candidate edge values searched
    seconds: float
    history: tuple[dict[str, Any], ...] = ()  # coordinate: one row per iteration

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["edges"] = list(self.edges)
        d["history"] = list(self.history)
        return d


def _validate(
    lengths: Any,
    num_buckets: int,
    token_budget: int,
    max_batch_size: int,
    method: str,
    objective: "str | Objective",
    num_candidates: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The histogram (sorted distinct lengths, counts) of the checked lengths; ``ValueError`` naming the
    setting. Integer lengths are counted as they are (no int64 copy). O(n)."""
    x = np.asarray(lengths)
    if not (x.ndim == 1 and x.size and x.dtype.kind in "iu" and x.min() > 0):
        x = check_lengths(lengths)  # raises, or converts integral floats
    v, c = value_counts(x)
    if method not in METHODS:
        raise ValueError(f"boundaries.method {method!r} unknown; choose one of {list(METHODS)}")
    objective_of(objective)  # ValueError naming the choices
    if token_budget <= 0 or max_batch_size <= 0:
        raise ValueError(
            f"batching.token_budget ({token_budget}) and batching.max_batch_size ({max_batch_size}) must be > 0"
        )
    if v[-1] > token_budget:
        raise ValueError(
            f"a sample of {int(v[-1])} tokens exceeds batching.token_budget={token_budget}; "
            "raise the budget or truncate samples (data.max_len)"
        )
    if num_candidates < 1:
        raise ValueError(f"boundaries.num_candidates must be >= 1, got {num_candidates}")
    distinct = int(v.size)
    if not 1 <= num_buckets <= distinct:
        raise ValueError(
            f"boundaries.num_buckets={num_buckets} but the lengths have {distinct} distinct values; "
            f"choose K in 1..{distinct}"
        )
    if num_buckets - 1 > num_candidates:
        raise ValueError(
            f"boundaries.num_buckets={num_buckets} needs >= {num_buckets - 1} candidates; "
            f"raise boundaries.num_candidates (now {num_candidates})"
        )
    return v, c


# --------------------------------------------------------------------------- optimizers on a cost matrix


def dp_partition(cost: np.ndarray, k: int) -> tuple[float, list[int]]:
    """Exact min over increasing grid index paths 0 = i_0 < ... < i_k = last of sum cost[i_j, i_j+1]."""
    best, arg = _dp_tables(cost, k)
    last = cost.shape[0] - 1
    return float(best[k][last]), _backtrack(arg, k, last)


def _dp_tables(cost: np.ndarray, kmax: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    L2 = cost.shape[0]
    best = [np.full(L2, np.inf)]
    best[0][0] = 0.0
    arg = [np.zeros(L2, dtype=np.int64)]
    for _ in range(kmax):
        tot = best[-1][:, None] + cost  # (from a, to b)
        a = np.argmin(tot, axis=0)
        best.append(tot[a, np.arange(L2)])
        arg.append(a)
    return best, arg


def _backtrack(arg: list[np.ndarray], k: int, last: int) -> list[int]:
    path = [last]
    for j in range(k, 0, -1):
        path.append(int(arg[j][path[-1]]))
    return path[::-1]


def _path_cost(cost: np.ndarray, path: list[int]) -> float:
    return float(sum(cost[a, b] for a, b in zip(path[:-1], path[1:])))


def geometric_path(v: np.ndarray, cand: np.ndarray, P: np.ndarray, k: int) -> list[int]:
    """Grid path of the geometric edges min * r^i, r = ((max+1)/min)^(1/K), each snapped to the nearest
    candidate value (kept strictly increasing)."""
    lo, hi = float(v[0]), float(v[-1] + 1)
    targets = lo * (hi / lo) ** (np.arange(1, k) / k)
    path = [0]
    L = len(cand)
    for i, t in enumerate(targets):
        j = int(np.argmin(np.abs(cand - t))) + 1  # grid index (1..L)
        j = max(j, path[-1] + 1)
        j = min(j, L - (k - 1 - i) + 1)  # leave room for the remaining edges
        path.append(j)
    path.append(len(P) - 1)
    return path


def coordinate_path(cost: np.ndarray, start: list[int], *, max_iter: int = 100) -> tuple[list[int], list[dict]]:
    """The study's search: Gauss-Seidel coordinate descent, each interior edge in turn moved to the best
    grid position strictly between its neighbours, until an iteration changes nothing."""
    path = list(start)
    history = [{"iteration": 0, "path": list(path), "cost": _path_cost(cost, path)}]
    for it in range(1, max_iter + 1):
        changed = False
        for i in range(1, len(path) - 1):
            lo, hi = path[i - 1], path[i + 1]
            cands = np.arange(lo + 1, hi)
            if cands.size == 0:
                continue
            tot = cost[lo, cands] + cost[cands, hi]
            j = int(cands[np.argmin(tot)])
            if tot.min() < cost[lo, path[i]] + cost[path[i], hi] - 1e-9 and j != path[i]:
                path[i] = j
                changed = True
        history.append({"iteration": it, "path": list(path), "cost": _path_cost(cost, path)})
        if not changed:
            break
    return path, history


def _edges_from_path(path: list[int], cand: np.ndarray, vmax: int) -> tuple[int, ...]:
    return tuple([0] + [int(cand[j - 1]) for j in path[1:-1]] + [int(vmax) + 1])


def optimize_boundaries(
    lengths: Any,
    num_buckets: int = 6,
    *,
    token_budget: int | None = None,
    max_batch_size: int | None = None,
    method: str = "dp",
    objective: "str | Objective" = "greedy",
    num_candidates: int = 290,
    spec: BatchSpec | None = None,
) -> Boundaries:
    """Bucket edges for ``lengths`` (see module doc). ``ValueError`` on bad input (naming the setting).
    The objective reads the budget and max batch size from ``spec`` or the keywords.

    Cost: one counting pass over the lengths (O(n), no sort and no int64 copy: every step after it
    works on the histogram), then O(C * max_batch_size * distinct) for the cost matrix and O(K C^2)
    for ``dp`` (benchmarks/bench_scale.py: below numpy's argsort of the same lengths at 20 M)."""
    t0 = time.perf_counter()
    spec = spec_or_keywords(spec, token_budget=token_budget, max_batch_size=max_batch_size)
    token_budget, max_batch_size = spec.token_budget, spec.max_batch_size
    v, c = _validate(lengths, num_buckets, token_budget, max_batch_size, method, objective, num_candidates)
    top = int(v[-1])
    cand = candidates_of_counts(v, c, num_candidates)
    useful = float(np.dot(v, c))
    history: list[dict] = []
    if num_buckets == 1:
        edges: tuple[int, ...] = (0, top + 1)
    elif num_buckets - 1 > cand.size:
        raise ValueError(
            f"boundaries.num_buckets={num_buckets} but only {cand.size} candidate edges exist; "
            "raise boundaries.num_candidates or lower num_buckets"
        )
    elif method == "geometric":
        P = np.concatenate([[0], np.searchsorted(v, cand), [len(v)]])
        edges = _edges_from_path(geometric_path(v, cand, P, num_buckets), cand, top)
    else:
        cost, P, _ = cost_matrix(None, cand, token_budget, max_batch_size, objective, counts=(v, c))
        if method == "dp":
            _, path = dp_partition(cost, num_buckets)
        else:
            path, hist = coordinate_path(cost, geometric_path(v, cand, P, num_buckets))
            history = [
                {
                    "iteration": h["iteration"],
                    "edges": list(_edges_from_path(h["path"], cand, top)),
                    "predicted_efficiency": useful / h["cost"],
                }
                for h in hist
            ]
        edges = _edges_from_path(path, cand, top)
    pred = predict_bucketed_counts(
        v, c, edges, token_budget=token_budget, max_batch_size=max_batch_size, objective=objective
    )["efficiency"]
    return Boundaries(
        method=method,
        num_buckets=num_buckets,
        edges=edges,
        predicted_efficiency=float(pred),
        objective=objective_of(objective).name,
        token_budget=token_budget,
        max_batch_size=max_batch_size,
        num_candidates=int(cand.size),
        seconds=time.perf_counter() - t0,
        history=tuple(history),
    )


def _solve_all(
    v: np.ndarray,
    c: np.ndarray,
    ks: list[int],
    *,
    token_budget: int,
    max_batch_size: int,
    method: str,
    objective: "str | Objective",
    num_candidates: int,
) -> dict[int, tuple[tuple[int, ...], list[dict]]]:
    """Edges (and coordinate history) for every K in ``ks`` from one cost matrix, on the histogram
    (sorted distinct lengths ``v``, counts ``c``)."""
    cand = candidates_of_counts(v, c, num_candidates)
    top = int(v[-1])
    out: dict[int, tuple[tuple[int, ...], list[dict]]] = {}
    need = [k for k in ks if k > 1]
    if 1 in ks:
        out[1] = ((0, top + 1), [])
    if not need:
        return out
    P = np.concatenate([[0], np.searchsorted(v, cand), [len(v)]])
    if method == "geometric":
        for k in need:
            out[k] = (_edges_from_path(geometric_path(v, cand, P, k), cand, top), [])
        return out
    cost, P, _ = cost_matrix(None, cand, token_budget, max_batch_size, objective, counts=(v, c))
    useful = float(np.dot(v, c))
    if method == "dp":
        _, arg = _dp_tables(cost, max(need))
        for k in need:
            out[k] = (_edges_from_path(_backtrack(arg, k, len(P) - 1), cand, top), [])
    else:
        for k in need:
            path, hist = coordinate_path(cost, geometric_path(v, cand, P, k))
            history = [
                {
                    "iteration": h["iteration"],
                    "edges": list(_edges_from_path(h["path"], cand, top)),
                    "predicted_efficiency": useful / h["cost"],
                }
                for h in hist
            ]
            out[k] = (_edges_from_path(path, cand, top), history)
    return out


def simulate_bucketed(
    x: np.ndarray,
    edges: Any,
    *,
    token_budget: int | None = None,
    max_batch_size: int | None = None,
    seed: int = 0,
    spec: BatchSpec | None = None,
    reference: Sequence[np.ndarray] | None = None,
) -> dict[str, float]:
    """Simulated epoch 0 of the bucketed plan: padding efficiency; diversity from epochs 0 and 1.
    ``spec`` or the keywords give the batching limits, ``edges`` the buckets. Length mixing is
    against ``reference``, the ``random`` plan of epoch 0 under the same spec (made here when None;
    :func:`sweep_num_buckets` makes it once for every K)."""
    from lenbatch.batching.padding import composition_repeat, length_mixing, padding_efficiency
    from lenbatch.batching.strategies import plan_epoch_all

    spec = spec_or_keywords(spec, token_budget=token_budget, max_batch_size=max_batch_size, seed=seed)
    plans = [plan_epoch_all(x, strategy=Strategy("bucketed", edges), epoch=e, spec=spec)[0] for e in (0, 1)]
    if reference is None:
        reference = plan_epoch_all(x, strategy="random", epoch=0, spec=spec)[0]
    return {
        "simulated_efficiency": padding_efficiency(x, plans[0]),
        "composition_repeat": composition_repeat(plans[0], plans[1], x.size),
        "length_mixing": length_mixing(x, plans[0], reference=reference),
    }


def sweep_num_buckets(
    lengths: Any,
    max_buckets: int = 16,
    *,
    token_budget: int | None = None,
    max_batch_size: int | None = None,
    method: str = "dp",
    objective: "str | Objective" = "greedy",
    num_candidates: int = 290,
    seed: int = 0,
    simulate: bool = True,
    spec: BatchSpec | None = None,
) -> list[dict[str, Any]]:
    """The efficiency-diversity frontier: for K = 1..max_buckets (capped at the distinct lengths), the
    edges, predicted efficiency and, with ``simulate``, the simulated efficiency, composition repeat and
    length mixing of the bucketed plan (epochs 0 and 1). dp solves every K from one cost matrix."""
    log = logging.getLogger("lenbatch.boundaries")
    spec = spec_or_keywords(spec, token_budget=token_budget, max_batch_size=max_batch_size, seed=seed)
    seed, token_budget, max_batch_size = spec.seed, spec.token_budget, spec.max_batch_size
    v, c = _validate(lengths, 1, token_budget, max_batch_size, method, objective, num_candidates)
    x = check_lengths(lengths)
    if max_buckets < 1:
        raise ValueError(f"boundaries.sweep_max_buckets must be >= 1, got {max_buckets}")
    kmax = min(max_buckets, int(v.size), candidates_of_counts(v, c, num_candidates).size + 1)
    t0 = time.perf_counter()
    solved = _solve_all(
        v,
        c,
        list(range(1, kmax + 1)),
        token_budget=token_budget,
        max_batch_size=max_batch_size,
        method=method,
        objective=objective,
        num_candidates=num_candidates,
    )
    log.info("sweep: edges for K = 1..%d by %s in %.2f s", kmax, method, time.perf_counter() - t0)
    rows = []
    from lenbatch.batching.strategies import plan_epoch_all

    reference = plan_epoch_all(x, strategy="random", epoch=0, spec=spec)[0] if simulate else None
    for k in range(1, kmax + 1):
        edges = solved[k][0]
        pred = predict_bucketed_counts(
            v, c, edges, token_budget=token_budget, max_batch_size=max_batch_size, objective=objective
        )["efficiency"]
        row: dict[str, Any] = {"num_buckets": k, "edges": list(edges), "predicted_efficiency": pred}
        if simulate:
            row.update(
                simulate_bucketed(
                    x, edges, token_budget=token_budget, max_batch_size=max_batch_size, seed=seed, reference=reference
                )
            )
            log.info(
                "sweep K=%d: predicted %.4f, simulated %.4f, composition repeat %.5f, length mixing %.4f",
                k,
                pred,
                row["simulated_efficiency"],
                row["composition_repeat"],
                row["length_mixing"],
            )
        rows.append(row)
    return rows
