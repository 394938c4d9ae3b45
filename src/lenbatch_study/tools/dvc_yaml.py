"""``lenbatch dvc-yaml``: write ``dvc.yaml`` from the stages' derived dependencies
(:func:`lenbatch_study.pipeline.deps.dvc_yaml`)."""

from __future__ import annotations

from pathlib import Path

from lenbatch_study.pipeline.deps import dvc_yaml


def run(*, out: str, check: bool = False) -> int:
    """``lenbatch dvc-yaml``: write :func:`dvc_yaml` to ``out`` ('-': stdout); with ``check``, exit 1
    when ``out`` differs from it instead of writing."""
    import sys

    text = dvc_yaml(pretrained=_pretrained("params.yaml"), source=_source("params.yaml"))
    if out == "-":
        sys.stdout.write(text)
        return 0
    path = Path(out)
    if check:
        if not path.exists() or path.read_text() != text:
            print(f"{path} is stale: regenerate it with `lenbatch dvc-yaml`", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    return 0


def _pretrained(params: str) -> str | None:
    """``model.pretrained`` of the params file DVC tracks (its checkpoint files become deps), None without one."""
    from lenbatch_study.core.config import load_params

    return load_params(params).model.pretrained if Path(params).exists() else None


def _source(params: str) -> str | None:
    """``data.source`` of the params file DVC tracks (a user's file becomes a dep of tokenize), None without one."""
    from lenbatch_study.core.config import load_params

    return load_params(params).data.source if Path(params).exists() else None
