"""lenbatch.hf.LengthBatchMixin with TRL's SFTTrainer (trl on CPU, a tiny random Qwen2, a local ChatML tokenizer):
under real torchrun, and the collator against TRL's own collators tensor for tensor."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("accelerate", reason="Trainer needs accelerate: pip install 'lenbatch[hf]'")
trl = pytest.importorskip("trl", reason="the SFTTrainer integration needs trl: pip install 'lenbatch[trl]'")
datasets = pytest.importorskip("datasets")

import lenbatch as lb  # noqa: E402
from lenbatch.hf import LengthBatchCollator, LengthBatchMixin, LengthBatchTrainer  # noqa: E402
from lenbatch.hf import _dataset_lengths  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _sft_data import chat_tokenizer, conversations, tiny_qwen2  # noqa: E402

N, BUDGET, MAX_BS = 64, 384, 8  # _sft_trainer_run.py's


class LBSFT(LengthBatchMixin, SFTTrainer):
    pass


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return chat_tokenizer(tmp_path_factory.mktemp("tok"))


def _sft(tok, tmp_path, data, cls=SFTTrainer, **kw):
    args = {k: kw.pop(k) for k in list(kw) if k in SFTConfig.__dataclass_fields__}
    return cls(
        model=tiny_qwen2(len(tok)),
        args=SFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **args),
        train_dataset=datasets.Dataset.from_list(data),
        processing_class=tok,
        **kw,
    )


@pytest.mark.slow
def test_sft_two_ranks_bucketed_and_packed(tmp_path, tok):
    """Under torchrun with 2 ranks, for bucketed (prompt/completion turns, TRL's completion_mask) and packed
    (user/assistant messages, TRL's assistant_only_loss): every sample exactly once per epoch across ranks,
    each rank trains exactly its plan (lengths from the prepared dataset's input_ids, bucketed edges optimal
    for them), epochs differ, a resume from mid-epoch 1 trains the uninterrupted run's remaining batches to
    the same weights; and at every step, SFTTrainer's default collator on the same samples gives the same
    per-sample labels and the same loss at the same weights, and the trained tokens are exactly the
    completions' (not the prompts')."""
    cases = {"bucketed": "prompt_completion", "packed": "messages"}
    script = Path(__file__).with_name("_sft_trainer_run.py")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(script),
            str(tmp_path),
            str(tok.name_or_path),
        ]
        + [f"{s}:{f}" for s, f in cases.items()],
        env=dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    for strategy in cases:
        ranks = [json.loads((tmp_path / strategy / f"rank{r}.json").read_text()) for r in (0, 1)]
        r0 = ranks[0]
        assert all(r["world_size"] == 2 for r in ranks) and ranks[1]["steps_per_epoch"] == r0["steps_per_epoch"]
        lengths = np.array(r0["lengths"])
        assert r0["lengths"] == r0["prepared_lengths"], "lengths are not the prepared input_ids' lengths"
        edges = None
        if strategy == "bucketed":
            edges = lb.optimize_boundaries(lengths, num_buckets=3, token_budget=BUDGET, max_batch_size=MAX_BS).edges
            assert tuple(r0["edges"]) == edges
        per_epoch = []
        for e in (0, 1):
            batches = [b for r in ranks for ep, b in r["full"] if int(ep) == e]
            assert len(batches) == 2 * r0["steps_per_epoch"], strategy
            assert sorted(i for b in batches for i in b) == list(range(N)), f"{strategy} epoch {e}: missing/repeated"
            per_epoch.append({frozenset(b) for b in batches})
            for rank, r in enumerate(ranks):
                plan = lb.plan_epoch(
                    lengths,
                    strategy=strategy,
                    epoch=e,
                    seed=5,
                    token_budget=BUDGET,
                    max_batch_size=MAX_BS,
                    edges=edges,
                    rank=rank,
                    world_size=2,
                    min_batches=r["min_batches"],
                )
                assert [b for ep, b in r["full"] if int(ep) == e] == [p.tolist() for p in plan], strategy
        assert per_epoch[0] != per_epoch[1], f"{strategy}: epoch 1 repeated epoch 0's batches"
        for r in ranks:
            assert r["resumed"] == r["full"][r["k"] :], f"{strategy}: resume is not exact"
            assert r["max_weight_diff"] <= 1e-6, (strategy, r["max_weight_diff"])
            pairs = r["loss_pairs"]
            assert len(pairs) == 2 * r0["steps_per_epoch"]
            assert all(same for _, _, same, _ in pairs), f"{strategy}: labels differ from SFTTrainer's collator"
            for ours, theirs, _, _ in pairs:
                assert abs(ours - theirs) <= 1e-5 * max(1.0, abs(theirs)), (strategy, ours, theirs)
        # the trained tokens of one epoch, both ranks: exactly the prepared labels' (completions only)
        steps = r0["steps_per_epoch"]
        assert sum(n for r in ranks for _, _, _, n in r["loss_pairs"][:steps]) == r0["trained_tokens"]
        assert 0 < r0["trained_tokens"] < 0.7 * r0["all_tokens"], "prompt tokens trained, or nothing trained"


def test_collator_equals_trl_collators(tmp_path, tok):
    """On SFTTrainer-prepared samples, LengthBatchCollator('padded') is SFTTrainer's default collator and
    ('packed') its padding_free collator: same keys, dtypes and values (labels -100 on prompts)."""
    tr = _sft(tok, tmp_path, conversations(9, fmt="prompt_completion"))
    rows = [{k: tr.train_dataset[i][k] for k in ("input_ids", "labels")} for i in range(9)]
    assert any(-100 in r["labels"] for r in rows) and all(r["labels"][-1] != -100 for r in rows)
    pad = tok.pad_token_id
    for layout, ref in (
        ("padded", DataCollatorForLanguageModeling(pad_token_id=pad)),
        ("packed", DataCollatorForLanguageModeling(pad_token_id=pad, padding_free=True)),
    ):
        ours, theirs = LengthBatchCollator(layout=layout, pad_id=pad)(rows), ref(rows)
        assert set(ours) - {"use_cache"} == set(theirs), layout
        for key, want in theirs.items():
            got = ours[key]
            if torch.is_tensor(want):
                assert got.dtype == want.dtype and torch.equal(got, want), (layout, key)
            else:
                assert got == want, (layout, key)


def test_collator_folds_masks_as_trl_does(tmp_path, tok):
    """Pre-tokenized samples with completion_mask and assistant_masks: the collator's labels equal the ones
    SFTTrainer builds from the same columns (assistant_masks always, completion_mask only with
    completion_only_loss), for both settings; the mixin takes completion_only_loss from the trainer."""
    rng = np.random.default_rng(3)
    data = []
    for n in rng.integers(4, 30, size=8):
        am = rng.integers(0, 2, size=n)
        am[-1] = 1  # a token both masks keep, so TRL keeps the sample
        cm = (np.arange(n) >= n // 2).astype(int)
        data.append(
            {
                "input_ids": rng.integers(2, 300, size=n).tolist(),
                "completion_mask": cm.tolist(),
                "assistant_masks": am.tolist(),
            }
        )
    labels = {}
    for completion_only in (True, False):
        tr = _sft(
            tok,
            tmp_path,
            data,
            cls=LBSFT,
            completion_only_loss=completion_only,
            strategy="packed",
            token_budget=1024,
            max_batch_size=16,
        )
        assert tr.data_collator.completion_only_loss is completion_only
        want = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id)(
            [{k: tr.train_dataset[i][k] for k in ("input_ids", "labels")} for i in range(len(data))]
        )["labels"]
        got = LengthBatchCollator(layout="padded", pad_id=tok.pad_token_id, completion_only_loss=completion_only)(data)[
            "labels"
        ]
        assert torch.equal(got, want), completion_only
        labels[completion_only] = got
    assert (labels[True] != -100).sum() < (labels[False] != -100).sum(), "completion_mask changed nothing"


def test_plain_trainer_keeps_a_completion_mask_column(tmp_path):
    """LengthBatchTrainer over plain Trainer: a completion_mask column survives remove_unused_columns and masks
    the labels; a text column (not a model input) is left out; lengths come from the Arrow offsets."""
    import transformers

    rng = np.random.default_rng(0)
    ids = [rng.integers(1, 250, size=n).tolist() for n in rng.integers(3, 20, size=12)]
    cm = [[int(j >= len(x) // 2) for j in range(len(x))] for x in ids]
    ds = datasets.Dataset.from_dict({"input_ids": ids, "completion_mask": cm, "text": ["t"] * 12})
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    tr = LengthBatchTrainer(
        model=tiny_qwen2(256), args=args, train_dataset=ds, strategy="random", token_budget=64, max_batch_size=4
    )
    assert tr.lengths.tolist() == [len(x) for x in ids]
    loader = tr.get_train_dataloader()
    batch_idx, batch = next(iter(loader.batch_sampler)), next(iter(loader))
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    for row, i in enumerate(batch_idx):
        n = len(ids[i])
        want = [t if m else -100 for t, m in zip(ids[i], cm[i])]
        assert batch["labels"][row, :n].tolist() == want and (batch["labels"][row, n:] == -100).all()


def test_fields_that_cannot_be_kept_are_refused():
    base = {"input_ids": [5, 6, 7]}
    col = LengthBatchCollator(layout="packed")
    for extra, name in (
        ({"seq_lengths": [2, 1]}, "seq_lengths"),
        ({"token_type_ids": [0, 0, 0]}, "token_type_ids"),
        ({"attention_mask": [1, 1, 0]}, "attention_mask"),
        ({"position_ids": [0, 1, 1]}, "position_ids"),
        ({"completion_mask": [0, 1]}, "completion_mask"),
        ({"labels": [1, 2]}, "labels"),
    ):
        with pytest.raises(ValueError, match=name):
            col([{**base, **extra}])
    # accepted: what the layout rebuilds anyway, and a field the model does not take (as remove_unused_columns)
    ok = col([{**base, "attention_mask": [1, 1, 1], "position_ids": [0, 1, 2]}])
    assert ok["position_ids"].tolist() == [[0, 1, 2]]
    assert "text" not in LengthBatchCollator(layout="padded", model_fields={"input_ids"})([{**base, "text": "x"}])


def test_mixin_refuses_trl_settings_that_rebatch(tmp_path, tok):
    data = conversations(4, fmt="prompt_completion")
    plan = dict(strategy="packed", token_budget=512, max_batch_size=8)
    for setting, name in (
        ({"packing": True, "max_length": 128}, "packing=True in the trainer's args"),
        ({"padding_free": True, "max_length": None}, "padding_free=True in the trainer's args"),
        ({"pad_to_multiple_of": 8}, "pad_to_multiple_of=8 would pad"),
    ):
        with pytest.raises(ValueError, match=name):
            _sft(tok, tmp_path, data, cls=LBSFT, **setting, **plan)


def test_lengths_from_arrow_offsets():
    """_dataset_lengths reads the list offsets through filter/shuffle indices mappings, several chunks and a
    sliced chunk, an integer column as the lengths, a pyarrow table, and a list of dicts; it names a missing
    column."""
    import pyarrow as pa

    rng = np.random.default_rng(1)
    ids = [rng.integers(0, 9, size=n).tolist() for n in rng.integers(1, 40, size=50)]
    ds = datasets.concatenate_datasets(
        [datasets.Dataset.from_dict({"input_ids": ids[:20]}), datasets.Dataset.from_dict({"input_ids": ids[20:]})]
    )
    assert ds.data.table.column("input_ids").num_chunks == 2
    mapped = ds.filter(lambda e: len(e["input_ids"]) % 3 != 0).shuffle(seed=0)
    assert mapped._indices is not None
    sliced = ds.select(range(5, 30))  # contiguous: a sliced table (chunk offset 5), no indices mapping
    assert sliced._indices is None and sliced.data.table.column("input_ids").chunk(0).offset == 5
    for d in (ds, mapped, sliced):
        assert _dataset_lengths(d, "input_ids").tolist() == [len(x) for x in d["input_ids"]]
    counts = datasets.Dataset.from_dict({"n": [len(x) for x in ids]})
    assert _dataset_lengths(counts, "n").tolist() == [len(x) for x in ids]
    assert _dataset_lengths(pa.table({"input_ids": ids}), "input_ids").tolist() == [len(x) for x in ids]
    assert _dataset_lengths([{"input_ids": x} for x in ids[:5]]).tolist() == [len(x) for x in ids[:5]]
    with pytest.raises(ValueError, match="length_column='tokens'"):
        _dataset_lengths(ds, "tokens")
