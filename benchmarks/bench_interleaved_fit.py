"""Score profile grids against an interleaved measurement: how close each step-model fit predicts the measured
ratios to sorted (the interleave stage's, ``results/interleave/interleave.json``).

Per profile folder and per way of reducing each grid point's timed passes to one number -- ``median`` (the
plain median per point) and ``pass-corrected`` (what compare does: the drift between passes taken out,
:func:`lenbatch_study.analysis.stepmodel.pass_corrected_seconds`) -- it fits the CPU-clock step models as
compare does (:func:`lenbatch_study.analysis.stepmodel.select_model`) and prints each strategy's measured
ratio, its 95% interval, the predicted ratio and the error (predicted / measured - 1), beside the fits'
held-out errors and the pass factors. Use it to compare profiles of other code or settings on one and the
same measurement (a profile run apart from the measurement moves the predictions by its own noise).

    python benchmarks/bench_interleaved_fit.py --profile results/profile [other profile folders] \\
        --interleave results/interleave --data results/tokenize [--candidates]

``--candidates`` adds, per profile, every drafter model the fit scored (with the chosen target model), then
every target model (with the chosen drafter model): its held-out error on the grid and its predicted /
measured - 1 per strategy.

``--data`` needs the tokenized dataset (the drafter's exact work comes from its loss masks). Cost: seconds
(the fits' held-out splits); it times nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from lenbatch_study.analysis import interleaved as il  # noqa: E402
from lenbatch_study.analysis import stepmodel as sm  # noqa: E402
from lenbatch_study.core.config import load_params  # noqa: E402
from lenbatch_study.pipeline.artifacts import interleave_timings, profile_grid, tokenized  # noqa: E402
from lenbatch_study.pipeline.artifacts.bucket_edges import edges_for  # noqa: E402
from lenbatch_study.stages import compare  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", nargs="+", required=True, help="profile output folders (grid.json)")
    ap.add_argument("--interleave", required=True, help="interleave output folder (interleave.json)")
    ap.add_argument("--data", default="results/tokenize", help="tokenize output (dataset/, lengths.npy)")
    ap.add_argument("--boundaries", default="results/boundaries/boundaries.json")
    ap.add_argument("--params", nargs="+", default=["params.yaml"])
    ap.add_argument(
        "--candidates",
        action="store_true",
        help="also every candidate model of the pass-corrected fit, each role beside the other's chosen one",
    )
    a = ap.parse_args()
    params = load_params(*a.params)
    lengths = tokenized.read_lengths(a.data)
    masks = compare.LossMasks(Path(a.data), lengths)
    if not masks.available:
        raise SystemExit(f"{a.data} has no dataset: the drafter's work would be estimated; give the tokenize output")
    doc = interleave_timings.read_timings(a.interleave, per_role=False)  # it scores totals: history reads too
    st = doc["strategies"]
    edges = edges_for(a.boundaries, list(st))
    target_ranks = max(params.train.nproc - 1, 1) * params.train.nodes
    cols = {}
    for s, rec in st.items():
        plan = compare.planned_batches(
            lengths,
            params,
            s,
            edges if s == "bucketed" else None,
            useful_tokens=params.train.useful_tokens,
            target_ranks=target_ranks,
        )
        picked = [(int(e), int(i)) for e, i in zip(rec["epochs"], rec["steps"])]
        cols[s] = compare.step_columns(
            lengths,
            [(e, plan[i][1]) for e, i in picked],
            layout=compare.layout_of(s),
            params=params,
            masks=masks,
            numbers=[i for _, i in picked],
        )
    print(f"interleaved measurement: {a.interleave} ({doc['rounds']} rounds, clock {doc.get('clock')})")
    for folder in a.profile:
        rows = profile_grid.read_grid(folder)
        grid = compare.grid_columns(rows)
        for mode in ("median", "pass-corrected"):
            fits, notes, cands = {}, [], {}
            for role in ("target", "drafter"):
                runs = [r[f"{role}_cpu_seconds_all"] for r in rows]
                if mode == "median":
                    secs = np.array([float(np.median(x)) for x in runs])
                    fits[role], _ = sm.select_model(
                        grid,
                        secs,
                        role=role,
                        candidates=sm.CANDIDATES[role],
                        holdout_fraction=params.compare.holdout_fraction,
                        seed=params.batching.seed,
                    )
                else:  # as compare fits
                    fit = sm.fit_role(
                        grid,
                        runs,
                        role=role,
                        holdout_fraction=params.compare.holdout_fraction,
                        seed=params.batching.seed,
                    )
                    fits[role], cands[role] = fit["best"], fit["candidates"]
                    notes.append(f"{role} pass factors {np.round(fit['pass_factors'], 3).tolist()}")
                notes.append(f"{role} {fits[role].name}, held-out error {fits[role].holdout_error:.1%}")
            pred = {s: fits["target"].predict(c) + fits["drafter"].predict(c) for s, c in cols.items()}
            table = il.judge(
                {s: st[s]["seconds"] for s in st},
                {s: st[s]["useful_tokens"] for s in st},
                pred,
                {s: st[s]["step_useful_tokens"] for s in st},
            )
            print(f"\nprofile {folder} ({len(rows)} points), {mode}: " + "; ".join(notes))
            print("| strategy | measured | 95% interval | predicted | predicted / measured |")
            print("|---|---|---|---|---|")
            for s, r in table.items():
                if s != il.BASELINE:
                    lo, hi = r["ci95"]
                    print(
                        f"| {s} | {r['ratio_to_sorted']:.3f} | [{lo:.3f}, {hi:.3f}] | {r['predicted_ratio']:.3f} | "
                        f"{100 * r['prediction_error']:+.1f}% |"
                    )
            if a.candidates and cands:
                names = [s for s in st if s != il.BASELINE]
                for role, other in (("drafter", "target"), ("target", "drafter")):
                    print(f"\nevery {role} candidate beside {other} {fits[other].name}: predicted / measured - 1")
                    print(f"| {role} model | held-out error | " + " | ".join(names) + " |")
                    print("|---|---|" + "---|" * len(names))
                    for c in cands[role]:
                        pred = {s: fits[other].predict(x) + c.predict(x) for s, x in cols.items()}
                        t = il.judge(
                            {s: st[s]["seconds"] for s in st},
                            {s: st[s]["useful_tokens"] for s in st},
                            pred,
                            {s: st[s]["step_useful_tokens"] for s in st},
                        )
                        chosen = " (chosen)" if c.name == fits[role].name else ""
                        print(
                            f"| {c.name}{chosen} | {c.holdout_error:.1%} | "
                            + " | ".join(f"{100 * t[s]['prediction_error']:+.1f}%" for s in names)
                            + " |"
                        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
