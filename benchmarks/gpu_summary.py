"""The GPU check's summary (``OUT/summary.json``), its printed table and ``--collect``: what the steps
wrote, read back (benchmarks/gpu_check.py runs the steps). Standard library only."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any


def _load(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def verify_result(log: Path) -> dict[str, Any] | None:
    """PASS/FAIL, backends and the per-layer differences printed by verify-packing."""
    if not log.exists():
        return None
    text = log.read_text()
    res: dict[str, Any] = {
        "result": "PASS" if "verify-packing: PASS" in text else ("FAIL" if "verify-packing: FAIL" in text else None)
    }
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("verify-packing:") and "backend" in line:
            res["setting"] = line.removeprefix("verify-packing: ")
        elif "max |packed - per-sequence|" in line:
            kind = line.split()[0] if not line.startswith("final") else "final"
            res[f"{kind}_max_abs_diff"] = float(line.split("=")[1].split()[0])
        elif line.startswith("fla triangular solve"):
            res["solve"] = line
        elif line.startswith("verify-packing: PASS") or line.startswith("verify-packing: FAIL"):
            res["tolerance"] = line.split("(", 1)[1].rstrip(")") if "(" in line else None
    return res


def summarize(
    out: Path,
    timings: dict[str, float],
    failed: str | None,
    *,
    strategies: tuple[str, ...],
    estimates: dict[str, int],
    machine: dict[str, Any],
    rehearse: bool = False,
    tolerance_missed: list[str] | None = None,
    skipped: dict[str, str] | None = None,
    failed_steps: list[str] | None = None,
    budget: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What the check found, from the files the steps wrote (a missing file -> None).
    ``failed``: the first step that failed; ``failed_steps``: all of them (a step after compare fails
    alone); ``tolerance_missed``: the verify steps over their tolerance (the check went on past them);
    ``skipped``: step -> why it did not run here (:func:`skip_reason`, :func:`gate`); ``budget``:
    ``gpu_check.budget`` of the plan; ``strategies``, ``estimates`` (``ESTIMATE_S``), ``machine``: the
    check's."""
    diagnostics = _load(out / "compare" / "diagnostics.json") or {}  # every flat key (metrics.json: the headline)
    metrics = diagnostics
    train: dict[str, Any] = {}
    for s in strategies:
        summ = _load(out / "train" / s / "summary.json")
        if not summ:
            continue
        kb = summ.get("kernel_backend") or {}
        train[s] = {
            k: summ.get(k)
            for k in (
                "steps",
                "measured_steps",
                "useful_tokens_per_s",
                "padding_efficiency",
                "final_loss",
                "queue_wait_s_mean",
                "credit_wait_s_mean",
                "stage_s_mean",
                "target_s_mean",
                "drafter_s_mean",
                "transport_s_mean",
                "transport_bytes_mean",
                "compile_s_warmup",
                "compile_s_measured",
                "measured_steps_with_compile",
                "peak_memory_bytes",
                "memory_estimate_bytes",
            )
        }
        train[s]["kernel_backend"] = kb.get("gated_delta_rule")
        train[s]["conv_backend"] = kb.get("conv")
        train[s]["warmup_compile_s"] = kb.get("warmup_compile_s")
        # the token counts fla's kernels were warmed (and autotuned) at, and how many choices it made there
        train[s]["warmup_tokens"] = kb.get("warmup_tokens")
        train[s]["autotune_choices"] = sum(len(v) for v in (kb.get("autotune_choices") or {}).values()) or None
        train[s]["predicted_tok_s"] = metrics.get(f"{s}.predicted_tok_s")
        # the features' transport to the drafter rank, mean seconds per measured step: the step model's (from the
        # profile's measurement; None when it measured none) and the run's
        train[s]["transport_s_predicted"] = diagnostics.get(f"{s}.predicted_transport_s")
        train[s]["transport_s_measured"] = diagnostics.get(f"{s}.measured_transport_s", summ.get("transport_s_mean"))
        # per role, measured / predicted seconds of the measured steps: on one GPU the ranks share the
        # device (which the prediction does not model; the features' crossing through the host it does, from
        # the profile's transport measurement), so each role's ratio says where measured and predicted part
        for role in ("target", "drafter"):
            train[s][f"{role}_measured_over_predicted"] = diagnostics.get(f"{s}.{role}_step_ratio")
    ref = train.get("sorted", {})
    for s, t in train.items():
        for key, src in (("ratio_to_sorted", "useful_tokens_per_s"), ("predicted_ratio_to_sorted", "predicted_tok_s")):
            a, b = t.get(src), ref.get(src)
            t[key] = a / b if a and b else None
    # grid.json is {machine, reference, points} (lenbatch_study.pipeline.artifacts.profile_grid)
    grid_doc = _load(out / "profile" / "grid.json")
    grid = grid_doc.get("points", []) if isinstance(grid_doc, dict) else (grid_doc or [])
    profile = (
        {
            "points": len(grid),
            "kernel_backend": sorted({r.get("kernel_backend") for r in grid} - {None}),
            "compile_s_timed": sum(r.get("target_compile_seconds_timed", 0.0) for r in grid),
            # the features' transport it measured and compare's fit of it (None: not measured)
            "transport_backend": next((r["transport_backend"] for r in grid if "transport_backend" in r), None),
            "transport_fit": {
                k: diagnostics.get(f"fit.transport.receive.{k}") for k in ("const_s", "s_per_gb", "error")
            },
        }
        if grid
        else None
    )
    skipped = dict(skipped or {})
    nccl = _nccl_result(out) or (
        {"exercised": False, "reason": skipped["nccl-2gpu"]} if "nccl-2gpu" in skipped else None
    )
    return {
        "failed_step": failed,
        "failed_steps": list(failed_steps or ([failed] if failed else [])),
        "complete": failed is None,
        "rehearsal": rehearse,
        "verify_tolerance_missed": list(tolerance_missed or []),
        "skipped": skipped,
        "nccl_2gpu": nccl,
        "interleaved": _interleaved(out, diagnostics),
        "seconds": timings,
        "seconds_total": round(sum(timings.values()), 1),
        "estimated_seconds_h200": estimates,
        "budget": budget,
        "environment": _load(out / "env.json"),
        "verify_packing_fla": {d: verify_result(out / f"verify-fla-{d}.log") for d in ("bfloat16", "float32")},
        "profile": profile,
        "train": train,
        "compare_written": bool(metrics),
        "machine": machine,
    }


def _interleaved(out: Path, diagnostics: dict[str, Any]) -> dict[str, Any] | None:
    """Per strategy, the throughput ratio to sorted measured in turns in one process, its 95% interval and
    the step model's predicted ratio of the same steps (compare's ``<strategy>.interleaved.*``), with the
    rounds the interleave step ran; None when it did not run."""
    doc = _load(out / "interleave" / "interleave.json")
    if not doc:
        return None
    table: dict[str, Any] = {}
    for s in doc.get("strategies", {}):
        p = f"{s}.interleaved."
        table[s] = {
            "ratio_to_sorted": diagnostics.get(p + "ratio_to_sorted", 1.0 if s == "sorted" else None),
            "ci95": [
                diagnostics.get(p + "ci95.low", 1.0 if s == "sorted" else None),
                diagnostics.get(p + "ci95.high", 1.0 if s == "sorted" else None),
            ],
            "predicted_ratio": diagnostics.get(p + "predicted_ratio", 1.0 if s == "sorted" else None),
            "prediction_error": diagnostics.get(p + "prediction_error", 0.0 if s == "sorted" else None),
        }
    return {
        "rounds": doc.get("rounds"),
        "stopped": doc.get("stopped"),
        "clock": doc.get("clock"),
        "seconds": doc.get("seconds"),
        "strategies": table,
    }


def _nccl_result(out: Path) -> dict[str, Any] | None:
    """The two-GPU NCCL run's steps and timings (None when it did not run)."""
    summ = _load(out / "nccl" / "sorted" / "summary.json")
    if not summ:
        return None
    return {"exercised": True} | {
        k: summ.get(k)
        for k in (
            "steps",
            "world_size",
            "useful_tokens_per_s",
            "target_s_mean",
            "drafter_s_mean",
            "queue_wait_s_mean",
            "final_loss",
            "peak_memory_bytes",
        )
    }


def _gib(x: Any) -> str:
    return f"{x / 2**30:.1f}" if x else "-"


def render(summary: dict[str, Any]) -> str:
    """One table: verify, then a row per strategy."""
    head = "complete" if summary["complete"] else f"FAILED at {summary['failed_step']}"
    for name in summary.get("failed_steps", [])[1:]:
        head += f"; {name} failed"
    for name, why in (summary.get("skipped") or {}).items():
        head += f"; {name} skipped ({why})"
    if summary.get("verify_tolerance_missed"):
        head += f" (over tolerance: {', '.join(summary['verify_tolerance_missed'])})"
    lines = [
        f"gpu-check{' (CPU rehearsal)' if summary['rehearsal'] else ''}: {head} in {summary['seconds_total']:.0f} s"
    ]
    for d, v in summary["verify_packing_fla"].items():
        if v:
            diffs = ", ".join(f"{k.removesuffix('_max_abs_diff')} {x:.1e}" for k, x in v.items() if k.endswith("diff"))
            lines.append(f"  verify {d:<9} {v['result']} ({v.get('tolerance')}): {diffs}")
    if summary["profile"]:
        p = summary["profile"]
        lines.append(
            f"  profile {p['points']} points, kernels {'/'.join(p['kernel_backend'])}, compile in timed "
            f"steps {p['compile_s_timed']:.2f} s"
        )
        fit = p.get("transport_fit") or {}
        if p.get("transport_backend"):
            lines.append(
                f"  transport ({p['transport_backend']}) receive fit: {fit.get('const_s')} s + "
                f"{fit.get('s_per_gb')} s/GB (fit error {fit.get('error')})"
            )
    nccl = summary.get("nccl_2gpu") or {}
    if nccl.get("exercised") is False:
        lines.append(f"  nccl-2gpu not exercised: {nccl['reason']}")
    il = summary.get("interleaved")
    if il:

        def r(x: Any) -> str:
            return f"{x:.3f}" if isinstance(x, (int, float)) else "-"

        lines.append(
            f"  interleaved ({il['rounds']} rounds, {il['clock']} clock): ratio to sorted [95%] vs "
            "predicted: "
            + "; ".join(
                f"{s} {r(v['ratio_to_sorted'])} [{r(v['ci95'][0])}, {r(v['ci95'][1])}] vs {r(v['predicted_ratio'])}"
                for s, v in il["strategies"].items()
                if s != "sorted"
            )
        )
    lines.append(
        f"  {'strategy':<9} {'tok/s':>9} {'predicted':>9} {'/sorted':>7} {'pred/s':>6} {'kern':>5} "
        f"{'compile w/m s':>13} {'peak GiB t/d':>12} {'est GiB t/d':>11} {'queue s':>7} {'credit s':>8} "
        f"{'meas/pred t/d':>13} {'transport s pred/meas':>21}"
    )
    for s, t in summary["train"].items():
        peak, est = t.get("peak_memory_bytes") or {}, t.get("memory_estimate_bytes") or {}

        def num(x: Any, fmt: str) -> str:
            return format(x, fmt) if isinstance(x, (int, float)) else "-"

        lines.append(
            f"  {s:<9} {num(t['useful_tokens_per_s'], ',.0f'):>9} {num(t['predicted_tok_s'], ',.0f'):>9} "
            f"{num(t['ratio_to_sorted'], '.2f'):>7} {num(t['predicted_ratio_to_sorted'], '.2f'):>6} "
            f"{t['kernel_backend'] or '-':>5} "
            f"{num(t['compile_s_warmup'], '.1f') + '/' + num(t['compile_s_measured'], '.1f'):>13} "
            f"{_gib(peak.get('target')) + '/' + _gib(peak.get('drafter')):>12} "
            f"{_gib(est.get('target')) + '/' + _gib(est.get('drafter')):>11} "
            f"{num(t['queue_wait_s_mean'], '.3f'):>7} {num(t['credit_wait_s_mean'], '.3f'):>8} "
            f"{num(t.get('target_measured_over_predicted'), '.2f') + '/' + num(t.get('drafter_measured_over_predicted'), '.2f'):>13} "
            f"{num(t.get('transport_s_predicted'), '.4f') + '/' + num(t.get('transport_s_measured'), '.4f'):>21}"
        )
    return "\n".join(lines)


def collect(out: Path, dest: Path) -> list[str]:
    """Copy the summary, every step's log and the small result files a reader needs (each stage's JSON,
    compare's report) from ``out`` into ``dest``, keeping their paths: one folder a caller collects (a
    device machine returns only its output folder). Returns the paths copied, relative to ``out``."""
    keep = [
        "summary.json",
        "summary.txt",
        "env.json",
        "check.yaml",
        "shapes.yaml",
        "*.log",
        "*/*.json",
        "*/*.md",
        "train/*/*.json",
        "train/*/*.jsonl",
        "train/*/*.log",
        "nccl/*/*.json",
        "nccl/*/*.log",
    ]
    copied = []
    for pattern in keep:
        for f in sorted(out.glob(pattern)):
            if f.is_file() and "site" not in f.relative_to(out).parts:
                rel = f.relative_to(out)
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, dest / rel)
                copied.append(str(rel))
    return copied
