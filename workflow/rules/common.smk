# Shared helpers: params validation (before any rule runs), the results root, each rule's code
# inputs and params (derived in src/lenbatch/deps.py, which also writes dvc.yaml), and Ctrl-C.
import json
import os
import shlex
import signal

from lenbatch.pipeline import deps
from lenbatch.core.config import STRATEGY_NAMES, params_from_dict

# Where this config's results go. params.yaml leaves it at results/ (what DVC tracks and git commits);
# configs/*.yaml set their own (results/tiny, results/qwen3.6-27b-8gpu) so they never overwrite it.
R = str(config.pop("results_dir", "results")).rstrip("/")

# Refuse a bad params file before anything runs: our loader names the key and the fix,
# the JSON schema (generated from the same dataclasses) is Snakemake's own check.
try:
    PARAMS = params_from_dict(config, source="the workflow config (params.yaml and any --configfile/--config)")
except ValueError as err:
    raise WorkflowError(f"invalid params: {err}")
validate(config, "../schemas/params.schema.yaml")

LOGS = f"{R}/logs" if R != "results" else "logs"
BENCH = f"{LOGS}/benchmarks"
STRATEGIES = deps.strategies(config)


wildcard_constraints:
    strategy="|".join(STRATEGY_NAMES),


def cfg(stage):
    """The params ``stage`` reads (deps.STAGES), as one shell-quoted JSON argument.

    Snakemake reruns a rule when its params change, so a rule gets exactly the keys its code
    reads: editing train.warmup_steps reruns train and compare, not profile. dvc.yaml lists the
    same keys (lenbatch dvc-yaml), so `dvc status` names the same stages.
    """
    return shlex.quote(json.dumps(deps.stage_payload(stage, config), sort_keys=True))


# DVC's stage commands set LENBATCH_STAGE_ONLY=1 and force their one rule: DVC has already judged
# the stage stale and run everything upstream (or restored it: `dvc exp run --temp` works in a fresh
# clone whose file times say nothing). Every input is then ancient(), so Snakemake never reruns an
# upstream job on file times, and --rerun-triggers mtime keeps it off params it recorded elsewhere.
STAGE_ONLY = os.environ.get("LENBATCH_STAGE_ONLY") == "1"


def up(path):
    """An input path; ancient() under a DVC stage command (see STAGE_ONLY)."""
    if isinstance(path, (list, tuple)):
        return [up(p) for p in path]
    return ancient(path) if STAGE_ONLY else path


def code(stage):
    """Source files ``stage`` runs: the import closure of its entry module (deps.stage_code)."""
    return up(deps.stage_code(stage))


def pretrained():
    """The target checkpoint's files (model.pretrained; none when null): inputs of the rules that load it
    (deps.PRETRAINED_STAGES), so a changed checkpoint reruns them. dvc.yaml lists the same files."""
    return up(deps.pretrained_files(config["model"]["pretrained"]))


STAGE = "lenbatch {stage} --params params.yaml --params-json {cfg}"


# Ctrl-C (SIGINT) to snakemake alone: Snakemake's local executor waits for running jobs to finish
# (a training would run to its end and then be discarded as incomplete). Pass the interrupt on to
# every process this snakemake started (torchrun forwards it to its workers), then let Snakemake
# handle it as usual: it marks the jobs incomplete, and the next run resumes the training.
def _descendants(pid):
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


_previous_sigint = signal.getsignal(signal.SIGINT)


def _forward_sigint(signum, frame):
    for pid in _descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            pass
    if callable(_previous_sigint):
        _previous_sigint(signum, frame)
    else:
        raise KeyboardInterrupt


if os.path.isdir("/proc") and signal.getsignal(signal.SIGINT) is not _forward_sigint:
    try:
        signal.signal(signal.SIGINT, _forward_sigint)
    except ValueError:  # not the main thread (an API caller): nothing to forward from here
        pass
