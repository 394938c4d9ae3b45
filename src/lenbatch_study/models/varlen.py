"""Variable-length (sequence-boundary-aware) kernels for Qwen3.5 layers.

Not the ``packed`` batching strategy (that is :mod:`lenbatch.batching.strategies`): this module makes a
row of several sequences compute as if each ran alone. ``lenbatch verify-packing`` (the check
that it does) lives in :mod:`lenbatch_study.models.verify`.

Why this module exists (measured with transformers 5.24.0, torch 2.13 CPU; see
``tests/models/test_packing.py::test_hf_fallback_leaks_or_refuses``): given a packed row of
sequences with only restarting ``position_ids``, Hugging Face's ``Qwen3_5TextModel``
keeps the full-attention layers apart (``find_packed_sequence_indices`` turns the
position ids into a block-diagonal mask -- a dense [N, N] mask, 268 MB for a 16,384-token
row) but its Gated DeltaNet layers do not: the torch fallback
``torch_chunk_gated_delta_rule`` carries the recurrent state, and ``causal_conv1d_fn``
(a plain ``F.conv1d``) its K-1 taps, from one sequence into the next. The final
(normed, O(1)-scale) hidden states of the second and third sequences then differ from
their stand-alone forwards by 1.18 and 0.99 (tiny config, lenbatch's seeded weights,
sequences of 5, 17, 30 tokens; the first sequence: 1.1e-6), against 1.7e-6 with this
module's path.
Given ``cu_seq_lens_q`` (the flash-attention varlen kwargs) the fallback refuses:
``ValueError: `chunk_gated_delta_rule` can't keep packed sequences apart without
`flash-linear-attention``. Even with ``fla`` installed the HF path hands
``cu_seq_lens_q`` to the conv only under a name it drops, so the conv taps leak
unless the ``causal_conv1d`` package honours ``seq_idx`` -- which HF never passes.

What this module does instead: the real ``transformers`` modules, with their weights
and names, get a boundary-aware forward (a class swap, :func:`make_boundary_aware`;
without boundaries the Hugging Face forward runs unchanged):

* short causal depthwise conv (:func:`causal_conv`): the K taps as K shifted fused
  multiply-adds over the row; then the first K-1 outputs of every sequence after the
  first (the only ones whose window crosses a start) are recomputed from their own
  sequence alone and overwritten, so no output uses a tap across a boundary.
  Cost O(N * channels * K) + O(S * K^2 * channels).
* gated delta rule (:func:`chunk_gated_delta_rule`): the chunked (WY / UT-transform)
  algorithm with no chunk crossing a sequence: each sequence is padded internally to a
  multiple of the chunk size (32 on CPU), chunks are laid out chunk-major with sequences
  sorted by chunk count, and the inter-chunk scan starts every sequence from a zero
  state (the active sequences at scan step j are a prefix). Everything intra-chunk is
  one batched computation over all chunks. Cost O(N * C * d) + O(#chunks * d^2),
  max-chunks-per-sequence sequential steps; never a T x T matrix.
* full attention (:func:`varlen_attention`): SDPA (causal) on each sequence of a packed
  row; a padded batch is one batched causal SDPA (right padding never reaches a real
  query). Cost sum L_i^2 (packed) vs B * T^2 (padded); never a row-by-row mask.

A padded batch [B, T] goes through the same three kernels as a packed row (its rows
are B sequences of length T, padding included: the cost of padding is paid, as on a
GPU), so throughput differences between layouts come from the layout alone.

On CUDA with ``flash-linear-attention`` (>= 0.5: grouped value heads handled by the kernel,
no repeated q/k) installed, the default ``auto`` kernels run fla's
``chunk_gated_delta_rule(..., cu_seqlens=...)`` in bf16/fp16 (fp32 uses the torch path above,
on the GPU) and the conv fla's ``causal_conv1d(x [B, T, D], weight [D, K], activation="silu",
cu_seqlens=...)`` (when its signature is the seq-first one; else the shift conv above, which is
exact and memory-bound); both get every layout as one row with ``cu_seqlens`` (a padded [B, T]
batch: boundaries at multiples of T), and a CUDA run never falls back to the torch path unasked
(:mod:`lenbatch_study.models.kernels`, ``train.kernels``). ``lenbatch verify-packing --backend {auto,torch,fla}`` checks the chosen
kernels against the Hugging Face per-sequence forward, whose Gated DeltaNet stays transformers'
torch code whatever is installed (:func:`torch_reference_kernels`). ``--backend fla`` on CPU runs
fla's kernels under Triton's interpreter in fp32 (:mod:`lenbatch_study.models.fla_cpu`); fp32 on a GPU sets
``TRITON_F32_DEFAULT=ieee`` and forces fla's explicitly-TF32 triangular solve to IEEE
(:func:`lenbatch_study.models.fla_cpu.force_ieee_solve`); bf16 is judged by ``--rtol``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from lenbatch_study.models.kernels import (  # noqa: F401 (re-exported: verify-packing, the CLI, tests)
    KERNEL_BACKENDS,
    _fla_chunk,
    _fla_conv,
    _fla_gated_delta_rule,
    backend_name,
    fla_problem,
    select_kernels,
    set_kernel_backend,
    use_fla,
)

ATTN_IMPLEMENTATION = "lenbatch_varlen"
CHUNK_SIZE = 32  # tokens per chunk of the CPU gated delta rule (fla uses 64; the result is the same)
_BLOCK_TOKENS = 1024  # tokens per phase-1 block: keeps the [C, C] intermediates in cache
LAYER_TYPES = ("linear_attention", "full_attention")


# --------------------------------------------------------------------------- sequence layout


@dataclass(eq=False)
class Segments:
    """Where the sequences are in a batch: the one object every boundary-aware layer reads.

    ``layout`` "padded": ``batch`` rows of ``seq_len``, each row one sequence (computed in
    full, padding included). "packed": one row of ``seq_len`` tokens holding
    ``len(lengths)`` sequences back to back. ``starts``/``lengths`` index the flattened
    ``batch * seq_len`` tokens. ``boundaries=False`` (packed only) treats the row as one
    sequence while positions still restart: the deliberately wrong forward.
    """

    layout: str
    batch: int
    seq_len: int
    starts: tuple[int, ...]
    lengths: tuple[int, ...]
    position_ids: torch.Tensor  # [batch, seq_len] int64, restarting at every sequence
    boundaries: bool = True
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False)

    @property
    def device(self) -> torch.device:
        return self.position_ids.device

    @property
    def num_tokens(self) -> int:
        return self.batch * self.seq_len

    def cu_seqlens(self) -> torch.Tensor:
        """int64 [S+1] over the flattened tokens (what fla's varlen kernels take)."""
        if "cu" not in self._cache:
            cu = [0, *np.cumsum(self.lengths).tolist()]
            self._cache["cu"] = torch.tensor(cu, dtype=torch.int64, device=self.device)
        return self._cache["cu"]

    def conv_fixups(self, kernel: int) -> tuple[torch.Tensor, ...] | None:
        """Tokens whose conv window would cross a sequence start, and their in-sequence taps.

        Returns (tok [P], src [P, K], tap [K], valid [P, K]): output token ``tok[p]`` is
        ``sum_j w[:, K-1-j] * x[src[p, j]]`` over ``valid[p, j]`` (position in sequence >= j);
        None when no window crosses (one sequence, or K = 1). P <= (S - 1) * (K - 1).
        """
        key = ("conv", kernel)
        if key not in self._cache:
            starts = np.asarray(self.starts[1:], dtype=np.int64)
            lengths = np.asarray(self.lengths[1:], dtype=np.int64)
            offs = np.arange(kernel - 1, dtype=np.int64)
            tok = (starts[:, None] + offs[None, :])[offs[None, :] < lengths[:, None]]
            if tok.size == 0:
                self._cache[key] = None
            else:
                pos = self.position_ids.reshape(-1).cpu().numpy()[tok]
                j = np.arange(kernel, dtype=np.int64)
                valid = j[None, :] <= pos[:, None]
                src = np.where(valid, tok[:, None] - j[None, :], 0)
                tap = kernel - 1 - j  # weight column of tap j
                self._cache[key] = tuple(torch.from_numpy(a).to(self.device) for a in (tok, src, tap, valid))
        return self._cache[key]

    def chunk_plan(self, chunk: int) -> "ChunkPlan":
        key = ("chunks", chunk)
        if key not in self._cache:
            self._cache[key] = ChunkPlan.build(self.starts, self.lengths, chunk, self.num_tokens, self.device)
        return self._cache[key]


def make_segments(
    input_ids: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    boundaries: bool = True,
    device: torch.device | str | None = None,
) -> Segments:
    """Validate a padded ([B, T] + mask) or packed ([1, N] + cu_seqlens) batch -> :class:`Segments`."""
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be 2-D [batch, tokens], got shape {tuple(input_ids.shape)}")
    device = torch.device(device) if device is not None else input_ids.device
    batch, seq_len = (int(s) for s in input_ids.shape)
    if seq_len == 0:
        raise ValueError("input_ids has no tokens; pass at least one token per sequence")
    if attention_mask is not None and cu_seqlens is not None:
        raise ValueError("pass attention_mask (padded layout) or cu_seqlens (packed layout), not both")
    if cu_seqlens is None:
        if attention_mask is not None:
            if tuple(attention_mask.shape) != (batch, seq_len):
                raise ValueError(
                    f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape "
                    f"{(batch, seq_len)}; give one 0/1 entry per token"
                )
            m = attention_mask.to("cpu")
            if not bool(((m == 0) | (m == 1)).all()):
                raise ValueError("attention_mask must hold only 0 (padding) and 1 (token)")
            if bool((m[:, 1:] > m[:, :-1]).any()):
                raise ValueError(
                    "attention_mask is not right-padded (a token follows padding); put the padding "
                    "at the end of each row (tokenizer padding_side='right')"
                )
            if bool((m[:, 0] == 0).any()):
                raise ValueError("attention_mask has an empty row; drop rows without tokens")
        pos = torch.arange(seq_len, device=device).unsqueeze(0).expand(batch, seq_len)
        return Segments("padded", batch, seq_len, tuple(i * seq_len for i in range(batch)), (seq_len,) * batch, pos)
    cu = torch.as_tensor(cu_seqlens).to("cpu")
    if cu.ndim != 1 or cu.numel() < 2 or cu.dtype.is_floating_point:
        raise ValueError(
            f"cu_seqlens must be a 1-D integer tensor [0, end_1, ..., N], got {cu.dtype} shape {tuple(cu.shape)}"
        )
    if batch != 1:
        raise ValueError(
            f"a packed batch has one row: input_ids must be [1, N], got {tuple(input_ids.shape)}; "
            "flatten the rows or pass attention_mask for a padded batch"
        )
    cu_list = [int(x) for x in cu.tolist()]
    lengths = np.diff(cu_list)
    if cu_list[0] != 0 or cu_list[-1] != seq_len or (lengths <= 0).any():
        raise ValueError(
            f"cu_seqlens {cu_list[:6]}{'...' if len(cu_list) > 6 else ''} is inconsistent with "
            f"input length {seq_len}: it must start at 0, increase strictly (every sequence "
            f"non-empty) and end at {seq_len}"
        )
    pos = torch.from_numpy(np.arange(seq_len) - np.repeat(np.asarray(cu_list[:-1]), lengths)).to(device)
    pos = pos.unsqueeze(0)
    if not boundaries:
        return Segments("packed", 1, seq_len, (0,), (seq_len,), pos, boundaries=False)
    return Segments("packed", 1, seq_len, tuple(cu_list[:-1]), tuple(int(x) for x in lengths), pos)


@dataclass(eq=False)
class ChunkPlan:
    """Chunk-major layout of the sequences for the gated delta rule (no chunk crosses a boundary).

    Sequences sorted by chunk count (descending); chunk j of every sequence that has one is
    at ``offsets[j] : offsets[j] + active[j]``, so at scan step j the live states are a prefix.
    ``gather`` maps layout slots to tokens (N = the appended zero row for in-chunk padding);
    ``inverse`` maps each token back to its slot.
    """

    chunk: int
    num_chunks: int
    active: tuple[int, ...]
    offsets: tuple[int, ...]
    gather: torch.Tensor  # [num_chunks * chunk] int64 in 0..N
    inverse: torch.Tensor  # [N] int64

    @classmethod
    def build(
        cls, starts: tuple[int, ...], lengths: tuple[int, ...], chunk: int, num_tokens: int, device: torch.device
    ) -> "ChunkPlan":
        starts_a = np.asarray(starts, dtype=np.int64)
        lengths_a = np.asarray(lengths, dtype=np.int64)
        nch = -(-lengths_a // chunk)
        order = np.argsort(-nch, kind="stable")
        max_nc = int(nch.max())
        active = [int((nch > j).sum()) for j in range(max_nc)]
        seq = np.concatenate([order[:a] for a in active])
        step = np.concatenate([np.full(a, j, dtype=np.int64) for j, a in enumerate(active)])
        tok = (starts_a[seq] + step * chunk)[:, None] + np.arange(chunk)[None, :]
        valid = tok < (starts_a + lengths_a)[seq][:, None]
        gather = np.where(valid, tok, num_tokens).ravel()
        inverse = np.empty(num_tokens, dtype=np.int64)
        inverse[tok[valid]] = np.flatnonzero(valid.ravel())
        assert int(valid.sum()) == num_tokens, "every token must land in exactly one chunk slot"
        offsets = tuple(int(x) for x in np.concatenate([[0], np.cumsum(active)]))
        return cls(
            chunk,
            len(seq),
            tuple(active),
            offsets,
            torch.from_numpy(gather).to(device),
            torch.from_numpy(inverse).to(device),
        )


# --------------------------------------------------------------------------- the three kernels


def causal_conv(x: torch.Tensor, weight: torch.Tensor, segs: Segments, *, activation: bool = True) -> torch.Tensor:
    """Causal depthwise conv that stops at sequence starts: ``y[t] = sum_j w[:, K-1-j] * x[t-j]``.

    ``x`` [B, T, C] (channels last), ``weight`` [C, K]; taps reading before the start of
    the token's sequence contribute 0 (the zero left-padding of a stand-alone forward).
    SiLU applied when ``activation``. Cost: K multiply-adds per element.
    """
    fla_conv = _fla_conv() if use_fla(x) else None
    if fla_conv is not None:  # one row with cu_seqlens, as the gated delta rule (_fla_gated_delta_rule)
        y = fla_conv(
            x=x.reshape(1, -1, x.shape[-1]),
            weight=weight.to(x.dtype),
            bias=None,
            activation="silu" if activation else None,
            cu_seqlens=segs.cu_seqlens(),
        )
        y = y[0] if isinstance(y, tuple) else y
        return y.reshape(x.shape)
    kernel = weight.shape[1]
    w = weight.to(x.dtype)
    out = x * w[:, kernel - 1]
    for j in range(1, min(kernel, x.shape[1])):  # one fused multiply-add per tap over the whole batch
        out[:, j:].addcmul_(x[:, :-j], w[:, kernel - 1 - j])
    fix = segs.conv_fixups(kernel) if segs.layout == "packed" else None
    if fix is not None:
        # The first K-1 tokens of every sequence but the first took taps from the previous
        # sequence above: recompute those few outputs from their own sequence only and overwrite.
        tok, src, tap, valid = fix  # [P], [P, K], [K], [P, K]
        taps = x[0].index_select(0, src.reshape(-1)).view(*src.shape, -1)  # [P, K, C]
        vals = (taps * valid.to(x.dtype).unsqueeze(-1) * w.t()[tap].unsqueeze(0)).sum(dim=1)
        out[0].index_copy_(0, tok, vals)
    return F.silu(out) if activation else out


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)  # the formula HF and fla use


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    segs: Segments,
    *,
    chunk: int = CHUNK_SIZE,
) -> torch.Tensor:
    """Gated delta rule over the sequences of ``segs``, state reset at every sequence start.

    ``q, k`` [B, T, Hk, Dk], ``v`` [B, T, Hv, Dv], ``g`` (log decay, <= 0) and ``beta``
    [B, T, Hv]; q and k are L2-normalised here and q scaled by Dk^-1/2 (as HF's
    ``use_qk_l2norm_in_kernel=True``). Per sequence, with S_0 = 0:
    S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T) + beta_t k_t v_t^T,  o_t = S_t^T q_t.
    Returns [B, T, Hv, Dv] in v's dtype; computed in fp32 (torch) or by fla on CUDA.
    """
    if use_fla(q):
        return _fla_gated_delta_rule(q, k, v, g, beta, segs)
    out_dtype = v.dtype
    batch, seq_len, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    n_tok = batch * seq_len
    plan = segs.chunk_plan(chunk)
    n, c = plan.num_chunks, chunk

    q = _l2norm(q.float()) * dk**-0.5
    k = _l2norm(k.float())
    if hv != hk:  # grouped value heads: value head h reads key head h // (hv // hk)
        q = q.repeat_interleave(hv // hk, dim=2)
        k = k.repeat_interleave(hv // hk, dim=2)
    # One token table [N + 1, H, Dk | Dk | Dv | g | beta]; row N is the zero row that in-chunk
    # padding slots read (k = v = beta = 0 and g = 0: they neither write nor decay the state).
    table = torch.empty(n_tok + 1, hv, 2 * dk + dv + 2, dtype=torch.float32, device=q.device)
    table[n_tok] = 0.0
    table[:n_tok, :, :dk] = q.reshape(n_tok, hv, dk)
    table[:n_tok, :, dk : 2 * dk] = k.reshape(n_tok, hv, dk)
    table[:n_tok, :, 2 * dk : 2 * dk + dv] = v.reshape(n_tok, hv, dv)
    table[:n_tok, :, -2] = g.reshape(n_tok, hv)
    table[:n_tok, :, -1] = beta.reshape(n_tok, hv)
    del q, k, v, g, beta

    # Phase 1, per block of chunks (cache-sized: the [C, C] intermediates stay in cache), for
    # every chunk independently: the UT transform and the within-chunk attention.
    base = torch.empty(n, hv, c, dv, dtype=torch.float32, device=table.device)  # intra @ u
    reads = torch.empty(n, hv, 2 * c, dk, dtype=torch.float32, device=table.device)  # [w ; q~]: rows that read S
    u_all = torch.empty(n, hv, c, dv, dtype=torch.float32, device=table.device)
    k_upd = torch.empty(n, hv, dk, c, dtype=torch.float32, device=table.device)  # decayed keys^T: write S
    chunk_decay = torch.empty(n, hv, 1, 1, dtype=torch.float32, device=table.device)
    lower = torch.ones(c, c, dtype=torch.bool, device=table.device).tril()
    block = max(1, _BLOCK_TOKENS // c)
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        x = table.index_select(0, plan.gather[lo * c : hi * c]).view(hi - lo, c, hv, -1)
        x = x.transpose(1, 2).contiguous()  # [b, H, C, features]: one copy, then dense batched matmuls
        qc, kc, vc = x[..., :dk], x[..., dk : 2 * dk], x[..., 2 * dk : 2 * dk + dv]
        cum = x[..., -2].cumsum(dim=-1)  # [b, H, C] log decay from the chunk start
        beta = x[..., -1:]
        decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill_(~lower, float("-inf")).exp_()
        k_beta = kc * beta
        # UT transform: (I + strict_lower(beta K K^T * decay)) [u | w] = [beta V | beta K exp(cum)]
        system = (k_beta @ kc.transpose(-1, -2)).mul_(decay)
        ecum = cum.exp().unsqueeze(-1)
        sol = torch.linalg.solve_triangular(
            system, torch.cat([vc * beta, k_beta * ecum], dim=-1), upper=False, unitriangular=True
        )
        u, w = sol[..., :dv], sol[..., dv:]
        intra = (qc @ kc.transpose(-1, -2)).mul_(decay)  # causal within the chunk, diagonal included
        # o = intra @ (u - w S) + q exp(cum) S = intra @ u + (q exp(cum) - intra @ w) S
        torch.matmul(intra, u, out=base[lo:hi])
        reads[lo:hi, :, :c] = w
        reads[lo:hi, :, c:] = qc * ecum - intra @ w
        u_all[lo:hi] = u
        k_upd[lo:hi] = (kc * (cum[..., -1:] - cum).exp().unsqueeze(-1)).transpose(-1, -2)
        chunk_decay[lo:hi] = cum[..., -1:].exp().unsqueeze(-1)
    del table

    # Phase 2: the scan over chunk index, batched over the live sequences (a prefix), every
    # sequence starting from S = 0. Output written token-major [n, C, H, Dv].
    out = torch.empty(n, c, hv, dv, dtype=torch.float32, device=base.device)
    state = torch.zeros(plan.active[0], hv, dk, dv, dtype=torch.float32, device=base.device)
    for j, a in enumerate(plan.active):
        lo, hi = plan.offsets[j], plan.offsets[j] + a
        state = state[:a]
        r = reads[lo:hi] @ state
        out[lo:hi] = (base[lo:hi] + r[:, :, c:]).transpose(1, 2)
        if j + 1 < len(plan.active):
            state = torch.baddbmm(
                state.mul_(chunk_decay[lo:hi]).view(a * hv, dk, dv),
                k_upd[lo:hi].view(a * hv, dk, c),
                (u_all[lo:hi] - r[:, :, :c]).reshape(a * hv, c, dv),
            ).view(a, hv, dk, dv)
    out = out.view(n * c, hv, dv).index_select(0, plan.inverse)
    return out.view(batch, seq_len, hv, dv).to(out_dtype)


def varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention interface ``lenbatch_varlen``: causal SDPA per sequence; plain HF sdpa otherwise.

    ``query`` [B, Hq, T, D], ``key``/``value`` [B, Hkv, T, D] -> ([B, T, Hq, D], None).
    """
    segs: Segments | None = kwargs.get("lenbatch_segments")
    if segs is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    if key.shape[1] != query.shape[1]:  # GQA: explicit repeat (portable across SDPA backends)
        rep = query.shape[1] // key.shape[1]
        key = key.repeat_interleave(rep, dim=1)
        value = value.repeat_interleave(rep, dim=1)
    if segs.layout == "padded" or len(segs.lengths) == 1:
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling)
    else:
        out = torch.empty_like(query)
        for start, length in zip(segs.starts, segs.lengths):
            sl = slice(start, start + length)
            out[:, :, sl] = F.scaled_dot_product_attention(
                query[:, :, sl], key[:, :, sl], value[:, :, sl], is_causal=True, scale=scaling
            )
    return out.transpose(1, 2).contiguous(), None


# --------------------------------------------------------------------------- the torch reference

HF_KERNEL_NAMES = (
    "torch_chunk_gated_delta_rule",
    "torch_recurrent_gated_delta_rule",
    "causal_conv1d_fn",
    "causal_conv1d_update",
)


@contextlib.contextmanager
def torch_reference_kernels() -> Iterator[None]:
    """Within the block, transformers' Qwen3.5 Gated DeltaNet runs its own torch kernels.

    transformers 5.24 wraps ``torch_chunk_gated_delta_rule`` & co. at import: when
    flash-linear-attention (or ``causal_conv1d``) is importable the module-level names call
    those packages instead, on every device. verify-packing's reference must stay independent of
    the kernels under test (and a CPU machine with fla installed has no driver for it), so the
    block points those names at the undecorated torch functions (``inspect.unwrap``) and
    restores them after. Not thread-safe (module globals); cost: four attribute swaps.
    """
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    saved = {name: getattr(hf, name) for name in HF_KERNEL_NAMES}
    try:
        for name, fn in saved.items():
            plain = inspect.unwrap(fn)
            assert plain.__code__.co_filename == hf.__file__, f"{name} did not unwrap to transformers' own"
            setattr(hf, name, plain)
        yield
    finally:
        for name, fn in saved.items():
            setattr(hf, name, fn)


# --------------------------------------------------------------------------- hooking the HF modules


@functools.cache
def register_attention() -> None:
    """Register ``lenbatch_varlen`` with transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, varlen_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)  # plain HF calls build sdpa masks


@functools.cache
def _boundary_gdn_class() -> type:
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    class BoundaryGatedDeltaNet(Qwen3_5GatedDeltaNet):
        """Qwen3_5GatedDeltaNet whose forward keeps sequences apart when given ``lenbatch_segments``."""

        def forward(
            self, hidden_states: torch.Tensor, cache: Any = None, attention_mask: Any = None, **kwargs: Any
        ) -> torch.Tensor:
            segs = kwargs.pop("lenbatch_segments", None)
            if segs is None:
                return super().forward(hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
            return gated_deltanet_forward(self, hidden_states, segs)

    return BoundaryGatedDeltaNet


def gated_deltanet_forward(mod: Any, hidden_states: torch.Tensor, segs: Segments) -> torch.Tensor:
    """The HF Qwen3_5GatedDeltaNet forward (same weights, same order of operations) on segments."""
    batch, seq_len, _ = hidden_states.shape
    mixed = mod.in_proj_qkv(hidden_states)  # [B, T, 2*key_dim + value_dim]
    z = mod.in_proj_z(hidden_states).reshape(batch, seq_len, -1, mod.head_v_dim)
    b = mod.in_proj_b(hidden_states)
    a = mod.in_proj_a(hidden_states)
    mixed = causal_conv(mixed, mod.conv1d.weight.squeeze(1), segs, activation=mod.activation in ("silu", "swish"))
    query, key, value = torch.split(mixed, [mod.key_dim, mod.key_dim, mod.value_dim], dim=-1)
    query = query.reshape(batch, seq_len, -1, mod.head_k_dim)
    key = key.reshape(batch, seq_len, -1, mod.head_k_dim)
    value = value.reshape(batch, seq_len, -1, mod.head_v_dim)
    beta = b.sigmoid()
    g = -mod.A_log.float().exp() * F.softplus(a.float() + mod.dt_bias)
    core = chunk_gated_delta_rule(query, key, value, g, beta, segs)
    core = mod.norm(core.reshape(-1, mod.head_v_dim), z.reshape(-1, mod.head_v_dim))
    return mod.out_proj(core.reshape(batch, seq_len, -1))


def make_boundary_aware(model: torch.nn.Module) -> torch.nn.Module:
    """Swap every Qwen3_5GatedDeltaNet of ``model`` to the boundary-aware subclass, in place.

    Parameters, buffers and state-dict names are unchanged; attention goes through the
    ``lenbatch_varlen`` interface (set as ``config._attn_implementation`` by lenbatch_study.models.target).
    """
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    register_attention()
    cls = _boundary_gdn_class()
    for module in model.modules():
        if isinstance(module, Qwen3_5GatedDeltaNet):
            module.__class__ = cls
    return model
