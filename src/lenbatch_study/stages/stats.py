"""The ``stats`` stage: length percentiles, histogram (and its plot), counts per bucket.

The numbers come from :mod:`lenbatch.batching.lengths` (the library); this module is the stage: it reads the lengths input, writes ``stats.json``, ``histogram.json`` and
``histogram.png``. Cost: O(N log N) for N lengths.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from lenbatch.batching.lengths import bucket_counts, histogram, length_stats
from lenbatch_study.corpus.seed_profile import SEED_COUNT
from lenbatch_study.pipeline.artifacts.tokenized import read_lengths_input
from lenbatch_study.pipeline.artifacts.length_stats import HISTOGRAM, PLOT, STATS
from lenbatch_study.pipeline.artifacts.writing import write_json, write_resolved

if TYPE_CHECKING:
    from lenbatch_study.core.config import Params


def run(
    *,
    params: Params,
    lengths: str | None,
    out: str | Path,
    seed_profile: bool = False,
    seed_profile_size: int = SEED_COUNT,
    edges: list[int] | None = None,
) -> int:
    """``lenbatch stats``: stats.json, histogram.json and histogram.png of the lengths at ``lengths`` (or
    the generated ``seed_profile``), counts per bucket of ``edges`` (tokens) when given."""
    from lenbatch_study.core.log import get_logger

    log = get_logger("lenbatch.stats")
    x, source = read_lengths_input(
        lengths=lengths, generate=seed_profile, seed_profile_size=seed_profile_size, seed=params.batching.seed
    )
    out = Path(out)
    st = length_stats(x)
    st["source"] = source
    if edges:
        st["buckets"] = bucket_counts(x, edges)
    hist = histogram(x, bins=params.stats.histogram_bins)
    write_json(out / STATS, st)
    write_json(out / HISTOGRAM, hist)
    _plot_histogram(hist, out / PLOT, st)
    write_resolved(params, out, sections=("stats",))
    log.info(
        "%s: %d samples, %d tokens, mean %.1f tokens, p50 %.0f, max %d tokens -> %s",
        source,
        st["count"],
        st["total_tokens"],
        st["mean"],
        st["percentiles"]["p50"],
        st["max"],
        out,
    )
    return 0


def _plot_histogram(hist: list[dict[str, int]], path: Path, st: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(
        [h["lo"] for h in hist],
        [h["count"] for h in hist],
        width=[h["hi"] - h["lo"] for h in hist],
        align="edge",
        color="#4477aa",
    )
    for key in ("p50", "p90", "p99"):
        ax.axvline(st["percentiles"][key], color="#cc6677", lw=0.8, ls="--")
    ax.set_xlabel("length (tokens)")
    ax.set_ylabel("samples")
    ax.set_title(f"{st['count']:,} samples, mean {st['mean']:.0f} tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
