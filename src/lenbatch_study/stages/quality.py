"""Quality stage: does batch composition change what the drafter learns? Measured, with seeds.

Setting (``params.quality``; the train stage and its results are untouched):

* **data**: a fixed random split of the tokenized samples (``batching.seed``): a training subset of
  about ``quality.train_tokens`` useful tokens and a disjoint **held-out** set of about
  ``quality.heldout_tokens``, never trained on.
* **learnable objective**: the drafter of the train stage (same architecture, block size, loss
  weights, anchors) with a *trainable* output head over a draft vocabulary, the
  ``quality.draft_vocab`` most frequent trained tokens of the training subset plus one "other"
  class, instead of the target's frozen random 248,320-wide ``lm_head`` (through which the loss
  barely moves: DESIGN.md). A reduced, trainable draft vocabulary is what EAGLE-3-style
  drafters use; labels stay the dataset's tokens, so batch composition (long vs short
  conversations) changes the gradient exactly as in the train stage. Uniform = ln(V' + 1) nats.
* **features**: the target is frozen and deterministic and a sequence's features do not depend on
  its batch-mates (``verify-packing``), so each sample's target features are computed once and
  reused by every strategy and seed; runs differ only by the batches the strategy makes.
* **runs**: every strategy of ``train.strategies``, ``quality.seeds`` seeds (seed k: plan seed,
  anchors and drafter/head initialisation; seed k of two strategies starts from the same weights),
  ``quality.epochs`` whole epochs of the training subset: equal useful tokens for every run. The
  held-out loss (fixed anchors) is measured at start and each time another 1/eval_points of the
  tokens has been trained. Batches follow ``batching`` (budget, max batch size, window), the
  bucketed edges come from the boundaries stage.
* **gradient quality at fixed weights** (:mod:`lenbatch_study.analysis.gradquality`): at the initial weights
  and at the weights after the ``random`` seed-0 run (composition-neutral SGD), for each strategy
  every batch of one epoch (anchors fixed per sample, so every strategy's epoch sums to the same
  full-data gradient G, checked): cosine to G, variance per useful token, noise scale, and the
  correlation of a batch's mean sample length with its loss.

Outputs (``--out``, data only: :mod:`lenbatch_study.pipeline.artifacts.quality_result`): ``quality.json``
(everything; ``machine``: the fingerprint of the machine its ``timing`` was taken on,
:mod:`lenbatch_study.core.machine`), ``metrics.json`` (flat, for ``dvc metrics diff``), ``curves.json`` and ``gradients.json``
(DVC plot data), ``params.json``. The report section and ``quality.png`` are drawn by the compare stage
(:mod:`lenbatch_study.analysis.quality_report`).

Cost: one target forward over train + held-out tokens, then per run epochs x train_tokens drafter
steps (forward + backward) and eval_points + 1 held-out forwards; per checkpoint and strategy one
epoch of forward + backward (measured times: README, "Results"). One process on ``train.device``
(a GPU when available): features, drafter and head on that device. The data split, draft vocabulary,
features and the drafter's objective are :mod:`lenbatch_study.models.quality_drafter`'s.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from lenbatch_study.analysis import gradquality as gq
from lenbatch_study.analysis import quality_stats
from lenbatch.batching.strategies import plan_epoch
from lenbatch.batching.strategy import Strategy, layout_of
from lenbatch_study.core.config import Params
from lenbatch_study.pipeline.artifacts.quality_result import CURVES, GRADIENTS, METRICS, QUALITY
from lenbatch_study.pipeline.artifacts.writing import write_resolved
from lenbatch_study.core.log import get_logger
from lenbatch_study.core.machine import fingerprint
from lenbatch_study.models.drafter import Drafter
from lenbatch_study.models.quality_drafter import (
    assemble,
    draft_loss,
    draft_model,
    draft_vocabulary,
    flat_grad,
    split_samples,
    target_features,
    unigram_loss,
)
from lenbatch_study.pipeline.artifacts.bucket_edges import edges_for
from lenbatch_study.pipeline.artifacts.tokenized import read_dataset, read_lengths

log = get_logger("quality")
TRAINED_FROM = "random"  # the weights of the "trained" checkpoint: this strategy's seed-0 run


# --------------------------------------------------------------------------- the experiment


class Experiment:
    """The data, features and fixed evaluation of one quality stage (built once, shared by every run)."""

    def __init__(self, params: Params, *, data: Path, lengths: np.ndarray, edges: Optional[tuple[int, ...]]) -> None:
        from lenbatch_study.models import target as target_model

        q, b = params.quality, params.batching
        self.params, self.edges = params, edges
        self.train_idx, self.held_idx = split_samples(
            lengths, train_tokens=q.train_tokens, heldout_tokens=q.heldout_tokens, seed=b.seed
        )
        too_long = int((lengths[self.train_idx] > b.token_budget).sum())
        if too_long:
            raise ValueError(
                f"{too_long} samples are longer than batching.token_budget={b.token_budget}; raise the "
                "budget or lower data.max_len and re-tokenize"
            )
        self.lengths = lengths
        both = np.concatenate([self.train_idx, self.held_idx])
        self.samples = read_dataset(data, lengths).arrays(both)
        self.vocab, cmap, self.coverage = draft_vocabulary(
            self.samples, self.train_idx, size=q.draft_vocab, vocab_size=params.model.vocab_size
        )
        self.device = quality_device(params.train.device)
        self.class_map = torch.from_numpy(cmap).to(self.device)
        self.classes = int(self.vocab.size) + 1
        self.unigram = unigram_loss(self.samples, self.train_idx, self.held_idx, class_map=cmap, classes=self.classes)
        t0, c0 = time.perf_counter(), time.process_time()
        target = target_model.build_target(params.model, device=self.device)
        # a float32 copy of the frozen embedding: the drafter trains in float32 whatever the target's dtype
        self.embed_tokens = nn.Embedding.from_pretrained(target.embed_tokens.weight.float(), freeze=True)
        self.feats = target_features(target, self.samples, both, row_tokens=b.token_budget)
        del target
        self.features_s, self.features_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        # held-out batches and their fixed anchors (seed, epoch 0, step 0, dataset index): one evaluation set
        self.held_batches = []
        for rows in _rows(self.held_idx, lengths, b.token_budget):
            batch, f = assemble(self.samples, self.feats, rows, layout="packed")
            self.held_batches.append((batch, f))

    def heldout_loss(self, model: Drafter) -> float:
        """Held-out loss: ``sum w ce / sum w`` over every held-out block position (fixed anchors)."""
        q = self.params.quality
        num = den = 0.0
        with torch.no_grad():
            for batch, f in self.held_batches:
                an, va = model.anchors_for(
                    batch, anchors_per_seq=q.anchors_per_seq, seed=self.params.batching.seed, epoch=0, step=0
                )
                loss, w = draft_loss(model, f, batch, an, va, embed_tokens=self.embed_tokens, class_map=self.class_map)
                num += float(loss) * w
                den += w
        return num / den

    def plan(self, strategy: str, *, seed: int, epoch: int) -> list[np.ndarray]:
        """One epoch of ``strategy`` over the training subset, as dataset indices."""
        b = self.params.batching
        sub = self.lengths[self.train_idx]
        plan = plan_epoch(
            sub,
            strategy=Strategy.sharing(strategy, self.edges),
            epoch=epoch,
            seed=seed,
            token_budget=b.token_budget,
            max_batch_size=b.max_batch_size,
            rank=0,
            world_size=1,
            packed_window=b.packed_window,
        )
        return [self.train_idx[np.asarray(p, dtype=np.int64)] for p in plan]

    def train_run(self, strategy: str, *, seed_index: int) -> tuple[dict[str, Any], Drafter]:
        """One run: ``quality.epochs`` epochs of ``strategy``; held-out loss at equal-token checkpoints."""
        p, q = self.params, self.params.quality
        seed = p.batching.seed + seed_index
        model = draft_model(p, classes=self.classes, seed=seed_index).to(self.device)
        opt = torch.optim.AdamW(model.parameters(), lr=q.lr, weight_decay=p.drafter.weight_decay)
        layout = layout_of(strategy)
        total = q.epochs * int(self.lengths[self.train_idx].sum())
        marks = [total * k / q.eval_points for k in range(1, q.eval_points + 1)]
        curve = [(0, self.heldout_loss(model))]
        steps: list[dict[str, float]] = []
        done, step = 0, 0
        t0, c0 = time.perf_counter(), time.process_time()
        for epoch in range(q.epochs):
            for idx in self.plan(strategy, seed=seed, epoch=epoch):
                batch, f = assemble(self.samples, self.feats, idx, layout=layout)
                an, va = model.anchors_for(batch, anchors_per_seq=q.anchors_per_seq, seed=seed, epoch=epoch, step=step)
                loss, _ = draft_loss(model, f, batch, an, va, embed_tokens=self.embed_tokens, class_map=self.class_map)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), p.drafter.grad_clip)
                opt.step()
                done += batch.useful_tokens
                step += 1
                steps.append(
                    {
                        "useful_tokens": batch.useful_tokens,
                        "loss": loss.item(),
                        "mean_length": batch.useful_tokens / batch.num_sequences,
                    }
                )
                crossed = sum(1 for m in marks[len(curve) - 1 :] if done >= m - 0.5)
                if crossed:  # one evaluation, recorded for every mark this step crossed
                    curve += [(done, self.heldout_loss(model))] * crossed
        assert done == total, f"{strategy}: trained {done} useful tokens, expected {total}: an epoch lost samples"
        run = {
            "strategy": strategy,
            "seed": seed,
            "steps": step,
            "useful_tokens": done,
            "curve_tokens": [c[0] for c in curve],
            "curve_loss": [c[1] for c in curve],
            "final_heldout_loss": curve[-1][1],
            "final_train_loss": float(np.mean([s["loss"] for s in steps[-5:]])),
            "seconds": time.perf_counter() - t0,
            "cpu_s": time.process_time() - c0,
            "train_length_loss_r": gq.pearson(
                np.array([s["mean_length"] for s in steps]), np.array([s["loss"] for s in steps])
            ),
        }
        return run, model

    def gradients(self, model: Drafter, strategy: str) -> dict[str, Any]:
        """Every batch gradient of one epoch of ``strategy`` at ``model``'s weights (anchors fixed per sample)."""
        p, q = self.params, self.params.quality
        layout = layout_of(strategy)
        grads, weights, sizes, mean_len, losses = [], [], [], [], []
        for idx in self.plan(strategy, seed=p.batching.seed, epoch=0):
            batch, f = assemble(self.samples, self.feats, idx, layout=layout)
            an, va = model.anchors_for(batch, anchors_per_seq=q.anchors_per_seq, seed=p.batching.seed, epoch=0, step=0)
            model.zero_grad(set_to_none=True)
            loss, w = draft_loss(model, f, batch, an, va, embed_tokens=self.embed_tokens, class_map=self.class_map)
            if w == 0:
                continue
            loss.backward()
            grads.append(flat_grad(model))
            weights.append(w)
            sizes.append(batch.useful_tokens)
            mean_len.append(batch.useful_tokens / batch.num_sequences)
            losses.append(loss.item())
        model.zero_grad(set_to_none=True)
        g = np.stack(grads)
        G = gq.full_gradient(g, np.array(weights))
        out = gq.gradient_quality(g, np.array(sizes), G)
        out["length_loss_r"] = gq.pearson(np.array(mean_len), np.array(losses))
        out["batch_mean_length"] = mean_len
        out["batch_loss"] = losses
        out["full_gradient"] = G
        return out


def quality_device(name: str) -> torch.device:
    """``train.device`` -> where the quality stage runs (auto: cuda when available; one device, one process)."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device is 'cuda' but no GPU is visible; set train.device: cpu (or auto)")
    return torch.device("cuda" if name in ("auto", "cuda") and torch.cuda.is_available() else "cpu")


def _rows(indices: np.ndarray, lengths: np.ndarray, budget: int) -> list[np.ndarray]:
    rows, cur, total = [], [], 0
    for i in indices:
        if cur and total + lengths[i] > budget:
            rows.append(np.array(cur))
            cur, total = [], 0
        cur.append(int(i))
        total += int(lengths[i])
    if cur:
        rows.append(np.array(cur))
    return rows


def run_quality(params: Params, *, data: Path, edges: Optional[tuple[int, ...]]) -> dict[str, Any]:
    """The whole experiment (module doc) -> the result dict written as quality.json."""
    q = params.quality
    strategies = list(params.train.strategies)
    if "sorted" not in strategies:
        raise ValueError("train.strategies lacks 'sorted', the baseline every difference is taken to; add it")
    t_start, c_start = time.perf_counter(), time.process_time()
    lengths = read_lengths(data)
    exp = Experiment(params, data=data, lengths=lengths, edges=edges)
    log.info(
        "split: %d training samples (%s tokens), %d held-out (%s tokens); draft vocabulary %d + other "
        "(covers %.1f%% of trained tokens); features in %.1f s",
        exp.train_idx.size,
        f"{int(lengths[exp.train_idx].sum()):,}",
        exp.held_idx.size,
        f"{int(lengths[exp.held_idx].sum()):,}",
        exp.vocab.size,
        100 * exp.coverage,
        exp.features_s,
    )
    runs: list[dict[str, Any]] = []
    trained_model: Optional[Drafter] = None
    for k in range(q.seeds):
        for s in strategies:
            run, model = exp.train_run(s, seed_index=k)
            runs.append(run)
            log.info(
                "%-8s seed %d: %d steps, held-out loss %.3f -> %.3f (%.1f s)",
                s,
                run["seed"],
                run["steps"],
                run["curve_loss"][0],
                run["final_heldout_loss"],
                run["seconds"],
            )
            if k == 0 and (s == TRAINED_FROM or (trained_model is None and s == strategies[-1])):
                trained_model = model
    assert trained_model is not None
    t_grad, c_grad = time.perf_counter(), time.process_time()
    grads: dict[str, dict[str, Any]] = {}
    init_model = draft_model(params, classes=exp.classes, seed=0).to(exp.device)
    for ck, model in (("init", init_model), ("trained", trained_model)):
        fulls = {}
        for s in strategies:
            g = exp.gradients(model, s)
            fulls[s] = g.pop("full_gradient")
            grads[f"{ck}.{s}"] = {"checkpoint": ck, "strategy": s, **g}
        ref = fulls["sorted"]
        for s, G in fulls.items():  # every epoch holds every sample once: one full-data gradient
            rel = float(np.linalg.norm(G - ref) / max(np.linalg.norm(ref), 1e-300))
            assert rel < 1e-3, f"{ck}: {s}'s epoch sums to another full gradient than sorted's (rel. diff {rel:.2e})"
    grad_s, grad_cpu_s = time.perf_counter() - t_grad, time.process_time() - c_grad
    uniform = math.log(exp.classes)
    result = {
        "strategies": strategies,
        "setting": {
            "objective": "dataset tokens through a trainable head over the draft vocabulary",
            "draft_vocab": int(exp.vocab.size),
            "classes": exp.classes,
            "coverage": exp.coverage,
            "uniform_loss": uniform,
            "unigram_loss": exp.unigram,
            "min_drop_nats": q.min_drop_nats,
            "train_samples": int(exp.train_idx.size),
            "train_tokens": int(lengths[exp.train_idx].sum()),
            "heldout_samples": int(exp.held_idx.size),
            "heldout_tokens": int(lengths[exp.held_idx].sum()),
            "epochs": q.epochs,
            "seeds": q.seeds,
            "useful_tokens_per_run": runs[0]["useful_tokens"],
            "anchors_per_seq": q.anchors_per_seq,
            "lr": q.lr,
            "token_budget": params.batching.token_budget,
            "trained_checkpoint": f"{TRAINED_FROM if TRAINED_FROM in strategies else strategies[-1]} seed 0",
        },
        "runs": runs,
        "gradients": grads,
        "timing": {
            "features_s": exp.features_s,
            "features_cpu_s": exp.features_cpu_s,
            "runs_s": float(sum(r["seconds"] for r in runs)),
            "runs_cpu_s": float(sum(r["cpu_s"] for r in runs)),
            "gradients_s": grad_s,
            "gradients_cpu_s": grad_cpu_s,
            "total_s": time.perf_counter() - t_start,
            "total_cpu_s": time.process_time() - c_start,
            "threads": torch.get_num_threads(),
        },
        "machine": fingerprint(threads=torch.get_num_threads()),  # where the timings above were taken
    }
    result["summary"] = quality_stats.summarize(result)
    return result


# --------------------------------------------------------------------------- outputs


def write_outputs(result: dict[str, Any], out: Path, *, params: Params) -> dict[str, Any]:
    """``quality.json``, ``metrics.json``, ``curves.json``, ``gradients.json`` and ``params.json`` in ``out``
    (the files of :mod:`lenbatch_study.pipeline.artifacts.quality_result`); returns the metrics."""
    out.mkdir(parents=True, exist_ok=True)
    (out / QUALITY).write_text(json.dumps(result, indent=1, default=_json_default) + "\n")
    metrics = {**quality_stats.strategy_metrics(result), **quality_stats.stage_metrics(result)}
    (out / METRICS).write_text(json.dumps(metrics, indent=2) + "\n")
    curves = [
        {"strategy": r["strategy"], "seed": r["seed"], "useful_tokens": t, "heldout_loss": round(v, 6)}
        for r in result["runs"]
        for t, v in zip(r["curve_tokens"], r["curve_loss"])
    ]
    (out / CURVES).write_text(json.dumps(curves, indent=1) + "\n")
    rows = [
        {
            "checkpoint": g["checkpoint"],
            "strategy": g["strategy"],
            **{k: g[k] for k in ("cosine_mean", "variance_per_token", "noise_scale", "length_loss_r")},
        }
        for g in result["gradients"].values()
    ]
    (out / GRADIENTS).write_text(json.dumps(rows, indent=1, default=_json_default) + "\n")
    write_resolved(params, out, sections=("batching", "model", "drafter", "quality"))
    return metrics


def _json_default(x: Any) -> Any:
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(type(x))


# ------------------------------------------------------------ stage: lenbatch quality (flags: lenbatch_study.cli.flags)


def run(*, params: Params, data: str | Path, out: str | Path, boundaries: str | None = None) -> int:
    """``lenbatch quality``: :func:`run_quality` on the tokenize output ``data`` (bucketed with the
    edges of ``boundaries``), written to ``out`` (:func:`write_outputs`)."""
    torch.set_num_threads(params.quality.threads)
    edges = edges_for(boundaries, params.train.strategies)
    result = run_quality(params, data=Path(data), edges=edges)
    write_outputs(result, Path(out), params=params)
    summ = result["summary"]
    for s in result["strategies"]:
        f = summ["final"][s]
        log.info(
            "%-8s held-out loss %.4f [%.4f, %.4f]%s",
            s,
            f["mean"],
            f["lo"],
            f["hi"],
            ""
            if s == "sorted"
            else (
                "  differs from sorted" if summ["vs_sorted"][s]["distinguishable"] else "  within seed noise of sorted"
            ),
        )
    t = result["timing"]
    log.info("wrote %s in %.0f s (%.0f CPU s)", out, t["total_s"], t["total_cpu_s"])
    if not summ["learned"]:
        log.warning(
            "the held-out loss did not fall %.1f nats below uniform (%.2f) for every strategy: raise "
            "quality.epochs, quality.train_tokens or quality.lr",
            result["setting"]["min_drop_nats"],
            result["setting"]["uniform_loss"],
        )
    return 0
