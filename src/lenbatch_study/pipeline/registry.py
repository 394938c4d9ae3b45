"""The stage table: each stage of the DAG, the params keys its code reads, its inputs (other stages'
outputs) and its outputs. dvc.yaml, the Snakemake rules, ``rule all``, the stages' commands and their code
dependencies derive from it (DESIGN.md, "The stage graph"; adding a stage: docs/workflow.md). No stage imports
this module (editing it reruns nothing); it imports the artifact modules only for their file names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from lenbatch_study.pipeline.artifacts import (
    bucket_edges,
    compare_report,
    interleave_timings,
    length_stats,
    machine_file,
    source_file,
    plan_metrics,
    profile_grid,
    quality_result,
    tokenized,
    train_runs,
    writing,
)


@dataclass(frozen=True)
class Output:
    """A file (or folder) a stage writes, under ``<results>/<stage>/[<strategy>/]``. ``kind``: DVC's
    ``outs``, ``metrics`` or ``plots`` (``plot`` its axes); ``cache``: in DVC's cache instead of git (the
    tokenized dataset); ``declared``: a Snakemake output too (not a file a resumed job appends to, which
    Snakemake would delete before the job runs)."""

    file: str
    kind: str = "outs"
    cache: bool = False
    directory: bool = False
    plot: Mapping[str, str] | None = None
    declared: bool = True


@dataclass(frozen=True)
class Input:
    """Output ``output`` of stage ``stage``. ``only_for``: read only when that strategy runs;
    ``trigger_only``: reruns the stage but is never read (the machine fingerprint); ``gate``: DVC's stand-in
    for an ``only_for`` input of a per-strategy stage, ``<gate>/<strategy>.json`` (DESIGN.md, "The stage graph")."""

    stage: str
    output: str
    only_for: str | None = None
    trigger_only: bool = False
    gate: str | None = None


@dataclass(frozen=True)
class Stage:
    """``params``: whole sections (``"model"``) or single keys (``"data.max_len"``), ``exclude`` dropping keys
    of a whole section; ``per_strategy``: one job per strategy (DVC's ``foreach``); ``always_changed``: run by
    DVC every time and written by the Snakefile as it is parsed, rewriting its file only when it changes (what
    no file tells has changed: the machine, the data source); ``threads``: the params key that sets its rule's
    threads."""

    params: tuple[str, ...]
    inputs: tuple[Input, ...] = ()
    outputs: Mapping[str, Output] = field(default_factory=dict)
    exclude: tuple[str, ...] = ()
    per_strategy: bool = False
    always_changed: bool = False
    threads: str | None = None


@dataclass(frozen=True)
class Command:
    """``lenbatch <name>``: ``help`` its one line; ``staged``: its ``--out`` is written whole or not at all
    (:func:`lenbatch_study.pipeline.outputs.staged_output`); ``stage``: set for a stage of the DAG."""

    name: str
    help: str
    staged: bool = False
    stage: Stage | None = None

    @property
    def module(self) -> str:
        """``lenbatch_study.stages.<name>`` for a stage, ``lenbatch_study.tools.<name>`` for a tool."""
        return f"lenbatch_study.{'stages' if self.stage else 'tools'}." + self.name.replace("-", "_")


_IN_LENGTHS = Input("tokenize", "lengths")
_IN_DATASET = Input("tokenize", "dataset")
_IN_EDGES = Input("boundaries", "boundaries")
# The measuring stages depend on the machine: another machine (or another torch) reruns them
_IN_MACHINE = Input("machine", "machine", trigger_only=True)
# The data source's bytes (user's file or the embedded one): changed data retokenizes
_IN_SOURCE = Input("source", "source", trigger_only=True)
_PLOTS = compare_report.DVC_PLOTS
_MODEL_RUN = ("model", "drafter", "batching")  # what a stage that runs the model reads besides its own section


def _train(*keys: str) -> tuple[str, ...]:
    return tuple(f"train.{k}" for k in keys)


# what profile and interleave time: the StepRunner (lenbatch_study.runtime.runner) with these train.* keys
_STEP_RUNNER = _train("nproc", "threads", "device", "kernels", "reuse_host_memory")

# In DAG order.
_ALL = (
    Command(
        "machine",
        "write this machine's fingerprint to machine.json (only when it changed)",
        stage=Stage(params=(), always_changed=True, outputs={"machine": Output(machine_file.MACHINE)}),
    ),
    Command(
        "source",
        "write the data source's identity (sha256, size) to source.json (only when it changed)",
        stage=Stage(params=("data.source",), always_changed=True, outputs={"source": Output(source_file.SOURCE)}),
    ),
    Command(
        "tokenize",
        "tokenize chat data into an Arrow dataset and lengths.npy",
        staged=True,
        stage=Stage(
            params=("data",),
            threads="data.workers",
            inputs=(_IN_SOURCE,),
            outputs={
                "dataset": Output(tokenized.DATASET, cache=True, directory=True),
                "lengths": Output(tokenized.LENGTHS),
                "counts": Output(tokenized.STATS),
            },
        ),
    ),
    Command(
        "stats",
        "length percentiles, histogram and counts per bucket",
        staged=True,
        stage=Stage(
            params=("stats", "batching.seed"),  # seed: lengths drawn from a profile
            inputs=(_IN_LENGTHS,),
            outputs={
                "stats": Output(length_stats.STATS),
                "histogram": Output(length_stats.HISTOGRAM),  # compare's histogram.json is the plot (edges)
                "plot": Output(length_stats.PLOT),
            },
        ),
    ),
    Command(
        "boundaries",
        "optimal length-bucket edges (geometric, coordinate, dp) and a K sweep",
        staged=True,
        stage=Stage(
            params=("boundaries", "batching", "plans", "data.max_len"),
            inputs=(_IN_LENGTHS,),
            outputs={
                "boundaries": Output(bucket_edges.BOUNDARIES),
                "sweep": Output(bucket_edges.SWEEP),
                "by_strategy": Output(bucket_edges.BY_STRATEGY, directory=True),
            },
        ),
    ),
    Command(
        "plans",
        "simulate every strategy: padding efficiency, budget fill, diversity",
        staged=True,
        stage=Stage(
            params=("batching", "plans", "data.max_len"),
            inputs=(_IN_LENGTHS, _IN_EDGES),
            outputs={"metrics": Output(plan_metrics.METRICS)},
        ),
    ),
    # times train's StepRunner but never trains: no warmup_steps, queue_size, useful_tokens or strategies
    Command(
        "profile",
        "time the target + drafter step on a grid of batch shapes",
        staged=True,
        stage=Stage(
            params=(*_MODEL_RUN, *_STEP_RUNNER, "profile", "data.max_len"),
            inputs=(_IN_MACHINE,),
            outputs={"grid": Output(profile_grid.GRID)},
        ),
    ),
    # one job per strategy; only bucketed reads the edges, so boundaries.* never reruns the others
    Command(
        "train",
        "train the drafter with one batching strategy and measure throughput",
        stage=Stage(
            params=(*_MODEL_RUN, "train", "data.max_len"),
            exclude=("train.strategies",),
            per_strategy=True,
            inputs=(
                _IN_MACHINE,
                _IN_DATASET,
                _IN_LENGTHS,
                Input("boundaries", "boundaries", only_for="bucketed", gate="by_strategy"),
            ),
            outputs={"summary": Output(train_runs.SUMMARY), "steps": Output(train_runs.STEPS, declared=False)},
        ),
    ),
    # its own lr and anchors; the edges whatever the list holds (DVC's one stage cannot drop them)
    Command(
        "quality",
        "held-out loss over seeds and gradient quality of every strategy",
        stage=Stage(
            params=("quality", *_MODEL_RUN, "train.strategies", "train.device", "data.max_len"),
            exclude=("drafter.lr", "drafter.anchors_per_seq"),
            inputs=(_IN_MACHINE, _IN_DATASET, _IN_LENGTHS, _IN_EDGES),
            outputs={
                "quality": Output(quality_result.QUALITY),
                "metrics": Output(quality_result.METRICS),
                "curves": Output(quality_result.CURVES),
                "gradients": Output(quality_result.GRADIENTS),
            },
        ),
    ),
    # the edges whatever the list holds, as quality's
    Command(
        "interleave",
        "time every strategy's training steps in turns, in one process",
        staged=True,
        stage=Stage(
            params=(
                *_MODEL_RUN,
                *_STEP_RUNNER,
                *_train("strategies", "nodes", "queue_size", "useful_tokens", "warmup_steps"),
                "interleave",
                "data.max_len",
            ),
            inputs=(_IN_MACHINE, _IN_DATASET, _IN_LENGTHS, _IN_EDGES),
            outputs={"timings": Output(interleave_timings.TIMINGS)},
        ),
    ),
    # compare's files are for people (no stage reads them): metrics users compare, the plots, the rest
    Command(
        "compare",
        "predicted vs measured throughput, frontier plot and report",
        staged=True,
        stage=Stage(
            params=(*_MODEL_RUN, "train", "plans", "boundaries", "interleave", "compare", "data.max_len"),
            inputs=(
                Input("stats", "stats"),
                Input("stats", "histogram"),
                _IN_DATASET,
                _IN_LENGTHS,
                _IN_EDGES,
                Input("tokenize", "counts"),
                Input("boundaries", "sweep"),
                Input("plans", "metrics"),
                Input("profile", "grid"),
                Input("train", "summary"),
                Input("train", "steps"),
                Input("quality", "quality"),
                Input("interleave", "timings"),
            ),
            outputs={
                "metrics": Output(compare_report.METRICS, kind="metrics"),
                "diagnostics": Output(compare_report.DIAGNOSTICS),
                "report": Output(compare_report.REPORT),
                "details": Output(compare_report.DETAILS),
                "stepmodel": Output(compare_report.STEPMODEL),
                "histogram": Output(compare_report.HISTOGRAM_PLOT),
                "quality_plot": Output(compare_report.QUALITY_PLOT),
                "params": Output(writing.PARAMS),
                # DVC's interactive plots, drawn as compare_report.DVC_PLOTS says
                "frontier": Output(compare_report.FRONTIER, kind="plots", plot=_PLOTS[compare_report.FRONTIER]),
                "throughput": Output(compare_report.THROUGHPUT, kind="plots", plot=_PLOTS[compare_report.THROUGHPUT]),
                "histogram_data": Output(compare_report.HISTOGRAM, kind="plots", plot=_PLOTS[compare_report.HISTOGRAM]),
                "frontier_plot": Output(compare_report.FRONTIER_PLOT, kind="plots"),
                "throughput_plot": Output(compare_report.THROUGHPUT_PLOT, kind="plots"),
            },
        ),
    ),
)

COMMANDS: dict[str, Command] = {c.name: c for c in _ALL}
STAGES: dict[str, Stage] = {c.name: c.stage for c in _ALL if c.stage is not None}


def output_path(stage: str, name: str, *, results: str = "results", strategy: str | None = None) -> str:
    """Where output ``name`` of ``stage`` lives: ``<results>/<stage>/[<strategy>/]<file>`` (a per-strategy
    stage without ``strategy``: the ``{strategy}`` wildcard)."""
    st = STAGES[stage]
    sub = f"{strategy if strategy is not None else '{strategy}'}/" if st.per_strategy else ""
    return f"{results}/{stage}/{sub}{st.outputs[name].file}"


def input_paths(
    stage: str, *, results: str = "results", strategies: Any, strategy: str | None = None
) -> dict[str, list[str]]:
    """``stage``'s inputs as ``{output name: [paths]}`` for a run of ``strategies`` (a per-strategy
    stage's job: its ``strategy``). An input from a per-strategy stage is its output for every
    strategy; one ``only_for`` a strategy that does not run is left out."""
    st = STAGES[stage]
    running = [strategy] if st.per_strategy else list(strategies)
    out: dict[str, list[str]] = {}
    for i in st.inputs:
        if i.only_for is not None and i.only_for not in running:
            continue
        assert i.output not in out, f"stage {stage}: two inputs named {i.output!r}; rename an output"
        if STAGES[i.stage].per_strategy:
            out[i.output] = [output_path(i.stage, i.output, results=results, strategy=s) for s in strategies]
        else:
            out[i.output] = [output_path(i.stage, i.output, results=results)]
    return out


__all__ = ["COMMANDS", "STAGES", "Command", "Input", "Output", "Stage", "input_paths", "output_path"]
