"""Step-time model: fit step seconds on a profiling grid, predict a plan's throughput.

The study predicted throughput as ``padding efficiency x sorted throughput`` and
missed (86.8% predicted, 78% measured) because a step costs more than its
computed tokens: a fixed per-step cost (launches, optimizer, communication)
and the quadratic cost of attention. Here each role (target forward, drafter
step) gets a linear model in a few shape features,

    t = a * 1 + b * computed_tokens + c * sum_len_sq + d * sequences

fitted by non-negative least squares on *relative* error (a 5 ms step and a
2 s step matter alike), on a profiled grid of shapes, never on the run it
predicts. Candidate feature sets are scored on held-out grid points; the best
one is refitted on all points.

A pipelined run (target rank -> bounded queue -> drafter rank) is then
simulated step by step (:func:`~lenbatch_study.analysis.step_timeline.pipeline_ends`), so a step costs about
``max(target, drafter)`` in steady state, not the sum.

Across ``nodes`` nodes (``train.nodes``) each node runs that pipeline on its own target ranks' steps, and
the drafters meet once per cluster step (every node's c-th step) to all-reduce their gradients: cluster
step ``c`` ends at ``max over nodes (take + drafter step) + allreduce_s`` for every node, and the next
one starts no earlier (:func:`~lenbatch_study.analysis.step_timeline.pipeline_timeline`). ``allreduce_s`` is a
measured term: the mean ``allreduce_s`` of the run's steps (the all-reduce alone, the wait for the slowest
node excluded: that wait is what the max models).

Everything here is a pure function on numpy arrays; cost is O(steps) for
prediction and O(2^p * n * p^2) for a fit with p <= 6 features.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from lenbatch_study.pipeline.artifacts.profile_grid import GRID_PATH

# the pipelined run's timeline (its own module), re-exported: the prediction reads it as sm.<name>
from lenbatch_study.analysis.step_timeline import (
    blended_pipeline as blended_pipeline,
    busy_share as busy_share,
    pipeline_ends as pipeline_ends,
    pipeline_timeline as pipeline_timeline,
    throughput as throughput,
)

# Shape features a step's time may depend on (columns of a shape table).
# Model selection (select_model): held-out error over this many random splits; a larger feature set
# must lower the best held-out error by this share of it, and by at least this much (absolute).
HOLDOUT_SPLITS = 50
MIN_GAIN_RELATIVE = 0.1
MIN_GAIN_ABSOLUTE = 0.002
FEATURES = (
    "const",
    "computed_tokens",
    "sum_len_sq",
    "sequences",
    "useful_tokens",
    "ctx_tokens",
    "positions",
    "lm_chunks",
)

# Candidate feature sets compared on held-out grid points (smallest first; among sets of one size, the one
# the cost formula names first), per role.
# target: the forward runs over computed tokens (Gated DeltaNet: linear; full attention:
#   sum of length^2, n*m^2 when padded; packed rows pad each sequence to a 64-token chunk:
#   a per-sequence cost).
# drafter (lenbatch_study.models.drafter, "Cost"): projects the context once per token of the
#   batch's layout (computed_tokens), pushes up to anchors_per_seq x (block_size - 1) ``positions``
#   per sequence through the vocabulary-sized lm_head (fewer where the loss mask ends) in chunks of
#   128 rows that each read the whole lm_head (``lm_chunks``: a step of 129 positions pays a chunk
#   more than one of 128, which a cost linear in positions spreads over every step), and attends
#   from each block to its sequence's context up to the batch's largest anchor (sequences x that
#   anchor = ``ctx_tokens``); :func:`drafter_work` gives positions and ctx_tokens exactly.
#   Every set keeps computed_tokens: a packed row's ctx_tokens exceed its length (1.7x in the CPU
#   default's interleaved packed step), so a set that prices the projection through ctx_tokens
#   over-charges packed steps (4-8% there, docs/prediction.md). ``sequences`` stands in for
#   positions where a grid lacks them.
CANDIDATES: dict[str, dict[str, tuple[str, ...]]] = {
    "target": {
        "tokens": ("const", "computed_tokens"),
        "tokens+seq": ("const", "computed_tokens", "sequences"),
        "tokens+attn": ("const", "computed_tokens", "sum_len_sq"),
        "tokens+attn+seq": ("const", "computed_tokens", "sum_len_sq", "sequences"),
    },
    "drafter": {
        "tokens": ("const", "computed_tokens"),
        "tokens+pos": ("const", "computed_tokens", "positions"),
        "tokens+seq": ("const", "computed_tokens", "sequences"),
        "tokens+pos+chunks": ("const", "computed_tokens", "positions", "lm_chunks"),
        "tokens+pos+ctx": ("const", "computed_tokens", "positions", "ctx_tokens"),
        "tokens+pos+chunks+ctx": ("const", "computed_tokens", "positions", "lm_chunks", "ctx_tokens"),
    },
}


# --------------------------------------------------------------------------- shapes


# --------------------------------------------------------------------------- drift between passes


def pass_corrected_seconds(runs: Sequence[Sequence[float]], *, iterations: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """Each grid point's step seconds with the machine's drift between profile passes taken out.

    ``runs[i]``: point i's seconds in the timed passes, in order; a point that had taken
    ``profile.max_point_seconds`` is not repeated, so it holds the first ``k_i`` passes only. The
    profile goes over every point once per pass, and this VM's speed moved by 5-10% from one ~40 s
    pass to the next (CPU seconds included): a plain median per point then favours the long,
    capped points, whose few timings all fell in the early passes. Model, in logs (Tukey's median
    polish over the points x passes table, missing cells skipped):

        log t[i, p] = a_i + b_p + e[i, p];   b_p = median_i (log t[i, p] - a_i),   a_i = median_p (log t[i, p] - b_p)

    alternated until nothing moves (``iterations`` at most), with the pass effects centred on
    their median (median_p b_p = 0: the seconds of a typical pass). Returns (exp a_i: per point,
    exp b_p: per pass, the factor that pass ran at). Pure, O(iterations x points x passes).
    """
    if not runs or any(len(r) == 0 for r in runs):
        raise ValueError("every profile grid point needs at least one timed step; rerun: snakemake " + GRID_PATH)
    width = max(len(r) for r in runs)
    logs = np.full((len(runs), width), np.nan)
    for i, r in enumerate(runs):
        logs[i, : len(r)] = np.log(check_step_times(np.asarray(r, dtype=np.float64)))
    a, b = np.nanmedian(logs, axis=1), np.zeros(width)
    for _ in range(iterations):
        b_new = np.nanmedian(logs - a[:, None], axis=0)
        b_new -= np.median(b_new)
        a_new = np.nanmedian(logs - b_new[None, :], axis=1)
        moved = max(float(np.max(np.abs(a_new - a))), float(np.max(np.abs(b_new - b))))
        a, b = a_new, b_new
        if moved < 1e-12:
            break
    return np.exp(a), np.exp(b)


# --------------------------------------------------------------------------- fit


def design_matrix(columns: Mapping[str, np.ndarray], features: Sequence[str]) -> np.ndarray:
    """Stack the named feature columns (``const`` is ones) into an (n, p) matrix."""
    unknown = [f for f in features if f != "const" and f not in columns]
    if unknown:
        raise ValueError(f"shape table lacks feature columns {unknown}; have {sorted(columns)}")
    n = len(next(iter(columns.values())))
    return np.column_stack([np.ones(n) if f == "const" else np.asarray(columns[f], dtype=np.float64) for f in features])


def nnls(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares min ||X b - y|| s.t. b >= 0, exactly, by enumerating supports.

    With p <= 6 features there are at most 64 supports; each is an ordinary least-squares
    solve, and the NNLS optimum is the best support whose solution is non-negative
    (the KKT point is an unconstrained optimum on its support). Columns are scaled to
    unit norm first so that tokens (~1e4) and tokens^2 (~1e9) are solved stably.
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n, p = X.shape
    assert p <= 8, "support enumeration is for a handful of features"
    scale = np.linalg.norm(X, axis=0)
    scale[scale == 0] = 1.0
    Xs = X / scale
    best, best_res = np.zeros(p), float(np.sum(y * y))
    for k in range(1, p + 1):
        for support in itertools.combinations(range(p), k):
            cols = list(support)
            sol, *_ = np.linalg.lstsq(Xs[:, cols], y, rcond=None)
            if np.any(sol < 0):
                continue
            res = float(np.sum((Xs[:, cols] @ sol - y) ** 2))
            if res < best_res - 1e-15 * max(best_res, 1.0):
                best_res = res
                best = np.zeros(p)
                best[cols] = sol
    return best / scale


def check_step_times(seconds: np.ndarray) -> np.ndarray:
    """``seconds`` as float64 when every entry is a finite number > 0; ``ValueError`` naming the bad entries
    otherwise (numpy's least squares fails on NaN with "SVD did not converge", and a weight 1/0 is inf). O(n)."""
    seconds = np.asarray(seconds, dtype=np.float64)
    bad = np.flatnonzero(~(np.isfinite(seconds) & (seconds > 0)))
    if bad.size:
        shown = ", ".join(f"point {i}: {seconds[i]}" for i in bad[:4])
        raise ValueError(
            f"step times must be finite and > 0 seconds; the profile grid holds {bad.size} that are not "
            f"({shown}); rerun: snakemake {GRID_PATH}"
        )
    return seconds


def fit_coefficients(X: np.ndarray, seconds: np.ndarray, *, relative: bool = True) -> np.ndarray:
    """NNLS fit of ``seconds ~ X b``; ``relative`` weights each row by 1 / seconds (minimises relative error)."""
    seconds = check_step_times(seconds)
    w = 1.0 / seconds if relative else np.ones_like(seconds)
    return nnls(X * w[:, None], seconds * w)


@dataclass(frozen=True)
class StepFit:
    """A fitted step-time model for one role: ``seconds = sum coef[f] * feature f``."""

    role: str
    name: str
    features: tuple[str, ...]
    coef: tuple[float, ...]
    train_error: float  # mean |relative error| on all grid points (fit on all)
    holdout_error: float  # mean |relative error| on held-out points, averaged over random splits
    holdout_max_error: float  # worst |relative error| seen on any held-out point

    def predict(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        return design_matrix(columns, self.features) @ np.asarray(self.coef)

    def to_dict(self) -> dict:
        return {
            "role": self.role,
            "name": self.name,
            "features": list(self.features),
            "coef": dict(zip(self.features, self.coef)),
            "train_error": self.train_error,
            "holdout_error": self.holdout_error,
            "holdout_max_error": self.holdout_max_error,
        }


def holdout_errors(
    columns: Mapping[str, np.ndarray],
    seconds: np.ndarray,
    features: Sequence[str],
    *,
    holdout_fraction: float,
    splits: int = HOLDOUT_SPLITS,
    seed: int = 0,
) -> np.ndarray:
    """|relative error| of every held-out prediction over ``splits`` random train/held-out splits."""
    seconds = np.asarray(seconds, dtype=np.float64)
    n, p = len(seconds), len(features)
    n_out = max(1, int(round(holdout_fraction * n)))
    if n - n_out < p + 1:
        raise ValueError(
            f"profile grid has {n} points; fitting {p} coefficients with {n_out} held out needs at "
            f"least {p + 1 + n_out}. Add profile.batch_sizes / profile.lengths and rerun: "
            f"snakemake {GRID_PATH}"
        )
    X = design_matrix(columns, features)
    rng = np.random.default_rng(seed)
    errs = []
    for _ in range(splits):
        perm = rng.permutation(n)
        out, keep = perm[:n_out], perm[n_out:]
        coef = fit_coefficients(X[keep], seconds[keep])
        errs.append(np.abs(X[out] @ coef / seconds[out] - 1.0))
    return np.concatenate(errs)


def select_model(
    columns: Mapping[str, np.ndarray],
    seconds: np.ndarray,
    *,
    role: str,
    candidates: Mapping[str, Sequence[str]] | None = None,
    holdout_fraction: float = 0.25,
    splits: int = HOLDOUT_SPLITS,
    seed: int = 0,
) -> tuple[StepFit, list[StepFit]]:
    """Score every candidate feature set on held-out points; return the best (refitted on all) and all.

    A later (larger) set wins only if it lowers the best held-out error so far by a tenth of
    it, and by at least 0.2 percentage points (a tie goes to the simpler model: it
    extrapolates more safely to plan shapes).
    """
    candidates = dict(candidates or CANDIDATES[role])
    seconds = np.asarray(seconds, dtype=np.float64)
    if holdout_fraction <= 0:
        holdout_fraction = 1.0 / max(len(seconds), 1)
    fits = []
    for name, feats in candidates.items():
        feats = tuple(feats)
        if not np.all(np.isfinite(design_matrix(columns, feats))):
            continue  # a feature this grid did not record (e.g. positions of an older grid)
        errs = holdout_errors(columns, seconds, feats, holdout_fraction=holdout_fraction, splits=splits, seed=seed)
        X = design_matrix(columns, feats)
        coef = fit_coefficients(X, seconds)
        train = float(np.mean(np.abs(X @ coef / seconds - 1.0)))
        fits.append(
            StepFit(
                role=role,
                name=name,
                features=feats,
                coef=tuple(float(c) for c in coef),
                train_error=train,
                holdout_error=float(np.mean(errs)),
                holdout_max_error=float(np.max(errs)),
            )
        )
    best = fits[0]
    for fit in fits[1:]:
        if fit.holdout_error < best.holdout_error - max(MIN_GAIN_ABSOLUTE, MIN_GAIN_RELATIVE * best.holdout_error):
            best = fit
    return best, fits


# --------------------------------------------------------------------------- transport


@dataclass(frozen=True)
class TransportFit:
    """Seconds of one hop of a step's batch and features between a target rank and the drafter rank, linear
    in its bytes: ``seconds = const_s + per_byte_s x bytes`` (``role``: ``receive``, the drafter rank taking
    the batch: wire plus the copy onto its device; ``stage``, the target rank's copy onto the data group's
    device before it sends). ``error``: mean |relative error| on the profile's points (fit on all)."""

    role: str
    const_s: float
    per_byte_s: float
    error: float
    points: int

    def predict(self, nbytes: np.ndarray) -> np.ndarray:
        return self.const_s + self.per_byte_s * np.asarray(nbytes, dtype=np.float64)

    def to_dict(self) -> dict:
        return {
            "role": self.role,
            "const_s": self.const_s,
            "per_byte_s": self.per_byte_s,
            "error": self.error,
            "points": self.points,
        }


def fit_transport(
    nbytes: Sequence[float], seconds: Sequence[Sequence[float]] | Sequence[float], *, role: str = "receive"
) -> TransportFit:
    """The transport model of the profile's measured points: ``nbytes[i]`` moved in ``seconds[i]`` (one
    time, or every timed repeat: their median is taken). Non-negative least squares on relative error of
    ``const + per_byte x bytes``, as the step models (:func:`fit_coefficients`); a single point (or a
    single size) gives the rate through the origin. Times must be finite and > 0; ``ValueError`` otherwise.
    Pure; O(points)."""
    b = np.asarray(nbytes, dtype=np.float64)
    secs = np.array([float(np.median(np.asarray(x, dtype=np.float64))) if np.ndim(x) else float(x) for x in seconds])
    if b.size == 0 or b.size != secs.size:
        raise ValueError(f"transport fit needs one time per size, got {b.size} sizes and {secs.size} times")
    if not np.all(np.isfinite(b) & (b >= 0)):
        raise ValueError("transport bytes must be finite and >= 0")
    secs = check_step_times(secs)
    X = np.column_stack([np.ones_like(b), b]) if np.unique(b).size > 1 else b[:, None]
    coef = fit_coefficients(X, secs)
    const, per = (float(coef[0]), float(coef[1])) if X.shape[1] == 2 else (0.0, float(coef[0]))
    err = float(np.mean(np.abs((const + per * b) / secs - 1.0)))
    return TransportFit(role=role, const_s=const, per_byte_s=per, error=err, points=int(b.size))


def cpu_fits(
    rows: Sequence[Mapping[str, object]],
    cols: Mapping[str, np.ndarray],
    *,
    holdout_fraction: float,
    seed: int,
    rerun: str,
) -> dict[str, dict[str, object]]:
    """Target and drafter step models fitted on the profile grid's process CPU seconds (per point, from
    ``<role>_cpu_seconds_all`` with the drift between passes taken out, :func:`pass_corrected_seconds`;
    ``cols``: the grid's shape table) as compare fits its wall seconds
    (:func:`select_model`): what predicts a measurement on the CPU clock. Each role's entry: ``best``,
    ``candidates`` and ``pass_factors`` (the speed each timed pass ran at, against the median pass).
    ``ValueError`` naming ``rerun`` for a grid without CPU seconds. Cost: the fits' held-out splits."""
    if not all(r.get("target_cpu_seconds_all") and r.get("drafter_cpu_seconds_all") for r in rows):
        raise ValueError(
            "the profile grid records no CPU seconds (an older grid.json), so a measurement on the CPU "
            f"clock cannot be predicted; rerun: {rerun}"
        )
    return {
        role: fit_role(
            cols,
            [r[f"{role}_cpu_seconds_all"] for r in rows],
            role=role,  # type: ignore[misc]
            holdout_fraction=holdout_fraction,
            seed=seed,
        )
        for role in ("target", "drafter")
    }


def fit_role(
    cols: Mapping[str, np.ndarray], runs: Sequence[Sequence[float]], *, role: str, holdout_fraction: float, seed: int
) -> dict[str, object]:
    """One role's step model from the grid: each point's seconds over its timed passes (``runs``) with the drift
    between passes taken out (:func:`pass_corrected_seconds`), the candidates of the role (``target_busy`` takes
    the target's) scored by :func:`select_model`. ``{"best", "candidates", "pass_factors"}``, the last the
    seconds each timed pass took against the median pass. Cost: the held-out splits."""
    secs, factors = pass_corrected_seconds(runs)
    best, cands = select_model(
        cols,
        secs,
        role=role,
        candidates=CANDIDATES[role.removesuffix("_busy")],
        holdout_fraction=holdout_fraction,
        seed=seed,
    )
    return {"best": best, "candidates": cands, "pass_factors": [float(f) for f in factors]}


def components(pred: dict, fits: dict, *, warmup_steps: int) -> dict[str, float]:
    """Seconds each (role, feature) term of the step-time model adds over the counted steps."""
    out = {}
    for role in ("target", "drafter"):
        fit = fits[role]["best"]
        X = design_matrix(pred["columns"], fit.features)[warmup_steps:]
        for f, c, total in zip(fit.features, fit.coef, X.sum(axis=0)):
            out[f"{role}.{f}"] = float(c * total)
    return out


def ratio_ladder(
    comp: dict[str, dict[str, float]], useful: dict[str, float], tok_s: dict[str, float], measured: dict[str, float]
) -> dict[str, dict[str, float]]:
    """Throughput relative to sorted as the step-time model's terms are added one at a time.

    padding: only the per-token terms (the study's model: time proportional to computed tokens);
    +step: plus the fixed cost per step; +attention: plus the sum of length^2 terms;
    +sequences: plus the per-sequence terms (all terms, target and drafter run one after the other);
    pipelined: the full prediction (target and drafter overlap through the queue); measured.
    """
    levels = {
        "padding": ("computed_tokens", "useful_tokens"),
        "+step": ("computed_tokens", "useful_tokens", "const"),
        "+attention": ("computed_tokens", "useful_tokens", "const", "sum_len_sq"),
        "+sequences": ("computed_tokens", "useful_tokens", "const", "sum_len_sq", "sequences"),
    }
    out: dict[str, dict[str, float]] = {}
    for s in comp:
        out[s] = {}
        for level, feats in levels.items():
            t = sum(v for k, v in comp[s].items() if k.split(".", 1)[1] in feats)
            t0 = sum(v for k, v in comp["sorted"].items() if k.split(".", 1)[1] in feats)
            out[s][level] = (useful[s] / t) / (useful["sorted"] / t0) if t > 0 and t0 > 0 else float("nan")
        out[s]["pipelined"] = tok_s[s] / tok_s["sorted"]
        out[s]["measured"] = measured[s] / measured["sorted"]
    return out
