"""``lenbatch tokenize``: chat data into an Arrow dataset, ``lengths.npy`` and ``stats.json``.

The work is :mod:`lenbatch_study.corpus.tokenizing` (read, format as ChatML, encode, length-limit);
this stage runs it on the ``data`` section and writes ``--out``. A source that is already
tokenized (a save_to_disk folder or Parquet file with an ``input_ids`` column) skips the tokenizer
(:mod:`lenbatch_study.corpus.pretokenized`) and gives the same outputs; ``stats.json["input"]`` says
which ("chat records" or "pre-tokenized"). Cost: see
:func:`lenbatch_study.corpus.tokenizing.tokenize`.
"""

from __future__ import annotations

from pathlib import Path

from lenbatch_study.core.config import Params
from lenbatch_study.core.log import get_logger
from lenbatch_study.corpus.pretokenized import detect, tokenize_pretokenized
from lenbatch_study.corpus.tokenizing import tokenize, write_outputs
from lenbatch_study.pipeline.artifacts.tokenized import output_paths
from lenbatch_study.pipeline.artifacts.writing import write_resolved

log = get_logger("tokenize")


def run(*, params: Params, out: str | Path, progress: bool = True, allow_truncated: bool | None = None) -> int:
    """``lenbatch tokenize``: :func:`tokenize` the ``data`` section's source into ``out``
    (:func:`write_outputs`); ``allow_truncated`` as :func:`tokenize`'s."""
    d = params.data
    pre = detect(d.source)
    if pre is not None:  # an input_ids column: the ids are given, data.tokenizer is not used
        path, fmt, mask_column = pre
        log.info(
            "tokenize: %s is pre-tokenized (input_ids, loss mask %s): no tokenizer; max_len %d (%s)%s",
            path,
            f"from {mask_column!r}" if mask_column else "none: every token trained",
            d.max_len,
            d.overflow,
            f", limit {d.limit}" if d.limit else "",
        )
        result = tokenize_pretokenized(
            path=path,
            fmt=fmt,
            mask_column=mask_column,
            max_len=d.max_len,
            overflow=d.overflow,
            limit=d.limit,
            spill_path=Path(out) / "tokens.arrow.tmp",
        )
    else:
        log.info(
            "tokenize %s with %s: max_len %d (%s), %d workers%s",
            d.source,
            d.tokenizer,
            d.max_len,
            d.overflow,
            d.workers,
            f", limit {d.limit}" if d.limit else "",
        )
        result = tokenize(
            source=d.source,
            tokenizer=d.tokenizer,
            max_len=d.max_len,
            overflow=d.overflow,
            limit=d.limit,
            workers=d.workers,
            on_bad_record=d.on_bad_record,
            progress=progress,
            spill_path=Path(out) / "tokens.arrow.tmp",
            allow_truncated=allow_truncated,
        )
        result.stats = {"input": "chat records", **result.stats}  # which path stats.json came from
    files = output_paths(out)
    stats = write_outputs(result, **files)
    written = [*files.values(), write_resolved(params, out, sections=("data",))]
    src = stats["source"]
    log.info(
        "%d records read%s; %d samples, %.2f M tokens (%d truncated at %d), dropped %s, skipped %s",
        stats["records_read"],
        f" (file cut off: {src['records_recovered_from_cut_off_file']} complete records recovered, "
        f"{src['bytes_left_over']} bytes left over)"
        if src["cut_off"]
        else "",
        stats["samples"],
        stats["total_tokens"] / 1e6,
        stats["truncated"],
        d.max_len,
        stats["dropped"],
        stats["skipped"] or "nothing",
    )
    secs = result.seconds
    log.info(
        "wrote %s/{%s} in %.1f s (encode %.1f s, write %.1f s); content sha256 %s",
        out,
        ", ".join(p.name for p in written),
        secs["total"],
        secs["read_and_encode"],
        secs["write"],
        stats["content_sha256"],
    )
    return 0
