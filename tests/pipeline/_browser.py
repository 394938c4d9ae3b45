"""A real headless Chromium (Debian's `chromium`, installed by .ci/run) rendering a `dvc plots` page: the DOM
after Vega has drawn (the offline template makes Vega draw SVG: lenbatch_study.tools.plots), the marks
each plot drew, and a screenshot."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest

# Chromium as root in a container: no sandbox, no GPU; virtual time lets Vega's async rendering finish
# before the DOM is dumped, whatever the machine's load
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=30000"]


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("no chromium on PATH: apt-get install chromium (.ci/run installs it)")


def dump_dom(page: Path) -> str:
    out = subprocess.run(
        [chromium(), *FLAGS, "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and "</html>" in out.stdout, out.stderr[-2000:]
    return out.stdout


def screenshot(page: Path, png: Path, size: str = "1100,2400") -> None:
    png.parent.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        [chromium(), *FLAGS, f"--window-size={size}", f"--screenshot={png.resolve()}", page.resolve().as_uri()],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and png.stat().st_size > 0, out.stderr[-2000:]


class _Marks(HTMLParser):
    """Per DVC plot div (its id): the SVG elements Vega drew inside each data-mark group (``class="mark-<type>
    role-mark ..."``: bars, points, text, rules; axes and legends are other roles), by mark type."""

    def __init__(self) -> None:
        super().__init__()
        self.plot: str | None = None
        self.stack: list[tuple[str, str | None]] = []  # (tag, mark type of a role-mark group)
        self.found: dict[str, Counter] = {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div" and a.get("id") and a["id"].endswith("_json"):
            self.plot = a["id"]
            self.found.setdefault(self.plot, Counter())
        cls = a.get("class") or ""
        m = re.match(r"mark-(\w+) role-mark\b", cls)
        inside = next((t for _, t in reversed(self.stack) if t), None)
        if self.plot and inside and tag in ("path", "text", "line", "rect", "circle"):
            self.found[self.plot][inside] += 1
        if tag not in ("path", "line", "rect", "circle", "img", "br", "meta", "input"):
            self.stack.append((tag, m.group(1) if m else None))

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)  # <path/>: nothing to close

    def handle_endtag(self, tag):
        if tag not in (t for t, _ in self.stack):  # </path> of an element never pushed
            return
        while self.stack:
            t, _ = self.stack.pop()
            if t == tag:
                break


def marks_per_plot(dom: str) -> dict[str, Counter]:
    """``{plot div id: Counter(mark type -> SVG elements drawn)}`` of a rendered page."""
    parser = _Marks()
    parser.feed(dom)
    return parser.found
