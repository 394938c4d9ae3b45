"""``lb.learned_tokens``: accumulating ``model(**inputs, num_items_in_batch=n).loss`` over micro-batches of
different sizes gives the gradient of one big batch's token-mean loss (a tiny real Llama), where the
naive ``loss / accum`` does not; and the count sums over two real gloo ranks."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

import lenbatch as lb

transformers = pytest.importorskip("transformers")


def _model():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return transformers.LlamaForCausalLM(cfg).double()


def _samples():
    rng = np.random.default_rng(0)
    out = []
    for n in (5, 30, 9, 17, 3, 26):
        mask = (rng.random(n) < 0.7).astype(np.int64)
        out.append({"input_ids": rng.integers(1, 128, size=n).tolist(), "assistant_masks": mask.tolist()})
    return out


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("collate", [lb.collate_padded, lb.collate_packed])
def test_accumulated_gradient_equals_the_big_batch_token_mean(collate):
    samples = _samples()
    big = _model()
    big(**collate(samples).model_inputs()).loss.backward()  # mean over every learned token
    want = _grads(big)

    model = _model()
    micro = [collate(samples[:1]), collate(samples[1:4]), collate(samples[4:])]
    n = lb.learned_tokens(micro)
    labels = collate(samples).model_inputs()["labels"]
    assert n == int((labels[..., 1:] != -100).sum())
    for batch in micro:
        model(**batch.model_inputs(), num_items_in_batch=n).loss.backward()
    assert torch.allclose(_grads(model), want, atol=1e-6, rtol=0), float((_grads(model) - want).abs().max())

    naive = _model()
    for batch in micro:
        (naive(**batch.model_inputs()).loss / len(micro)).backward()
    assert (_grads(naive) - want).abs().max() > 1e-3  # what the helper fixes


def test_items_may_be_dicts_or_tensors_and_nothing_is_refused():
    batch = lb.collate_packed([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}])
    inputs = batch.model_inputs()  # labels [-100, 2, 3, -100, 5]
    assert lb.learned_tokens([batch]) == lb.learned_tokens([inputs]) == lb.learned_tokens([inputs["labels"]]) == 3
    with pytest.raises(ValueError, match="micro_batches is empty"):
        lb.learned_tokens([])
    with pytest.raises(ValueError, match="micro-batch 0 is a list without labels"):
        lb.learned_tokens([[1, 2]])


RANK = """
import sys, torch, torch.distributed as dist
import lenbatch as lb
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=int(sys.argv[2]), world_size=2)
labels = torch.full((1, 10), 7)
labels[0, : 3 + 4 * dist.get_rank()] = -100                    # after the shift: rank 0 learns 7 of 9, rank 1 3 of 9
print(lb.learned_tokens([labels]), lb.learned_tokens([labels], all_ranks=True))
dist.destroy_process_group()
"""


def test_all_ranks_sums_over_a_real_process_group(tmp_path):
    import subprocess

    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(tmp_path / "store"), str(r)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    assert [o.split() for o, _ in outs] == [["7", "10"], ["3", "10"]]
