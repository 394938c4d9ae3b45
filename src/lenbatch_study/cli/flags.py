"""Every stage's flags and glue (the one CLI layer: :mod:`lenbatch_study.cli` dispatches, this module declares flags).

Each ``_<stage>_flags`` adds a stage's arguments and sets ``func``, a callable ``args -> int`` that
turns the parsed arguments into keyword arguments of the stage module's plain function
(``lenbatch_study.stages.stats.run``). Stage modules are reached through importlib when the command runs,
so ``lenbatch stats --help`` never imports torch.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lenbatch_study.cli.params_args import (
    _setting,
    add_batching_arguments,
    add_override,
    BATCHING_FLAGS,
    add_params_argument,
    params_from_args,
)
from lenbatch_study.pipeline.artifacts.compare_report import REPORT_PATH
from lenbatch_study.cli.commands import COMMANDS
import lenbatch_study.cli.model_flags  # noqa: F401 (the model commands' flags register on import)
from lenbatch_study.cli.flag_table import FLAGS, _flags_of, _lengths_input, _stage, _strategies, add_lengths_arguments


# --------------------------------------------------------------------------- dvc-yaml, plots, params


@_flags_of("dvc-yaml")
def _dvc_yaml_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="dvc.yaml", help="where to write dvc.yaml ('-': stdout)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if OUT differs from what would be written or params.yaml lacks a section or key; write nothing",
    )
    parser.set_defaults(func=lambda args: _stage("dvc-yaml").run(out=args.out, check=args.check))


@_flags_of("reruns")
def _reruns_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "modules",
        nargs="*",
        metavar="MODULE",
        help="src/lenbatch_study/analysis/stepmodel.py or lenbatch_study.analysis.stepmodel (none: all)",
    )
    parser.set_defaults(func=lambda args: _stage("reruns").run(modules=args.modules))


@_flags_of("plots")
def _plots_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("revisions", nargs="*", help="revisions or experiments to compare (dvc plots diff)")
    parser.add_argument("--out", default="dvc_plots", help="output folder (index.html)")
    parser.add_argument(
        "--write-template",
        action="store_true",
        help="only write the offline template .dvc/config names (for dvc plots show/diff)",
    )
    parser.set_defaults(
        func=lambda args: _stage("plots").run(revisions=args.revisions, out=args.out, write_only=args.write_template)
    )


@_flags_of("readme")
def _readme_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--readme", default="README.md", help="the README whose results table to write")
    parser.add_argument("--report", default=REPORT_PATH, help="compare's report, the table's source")
    parser.add_argument("--check", action="store_true", help="exit 1 if the README's table differs from the report's")
    parser.set_defaults(
        func=lambda args: _stage("readme").run(readme=args.readme, report=args.report, check=args.check)
    )


@_flags_of("machine")
def _machine_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="results/machine", help="output folder (machine.json)")
    parser.add_argument("--show", action="store_true", help="also print the fingerprint as JSON")
    parser.set_defaults(func=lambda args: _stage("machine").run(out=args.out, show=args.show))


@_flags_of("source")
def _source_flags(parser: argparse.ArgumentParser) -> None:
    add_params_argument(parser)
    parser.add_argument("--out", default="results/source", help="output folder (source.json)")
    parser.set_defaults(func=lambda args: _stage("source").run(params=params_from_args(args), out=args.out))


@_flags_of("params")
def _params_flags(parser: argparse.ArgumentParser) -> None:
    add_params_argument(parser)
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--schema", action="store_true", help="print the JSON schema (YAML) of params files")
    what.add_argument("--show", action="store_true", help="print the resolved params as JSON")
    parser.set_defaults(func=lambda args: _stage("params").run(params=args.params, schema=args.schema, show=args.show))


# --------------------------------------------------------------------------- stats


@_flags_of("stats")
def _stats_flags(parser: argparse.ArgumentParser) -> None:
    add_params_argument(parser)
    add_lengths_arguments(parser)
    add_override(parser, "stats.histogram_bins", flag="--bins")
    parser.add_argument(
        "--edges",
        type=int,
        nargs="+",
        default=None,
        metavar="TOKENS",
        help="optional bucket edges (tokens) for counts per bucket",
    )
    parser.add_argument("--out", required=True, help="output directory (stats.json, histogram.json, histogram.png)")
    parser.set_defaults(func=_stats)


def _stats(args: argparse.Namespace) -> int:
    return _stage("stats").run(
        params=params_from_args(args, "stats.histogram_bins"), out=args.out, edges=args.edges, **_lengths_input(args)
    )


# --------------------------------------------------------------------------- boundaries, plan, plans

BOUNDARIES_FLAGS = (
    "boundaries.method",
    "boundaries.num_buckets",
    "boundaries.sweep_max_buckets",
    "boundaries.num_candidates",
    "boundaries.objective",
)


@_flags_of("boundaries")
def _boundaries_flags(parser: argparse.ArgumentParser) -> None:
    from lenbatch.batching.boundaries import METHODS as methods
    from lenbatch_study.core.objective import OBJECTIVES as objectives

    add_params_argument(parser)
    add_lengths_arguments(parser)
    for name in BOUNDARIES_FLAGS:
        add_override(parser, name, note="0: no sweep" if name == "boundaries.sweep_max_buckets" else "")
    assert set(_setting("boundaries.method")[1]) == set(methods), "boundaries.method's choices are the optimizers"
    assert set(_setting("boundaries.objective")[1]) == set(objectives), "boundaries.objective's choices"
    add_batching_arguments(parser, ("batching.token_budget", "batching.max_batch_size"))
    parser.add_argument("--out", required=True, help="output directory: boundaries.json, sweep.json, params.json")
    parser.set_defaults(func=_boundaries)


def _boundaries(args: argparse.Namespace) -> int:
    # --sweep-max-buckets 0 means "no sweep" here, which the setting itself does not allow
    names = [n for n in BOUNDARIES_FLAGS if n != "boundaries.sweep_max_buckets" or args.sweep_max_buckets]
    params = params_from_args(args, *BATCHING_FLAGS, *names)
    return _stage("boundaries").run(
        params=params, out=args.out, sweep=args.sweep_max_buckets != 0, **_lengths_input(args)
    )


@_flags_of("plan")
def _plan_flags(parser: argparse.ArgumentParser) -> None:
    add_params_argument(parser)
    add_lengths_arguments(parser)
    parser.add_argument("--strategy", required=True, choices=_strategies(), help="batching strategy")
    parser.add_argument("--boundaries", metavar="JSON", help="boundaries.json (edges in tokens; bucketed only)")
    parser.add_argument("--epoch", type=int, default=0, help="epoch to plan (count, from 0)")
    parser.add_argument("--rank", type=int, default=0, help="rank whose batches are written (0-based)")
    parser.add_argument("--world-size", type=int, default=1, help="number of data-parallel ranks (count)")
    add_batching_arguments(parser)
    parser.add_argument(
        "--out", required=True, help="output directory: plan.json (batches as index lists) + params.json"
    )
    parser.set_defaults(func=_plan)


def _plan(args: argparse.Namespace) -> int:
    params = params_from_args(args, *BATCHING_FLAGS)
    return _stage("plan").run(
        params=params,
        strategy=args.strategy,
        out=args.out,
        boundaries=args.boundaries,
        epoch=args.epoch,
        rank=args.rank,
        world_size=args.world_size,
        **_lengths_input(args),
    )


@_flags_of("plans")
def _plans_flags(parser: argparse.ArgumentParser) -> None:
    add_params_argument(parser)
    add_lengths_arguments(parser, required=False)
    parser.add_argument(
        "--study-replay",
        action="store_true",
        help="replay the study's own setting (seed profile, budget 49,152, 7 ranks, its edges and "
        "dp edges) beside what it measured: OUT/replay.json and replay.md (ignores the "
        "lengths and batching flags)",
    )
    parser.add_argument("--boundaries", metavar="JSON", help="boundaries.json (edges in tokens) for bucketed")
    parser.add_argument(
        "--strategies",
        nargs="+",
        choices=_strategies(),
        default=None,
        help="strategies to simulate (default: all; bucketed only with --boundaries)",
    )
    add_override(parser, "plans.epochs")
    parser.add_argument(
        "--world-size", type=int, default=1, help="data-parallel ranks the plans are split over (count)"
    )
    add_batching_arguments(parser)
    parser.add_argument("--out", required=True, help="output directory: metrics.json, params.json")
    parser.set_defaults(func=_plans)


def _plans(args: argparse.Namespace) -> int:
    params = params_from_args(args, *BATCHING_FLAGS, "plans.epochs")
    if not (args.study_replay or args.lengths or args.seed_profile):
        raise ValueError("give the lengths to plan: --lengths FILE.npy or --seed-profile (or --study-replay)")
    if args.study_replay:  # the study's setting, whatever the params: its own stage module
        return _stage("study-replay").run(out=args.out, samples=args.seed_profile_size)
    return _stage("plans").run(
        params=params,
        out=args.out,
        boundaries=args.boundaries,
        strategies=args.strategies,
        world_size=args.world_size,
        **_lengths_input(args),
    )


@_flags_of("study-replay")
def _study_replay_flags(parser: argparse.ArgumentParser) -> None:
    from lenbatch_study.corpus.seed_profile import SEED_COUNT

    parser.add_argument(
        "--seed-profile-size",
        type=int,
        default=SEED_COUNT,
        metavar="N",
        help="samples in the generated seed profile (count; the study had 902,087)",
    )
    parser.add_argument("--out", required=True, help="output directory: replay.json, replay.md")
    parser.set_defaults(func=lambda args: _stage("study-replay").run(out=args.out, samples=args.seed_profile_size))


# --------------------------------------------------------------------------- tokenize, quality


DATA_FLAGS = (
    "data.source",
    "data.tokenizer",
    "data.max_len",
    "data.overflow",
    "data.limit",
    "data.workers",
    "data.on_bad_record",
)


@_flags_of("tokenize")
def _tokenize_flags(parser: argparse.ArgumentParser) -> None:
    add_params_argument(parser)
    for name in DATA_FLAGS:
        add_override(parser, name)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar or progress log lines")
    parser.add_argument(
        "--allow-truncated",
        action="store_true",
        default=None,
        help="keep the complete records of a cut-off JSON/JSONL source (counted in stats.json) "
        "instead of stopping; always on for the embedded 'sharegpt' file",
    )
    parser.add_argument("--out", required=True, help="output directory (e.g. results/tokenize)")
    parser.set_defaults(func=_tokenize)


def _tokenize(args: argparse.Namespace) -> int:
    stage = _stage("tokenize")
    params = params_from_args(args, *DATA_FLAGS)
    return stage.run(params=params, out=args.out, progress=not args.no_progress, allow_truncated=args.allow_truncated)


@_flags_of("quality")
def _quality_flags(parser: argparse.ArgumentParser) -> None:
    add_params_argument(parser)
    parser.add_argument("--data", default="results/tokenize", help="tokenize stage output (dataset/, lengths.npy)")
    parser.add_argument("--boundaries", default=None, help="boundaries.json (bucket edges for bucketed)")
    parser.add_argument("--out", default="results/quality", help="output folder")
    parser.set_defaults(func=_quality)


def _quality(args: argparse.Namespace) -> int:
    stage = _stage("quality")
    return stage.run(params=params_from_args(args), data=args.data, out=args.out, boundaries=args.boundaries)


# --------------------------------------------------------------------------- a stage with no flags of its own


def generic_stage_flags(name: str) -> Any:
    """The flags of a stage of the DAG that registers none of its own (``_<name>_flags``), derived from its
    row of the table: ``--params``/``--params-json``, one ``--<input>`` per input it reads (the file an
    upstream stage wrote, named after that output: ``--stats`` for ``Input("stats", "stats")``) and ``--out``;
    it calls ``run(params=, out=, <input>=)`` of its module. A stage that wants more (overrides of single
    settings, optional inputs, a launcher) writes its own ``_<name>_flags`` above, as stats does."""
    from lenbatch_study.pipeline.registry import STAGES, output_path

    stage = STAGES[name]
    reads = [i for i in stage.inputs if not i.trigger_only]
    for i in reads:
        # why not per-strategy inputs: a list of files per run has no one flag shape; such a stage writes its
        # own flags (compare takes the folder results/train)
        if STAGES[i.stage].per_strategy:
            raise ValueError(
                f"stage {name}: input {i.stage}.{i.output} is per strategy; write _{name}_flags "
                "in lenbatch_study/cli/flags.py (the generic flags take one file per input)"
            )

    def add(parser: argparse.ArgumentParser) -> None:
        add_params_argument(parser)
        for i in reads:
            parser.add_argument(
                f"--{i.output.replace('_', '-')}",
                dest=i.output,
                required=True,
                metavar="PATH",
                help=f"{i.stage}'s {i.output} (the workflow's: {output_path(i.stage, i.output)})",
            )
        parser.add_argument("--out", required=True, help=f"output folder (the workflow's: results/{name})")

        def call(args: argparse.Namespace) -> int:
            kwargs = {i.output: Path(getattr(args, i.output)) for i in reads}
            return _stage(name).run(params=params_from_args(args), out=Path(args.out), **kwargs)

        parser.set_defaults(func=call)

    return add


# every stage of the table without flags of its own gets the generic ones (a new stage needs no edit here)
for _name, _command in COMMANDS.items():
    if _command.stage is not None and _name not in FLAGS:
        FLAGS[_name] = generic_stage_flags(_name)
