"""``python -m lenbatch compare LENGTHS --token-budget N --max-batch-size N``: every strategy on your lengths.

Prints :func:`lenbatch.compare_strategies`'s table (markdown) or, with ``--json``, its rows. LENGTHS is a
``.npy`` array of token counts or a text file with one count per line. The study's commands are
``lenbatch <command>`` (``python -m lenbatch_study``); this is the library's one command, with a small
hand-written parser so that the library imports nothing but numpy for it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

USAGE = """usage: python -m lenbatch compare LENGTHS --token-budget N --max-batch-size N [options]

Plan every strategy on LENGTHS (.npy, or text with one token count per line) and print one row each:
steps, padding efficiency, budget fill, composition repeat, length mixing (and relative cost).

options:
  --token-budget N         padded tokens per batch (n x longest), or tokens per packed row   (required)
  --max-batch-size N       samples per batch at most                                         (required)
  --seed N                 base seed (epoch e uses seed + e)                                 (default 0)
  --world-size N           ranks; steps are per rank, cost the costliest rank's per step      (default 1)
  --num-buckets K          buckets of the bucketed strategy (optimal edges)                  (default 6)
  --per-token A            cost per token: with --per-token-squared, adds a relative cost column
  --per-token-squared B    cost per token squared (attention): a batch costs n(A m + B m^2)
  --json                   the rows as JSON instead of a table
"""

INT_FLAGS = {
    "--token-budget": "token_budget",
    "--max-batch-size": "max_batch_size",
    "--seed": "seed",
    "--world-size": "world_size",
    "--num-buckets": "num_buckets",
}
FLOAT_FLAGS = {"--per-token": "per_token", "--per-token-squared": "per_token_squared"}


def parse(args: list[str]) -> dict:
    """The options of ``compare`` from ``args`` (after the command); ``ValueError`` naming the flag."""
    out: dict = {"path": None, "json": False}
    i = 0
    while i < len(args):
        a = args[i]
        name, eq, inline = a.partition("=")
        if name in INT_FLAGS or name in FLOAT_FLAGS:
            if eq:
                value = inline
            elif i + 1 < len(args):
                i += 1
                value = args[i]
            else:
                raise ValueError(f"{name} needs a value")
            try:
                out[INT_FLAGS[name] if name in INT_FLAGS else FLOAT_FLAGS[name]] = (
                    int(value) if name in INT_FLAGS else float(value)
                )
            except ValueError:
                raise ValueError(
                    f"{name} takes {'an integer' if name in INT_FLAGS else 'a number'}, got {value!r}"
                ) from None
        elif a == "--json":
            out["json"] = True
        elif a.startswith("-"):
            raise ValueError(f"unknown option {a}; see python -m lenbatch --help")
        elif out["path"] is None:
            out["path"] = a
        else:
            raise ValueError(f"one LENGTHS file, got {out['path']!r} and {a!r}")
        i += 1
    if out["path"] is None:
        raise ValueError("give the LENGTHS file (.npy or one count per line)")
    for flag in ("--token-budget", "--max-batch-size"):
        if INT_FLAGS[flag] not in out:
            raise ValueError(f"{flag} is required")
    return out


def read_lengths(path: str):
    import numpy as np

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{path}: no such file; give a .npy array of token counts or a text file of them")
    return np.load(p) if p.suffix == ".npy" else np.loadtxt(p, dtype=np.int64, ndmin=1)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "compare" and any(a in ("-h", "--help") for a in argv)):
        print(USAGE, end="")
        return 0
    if argv[0] != "compare":
        print(
            f"unknown command {argv[0]!r}; the one command is 'compare' (the study's: python -m lenbatch_study)",
            file=sys.stderr,
        )
        return 2
    from lenbatch.batching.compare import Cost, compare_strategies, format_table

    try:
        o = parse(argv[1:])
        cost = None
        if "per_token" in o or "per_token_squared" in o:
            cost = Cost(per_token=o.get("per_token", 0.0), per_token_squared=o.get("per_token_squared", 0.0))
        rows = compare_strategies(
            read_lengths(o["path"]),
            token_budget=o["token_budget"],
            max_batch_size=o["max_batch_size"],
            seed=o.get("seed", 0),
            world_size=o.get("world_size", 1),
            num_buckets=o.get("num_buckets", 6),
            cost=cost,
        )
    except ValueError as e:
        print(f"python -m lenbatch compare: {e}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=1) if o["json"] else format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
