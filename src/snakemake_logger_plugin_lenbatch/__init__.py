"""Snakemake finds a logger plugin by this module name (``logger: lenbatch`` in profiles/default); the
handler is :class:`lenbatch_study.pipeline.console.LogHandler`."""

from lenbatch_study.pipeline.console import LogHandler

__all__ = ["LogHandler"]
