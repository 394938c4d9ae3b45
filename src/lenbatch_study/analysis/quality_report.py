"""Report rendering of the quality stage's result (``results/quality/quality.json``), for the compare stage.

Compare embeds the quality section in its ``report.md``, draws ``quality.png`` beside it and adds the
per-second metrics; the quality stage itself writes only data (its numbers are
:mod:`lenbatch_study.analysis.quality_stats`), so editing this module reruns compare alone. Everything here is
a pure function of the result dict and, for the per-second answer, of the measured throughput of the
train stage.

* **at equal useful tokens**: the intervals of :func:`lenbatch_study.analysis.quality_stats.summarize`.
* **per second of training** (throughput x sample efficiency): strategy ``s`` at ``r_s`` useful
  tokens/s has trained ``r_s * t`` tokens after ``t`` seconds. At ``t* = tokens per run / max_s r_s``
  (when the fastest strategy finishes its tokens), each run's held-out loss curve is interpolated at
  ``r_s * t*`` tokens; same intervals and differences over seeds. Lower is better.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import numpy as np

from lenbatch_study.core import intervals
from lenbatch_study.analysis.quality_stats import by_strategy, metric_number, stage_metrics, strategy_metrics
from lenbatch_study.pipeline.artifacts.compare_report import QUALITY_PLOT
from lenbatch_study.pipeline.artifacts.quality_result import QUALITY_PATH

CHECKPOINTS = ("init", "trained")  # the weights the gradients were taken at (the quality stage's)


def per_second(result: dict[str, Any], tok_s: dict[str, float]) -> dict[str, Any]:
    """Held-out loss after equal training time (module doc), from the measured useful tokens/s."""
    runs = by_strategy(result)
    tokens = float(result["setting"]["useful_tokens_per_run"])
    fastest = max(tok_s[s] for s in runs)
    t_star = tokens / fastest
    at = {
        s: [float(np.interp(tok_s[s] * t_star, r["curve_tokens"], r["curve_loss"])) for r in rs]
        for s, rs in runs.items()
    }
    return {
        "seconds": t_star,
        "tokens": {s: tok_s[s] * t_star for s in runs},
        "loss": {s: intervals.mean_interval(v) for s, v in at.items()},
        "vs_sorted": {s: intervals.difference_interval(v, at["sorted"]) for s, v in at.items() if s != "sorted"},
    }


def _iv(i: dict[str, float], digits: int = 3) -> str:
    return f"{i['mean']:.{digits}f} [{i['lo']:.{digits}f}, {i['hi']:.{digits}f}]"


def _diff(d: dict[str, Any], digits: int = 3) -> str:
    verdict = "**beyond seed noise**" if d["distinguishable"] else "within seed noise"
    return f"{d['diff']:+.{digits}f} [{d['lo']:+.{digits}f}, {d['hi']:+.{digits}f}], {verdict}"


# What to change when the quality runs did not learn enough for their losses to compare strategies
TO_LEARN = (
    "To meet it, give the quality runs more to learn: more epochs (`quality.epochs`), more training tokens "
    "(`quality.train_tokens`), a higher learning rate (`quality.lr`) or fewer head classes "
    "(`quality.draft_vocab`); e.g. `dvc exp run -S quality.epochs=8`, or edit params.yaml and run "
    "`snakemake --cores all` (quality and compare rerun)"
)


def learned(result: Optional[dict[str, Any]]) -> bool:
    """Whether the quality runs met the learned criterion (their losses can then compare strategies)."""
    return bool(result) and bool(result["summary"]["learned"])


def not_learned_sentence(result: dict[str, Any]) -> str:
    """Why the report draws no quality conclusion, and what to change."""
    st, summ = result["setting"], result["summary"]
    return (
        f"The held-out losses do not compare strategies on this run: the learned criterion (every run's final "
        f"held-out loss at least {st['min_drop_nats']:g} nat below uniform, {st['uniform_loss']:.3f}) was not met "
        f"(worst run {summ['worst_final_loss']:.3f}), so the drafter learned too little for composition to show. "
        + TO_LEARN
        + "."
    )


def loss_cell(result: Optional[dict[str, Any]], strategy: str) -> str:
    """The compare table's "held-out loss at equal tokens" cell: mean [95% interval]; none when the runs did not
    learn (the criterion is not met)."""
    if not result:
        return "n/a"
    if not learned(result):
        return "not learned"
    return _iv(result["summary"]["final"][strategy])


def _direction(d: dict[str, Any], *, than: str) -> str:
    """'0.082 nats lower than sorted's (-0.082 [-0.340, +0.176], within seed noise)' for a Welch difference."""
    word = "lower" if d["diff"] < 0 else "higher"
    return f"{abs(d['diff']):.3f} nats {word} than {than} ({_diff(d)})"


def answer_sentence(result: Optional[dict[str, Any]], strategy: str) -> str:
    """One sentence for compare's answer: the recommended strategy's held-out loss at equal useful tokens against
    sorted's, with its direction and interval."""
    if not result:
        return f"Its held-out loss was not measured (no quality stage results; rerun: snakemake {QUALITY_PATH})."
    if not learned(result):
        return not_learned_sentence(result)
    summ = result["summary"]
    tokens = result["setting"]["useful_tokens_per_run"]
    text = (
        f"Its drafter's held-out loss after {tokens:,} useful tokens is {_iv(summ['final'][strategy])} "
        f"(95% interval over {result['setting']['seeds']} seeds)"
    )
    if strategy != "sorted":
        text += ", " + _direction(summ["vs_sorted"][strategy], than="sorted's")
    return text + "."


def tie_sentence(result: Optional[dict[str, Any]], tied: tuple[str, ...]) -> str:
    """What the held-out loss at equal useful tokens says between tied strategies (Welch's interval of the first
    against each other, over seeds)."""
    if not result:
        return "held-out loss not measured (no quality stage results)."
    if not learned(result):
        return "held-out loss not compared (the quality runs did not meet their learned criterion)."
    runs = by_strategy(result)
    first = tied[0]
    parts = []
    for s in tied[1:]:
        d = intervals.difference_interval(
            [r["final_heldout_loss"] for r in runs[first]], [r["final_heldout_loss"] for r in runs[s]]
        )
        parts.append(f"`{first}`'s held-out loss at equal useful tokens is " + _direction(d, than=f"`{s}`'s"))
    return "; ".join(parts) + "."


def summary_sentence(result: Optional[dict[str, Any]]) -> str:
    """The quality finding in one sentence for the report: which strategies' held-out loss at equal useful tokens
    differs from sorted's beyond seed noise, in which direction, with the interval (the tables, per second
    included, are in details.md)."""
    if not result:
        return f"Not measured: no quality stage results (rerun: snakemake {QUALITY_PATH})."
    if not learned(result):
        return not_learned_sentence(result)
    summ, st = result["summary"], result["setting"]
    where = (
        f"at equal useful tokens ({st['useful_tokens_per_run']:,} per run, {st['seeds']} seeds, the quality "
        "stage's drafter with a trainable head)"
    )
    vs = summ["vs_sorted"]
    beyond = {s: d for s, d in vs.items() if d["distinguishable"]}
    if beyond:
        return (
            "Held-out loss "
            + where
            + " differs from sorted's beyond seed noise for "
            + "; ".join(f"`{s}`: " + _direction(d, than="sorted's") for s, d in beyond.items())
            + "; the others are within seed "
            "noise (tables and gradient quality: details.md)."
        )
    lo = min(vs, key=lambda s: vs[s]["diff"])
    hi = max(vs, key=lambda s: vs[s]["diff"])
    return (
        f"No strategy's held-out loss {where} differs from sorted's beyond seed noise: the differences run from "
        f"{vs[lo]['diff']:+.3f} (`{lo}`) to {vs[hi]['diff']:+.3f} (`{hi}`) nats, every 95% interval containing 0 "
        "(tables and gradient quality: details.md)."
    )


def section(result: dict[str, Any], *, tok_s: Optional[dict[str, float]], level: int = 2) -> str:
    """Markdown: the setting, held-out loss tables (per token and, with ``tok_s``, per second), gradient tables."""
    st, summ = result["setting"], result["summary"]
    h = "#" * level
    strategies = result["strategies"]
    lines = [
        f"{h} Does composition matter? Held-out loss and gradient quality",
        "",
        "Setting (the quality stage, `params.quality`): the drafter of the train stage with a trainable head "
        f'over the {st["draft_vocab"]:,} most frequent trained tokens of the training subset plus one "other" '
        f"class ({100 * st['coverage']:.1f}% of trained tokens inside; uniform = {st['uniform_loss']:.3f} nats), "
        f"labels the dataset's tokens, the target's features as in training. Training subset "
        f"{st['train_samples']:,} samples ({st['train_tokens']:,} tokens), held-out {st['heldout_samples']:,} "
        f"samples ({st['heldout_tokens']:,} tokens, never trained on); {st['epochs']} epochs = "
        f"{st['useful_tokens_per_run']:,} useful tokens per run, {st['seeds']} seeds per strategy, budget "
        f"{st['token_budget']:,} tokens, {st['anchors_per_seq']} anchors per sequence, lr {st['lr']:g}. "
        f"Learned criterion: every run's final held-out loss at least {st['min_drop_nats']:g} nat below "
        f"uniform: "
        + ("**met**" if summ["learned"] else "**not met**")
        + f" (worst run {summ['worst_final_loss']:.3f})."
        + _unigram(st),
        "",
    ]
    runs = by_strategy(result)
    if not summ["learned"]:
        # no loss comparison: with a drafter that learned too little, differences say nothing about composition
        lines += [
            TO_LEARN + ".",
            "",
            "Final held-out loss of each run (not compared: the criterion is not met):",
            "",
            "| strategy | per-seed |",
            "|---|---|",
        ]
        lines += [f"| {s} | " + ", ".join(f"{r['final_heldout_loss']:.3f}" for r in runs[s]) + " |" for s in strategies]
        tok_s = None
    else:
        lines += [
            "Held-out loss at equal useful tokens (mean [95% t-interval] over seeds; difference from sorted "
            "with Welch's 95% interval):",
            "",
            "| strategy | held-out loss | difference from sorted | per-seed |",
            "|---|---|---|---|",
        ]
    for s in strategies if summ["learned"] else []:
        d = "(baseline)" if s == "sorted" else _diff(summ["vs_sorted"][s])
        seeds = ", ".join(f"{r['final_heldout_loss']:.3f}" for r in runs[s])
        lines.append(f"| {s} | {_iv(summ['final'][s])} | {d} | {seeds} |")
    if tok_s:
        ps = per_second(result, tok_s)
        lines += [
            "",
            f"Held-out loss per second of training: after {ps['seconds']:.1f} s at each strategy's useful "
            "tokens/s, i.e. when the fastest has trained the run's tokens (lower is better):",
            "",
            "| strategy | useful tok/s | tokens by then | held-out loss | difference from sorted |",
            "|---|---|---|---|---|",
        ]
        for s in strategies:
            d = "(baseline)" if s == "sorted" else _diff(ps["vs_sorted"][s])
            lines.append(f"| {s} | {tok_s[s]:,.0f} | {ps['tokens'][s]:,.0f} | {_iv(ps['loss'][s])} | {d} |")
        lines += [
            "",
            "(useful tokens/s: `sorted`'s training's, times each strategy's ratio to `sorted` measured in "
            "turns where it was measured (a drift between the trainings cannot move it), else each training's "
            "own; the train stage runs the same `batching` budget and plans. The quality runs' own seconds are "
            "not used: they reuse precomputed target features in one process)",
        ]
    grads = result["gradients"]
    lines += [
        "",
        "Gradient quality at fixed weights: every batch of one epoch of each strategy (anchors fixed per "
        "sample, so every epoch sums to the same full-data gradient G). cos = mean cos(g_b, G); "
        "tr Σ = mean B_b·‖g_b − G‖² (per useful token; composition bias inflates it); "
        "B_simple = tr Σ / |G|² (useful tokens); r = correlation of a batch's mean sample length with its "
        "loss.",
        "",
        "| strategy | batches | cos (init) | cos (trained) | tr Σ (init) | tr Σ (trained) | B_simple (init) | "
        "B_simple (trained) | r length-loss (init) | r length-loss (trained) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in strategies:
        a, b = grads[f"init.{s}"], grads[f"trained.{s}"]
        lines.append(
            f"| {s} | {a['batches']} | {a['cosine_mean']:.3f} | {b['cosine_mean']:.3f} | "
            f"{a['variance_per_token']:.3g} | {b['variance_per_token']:.3g} | {a['noise_scale']:,.0f} | "
            f"{b['noise_scale']:,.0f} | {_r(a['length_loss_r'])} | {_r(b['length_loss_r'])} |"
        )
    t = result["timing"]
    lines += [
        "",
        f"(trained weights: {st['trained_checkpoint']}. Stage time {t['total_s']:.0f} s wall, "
        f"{t['total_cpu_s']:.0f} CPU s on {t['threads']} thread(s): target features {t['features_s']:.0f} s, "
        f"runs {t['runs_s']:.0f} s, gradients {t['gradients_s']:.0f} s.)",
        "",
        f"![quality]({QUALITY_PLOT})",
        "",
    ]
    return "\n".join(lines)


def _unigram(st: dict[str, Any]) -> str:
    u = st.get("unigram_loss")
    if u is None:
        return ""
    return (
        f" Reference: predicting every held-out token by its training-subset frequency (no context) gives "
        f"{u:.3f} nats; a loss near it means the drafter learned little beyond the token frequencies, and "
        "composition can only matter above that floor."
    )


def _r(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.2f}"


def flat_metrics(result: Optional[dict[str, Any]], tok_s: Optional[dict[str, float]] = None) -> dict[str, Any]:
    """Flat metrics of the quality result for compare's ``metrics.json``: the quality stage's
    (:mod:`lenbatch_study.analysis.quality_stats`) and, with ``tok_s``, the held-out loss per second."""
    if not result:
        return {}
    out = strategy_metrics(result)
    if tok_s:
        ps = per_second(result, tok_s)
        for s, iv in ps["loss"].items():
            out[f"{s}.heldout_loss_per_second.mean"] = metric_number(iv["mean"])
            out[f"{s}.heldout_loss_per_second.lo"] = metric_number(iv["lo"])
            out[f"{s}.heldout_loss_per_second.hi"] = metric_number(iv["hi"])
    out.update(stage_metrics(result))
    return out


def write_plot(result: dict[str, Any], path: Path) -> Path:
    """``quality.png``: held-out loss curves (mean and 95% interval over seeds) and, per checkpoint, the
    batch-gradient cosine and noise scale of every strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summ = result["summary"]
    strategies = result["strategies"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    ax = axes[0]
    for s in strategies:
        c = summ["curves"][s]
        x = np.array(c["useful_tokens"]) / 1e3
        ax.plot(x, c["mean"], "-o", ms=3, label=s)
        ax.fill_between(x, c["lo"], c["hi"], alpha=0.2)
    ax.axhline(result["setting"]["uniform_loss"], color="#999", lw=1, ls=":", label="uniform")
    ax.set_xlabel("useful tokens trained (thousands)")
    ax.set_ylabel("held-out loss (nats), mean and 95% interval over seeds")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    xs = np.arange(len(strategies))
    for ax, key, label in (
        (axes[1], "cosine_mean", "mean cos(batch gradient, full gradient)"),
        (axes[2], "noise_scale", "gradient noise scale B_simple (useful tokens)"),
    ):
        for j, ck in enumerate(CHECKPOINTS):
            vals = [result["gradients"][f"{ck}.{s}"][key] for s in strategies]
            ax.bar(xs + (j - 0.5) * 0.38, vals, width=0.38, label=f"{ck} weights")
        ax.set_xticks(xs, strategies, fontsize=8)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    if result["gradients"]:
        axes[2].set_yscale("log")
    fig.suptitle("does batch composition matter? held-out loss at equal useful tokens, gradient quality")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = [
    "TO_LEARN",
    "answer_sentence",
    "flat_metrics",
    "learned",
    "loss_cell",
    "not_learned_sentence",
    "per_second",
    "section",
    "summary_sentence",
    "tie_sentence",
    "write_plot",
]
