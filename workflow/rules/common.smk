# Shared helpers: params validation (before any rule runs), the per-rule params
# payload, and the source modules each rule runs (so code changes rerun it).
import json
import shlex
from pathlib import Path

from lenbatch.config import STRATEGY_NAMES, params_from_dict

# Refuse a bad params file before anything runs: our loader names the key and the fix,
# the JSON schema (generated from the same dataclasses) is Snakemake's own check.
try:
    PARAMS = params_from_dict(config, source="the workflow config (params.yaml and any --configfile/--config)")
except ValueError as err:
    raise WorkflowError(f"invalid params: {err}")
validate(config, "../schemas/params.schema.yaml")

PYTHON_SRC = Path("src/lenbatch")
LOGS = "logs"
BENCH = "logs/benchmarks"


wildcard_constraints:
    strategy="|".join(STRATEGY_NAMES),


def cfg(*sections, exclude=()):
    """The params a rule reads, as one shell-quoted JSON argument.

    Snakemake reruns a rule when its params change, so a rule gets exactly the keys
    it uses: editing train.useful_tokens reruns train and compare, not tokenize.
    Items are whole sections ("batching") or single keys ("data.max_len");
    ``exclude`` holds "section.key" names a rule must not depend on.
    """
    payload = {}
    for item in sections:
        section, _, key = item.partition(".")
        if key:
            payload.setdefault(section, {})[key] = config[section][key]
        else:
            payload[section] = {k: v for k, v in config[section].items() if f"{section}.{k}" not in exclude}
    return shlex.quote(json.dumps(payload, sort_keys=True))


def code(*modules):
    """Source files a rule runs: the modules named plus the shared config, cli and log."""
    names = set(modules) | {"config", "cli", "log", "__init__"}
    files = sorted(str(PYTHON_SRC / f"{name}.py") for name in names)
    return [f for f in files if Path(f).exists()]


STAGE = "lenbatch {stage} --params params.yaml --params-json {cfg}"
