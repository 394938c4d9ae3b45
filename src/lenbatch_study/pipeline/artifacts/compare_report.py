"""The compare stage's output: files for people and for DVC's ``metrics``/``plots``; no stage reads them.

Written by :func:`lenbatch_study.analysis.report.write_outputs` (the report links its plots by these names);
``report.md`` is read by ``lenbatch readme`` (:mod:`lenbatch_study.tools.readme`), the plot data by
``lenbatch plots`` through DVC.

* ``metrics.json``: the numbers users compare (``dvc metrics diff``); ``diagnostics.json``: every number.
* ``report.md``: the answer and one table (at most 10 KB); ``details.md``: the evidence behind it;
  ``stepmodel.json``: the step-time fits, chosen and candidates.
* ``frontier.json``, ``throughput.json``, ``histogram.json``: DVC plot data; ``frontier.png``,
  ``throughput.png``, ``histogram.png`` and (with quality results) ``quality.png``: the report's figures.
"""

from __future__ import annotations

WRITER = "compare"
METRICS = "metrics.json"
DIAGNOSTICS = "diagnostics.json"
REPORT = "report.md"
DETAILS = "details.md"
STEPMODEL = "stepmodel.json"
FRONTIER = "frontier.json"
THROUGHPUT = "throughput.json"
HISTOGRAM = "histogram.json"
FRONTIER_PLOT = "frontier.png"
THROUGHPUT_PLOT = "throughput.png"
HISTOGRAM_PLOT = "histogram.png"
QUALITY_PLOT = "quality.png"
# How DVC draws each plot data file (dvc.yaml's plots entries), with its Vega-Lite template in workflow/plots/:
# DVC's default, a line over a quantitative x, draws strategies blank or joined
DVC_PLOTS = {
    FRONTIER: {
        "x": "length_mixing",
        "y": "efficiency",
        "template": "workflow/plots/labelled_points.json",
        "title": "padding efficiency vs length mixing (strategies and bucketed K)",
        "x_label": "length mixing",
        "y_label": "simulated padding efficiency",
    },
    THROUGHPUT: {
        "x": "measured_tok_s",
        "y": "strategy",
        "template": "workflow/plots/bars.json",
        "title": "measured throughput per strategy",
        "x_label": "useful tokens/s",
        "y_label": "strategy",
    },
    HISTOGRAM: {
        "x": "lo",
        "y": "count",
        "template": "workflow/plots/histogram.json",
        "title": "sample lengths and the bucket edges",
        "x_label": "length (tokens)",
        "y_label": "samples",
    },
}
# the report's path in the default results folder (``lenbatch readme`` reads it)
REPORT_PATH = f"results/{WRITER}/{REPORT}"

__all__ = [
    "DETAILS",
    "DIAGNOSTICS",
    "DVC_PLOTS",
    "FRONTIER",
    "FRONTIER_PLOT",
    "HISTOGRAM",
    "HISTOGRAM_PLOT",
    "METRICS",
    "QUALITY_PLOT",
    "REPORT",
    "REPORT_PATH",
    "STEPMODEL",
    "THROUGHPUT",
    "THROUGHPUT_PLOT",
    "WRITER",
]
