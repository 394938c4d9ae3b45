"""Write the README's "Which strategy" table: ``lenbatch.compare_strategies`` on the committed lengths
(``results/tokenize/lengths.npy``) at params.yaml's budget, batch size, seed and number of buckets.

    python tools/which_strategy.py           # rewrite the table between the markers in README.md
    python tools/which_strategy.py --check   # exit 1 when README.md's table is not what it would write

Only the lines between the two marker lines change (tests/pipeline/test_which_strategy.py checks that the
committed table is this script's output). Deterministic: the plans are a function of lengths, params, seed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
BEGIN = "<!-- which strategy: written by `python tools/which_strategy.py` from compare_strategies; do not edit -->"
END = "<!-- end of which strategy -->"


def table(lengths_path: Path = ROOT / "results/tokenize/lengths.npy", params_path: Path = ROOT / "params.yaml") -> str:
    """The markdown lines that go between the markers."""
    from lenbatch.batching.compare import compare_strategies, format_table

    params = yaml.safe_load(params_path.read_text())
    b = params["batching"]
    x = np.load(lengths_path)
    rows = compare_strategies(
        x,
        token_budget=b["token_budget"],
        max_batch_size=b["max_batch_size"],
        seed=b["seed"],
        packed_window=b["packed_window"],
        num_buckets=params["boundaries"]["num_buckets"],
    )
    head = (
        f"{x.size:,} samples, budget {b['token_budget']:,} tokens, at most {b['max_batch_size']} per batch, "
        f"{params['boundaries']['num_buckets']} buckets, seed {b['seed']}, one rank:"
    )
    return head + "\n\n" + format_table(rows)


def render(readme: str, body: str) -> str:
    """``readme`` with ``body`` between the marker lines; ``ValueError`` when they are missing."""
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or readme.index(BEGIN) > readme.index(END):
        raise ValueError(f"README needs the marker lines {BEGIN!r} and {END!r}, once each, in that order")
    a = readme.index(BEGIN) + len(BEGIN)
    return readme[:a] + "\n" + body + "\n" + readme[readme.index(END) :]


def main(argv: list[str]) -> int:
    path = ROOT / "README.md"
    text = path.read_text()
    new = render(text, table())
    if "--check" in argv:
        if new != text:
            print("README.md's 'Which strategy' table is stale; run python tools/which_strategy.py", file=sys.stderr)
            return 1
        return 0
    path.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
