"""The workflow's inputs, checked before any job runs: a bad input then fails in seconds, touching nothing.

Snakemake parses ``workflow/rules/common.smk`` once per run (and DVC runs one Snakemake per stage), so a
check made there refuses a run before its first job. :func:`check_inputs` covers what ``params.yaml``
names outside the results: the data source (it exists and its first record has a known schema), a local
tokenizer folder and a local target checkpoint folder. Cost: one ``stat`` per path and the first record
of the source (one read of at most a few MB, whatever the file's size; a Parquet file's footer and first
batch; a ``save_to_disk`` folder's metadata).
"""

from __future__ import annotations

from pathlib import Path

from lenbatch_study.core.config import Params
from lenbatch_study.corpus.chat import BadRecord, check_tokenizer_spec, conversation_from_record
from lenbatch_study.corpus.sources import SourceReport, iter_records, resolve_source


def check_source(source: str, *, on_bad_record: str) -> None:
    """``data.source`` exists, is a supported format and (under ``on_bad_record: error``) its first record
    has a known schema (ShareGPT ``conversations`` or OpenAI ``messages``); ``ValueError`` names the
    source and the fix. An empty source is left to the tokenize stage (it reports the counts)."""
    path, fmt = resolve_source(source)
    records = iter_records(path, fmt, SourceReport(str(path), fmt), limit=1)
    try:
        first = next(iter(records), None)
    finally:
        records.close()
    if first is None or on_bad_record != "error":
        return
    index, record = first
    try:
        conversation_from_record(record)
    except BadRecord as bad:
        if bad.reason == "no_schema":
            raise ValueError(
                f"data.source {source!r}: record {index + 1} {bad.detail}; give a source of ShareGPT "
                "('conversations') or OpenAI ('messages') records, or set data.on_bad_record: skip"
            ) from None


def check_pretrained(pretrained: str | None) -> None:
    """``model.pretrained`` (when set) is a folder holding ``config.json``."""
    if pretrained is None:
        return
    root = Path(pretrained)
    if not root.is_dir() or not (root / "config.json").is_file():
        what = (
            "does not exist"
            if not root.exists()
            else ("is not a folder" if not root.is_dir() else "has no config.json")
        )
        raise ValueError(
            f"model.pretrained {pretrained!r} {what}; give a local Hugging Face checkpoint folder "
            "(config.json + *.safetensors), or null for random weights"
        )


def check_inputs(params: Params) -> None:
    """Every input ``params`` names outside the results (see the module doc); ``ValueError`` on the first bad one."""
    check_source(params.data.source, on_bad_record=params.data.on_bad_record)
    check_tokenizer_spec(params.data.tokenizer)
    check_pretrained(params.model.pretrained)


__all__ = ["check_inputs", "check_pretrained", "check_source"]
