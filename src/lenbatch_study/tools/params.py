"""``lenbatch params``: validate a params file, or print its resolved values or its JSON schema."""

from __future__ import annotations

import json
import sys

from lenbatch_study.core.config import SECTIONS, load_params
from lenbatch_study.core.schema import schema_yaml


def run(*, params: list[str], schema: bool = False, show: bool = False) -> int:
    """``lenbatch params``: print the schema, or the params (files or inline JSON, merged in order)
    resolved as JSON (``show``), or one line saying they are valid."""
    if schema:
        sys.stdout.write(schema_yaml())
        return 0
    resolved = load_params(*params)
    if show:
        print(json.dumps(resolved.to_dict(), indent=2))
    else:
        print(f"{' + '.join(params)}: valid ({len(SECTIONS)} sections)")
    return 0
