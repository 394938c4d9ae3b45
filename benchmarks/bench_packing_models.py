"""check_packing on tiny random configs of the families users bring, and the cost of a packed row
without varlen kernels.

Part 1: for each family (tiny config built from transformers' config classes, random weights, CPU,
float32, sdpa), ``lb.check_packing(model)``: ok / max |logit difference| packed vs alone; and the same
row fed three other ways users take by hand (``model_inputs()`` without ``use_cache=False``; only
``input_ids`` + ``position_ids``; only ``input_ids``), to show why ``model_inputs()`` is the path.

Part 2: one packed row of 4,096 tokens holding 64 sequences vs the same 64 sequences padded (64 x 64),
forward time on CPU sdpa of a small Llama: sdpa without a varlen kernel attends over the whole row (a
4,096 x 4,096 masked attention) where the padded batch computes 64 attentions of 64 x 64.

Run: python benchmarks/bench_packing_models.py [--families-only | --cost-only]. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers as tf

import lenbatch as lb

SMALL = dict(vocab_size=256, hidden_size=32, num_attention_heads=4, intermediate_size=64)


def families() -> dict[str, object]:
    """Tiny configs, 2 layers each, attention dropout 0 (eval mode anyway)."""
    return {
        "Llama": tf.LlamaConfig(num_hidden_layers=2, num_key_value_heads=2, **SMALL),
        "Qwen2": tf.Qwen2Config(num_hidden_layers=2, num_key_value_heads=2, **SMALL),
        "Mistral": tf.MistralConfig(num_hidden_layers=2, num_key_value_heads=2, **SMALL),
        "Phi3": tf.Phi3Config(num_hidden_layers=2, num_key_value_heads=2, pad_token_id=0, **SMALL),
        "GPT-2": tf.GPT2Config(vocab_size=256, n_embd=32, n_layer=2, n_head=4, n_positions=512),
        "GPT-NeoX": tf.GPTNeoXConfig(num_hidden_layers=2, **SMALL),
        "OPT": tf.OPTConfig(
            vocab_size=256,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            ffn_dim=64,
            word_embed_proj_dim=32,
            pad_token_id=0,
        ),
        "BLOOM": tf.BloomConfig(vocab_size=256, hidden_size=32, n_layer=2, n_head=4),
    }


def build(config, attn: str = "sdpa"):
    torch.manual_seed(0)
    config._attn_implementation = attn
    return tf.AutoModelForCausalLM.from_config(config, attn_implementation=attn).eval()


def by_hand(model, lengths=(7, 13, 5, 11)) -> dict[str, float]:
    """max |logit difference| packed vs alone when the row is fed without parts of model_inputs()."""
    gen = torch.Generator().manual_seed(0)
    samples = [{"input_ids": torch.randint(1, 256, (n,), generator=gen)} for n in lengths]
    batch = lb.collate_packed(samples)
    full = batch.model_inputs()
    full.pop("labels")
    ways = {
        "model_inputs() without use_cache=False": {k: v for k, v in full.items() if k != "use_cache"},
        "input_ids + position_ids": {
            "input_ids": full["input_ids"],
            "position_ids": full["position_ids"],
            "use_cache": False,
        },
        "input_ids only": {"input_ids": full["input_ids"], "use_cache": False},
    }
    out = {}
    with torch.no_grad():
        alone = [model(input_ids=s["input_ids"][None], use_cache=False).logits[0] for s in samples]
        cu = batch.cu_seqlens.tolist()
        for name, kw in ways.items():
            try:
                packed = model(**kw).logits[0]
                out[name] = max(float((packed[a:b] - x).abs().max()) for x, a, b in zip(alone, cu, cu[1:]))
            except Exception as err:  # noqa: BLE001 (report what a hand-made call does)
                out[name] = f"{type(err).__name__}"
    return out


def report_families(only: str | None = None) -> None:
    print(f"transformers {tf.__version__}, torch {torch.__version__}, CPU float32")
    print(
        "| family | attention | check_packing | max diff vs alone (model_inputs()) | max cross diff | bfloat16: "
        "check_packing (vs alone / cross) | without use_cache=False | input_ids + position_ids | input_ids only |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, config in families().items():
        if only is not None and name != only:
            continue
        for attn in ("sdpa", "eager"):
            try:
                model = build(config, attn)
            except ValueError:  # BLOOM has no sdpa path in transformers
                print(f"| {name} | {attn} | (not offered by transformers) | | | | | | |")
                continue
            r = lb.check_packing(model)
            hand = by_hand(model)
            half = lb.check_packing(build(config, attn).to(torch.bfloat16))
            cells = [f"{v:.2g}" if isinstance(v, float) else v for v in hand.values()]

            def verdict(c):
                return "ok" if c.ok else "NOT ok" + (f" ({c.error})" if c.error else "")

            print(
                f"| {name} ({type(model).__name__}) | {attn} | {verdict(r)} | {r.max_abs_diff:.2g} | "
                f"{r.max_cross_diff:.2g} | {verdict(half)} ({half.max_abs_diff:.2g} / {half.max_cross_diff:.2g}) | "
                + " | ".join(cells)
                + " |"
            )


def report_cost(repeats: int = 5) -> None:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    config = tf.LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=8192,
    )
    model = build(config, "sdpa")
    gen = torch.Generator().manual_seed(0)
    samples = [{"input_ids": torch.randint(1, 256, (64,), generator=gen)} for _ in range(64)]
    packed = lb.collate_packed(samples).model_inputs()
    padded = lb.collate_padded(samples).model_inputs()
    for inputs in (packed, padded):
        inputs.pop("labels")
    padded["use_cache"] = False

    def best(inputs) -> float:
        times = []
        with torch.no_grad():
            model(**inputs)  # warm-up
            for _ in range(repeats):
                t0 = time.perf_counter()
                model(**inputs)
                times.append(time.perf_counter() - t0)
        return min(times)

    tp, td = best(packed), best(padded)
    print(
        f"packed row [1, 4096] (64 sequences of 64): {tp * 1e3:.1f} ms; the same tokens padded [64, 64]: "
        f"{td * 1e3:.1f} ms; ratio {tp / td:.1f}x (Llama, hidden 128, 2 layers, CPU sdpa, {torch.get_num_threads()} "
        f"threads, best of {repeats})"
    )


def report_attention_cost(repeats: int = 5) -> None:
    """The attention alone: sdpa over the 4,096-token row with a block-diagonal causal mask (what
    transformers builds from packed position_ids) vs 64 causal attentions of 64 tokens."""
    heads, dim = 4, 32
    q = torch.randn(1, heads, 4096, dim)
    seq = torch.arange(4096) // 64
    pos = torch.arange(4096)
    mask = (seq[:, None] == seq[None, :]) & (pos[:, None] >= pos[None, :])
    qp = q.view(1, heads, 64, 64, dim).permute(0, 2, 1, 3, 4).reshape(64, heads, 64, dim)
    F = torch.nn.functional.scaled_dot_product_attention

    def best(fn) -> float:
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    tp = best(lambda: F(q, q, q, attn_mask=mask))
    td = best(lambda: F(qp, qp, qp, is_causal=True))
    print(
        f"attention alone: packed [1, 4, 4096, 32] with the block mask {tp * 1e3:.1f} ms; padded [64, 4, 64, 32] "
        f"causal {td * 1e3:.1f} ms; ratio {tp / td:.1f}x"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--families-only", action="store_true")
    ap.add_argument("--cost-only", action="store_true")
    ap.add_argument("--family", default=None, help="one family only (e.g. BLOOM)")
    a = ap.parse_args()
    if not a.cost_only:
        report_families(a.family)
    if not a.families_only:
        report_cost()
        report_attention_cost()
