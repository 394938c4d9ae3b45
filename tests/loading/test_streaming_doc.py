"""docs/streaming.md's snippet runs as written and does what its prose says: every sample once per epoch,
the epochs differ, the state saved mid-pass resumes at the batch after it, and memory stays near the buffer."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "streaming.md"

CHECKS = """
chats = list(Chats())
lengths = [len(s["input_ids"]) for s in chats]
for e in (0, 1):
    batcher.set_epoch(e)
    got = [[len(s["input_ids"]) for s in b] for b in batcher]
    assert sorted(n for b in got for n in b) == sorted(lengths)
    assert all(len(b) * max(b) <= 16384 and len(b) <= 64 for b in got)
    if e == 0:
        first = got
assert got != first
again = lb.StreamingBatcher(Chats(), strategy="bucketed", token_budget=16384, max_batch_size=64, buffer_size=2048, seed=0)
again.load_state_dict(state)
again.set_epoch(1)
assert [[len(s["input_ids"]) for s in b] for b in again] == got[4:]
assert batcher.peak_held < 3000
print("OK")
"""


def test_the_streaming_snippet_runs_and_resumes():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 1
    out = subprocess.run([sys.executable, "-c", blocks[0] + CHECKS], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.match(r"held at most \d+ of 3000 samples", out.stdout)
    assert out.stdout.splitlines()[-1] == "OK"
