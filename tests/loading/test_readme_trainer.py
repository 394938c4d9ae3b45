"""README "Use it in your trainer": every python snippet of that section runs here, as written.

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

README = Path(__file__).resolve().parents[2] / "README.md"


def section_blocks() -> list[str]:
    text = README.read_text()
    start = text.index("\n## Use it in your trainer\n")
    end = text.index("\n## ", start + 5)
    return re.findall(r"```python\n(.*?)```", text[start:end], flags=re.S)


def test_section_has_the_four_integrations():
    blocks = section_blocks()
    assert len(blocks) == 6
    joined = "\n".join(blocks)
    for needle in ("sampler.consumed(loader)", "init_process_group", "LengthBatchTrainer", "StatefulDataLoader"):
        assert needle in joined, needle


CHECKS = textwrap.dedent("""
    import json, sys
    import numpy as np
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
    setup, plain, resume, _ddp, trainer, stateful = blocks
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
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    (tmp_path / "checks.py").write_text(CHECKS)
    proc = subprocess.run([sys.executable, "checks.py", "blocks.json"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-4000:]


@pytest.mark.slow
def test_ddp_snippet_under_torchrun(tmp_path):
    setup, ddp = section_blocks()[0], section_blocks()[3]
    tail = ('\nprint("PLAN", json.dumps([sampler.rank, sampler.world_size, '
            'sorted(int(i) for b in sampler.plan() for i in b)]))\n')
    (tmp_path / "train_ddp.py").write_text("import json\n" + setup + ddp + tail)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "train_ddp.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = {}
    for line in proc.stdout.splitlines():
        if line.startswith("PLAN "):
            rank, world, idx = json.loads(line[5:])
            assert world == 2
            ranks[rank] = idx
    assert sorted(ranks) == [0, 1]
    assert not set(ranks[0]) & set(ranks[1]) and len(ranks[0]) + len(ranks[1]) == 400
