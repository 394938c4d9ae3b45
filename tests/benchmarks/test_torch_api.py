"""No torch API newer than the GPU machine's (torch 2.11; CI has only the CPU build of 2.13).

CI cannot install torch 2.11 (no CPU build of it is reachable), so this is a tripwire, not a proof:
every ``torch.*`` name the package spells (module attributes, ``from torch... import``) must be in
``torch_api.txt``, the list reviewed against torch 2.4 (pyproject's floor) and 2.11. A new name fails
until someone checks it exists there and adds it. Tensor methods and keyword arguments are not seen
(the GPU check's first run on torch 2.11 is the rest of the proof). Cost: parsing src/ (< 1 s)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]


def torch_names(src: Path) -> set[str]:
    """Dotted ``torch.*`` names used in ``src`` (aliases of ``import torch...`` and ``from torch... import``
    resolved)."""
    names: set[str] = set()
    for path in src.rglob("*.py"):
        tree = ast.parse(path.read_text())
        aliases = {"torch": "torch"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "torch":
                        aliases[a.asname or "torch"] = a.name if a.asname else "torch"
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
                for a in node.names:
                    names.add(f"{node.module}.{a.name}")
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                chain, n = [], node
                while isinstance(n, ast.Attribute):
                    chain.append(n.attr)
                    n = n.value
                if isinstance(n, ast.Name) and n.id in aliases:
                    names.add(".".join([aliases[n.id], *reversed(chain)]))
    return names


def test_every_torch_name_the_package_uses_was_reviewed_for_torch_2_11():
    reviewed = {
        line.split("#")[0].strip() for line in (Path(__file__).parent / "torch_api.txt").read_text().splitlines()
    }
    reviewed.discard("")
    new = sorted(torch_names(ROOT / "src") - reviewed)
    assert new == [], (
        f"torch names not yet reviewed for torch 2.11 (the GPU machine's): {new}; check each exists "
        "there, then add it to tests/benchmarks/torch_api.txt"
    )


def test_the_scan_sees_aliases_and_from_imports(tmp_path):
    (tmp_path / "m.py").write_text(
        "import torch\nimport torch.nn.functional as F\nfrom torch.cuda import memory\n"
        "x = torch.cuda.current_stream()\ny = F.silu\nz = memory.stats\n"
    )
    assert torch_names(tmp_path) >= {
        "torch.cuda.current_stream",
        "torch.nn.functional.silu",
        "torch.cuda.memory",
        "torch.cuda.memory.stats",
    }
