"""docs/library.md "Use it in your trainer": every python snippet of that section runs here, as written.

The blocks run in order in one interpreter (the first is the toy data); the DDP block runs under real
torchrun with 2 processes. Checks between blocks assert what the prose claims.
"""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("accelerate", reason="the Trainer snippet needs accelerate: pip install 'lenbatch[hf]'")
pytest.importorskip("torchdata", reason="the StatefulDataLoader snippet needs torchdata: pip install 'lenbatch[dev]'")
pytest.importorskip("trl", reason="the SFTTrainer snippet needs trl: pip install 'lenbatch[trl]'")

README = Path(__file__).resolve().parents[2] / "docs" / "library.md"
sys.path.insert(0, str(Path(__file__).parent))
from _sft_data import chat_tokenizer  # noqa: E402


def section_blocks() -> list[str]:
    text = README.read_text()
    start = text.index("\n## Use it in your trainer\n")
    end = text.find("\n## ", start + 5)
    end = len(text) if end < 0 else end  # the next section, or the end of the file
    return re.findall(r"```python\n(.*?)```", text[start:end], flags=re.S)


def test_section_has_the_five_integrations():
    blocks = section_blocks()
    assert len(blocks) == 7
    joined = "\n".join(blocks)
    for needle in (
        "sampler.dataloader(dataset",
        "sampler.consumed(loader)",
        "init_process_group",
        "LengthBatchTrainer",
        "LengthBatchMixin, SFTTrainer",
        "StatefulDataLoader",
    ):
        assert needle in joined, needle


CHECKS = textwrap.dedent("""
    import json, sys
    import numpy as np
    import torch
    import lenbatch.loading.sampler as S

    blocks = json.loads(open(sys.argv[1]).read())
    LOG = []
    _iter = S.LengthBatchSampler.__iter__

    def recording_iter(self):  # observe what the sampler hands out (the real iterator underneath)
        for b in _iter(self):
            LOG.append((self.epoch, b))
            yield b

    S.LengthBatchSampler.__iter__ = recording_iter
    ns = {"__name__": "__readme__"}
    setup, plain, resume, _ddp, trainer, sft, stateful = blocks
    exec(setup, ns)
    lb, lengths, dataset = ns["lb"], ns["lengths"], ns["dataset"]
    kw = dict(token_budget=1024, max_batch_size=16, seed=0)

    exec(plain, ns)
    plans = [[b.tolist() for b in lb.plan_epoch(lengths, strategy="packed", epoch=e, **kw)] for e in (0, 1)]
    assert [b for e, b in LOG] == plans[0] + plans[1], "the plain loop did not train both epochs' plans"
    st = ns["ckpt"]["sampler"]
    assert (st["epoch"], st["position"]) == (1, 6), st     # what the loop received, not what was prefetched

    LOG.clear()
    exec(resume, ns)
    assert [b for e, b in LOG] == plans[1][6:], "resume did not continue at the first batch not trained on"

    exec(trainer, ns)
    tr = ns["trainer"]
    assert tr.state.global_step == 2 * len(tr.length_sampler) and round(tr.state.epoch) == 2

    LOG.clear()
    exec(sft, ns)
    tr = ns["trainer"]
    prepared = tr.train_dataset
    assert tr.lengths.tolist() == [len(x) for x in prepared["input_ids"]], "lengths are not the tokenized ones"
    edges = lb.optimize_boundaries(tr.lengths, num_buckets=4, token_budget=1024, max_batch_size=16).edges
    assert tr.plan_args["edges"] == edges, "bucketed edges are not the optimal ones"
    assert tr.state.global_step == 2 * len(tr.length_sampler) and round(tr.state.epoch) == 2
    sft_plans = [[b.tolist() for b in lb.plan_epoch(tr.lengths, strategy="bucketed", epoch=e, seed=tr.args.seed,
                                                   token_budget=1024, max_batch_size=16, edges=edges,
                                                   min_batches=tr.length_sampler.min_batches)] for e in (0, 1)]
    assert [b for e, b in LOG] == sft_plans[0] + sft_plans[1], "SFT did not train both epochs' plans"
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling
    rows = [{k: prepared[i][k] for k in ("input_ids", "labels")} for i in sft_plans[0][0]]
    ours, ref = tr.data_collator(rows), DataCollatorForLanguageModeling(pad_token_id=tr.processing_class.pad_token_id)(rows)
    assert all(torch.equal(ours[k], ref[k]) for k in ("input_ids", "attention_mask", "labels"))
    assert (ours["labels"] == -100).any() and (ours["labels"] != -100).any(), "not completion-only"

    exec(stateful, ns)
    plan = lb.plan_epoch(lengths, strategy="sortish", epoch=0, **kw)
    rest = ns["rest"]
    assert len(rest) == len(plan) - 6
    for got, want in zip(rest, plan[6:]):
        assert got.input_ids.equal(lb.collate_padded([dataset[i] for i in want]).input_ids)
    print("OK")
""")


@pytest.mark.slow
def test_snippets_run_and_do_what_the_prose_says(tmp_path):
    blocks = section_blocks()
    chat_tokenizer(tmp_path / "tokenizer")  # the SFT snippet's local tokenizer folder
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    (tmp_path / "checks.py").write_text(CHECKS)
    proc = subprocess.run(
        [sys.executable, "checks.py", "blocks.json"], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-4000:]


@pytest.mark.slow
def test_ddp_snippet_under_torchrun(tmp_path):
    """Each rank writes its plan to its own file (closed before the rank exits): two ranks printing to the
    one pipe torchrun shares can lose or splice lines, which would test the pipe, not the sampler."""
    setup, ddp = section_blocks()[0], section_blocks()[3]
    tail = (
        '\nwith open(f"plan_{sampler.rank}.json", "w") as _f:\n'
        "    json.dump([sampler.rank, sampler.world_size, sorted(int(i) for b in sampler.plan() for i in b)], _f)\n"
    )
    (tmp_path / "train_ddp.py").write_text("import json\n" + setup + ddp + tail)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "train_ddp.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = {}
    for path in sorted(tmp_path.glob("plan_*.json")):
        rank, world, idx = json.loads(path.read_text())
        assert world == 2 and path.name == f"plan_{rank}.json"
        ranks[rank] = idx
    assert sorted(ranks) == [0, 1], (sorted(p.name for p in tmp_path.iterdir()), proc.stderr[-3000:])
    assert not set(ranks[0]) & set(ranks[1]) and len(ranks[0]) + len(ranks[1]) == 400
