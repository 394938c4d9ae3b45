"""The CLI's command list: the stages of the DAG (:data:`lenbatch_study.pipeline.registry.COMMANDS`, the
stage table) and the CLI's own tools, the commands no workflow runs (each ``lenbatch_study.tools.<name>``)."""

from __future__ import annotations

from lenbatch_study.pipeline.registry import COMMANDS as STAGE_COMMANDS
from lenbatch_study.pipeline.registry import Command

TOOLS = (
    Command("plan", "plan one epoch of one strategy and write its batches as JSON", staged=True),
    Command("verify-packing", "check that a packed forward equals the per-sequence forwards"),
    Command(
        "study-replay",
        "the study's own setting replayed (seed profile, budget 49,152, 7 ranks, its edges)",
        staged=True,
    ),
    Command("params", "validate a params file, or print its resolved values or JSON schema"),
    Command("plots", "dvc plots diff rendered offline (Vega inlined): frontier, throughput, histogram"),
    Command(
        "dvc-yaml", "write dvc.yaml from the stages' derived code and params deps, and params.yaml's missing defaults"
    ),
    Command("reruns", "the stages an edit of each module reruns (derived: the stages' import closures)"),
    Command("readme", "copy the committed report's results table into README.md (--check: fail if it differs)"),
)

# every ``lenbatch <name>``: the stages in DAG order, then the tools
COMMANDS: dict[str, Command] = {**STAGE_COMMANDS, **{t.name: t for t in TOOLS}}
