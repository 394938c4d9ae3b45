"""The compare stage's plots and their DVC plot data: the length histogram with the bucket edges, predicted
vs measured throughput, and the efficiency-diversity frontier (every strategy and bucketed for each K, with
its Pareto fronts), drawn from a :class:`lenbatch_study.analysis.report.CompareResult`.

Separate from :mod:`lenbatch_study.analysis.report` (which writes every output and re-exports these names):
the figures and the points they draw are geometry (matplotlib, imported only when drawing), apart from the
report's words. Cost: O(strategies + K sweep) points, O(n^2) for a Pareto front, three matplotlib figures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from lenbatch_study.pipeline.artifacts import compare_report as files

CompareResult = Any  # lenbatch_study.analysis.report.CompareResult (which imports this module)


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Mask of points not dominated when both x and y are to be maximised. O(n^2), n is small."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.ones(x.size, dtype=bool)
    for i in range(x.size):
        dominated = (x >= x[i]) & (y >= y[i]) & ((x > x[i]) | (y > y[i]))
        keep[i] = not dominated.any()
    return keep


def frontier_points(result: CompareResult) -> list[dict]:
    """Every strategy and bucketed K = 1..max: efficiency, diversity, Pareto membership (DVC plot data)."""
    pts = [
        {
            "name": s,
            "kind": "strategy",
            "num_buckets": result.num_buckets if s == "bucketed" else None,
            "efficiency": r.simulated_efficiency,
            "length_mixing": r.length_mixing,
            "composition_repeat": r.composition_repeat,
            "predicted_ratio_to_sorted": r.ratio_to_sorted_predicted,
        }
        for s, r in result.rows.items()
    ]
    pts += [
        {
            "name": f"bucketed K={e['num_buckets']}",
            "kind": "sweep",
            "num_buckets": e["num_buckets"],
            "efficiency": e["simulated_efficiency"],
            "length_mixing": e["length_mixing"],
            "composition_repeat": e["composition_repeat"],
            "predicted_ratio_to_sorted": e["predicted_ratio_to_sorted"],
        }
        for e in result.sweep
    ]
    x = np.array([p["length_mixing"] for p in pts])
    y = np.array([p["efficiency"] for p in pts])
    front = pareto_front(x, y)
    front_repeat = pareto_front(1 - np.array([p["composition_repeat"] for p in pts]), y)
    padded = np.array([p["name"] != "packed" for p in pts])
    front_padded = np.zeros(len(pts), dtype=bool)
    front_padded[padded] = pareto_front(x[padded], y[padded])
    for p, f, g, h, isp in zip(pts, front, front_repeat, front_padded, padded):
        p["pareto_mixing"] = bool(f)
        p["pareto_repeat"] = bool(g)
        p["pareto_padded"] = bool(h) if isp else None
    return pts


def histogram_points(result: CompareResult) -> list[dict]:
    """DVC plot data of the length histogram with the bucket edges (``workflow/plots/histogram.json`` draws
    it): one row per bin (``lo``, ``hi``, ``count``, ``bucket``: 1-based index of the bucket holding the
    bin's midpoint), then one row per inner bucket edge (``edge``, and ``lo`` = ``hi`` = the edge). Every
    row has every key (null where it does not apply): DVC renders a plot blank when rows differ in keys.
    Cost: O(bins * log K)."""
    edges = np.asarray(result.edges, dtype=float)
    rows: list[dict] = []
    for r in result.histogram:
        mid = (float(r["lo"]) + float(r["hi"])) / 2
        bucket = int(np.clip(np.searchsorted(edges, mid, side="right"), 1, max(len(edges) - 1, 1)))
        rows.append({"lo": r["lo"], "hi": r["hi"], "count": r["count"], "bucket": bucket, "edge": None})
    rows += [{"lo": int(e), "hi": int(e), "count": None, "bucket": None, "edge": int(e)} for e in result.edges[1:-1]]
    return rows


def write_plots(result: CompareResult, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    # 1. length histogram with the bucket edges
    fig, ax = plt.subplots(figsize=(7, 4))
    h = result.histogram
    lo = np.array([r["lo"] for r in h], dtype=float)
    hi = np.array([r["hi"] for r in h], dtype=float)
    ax.bar(lo, [r["count"] for r in h], width=hi - lo, align="edge", color="#8aa", edgecolor="#577")
    for e in result.edges[1:-1]:
        ax.axvline(e, color="#c33", lw=1.2)
    ax.set_xlabel("length (tokens)")
    ax.set_ylabel("samples")
    ax.set_title(f"length histogram and the {result.num_buckets} bucket edges (red)")
    paths.append(_save(fig, out / files.HISTOGRAM_PLOT))
    # 2. predicted vs measured throughput
    fig, ax = plt.subplots(figsize=(5.5, 5))
    rows = result.rows
    meas = np.array([r.measured_tok_s for r in rows.values()])
    pred = np.array([r.predicted_tok_s for r in rows.values()])
    pad = np.array([r.ratio_to_sorted_padding * rows["sorted"].measured_tok_s for r in rows.values()])
    lim = [0, 1.1 * max(meas.max(), pred.max(), pad.max())]
    ax.plot(lim, lim, color="#999", lw=1, label="prediction = measurement")
    ax.scatter(meas, pred, color="#236", zorder=3, label="step-time model")
    ax.scatter(meas, pad, color="#c63", marker="x", zorder=3, label="padding model x sorted")
    for s, m, p in zip(rows, meas, pred):
        ax.annotate(s, (m, p), textcoords="offset points", xytext=(5, -10), fontsize=8)
    ax.set_xlim(lim)
    ax.set_ylim(lim)
    ax.set_xlabel("measured useful tokens/s")
    ax.set_ylabel("predicted useful tokens/s")
    ax.legend(fontsize=8, loc="upper left")
    paths.append(_save(fig, out / files.THROUGHPUT_PLOT))
    # 3. efficiency-diversity frontier
    pts = frontier_points(result)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, key, flip, label, front_key in (
        (axes[0], "length_mixing", False, "length mixing (0 sorted .. 1 random)", "pareto_mixing"),
        (axes[1], "composition_repeat", True, "1 - composition repeat (0 sorted .. 1 fresh batches)", "pareto_repeat"),
    ):
        sw = [p for p in pts if p["kind"] == "sweep"]
        xs = [(1 - p[key]) if flip else p[key] for p in sw]
        ax.plot(xs, [p["efficiency"] for p in sw], "-o", color="#9ab", ms=4, label="bucketed, K = 1..max")
        for p, xv in zip(sw, xs):
            ax.annotate(
                str(p["num_buckets"]), (xv, p["efficiency"]), fontsize=7, xytext=(3, 3), textcoords="offset points"
            )
        for p in pts:
            if p["kind"] == "strategy":
                xv = (1 - p[key]) if flip else p[key]
                ax.scatter([xv], [p["efficiency"]], s=50, zorder=3)
                ax.annotate(p["name"], (xv, p["efficiency"]), fontsize=8, xytext=(5, -10), textcoords="offset points")
        if not flip:
            fp = sorted((p[key], p["efficiency"]) for p in pts if p.get("pareto_padded"))
            ax.plot(
                [f[0] for f in fp],
                [f[1] for f in fp],
                ":",
                color="#36c",
                lw=1.5,
                label="Pareto front, padded strategies only",
            )
        front = sorted(((1 - p[key]) if flip else p[key], p["efficiency"]) for p in pts if p[front_key])
        ax.plot([f[0] for f in front], [f[1] for f in front], "--", color="#c33", lw=1.5, label="Pareto front")
        ax.scatter([f[0] for f in front], [f[1] for f in front], facecolors="none", edgecolors="#c33", s=110, zorder=4)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("padding efficiency (simulated plan)")
    axes[0].legend(fontsize=8, loc="lower left")
    fig.suptitle("efficiency vs diversity: every strategy, and bucketed for each K")
    paths.append(_save(fig, out / files.FRONTIER_PLOT))
    return paths


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
