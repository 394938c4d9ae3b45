"""``lenbatch plots``: ``dvc plots diff`` rendered without network. ``dvc plots show/diff`` load vega,
vega-lite and vega-embed from a CDN, so offline (a cluster node) the data plots stay blank.
:func:`offline_template` is a DVC HTML template with them inlined from the copies Snakemake ships
(``snakemake/assets/data``, BSD-3), which the repo's ``.dvc/config`` names as ``plots.html_template``
(:data:`TEMPLATE`), so DVC's own ``dvc plots show``/``diff`` render offline as well. :func:`write_template`
writes it (``make install``, ``lenbatch plots --write-template``); not committed: 2.2 MB rebuilt from the
installed Snakemake (without it DVC stops with "HTML template has to contain '{plot_divs}'").
docs/workflow.md shows use.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# DVC's plots.html_template, relative to the repo's .dvc/ folder (as .dvc/config has it; a test checks both agree)
TEMPLATE = "offline-plots.html"
LIBRARIES = ("vega/vega.js", "vega-lite/vega-lite.js", "vega-embed/vega-embed.js")
# DVC's page calls vegaEmbed(div, spec), which draws on a canvas; SVG puts every mark in the page (text that
# can be searched and printed sharply, and that tests/pipeline/_browser.py counts per plot in Chromium)
SVG_RENDERER = """(function () {
  var embed = window.vegaEmbed;
  window.vegaEmbed = function (el, spec, opt) { return embed(el, spec, Object.assign({renderer: "svg"}, opt || {})); };
})();"""


def _assets() -> Path:
    try:
        import snakemake
    except ImportError as err:  # pragma: no cover - snakemake is a workflow dependency
        raise ValueError(
            "lenbatch plots inlines the Vega libraries Snakemake ships; install 'lenbatch-study[workflow]' (make install)"
        ) from err
    return Path(snakemake.__file__).parent / "assets" / "data"


def offline_template() -> str:
    """A DVC plots HTML template (``{plot_divs}``) with vega, vega-lite and vega-embed inlined, and
    :data:`SVG_RENDERER`."""
    root = _assets()
    scripts = []
    for rel in LIBRARIES:
        path = root / rel
        if not path.is_file():
            raise ValueError(
                f"{path} is missing: the installed snakemake lacks its bundled Vega; reinstall "
                "snakemake (pip install --force-reinstall 'snakemake>=9') or use `dvc plots diff`"
            )
        js = path.read_text(encoding="utf8")
        assert "</script" not in js, f"{rel} cannot be inlined"
        scripts.append(f'<script type="text/javascript">\n{js}\n</script>')
    scripts.append(f'<script type="text/javascript">\n{SVG_RENDERER}\n</script>')
    return (
        '<!DOCTYPE html>\n<html>\n<head>\n<meta charset="utf-8">\n<title>lenbatch plots</title>\n'
        + "\n".join(scripts)
        + "\n<style>table { border-spacing: 15px; }</style>\n</head>\n<body>\n{plot_divs}\n</body>\n</html>\n"
    )


def write_template(root: str | Path = ".") -> Path:
    """Write :func:`offline_template` where ``.dvc/config`` points DVC (``<root>/.dvc/`` + :data:`TEMPLATE`),
    only when its bytes change; the path. ``ValueError`` when ``root`` is not a DVC repo."""
    dvc_dir = Path(root) / ".dvc"
    if not dvc_dir.is_dir():
        raise ValueError(f"{Path(root).absolute()} has no .dvc/ folder: run this in the lenbatch repo root")
    path = dvc_dir / TEMPLATE
    text = offline_template()
    if not path.is_file() or path.read_text(encoding="utf8") != text:
        path.write_text(text, encoding="utf8")
    return path


def run(*, revisions: list[str], out: str, write_only: bool = False) -> int:
    """``lenbatch plots``: write the template (:func:`write_template`), then, unless ``write_only``,
    ``dvc plots diff`` of ``revisions`` into ``out`` with it; DVC's exit code."""
    template = write_template(".")
    if write_only:
        print(f"wrote {template} (dvc plots show/diff now render offline)", file=sys.stderr)
        return 0
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = ["dvc", "plots", "diff", "--html-template", str(template.absolute()), "-o", str(out), *revisions]
    code = subprocess.call(cmd)
    if code == 0:
        print(f"wrote {out / 'index.html'} (renders offline)", file=sys.stderr)
    return code
