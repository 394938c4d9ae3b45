"""``lenbatch dvc-yaml``: write ``dvc.yaml`` from the stages' derived dependencies
(:func:`lenbatch.pipeline.deps.dvc_yaml`)."""

from __future__ import annotations

from pathlib import Path

from lenbatch.pipeline.deps import dvc_yaml


def run(*, out: str, check: bool = False) -> int:
    """``lenbatch dvc-yaml``: write :func:`dvc_yaml` to ``out`` ('-': stdout); with ``check``, exit 1
    when ``out`` differs from it instead of writing."""
    import sys

    text = dvc_yaml()
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
