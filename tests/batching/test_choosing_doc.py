"""docs/choosing.md's snippet runs as written and its claims hold: a row per strategy with a relative cost,
the cheapest at 1, and the cost-capped plan within both budgets, every sample once, equal steps per rank."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "choosing.md"

CHECKS = """
import numpy as np
assert [r["strategy"] for r in rows] == list(lb.STRATEGIES) and best["relative_cost"] == 1.0
c = lb.Cost(per_token=1.0, per_token_squared=1 / 4096)
assert len({len(r) for r in ranks}) == 1
assert np.array_equal(np.sort(np.concatenate([b for r in ranks for b in r])), np.arange(lengths.size))
assert all(c.of_batches(lengths, r, packed=False).max() <= 30_000.0 for r in ranks)
assert all(len(b) * lengths[b].max() <= 16384 for r in ranks for b in r)
print("OK")
"""


def test_the_choosing_snippet_runs_and_its_plan_holds_both_budgets():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 1
    out = subprocess.run([sys.executable, "-c", blocks[0] + CHECKS], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("| strategy |") and "relative cost" in lines[0] and len(lines) == 9
    assert lines[7].startswith("cheapest epoch: ") and lines[-1] == "OK"
