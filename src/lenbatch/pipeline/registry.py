"""The commands: one table of every ``lenbatch <name>`` (its module, its one-line help, whether its
``--out`` is written whole). The CLI reads it; no stage imports it (so its help strings are nobody's
code dependency)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """``lenbatch <name>``: ``module`` exposes the stage's keyword function; ``staged``: its ``--out``
    directory is written whole or not at all (:func:`lenbatch.pipeline.outputs.staged_output`: the
    stage writes into a staging directory that replaces ``--out`` only when it succeeds, under a
    one-writer lock). train appends across ``--resume`` and takes its own lock (on the rank that writes)."""

    module: str
    help: str
    staged: bool = False


# Order is the order of the DAG, then the tools.
COMMANDS: dict[str, Command] = {
    "tokenize": Command("lenbatch.stages.tokenize", "tokenize chat data into an Arrow dataset and lengths.npy",
                        staged=True),
    "stats": Command("lenbatch.stages.stats", "length percentiles, histogram and counts per bucket", staged=True),
    "boundaries": Command("lenbatch.stages.boundaries",
                          "optimal length-bucket edges (geometric, coordinate, dp) and a K sweep", staged=True),
    "plan": Command("lenbatch.stages.plan", "plan one epoch of one strategy and write its batches as JSON",
                    staged=True),
    "plans": Command("lenbatch.stages.plans", "simulate every strategy: padding efficiency, budget fill, diversity",
                     staged=True),
    "profile": Command("lenbatch.stages.profile", "time the target + drafter step on a grid of batch shapes",
                       staged=True),
    "train": Command("lenbatch.stages.train", "train the drafter with one batching strategy and measure throughput"),
    "verify-packing": Command("lenbatch.stages.verify_packing",
                              "check that a packed forward equals the per-sequence forwards"),
    "quality": Command("lenbatch.stages.quality", "held-out loss over seeds and gradient quality of every strategy"),
    "compare": Command("lenbatch.stages.compare", "predicted vs measured throughput, frontier plot and report",
                       staged=True),
    "params": Command("lenbatch.stages.params", "validate a params file, or print its resolved values or JSON schema"),
    "plots": Command("lenbatch.stages.plots",
                     "dvc plots diff rendered offline (Vega inlined): frontier, throughput, histogram"),
    "dvc-yaml": Command("lenbatch.stages.dvc_yaml",
                        "write dvc.yaml from the stages' derived code and params dependencies"),
    "sync": Command("lenbatch.stages.sync",
                    "record in Snakemake's metadata the results DVC verified (after dvc repro/checkout), so "
                    "snakemake -n agrees with dvc status"),
}

__all__ = ["COMMANDS", "Command"]
