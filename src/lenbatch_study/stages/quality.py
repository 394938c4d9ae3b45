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
(a GPU when available): features, drafter and head on that device.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lenbatch_study.analysis import gradquality as gq
from lenbatch_study.analysis import quality_stats
from lenbatch.batching.strategies import plan_epoch
from lenbatch.batching.strategy import Strategy, layout_of
from lenbatch.loading.collate import Batch, collate
from lenbatch_study.core.config import Params
from lenbatch_study.pipeline.artifacts.quality_result import CURVES, GRADIENTS, METRICS, QUALITY
from lenbatch_study.pipeline.artifacts.writing import write_resolved
from lenbatch_study.core.log import get_logger
from lenbatch_study.core.machine import fingerprint
from lenbatch_study.models.drafter import Drafter, build_drafter
from lenbatch_study.pipeline.artifacts.bucket_edges import edges_for
from lenbatch_study.pipeline.artifacts.tokenized import read_dataset, read_lengths

log = get_logger("quality")
TRAINED_FROM = "random"  # the weights of the "trained" checkpoint: this strategy's seed-0 run


# --------------------------------------------------------------------------- data


def split_samples(lengths: np.ndarray, *, train_tokens: int, heldout_tokens: int, seed: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint (train, held-out) dataset indices, each sorted: a seeded permutation, the held-out set
    first (until ``heldout_tokens`` useful tokens), then the training subset (until ``train_tokens``).
    Pure function of (lengths, sizes, seed); ``ValueError`` if the data is too small."""
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.random.default_rng([int(seed), 13]).permutation(lengths.size)
    csum = np.cumsum(lengths[order])
    if csum[-1] < train_tokens + heldout_tokens:
        raise ValueError(f"the data holds {int(csum[-1]):,} tokens, fewer than quality.train_tokens + "
                         f"quality.heldout_tokens = {train_tokens + heldout_tokens:,}; lower them")
    n_held = int(np.searchsorted(csum, heldout_tokens) + 1)
    rest = np.cumsum(lengths[order[n_held:]])
    n_train = int(np.searchsorted(rest, train_tokens) + 1)
    return np.sort(order[n_held:n_held + n_train]), np.sort(order[:n_held])


def draft_vocabulary(samples: dict[int, dict[str, np.ndarray]], indices: np.ndarray, *, size: int,
                     vocab_size: int) -> tuple[np.ndarray, np.ndarray, float]:
    """The ``size`` most frequent trained (loss-masked) tokens of ``indices``' samples.

    Returns (token ids [<= size], class map [vocab_size] int64: token -> class, others -> the last
    class ``len(ids)``, coverage = share of trained tokens inside the draft vocabulary).
    """
    toks = np.concatenate([np.asarray(samples[int(i)]["input_ids"])[np.asarray(samples[int(i)]["loss_mask"], bool)]
                           for i in indices])
    counts = np.bincount(toks, minlength=vocab_size)
    top = np.argsort(-counts, kind="stable")[:size]
    top = top[counts[top] > 0]
    cmap = np.full(vocab_size, top.size, dtype=np.int64)
    cmap[top] = np.arange(top.size)
    return top, cmap, float(counts[top].sum() / max(toks.size, 1))


def unigram_loss(samples: dict[int, dict[str, np.ndarray]], train: np.ndarray, heldout: np.ndarray, *,
                 class_map: np.ndarray, classes: int) -> float:
    """Reference: mean cross-entropy (nats) of the held-out trained tokens' classes under the training
    subset's class frequencies (add-1/2 smoothing): what a drafter that ignores its context reaches."""
    def labels(idx: np.ndarray) -> np.ndarray:
        return np.concatenate([class_map[samples[int(i)]["input_ids"][samples[int(i)]["loss_mask"]]] for i in idx])

    counts = np.bincount(labels(train), minlength=classes) + 0.5
    return float(-np.log(counts / counts.sum())[labels(heldout)].mean())


def target_features(target: Any, samples: dict[int, dict[str, np.ndarray]], indices: np.ndarray, *,
                    row_tokens: int) -> dict[int, torch.Tensor]:
    """Each sample's target features ``[L, F]``, from packed rows of at most ``row_tokens`` tokens (a packed
    forward equals the per-sequence forwards, so the features are the ones any batch would get)."""
    out: dict[int, torch.Tensor] = {}
    row: list[int] = []

    def flush() -> None:
        if not row:
            return
        b = collate([samples[i] for i in row], layout="packed", token_budget=None, max_batch_size=None, indices=row)
        f = target.features(b.input_ids, cu_seqlens=b.cu_seqlens)[0].clone()
        cu = b.cu_seqlens.tolist()
        for k, i in enumerate(row):
            out[i] = f[cu[k]:cu[k + 1]]
        row.clear()

    total = 0
    for i in indices:
        n = len(samples[int(i)]["input_ids"])
        if total + n > row_tokens:
            flush()
            total = 0
        row.append(int(i))
        total += n
    flush()
    return out


def assemble(samples: dict[int, dict[str, np.ndarray]], feats: dict[int, torch.Tensor], indices: np.ndarray, *,
             layout: str) -> tuple[Batch, torch.Tensor]:
    """The batch of ``indices`` in ``layout`` and its features in the same layout (zeros on padding),
    both on the features' device, features in float32 (the drafter's master precision)."""
    idx = [int(i) for i in indices]
    first = feats[idx[0]]
    batch = collate([samples[i] for i in idx], layout=layout, token_budget=None, max_batch_size=None,
                    indices=idx).to(first.device)
    if layout == "packed":
        return batch, torch.cat([feats[i] for i in idx])[None].float()
    m = batch.shape_length
    out = torch.zeros(len(idx), m, first.shape[1], device=first.device)
    for k, i in enumerate(idx):
        out[k, :feats[i].shape[0]] = feats[i]
    return batch, out


# --------------------------------------------------------------------------- model


def draft_model(params: Params, *, classes: int, seed: int) -> Drafter:
    """The train stage's drafter (:func:`lenbatch_study.models.drafter.build_drafter`) with a trainable head over
    the draft vocabulary's ``classes``, in float32, its weights drawn from ``model.init_seed + 1 + 1000 * seed``
    (seed k of every strategy starts from the same weights)."""
    return build_drafter(params, init_seed=params.model.init_seed + 1 + 1000 * seed, dtype="float32",
                         head_classes=classes)


def draft_loss(model: Drafter, feats: torch.Tensor, batch: Batch, anchors: torch.Tensor, valid: torch.Tensor, *,
               embed_tokens: nn.Module, class_map: torch.Tensor) -> tuple[torch.Tensor, float]:
    """``(sum_i w_i ce_i / sum_i w_i, sum_i w_i)`` over the block positions the train stage trains (the
    drafter's :meth:`~lenbatch_study.models.drafter.Drafter.trained_positions`: same targets, same weights
    exp(-(k-1)/gamma)), through ``model.head``, labels mapped to draft-vocabulary classes."""
    h = model.block_states(feats, batch, anchors, embed_tokens=embed_tokens)
    hid, tok, w = model.trained_positions(h, batch, anchors, valid)
    if w.numel() == 0:
        return h.sum() * 0.0, 0.0
    ce = F.cross_entropy(model.head(hid), class_map[tok], reduction="none")
    wsum = w.sum()
    return (w * ce).sum() / wsum, float(wsum)


def flat_grad(model: nn.Module) -> np.ndarray:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in model.parameters()]).double().cpu().numpy()


# --------------------------------------------------------------------------- the experiment


class Experiment:
    """The data, features and fixed evaluation of one quality stage (built once, shared by every run)."""

    def __init__(self, params: Params, *, data: Path, lengths: np.ndarray, edges: Optional[tuple[int, ...]]) -> None:
        from lenbatch_study.models import target as target_model

        q, b = params.quality, params.batching
        self.params, self.edges = params, edges
        self.train_idx, self.held_idx = split_samples(lengths, train_tokens=q.train_tokens,
                                                      heldout_tokens=q.heldout_tokens, seed=b.seed)
        too_long = int((lengths[self.train_idx] > b.token_budget).sum())
        if too_long:
            raise ValueError(f"{too_long} samples are longer than batching.token_budget={b.token_budget}; raise the "
                             "budget or lower data.max_len and re-tokenize")
        self.lengths = lengths
        both = np.concatenate([self.train_idx, self.held_idx])
        self.samples = read_dataset(data, lengths).arrays(both)
        self.vocab, cmap, self.coverage = draft_vocabulary(self.samples, self.train_idx, size=q.draft_vocab,
                                                           vocab_size=params.model.vocab_size)
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
                an, va = model.anchors_for(batch, anchors_per_seq=q.anchors_per_seq,
                                                   seed=self.params.batching.seed, epoch=0, step=0)
                loss, w = draft_loss(model, f, batch, an, va, embed_tokens=self.embed_tokens, class_map=self.class_map)
                num += float(loss) * w
                den += w
        return num / den

    def plan(self, strategy: str, *, seed: int, epoch: int) -> list[np.ndarray]:
        """One epoch of ``strategy`` over the training subset, as dataset indices."""
        b = self.params.batching
        sub = self.lengths[self.train_idx]
        plan = plan_epoch(sub, strategy=Strategy.sharing(strategy, self.edges), epoch=epoch, seed=seed,
                          token_budget=b.token_budget, max_batch_size=b.max_batch_size, rank=0, world_size=1,
                          packed_window=b.packed_window)
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
                an, va = model.anchors_for(batch, anchors_per_seq=q.anchors_per_seq, seed=seed, epoch=epoch,
                                                   step=step)
                loss, _ = draft_loss(model, f, batch, an, va, embed_tokens=self.embed_tokens, class_map=self.class_map)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), p.drafter.grad_clip)
                opt.step()
                done += batch.useful_tokens
                step += 1
                steps.append({"useful_tokens": batch.useful_tokens, "loss": loss.item(),
                              "mean_length": batch.useful_tokens / batch.num_sequences})
                crossed = sum(1 for m in marks[len(curve) - 1:] if done >= m - 0.5)
                if crossed:  # one evaluation, recorded for every mark this step crossed
                    curve += [(done, self.heldout_loss(model))] * crossed
        assert done == total, f"{strategy}: trained {done} useful tokens, expected {total}: an epoch lost samples"
        run = {"strategy": strategy, "seed": seed, "steps": step, "useful_tokens": done,
               "curve_tokens": [c[0] for c in curve], "curve_loss": [c[1] for c in curve],
               "final_heldout_loss": curve[-1][1], "final_train_loss": float(np.mean([s["loss"] for s in steps[-5:]])),
               "seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
               "train_length_loss_r": gq.pearson(np.array([s["mean_length"] for s in steps]),
                                                 np.array([s["loss"] for s in steps]))}
        return run, model

    def gradients(self, model: Drafter, strategy: str) -> dict[str, Any]:
        """Every batch gradient of one epoch of ``strategy`` at ``model``'s weights (anchors fixed per sample)."""
        p, q = self.params, self.params.quality
        layout = layout_of(strategy)
        grads, weights, sizes, mean_len, losses = [], [], [], [], []
        for idx in self.plan(strategy, seed=p.batching.seed, epoch=0):
            batch, f = assemble(self.samples, self.feats, idx, layout=layout)
            an, va = model.anchors_for(batch, anchors_per_seq=q.anchors_per_seq, seed=p.batching.seed,
                                               epoch=0, step=0)
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
    log.info("split: %d training samples (%s tokens), %d held-out (%s tokens); draft vocabulary %d + other "
             "(covers %.1f%% of trained tokens); features in %.1f s", exp.train_idx.size,
             f"{int(lengths[exp.train_idx].sum()):,}", exp.held_idx.size, f"{int(lengths[exp.held_idx].sum()):,}",
             exp.vocab.size, 100 * exp.coverage, exp.features_s)
    runs: list[dict[str, Any]] = []
    trained_model: Optional[Drafter] = None
    for k in range(q.seeds):
        for s in strategies:
            run, model = exp.train_run(s, seed_index=k)
            runs.append(run)
            log.info("%-8s seed %d: %d steps, held-out loss %.3f -> %.3f (%.1f s)", s, run["seed"], run["steps"],
                     run["curve_loss"][0], run["final_heldout_loss"], run["seconds"])
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
        "setting": {"objective": "dataset tokens through a trainable head over the draft vocabulary",
                    "draft_vocab": int(exp.vocab.size), "classes": exp.classes, "coverage": exp.coverage,
                    "uniform_loss": uniform, "unigram_loss": exp.unigram, "min_drop_nats": q.min_drop_nats,
                    "train_samples": int(exp.train_idx.size), "train_tokens": int(lengths[exp.train_idx].sum()),
                    "heldout_samples": int(exp.held_idx.size), "heldout_tokens": int(lengths[exp.held_idx].sum()),
                    "epochs": q.epochs, "seeds": q.seeds, "useful_tokens_per_run": runs[0]["useful_tokens"],
                    "anchors_per_seq": q.anchors_per_seq, "lr": q.lr, "token_budget": params.batching.token_budget,
                    "trained_checkpoint": f"{TRAINED_FROM if TRAINED_FROM in strategies else strategies[-1]} seed 0"},
        "runs": runs,
        "gradients": grads,
        "timing": {"features_s": exp.features_s, "features_cpu_s": exp.features_cpu_s,
                   "runs_s": float(sum(r["seconds"] for r in runs)), "runs_cpu_s": float(sum(r["cpu_s"] for r in runs)),
                   "gradients_s": grad_s, "gradients_cpu_s": grad_cpu_s,
                   "total_s": time.perf_counter() - t_start, "total_cpu_s": time.process_time() - c_start,
                   "threads": torch.get_num_threads()},
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
    curves = [{"strategy": r["strategy"], "seed": r["seed"], "useful_tokens": t, "heldout_loss": round(v, 6)}
              for r in result["runs"] for t, v in zip(r["curve_tokens"], r["curve_loss"])]
    (out / CURVES).write_text(json.dumps(curves, indent=1) + "\n")
    rows = [{"checkpoint": g["checkpoint"], "strategy": g["strategy"],
             **{k: g[k] for k in ("cosine_mean", "variance_per_token", "noise_scale", "length_loss_r")}}
            for g in result["gradients"].values()]
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
        log.info("%-8s held-out loss %.4f [%.4f, %.4f]%s", s, f["mean"], f["lo"], f["hi"],
                 "" if s == "sorted" else ("  differs from sorted" if summ["vs_sorted"][s]["distinguishable"]
                                           else "  within seed noise of sorted"))
    t = result["timing"]
    log.info("wrote %s in %.0f s (%.0f CPU s)", out, t["total_s"], t["total_cpu_s"])
    if not summ["learned"]:
        log.warning("the held-out loss did not fall %.1f nats below uniform (%.2f) for every strategy: raise "
                    "quality.epochs, quality.train_tokens or quality.lr", result["setting"]["min_drop_nats"],
                    result["setting"]["uniform_loss"])
    return 0
