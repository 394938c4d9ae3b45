"""The Python blocks of one section of docs/integrations.md (the tests run them as written)."""

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def section_blocks(title: str) -> list[str]:
    text = DOC.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 5)
    return re.findall(r"```python\n(.*?)```", text[start : end if end >= 0 else len(text)], flags=re.S)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
