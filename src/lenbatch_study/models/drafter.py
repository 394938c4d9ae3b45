"""A DFlash-style block-diffusion drafter trained on the frozen target's features.

Structure (one step, ``S`` sequences, ``A`` anchors each, block size ``b`` = 16):

* **context**: the target's hidden states at ``model.target_layers``, concatenated
  (``F = len(target_layers) * hidden``) -> ``Linear(F, H)`` -> RMSNorm.
* **blocks**: at anchor ``a`` (a position of a sequence), the block input is
  ``[embed(x_a), MASK, ..., MASK]`` (``b`` positions, ``embed`` = the target's frozen
  embedding, ``MASK`` a learned vector), at positions ``a .. a+b-1``.
* **layers**: pre-norm decoder layers. A block's queries attend to the context at the
  positions ``< a`` of *its own* sequence and to its own ``b`` positions in both
  directions (keys/values of the context and of the block go through the same
  k/v projections; RoPE on absolute in-sequence positions).
* **loss**: the block's output at offset ``k = 1..b-1`` goes through the target's frozen
  ``lm_head`` and predicts ``x_{a+k}``; cross-entropy weighted ``w_k = exp(-(k-1)/gamma)``,
  only where ``a+k`` is inside the sequence and inside its loss mask;
  ``loss = sum(w * ce) / sum(w)`` over the batch (the weights actually used).

Anchors: ``A`` per sequence, without replacement among the valid positions
``{a : a+1 < len, loss_mask[a+1]}`` (the first predicted token is a trained token),
drawn from ``numpy.random.default_rng([seed, epoch, step, dataset_index])``: a resumed
run, and the same sequences packed or padded, draw the same anchors. A sequence with
fewer valid positions gets fewer blocks (counted in :class:`DrafterOutput`).

Widths: hidden ``H = model.hidden_size`` (the target's, since its embedding and lm_head are
reused), MLP width ``model.intermediate_size``, ``drafter.num_heads`` heads of ``H / heads``.

Cost. Context: projected (``ctx_proj``, then each layer's k/v) once per token of the batch's
layout (``B*T`` tokens, padding included, as in the target). Attention: each sequence's
window is its first ``Lc = max anchor of the step`` positions (gathered), so a block sees keys
``[Lc + A*b]`` under a boolean mask ``[S, A*b, Lc + A*b]``: ``O(S * A * b * (Lc + A*b))`` per
layer, never ``(total tokens)^2`` for a packed row, and no context cap. lm_head: the frozen
``[V, H]`` matrix costs ``2 * N * H * V`` flops forward and the same again for its input
gradient, ``N <= S * A * (b-1)`` trained positions; with V = 248,320 it dominates a small
drafter (about 30 ms per block on one CPU core at H = 128), hence a moderate
``anchors_per_seq``. The cross-entropy is computed in chunks of ``CE_CHUNK_ROWS`` = 128 rows
(:class:`ChunkedLinearCrossEntropy`) so the ``[N, V]`` logits never exist at once; each chunk
reads the whole ``[V, H]`` matrix twice (logits, then the input gradient), a cost per chunk
(``ceil(N / 128)`` of them) beside the cost per row: on one CPU core at H = 128, about 18 ms per
chunk against 3 ms per row (``benchmarks/bench_lm_chunks.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lenbatch_study.models.anchors import CE_CHUNK_ROWS, draw_anchors
from lenbatch.loading.collate import Batch


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (half-split convention) of ``x [..., L, heads, d]`` at ``pos [..., L]``."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.to(torch.float32)[..., None] * inv  # [..., L, d/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[..., None, :].to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1)[..., None, :].to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class DrafterLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int, theta: float) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(
                f"drafter.num_heads={heads} does not divide model.hidden_size={hidden}; "
                "pick a divisor of the hidden size"
            )
        self.heads, self.head_dim, self.theta = heads, hidden // heads, theta
        self.attn_norm = RMSNorm(hidden)
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.mlp_norm = RMSNorm(hidden)
        self.gate = nn.Linear(hidden, intermediate, bias=False)
        self.up = nn.Linear(hidden, intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def forward(
        self,
        h: torch.Tensor,
        ctx_row: torch.Tensor,
        pos_row: torch.Tensor,
        ctx_idx: tuple[torch.Tensor, ...],
        blk_pos: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """``h [S, N, H]`` block states (N = A*b); ``ctx_row [B, T, H]`` the context in the batch's layout,
        ``pos_row [B, T]`` its in-sequence positions; ``ctx_idx`` (rows, cols) ``[S, Lc]`` picks each
        sequence's context window; ``blk_pos [S, N]``; ``mask [S, 1, N, Lc + N]``.

        Context keys/values are projected once per token of the row (cost ``B*T*H*H``, the
        layout's computed tokens), then each sequence's window is gathered: a packed row never
        pays for ``S`` windows of projections.
        """
        S, N, H = h.shape
        B, T, _ = ctx_row.shape
        x = self.attn_norm(h)
        q = _rope(self.q_proj(x).view(S, N, self.heads, self.head_dim), blk_pos, self.theta)
        k_blk = _rope(self.k_proj(x).view(S, N, self.heads, self.head_dim), blk_pos, self.theta)
        v_blk = self.v_proj(x).view(S, N, self.heads, self.head_dim)
        k_row = _rope(self.k_proj(ctx_row).view(B, T, self.heads, self.head_dim), pos_row, self.theta)
        v_row = self.v_proj(ctx_row).view(B, T, self.heads, self.head_dim)
        k = torch.cat([k_row[ctx_idx], k_blk], 1)  # context keys first, then the blocks' own keys
        v = torch.cat([v_row[ctx_idx], v_blk], 1)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        h = h + self.o_proj(o.transpose(1, 2).reshape(S, N, H))
        x = self.mlp_norm(h)
        return h + self.down(F.silu(self.gate(x)) * self.up(x))


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """``sum_i w_i * CE(h_i @ W^T, y_i)`` with the gradient w.r.t. ``h`` computed chunk by chunk.

    ``W`` (the frozen lm_head, ``[V, H]``) gets no gradient. Forward does both matmuls
    (``2 * 2 * N * H * V`` flops) and keeps only ``grad_h [N, H]``; memory ``O(chunk * V)``.
    """

    @staticmethod
    def forward(
        ctx,
        h: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,  # type: ignore[override]
        w: torch.Tensor,
    ) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        grad_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        for lo in range(0, h.shape[0], CE_CHUNK_ROWS):
            hi = min(lo + CE_CHUNK_ROWS, h.shape[0])
            logits = (h[lo:hi] @ weight.T).float()
            logp = torch.log_softmax(logits, -1)
            del logits
            tgt = targets[lo:hi]
            wc = w[lo:hi].float()
            total = total + (-(logp.gather(1, tgt[:, None])[:, 0]) * wc).sum()
            if grad_h is not None:
                p = logp.exp_()  # softmax, in place
                p[torch.arange(hi - lo, device=h.device), tgt] -= 1.0
                p.mul_(wc[:, None])
                grad_h[lo:hi] = (p.to(weight.dtype) @ weight).to(h.dtype)
        ctx.save_for_backward(grad_h if grad_h is not None else torch.empty(0))
        return total

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        (grad_h,) = ctx.saved_tensors
        return grad_h * grad_out.to(grad_h.dtype), None, None, None


@dataclass
class DrafterOutput:
    loss: torch.Tensor  # scalar, sum(w * ce) / sum(w)
    weight_sum: float  # sum of the loss weights used
    positions: int  # trained (sequence, offset) positions that went through the lm_head
    blocks: int  # blocks drawn
    sequences_without_anchor: int


class Drafter(nn.Module):
    """Trainable part of the drafter; the target's ``embed_tokens`` and ``lm_head`` are passed in, frozen.

    ``head_classes``: also a trainable output head ``Linear(H, head_classes)`` (``self.head``, created
    last, so the other weights draw the same initial values with or without it), for objectives other
    than the target's vocabulary (the quality stage's draft vocabulary: :meth:`trained_positions`
    gives it the same trained positions, targets and weights as :meth:`forward`).
    """

    def __init__(
        self,
        *,
        feature_dim: int,
        hidden_size: int,
        intermediate_size: int,
        num_layers: int,
        num_heads: int,
        block_size: int,
        gamma: float,
        rope_theta: float = 10000.0,
        head_classes: int | None = None,
    ) -> None:
        super().__init__()
        self.block_size, self.gamma = block_size, gamma
        self.ctx_proj = nn.Linear(feature_dim, hidden_size, bias=False)
        self.ctx_norm = RMSNorm(hidden_size)
        self.mask_embedding = nn.Parameter(torch.randn(hidden_size) * 0.02)
        self.layers = nn.ModuleList(
            DrafterLayer(hidden_size, num_heads, intermediate_size, rope_theta) for _ in range(num_layers)
        )
        self.final_norm = RMSNorm(hidden_size)
        self.head = nn.Linear(hidden_size, head_classes, bias=False) if head_classes else None

    # ------------------------------------------------------------------ anchors
    def anchors_for(
        self, batch: Batch, *, anchors_per_seq: int, seed: int, epoch: int, step: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Anchors ``[S, A]`` (int64, in-sequence positions) and their validity ``[S, A]`` (bool), on CPU."""
        rows, starts = batch.seq_rows_starts()
        lm = batch.loss_mask.cpu().numpy()
        lengths = batch.lengths.cpu().numpy()
        ids = batch.indices.cpu().numpy()
        S = len(lengths)
        anchors = np.zeros((S, anchors_per_seq), dtype=np.int64)
        valid = np.zeros((S, anchors_per_seq), dtype=bool)
        for s in range(S):
            r, st, n = int(rows[s]), int(starts[s]), int(lengths[s])
            a = draw_anchors(
                lm[r, st : st + n], n, num=anchors_per_seq, seed=seed, epoch=epoch, step=step, seq_id=int(ids[s])
            )
            anchors[s, : a.size] = a
            valid[s, : a.size] = True
        return torch.from_numpy(anchors), torch.from_numpy(valid)

    # ------------------------------------------------------------------ forward
    def block_states(
        self, features: torch.Tensor, batch: Batch, anchors: torch.Tensor, *, embed_tokens: nn.Module
    ) -> torch.Tensor:
        """Final (normed) hidden states of every block: ``[S, A, b, H]``.

        ``features`` is ``[B, T, F]`` in the batch's layout (padded or packed); ``anchors``
        ``[S, A]`` are in-sequence positions (invalid anchors may hold any position < length).
        """
        dev = features.device
        b = self.block_size
        rows, starts = (t.to(dev) for t in batch.seq_rows_starts())
        anchors = anchors.to(dev)
        S, A = anchors.shape
        T = features.shape[1]
        Lc = max(int(anchors.max()), 1)  # context positions any block of this step can see
        # context in the batch's layout; each sequence's window = its first Lc positions
        # (indices past the sequence are clamped, and masked below)
        ctx_row = self.ctx_norm(self.ctx_proj(features))  # [B, T, H]
        cols = (starts[:, None] + torch.arange(Lc, device=dev)[None]).clamp_max(T - 1)  # [S, Lc]
        ctx_idx = (rows[:, None].expand_as(cols), cols)
        pos_row = batch.position_ids.to(dev)
        offs = torch.arange(b, device=dev)
        blk_pos = (anchors[:, :, None] + offs).reshape(S, A * b)  # in-sequence positions
        anchor_tok = batch.input_ids.to(dev)[rows[:, None], starts[:, None] + anchors]  # [S, A]
        with torch.no_grad():
            anchor_emb = embed_tokens(anchor_tok)  # frozen
        h = self.mask_embedding.to(anchor_emb.dtype).expand(S, A, b, -1).clone()
        h[:, :, 0] = anchor_emb
        h = h.reshape(S, A * b, -1)
        mask = block_attention_mask(anchors, Lc, b)[:, None]
        for layer in self.layers:
            h = layer(h, ctx_row, pos_row, ctx_idx, blk_pos, mask)
        return self.final_norm(h).view(S, A, b, -1)

    def forward(
        self,
        features: torch.Tensor,
        batch: Batch,
        anchors: torch.Tensor,
        valid: torch.Tensor,
        *,
        embed_tokens: nn.Module,
        lm_head: nn.Module,
    ) -> DrafterOutput:
        """Weighted block cross-entropy of one batch (formula in the module doc).

        ``anchors``/``valid`` come from :meth:`anchors_for`.
        """
        h = self.block_states(features, batch, anchors, embed_tokens=embed_tokens)
        hid, tok, w = self.trained_positions(h, batch, anchors, valid)
        wsum = w.sum()
        if hid.shape[0] == 0:
            loss = h.sum() * 0.0  # no trained position: a zero loss that still has a graph
        else:
            loss = ChunkedLinearCrossEntropy.apply(hid, lm_head.weight, tok, w) / wsum
        valid = valid.to(features.device)
        return DrafterOutput(
            loss=loss,
            weight_sum=float(wsum),
            positions=int(hid.shape[0]),
            blocks=int(valid.sum()),
            sequences_without_anchor=int((~valid.any(1)).sum()),
        )

    def trained_positions(
        self, h: torch.Tensor, batch: Batch, anchors: torch.Tensor, valid: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What the loss trains, from the block states ``h [S, A, b, H]`` (:meth:`block_states`):
        ``(states [N, H], target tokens [N], weights [N])`` of every block offset ``k = 1..b-1`` whose
        target ``a+k`` is inside its sequence and its loss mask (valid anchors only), weights
        ``exp(-(k-1)/gamma)``; ``N`` = the trained positions. O(S * A * b) gathers.
        """
        dev = h.device
        rows, starts = (t.to(dev) for t in batch.seq_rows_starts())
        lengths = batch.lengths.to(dev)
        anchors, valid = anchors.to(dev), valid.to(dev)
        T = batch.input_ids.shape[1]
        offs = torch.arange(1, self.block_size, device=dev)
        tgt_pos = anchors[:, :, None] + offs  # [S, A, b-1] in-sequence positions of the targets
        inside = (tgt_pos < lengths[:, None, None]) & valid[:, :, None]
        flat = (starts[:, None, None] + tgt_pos).clamp_max(T - 1)
        tok = batch.input_ids.to(dev)[rows[:, None, None], flat]
        use = inside & batch.loss_mask.to(dev)[rows[:, None, None], flat]
        wk = torch.exp(-(offs.to(torch.float32) - 1.0) / self.gamma)  # [b-1]
        sel = use.nonzero(as_tuple=True)
        return h[:, :, 1:][sel], tok[sel], wk[sel[2]]


def block_attention_mask(anchors: torch.Tensor, context_len: int, block_size: int) -> torch.Tensor:
    """Boolean mask ``[S, A*b, Lc + A*b]`` (True = attend): query of block ``j`` sees context
    positions ``< anchors[s, j]`` and the ``b`` positions of block ``j``, nothing else."""
    S, A = anchors.shape
    dev = anchors.device
    blk_of = torch.arange(A * block_size, device=dev) // block_size
    ctx_ok = torch.arange(context_len, device=dev)[None, None, :] < anchors[:, blk_of, None]  # [S, A*b, Lc]
    own = (blk_of[:, None] == blk_of[None, :]).expand(S, -1, -1)
    return torch.cat([ctx_ok, own], -1)


def build_drafter(
    params,
    *,
    device: str | torch.device = "cpu",
    init_seed: int | None = None,
    dtype: str | None = None,
    head_classes: int | None = None,
) -> Drafter:
    """The drafter for ``params`` (sections model and drafter), its weights drawn from torch seed
    ``init_seed`` (default ``model.init_seed + 1``; the global RNG is left as it was), in ``dtype``
    (default ``model.dtype``), with a trainable head of ``head_classes`` classes when given."""
    m, d = params.model, params.drafter
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(m.init_seed + 1 if init_seed is None else init_seed)
    try:
        drafter = Drafter(
            feature_dim=len(m.target_layers) * m.hidden_size,
            hidden_size=m.hidden_size,
            intermediate_size=m.intermediate_size,
            num_layers=d.num_layers,
            num_heads=d.num_heads,
            block_size=d.block_size,
            gamma=d.gamma,
            head_classes=head_classes,
        )
    finally:
        torch.random.set_rng_state(gen_state)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype or m.dtype]
    return drafter.to(device=device, dtype=torch_dtype)
