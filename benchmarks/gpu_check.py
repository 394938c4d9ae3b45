"""One prepared device check of the GPU path (``make gpu-check``): about 8 minutes on one H200.

    python benchmarks/gpu_check.py [--out results/gpu-check] [--no-install] [--dry-run]

Steps (each a subprocess, its output in ``OUT/<step>.log``; the run stops at the first failure):

1. ``pip install -e '.[gpu]'`` (flash-linear-attention, the version CI tests on CPU);
2. ``verify-packing --backend fla --device cuda`` on Qwen3.6-27B layer shapes (4 layers: three
   Gated DeltaNet, one attention; 16 key / 48 value heads) in bfloat16 (relative tolerance) and in
   float32 (``TRITON_F32_DEFAULT=ieee``, absolute 1e-4);
3. the workflow's stages on a mid-size config (hidden 2,048, 8 layers, budget 16,384 tokens,
   ``train.useful_tokens`` fixed): tokenize, stats, boundaries, plans, profile, then train every
   strategy with 2 target ranks + 1 drafter rank sharing the one GPU (``LENBATCH_SHARE_GPU=1``:
   NCCL refuses two ranks on one GPU, so this check's tensors go over gloo through host memory;
   NCCL point-to-point needs >= 2 GPUs), then compare: predicted vs measured tok/s on a GPU;
4. ``OUT/summary.json`` and one printed summary.

Without CUDA it refuses with one line and exit code 3. ``--dry-run`` prints the plan only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

STRATEGIES = ("sorted", "random", "bucketed", "sortish", "packed")
STUDY = "configs/qwen3.6-27b-8gpu.yaml"

MID = {  # the mid-size config: minutes on one H200, shapes of the study's kind
    "data": {"limit": 3000, "max_len": 4096, "workers": 8},
    "batching": {"token_budget": 16384, "max_batch_size": 32},
    "model": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 8,
              "layer_types": ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3
              + ["full_attention"],
              "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128,
              "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
              "linear_value_head_dim": 128, "target_layers": [1, 3, 5, 7], "dtype": "bfloat16"},
    "drafter": {"num_heads": 16, "anchors_per_seq": 4},
    "train": {"nproc": 3, "device": "cuda", "useful_tokens": 1_500_000, "warmup_steps": 3, "queue_size": 2,
              "threads": 4, "checkpoint_every": 0},
    "profile": {"batch_sizes": [1, 4, 16], "lengths": [512, 1024, 4096], "packed_seqs": [1, 4, 16],
                "packed_lengths": [16384], "repeats": 3, "warmup": 2},
}


def layer_shapes_config() -> dict[str, Any]:
    """The study's model section cut to 4 layers (3 linear + 1 full attention): the 27B shapes."""
    model = dict(yaml.safe_load(Path(STUDY).read_text())["model"])
    model.update(num_hidden_layers=4, layer_types=["linear_attention"] * 3 + ["full_attention"],
                 target_layers=[0, 3])
    return {"model": model}


def plan(out: Path, *, install: bool, python: str = sys.executable) -> list[dict[str, Any]]:
    """Every step: ``{"name", "cmd", "env", "timeout"}`` (pure: writes nothing)."""
    lb = [python, "-m", "lenbatch"]
    mid, shapes = str(out / "mid.yaml"), str(out / "shapes27b.yaml")
    cfg = ["--params", "params.yaml", mid]
    steps: list[dict[str, Any]] = []
    if install:
        steps.append({"name": "install", "cmd": [python, "-m", "pip", "install", "-q", "-e", ".[gpu]"],
                      "env": {}, "timeout": 240})
    lengths = "4096,1000,2500,64,300"  # 7,960 tokens, one row, 27B layer shapes
    for dtype, env in (("bfloat16", {}), ("float32", {"TRITON_F32_DEFAULT": "ieee"})):
        steps.append({"name": f"verify-fla-{dtype}", "env": env, "timeout": 180,
                      "cmd": lb + ["verify-packing", "--params", "params.yaml", shapes, "--backend", "fla",
                                   "--device", "cuda", "--dtype", dtype, "--lengths", lengths]})
    r = str(out)
    steps += [
        {"name": "tokenize", "cmd": lb + ["tokenize", *cfg, "--no-progress", "--out", f"{r}/tokenize"]},
        {"name": "stats", "cmd": lb + ["stats", *cfg, "--lengths", f"{r}/tokenize/lengths.npy", "--out",
                                       f"{r}/stats"]},
        {"name": "boundaries", "cmd": lb + ["boundaries", *cfg, "--lengths", f"{r}/tokenize/lengths.npy", "--out",
                                            f"{r}/boundaries"]},
        {"name": "plans", "cmd": lb + ["plans", *cfg, "--lengths", f"{r}/tokenize/lengths.npy", "--boundaries",
                                       f"{r}/boundaries/boundaries.json", "--out", f"{r}/plans"]},
        {"name": "profile", "cmd": lb + ["profile", *cfg, "--out", f"{r}/profile"]},
    ]
    for s in STRATEGIES:
        steps.append({"name": f"train-{s}", "env": {"LENBATCH_SHARE_GPU": "1"}, "timeout": 150,
                      "cmd": [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "3",
                              "-m", "lenbatch", "train", *cfg, "--strategy", s, "--data", f"{r}/tokenize",
                              "--boundaries", f"{r}/boundaries/boundaries.json", "--out", f"{r}/train/{s}"]})
    steps.append({"name": "compare", "cmd": lb + ["compare", *cfg, "--stats", f"{r}/stats", "--boundaries",
                                                  f"{r}/boundaries", "--plans", f"{r}/plans", "--profile",
                                                  f"{r}/profile", "--train", f"{r}/train", "--data",
                                                  f"{r}/tokenize", "--out", f"{r}/compare"]})
    for st in steps:
        st.setdefault("env", {})
        st.setdefault("timeout", 120)
    return steps


def summarize(out: Path, timings: dict[str, float], failed: str | None) -> dict[str, Any]:
    """What the check found, from the files the steps wrote (missing files -> None)."""
    def load(path: Path) -> Any:
        return json.loads(path.read_text()) if path.exists() else None

    verify = {}
    for dtype in ("bfloat16", "float32"):
        log = out / f"verify-fla-{dtype}.log"
        text = log.read_text() if log.exists() else ""
        verify[dtype] = "PASS" if "verify-packing: PASS" in text else ("FAIL" if "verify-packing: FAIL" in text
                                                                        else None)
    train = {}
    for s in STRATEGIES:
        summ = load(out / "train" / s / "summary.json")
        if summ:
            train[s] = {k: summ.get(k) for k in ("steps", "useful_tokens_per_s", "padding_efficiency", "final_loss",
                                                 "queue_wait_s_mean", "credit_wait_s_mean")}
    return {"failed_step": failed, "seconds": timings, "verify_packing_fla": verify, "train": train,
            "compare_written": (out / "compare").is_dir() and any((out / "compare").iterdir()),
            "machine": machine_fingerprint()}


def machine_fingerprint() -> dict[str, Any]:
    """This machine's fingerprint (lenbatch.core.machine), loaded from the tree by path: it needs only the
    standard library, so the summary records it even when the install step failed."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "src" / "lenbatch" / "core" / "machine.py"
    spec = importlib.util.spec_from_file_location("_lenbatch_machine", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.fingerprint()


def render(summary: dict[str, Any]) -> str:
    lines = [f"gpu-check: {'FAILED at ' + summary['failed_step'] if summary['failed_step'] else 'complete'} "
             f"in {sum(summary['seconds'].values()):.0f} s",
             "  verify-packing --backend fla: " + ", ".join(f"{k} {v}" for k, v in
                                                          summary["verify_packing_fla"].items())]
    for s, t in summary["train"].items():
        tps = t["useful_tokens_per_s"]
        lines.append(f"  train {s:<9} {t['steps']:>4} steps, {tps:,.0f} useful tok/s, padding eff "
                     f"{t['padding_efficiency']:.3f}, queue wait {t['queue_wait_s_mean']:.4f} s, credit wait "
                     f"{t['credit_wait_s_mean']:.4f} s" if tps else f"  train {s}: no measured steps")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/gpu-check")
    ap.add_argument("--no-install", action="store_true", help="skip pip install -e '.[gpu]'")
    ap.add_argument("--dry-run", action="store_true", help="print the steps and exit")
    args = ap.parse_args(argv)
    out = Path(args.out)
    steps = plan(out, install=not args.no_install)
    if args.dry_run:
        for st in steps:
            env = " ".join(f"{k}={v}" for k, v in st["env"].items())
            print(f"{st['name']}: {env + ' ' if env else ''}{' '.join(st['cmd'])}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device visible (torch.cuda.is_available() is False); run it on a GPU machine",
              file=sys.stderr)
        return 3
    out.mkdir(parents=True, exist_ok=True)
    (out / "mid.yaml").write_text(yaml.safe_dump(MID))
    (out / "shapes27b.yaml").write_text(yaml.safe_dump(layer_shapes_config()))
    timings: dict[str, float] = {}
    failed = None
    for st in steps:
        t0 = time.perf_counter()
        with open(out / f"{st['name']}.log", "w") as log:
            try:
                rc = subprocess.run(st["cmd"], env={**os.environ, **st["env"]}, stdout=log, stderr=subprocess.STDOUT,
                                    timeout=st["timeout"]).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        timings[st["name"]] = round(time.perf_counter() - t0, 1)
        print(f"gpu-check: {st['name']} rc={rc} {timings[st['name']]} s", file=sys.stderr, flush=True)
        if rc != 0:
            failed = st["name"]
            break
    summary = summarize(out, timings, failed)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    text = render(summary)
    (out / "summary.txt").write_text(text + "\n")
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
