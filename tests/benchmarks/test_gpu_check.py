"""make gpu-check's CPU-side parts: it refuses without CUDA, its plan covers every step, its
configs load and fit an H200, its summary reads what the steps write."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from lenbatch.models import memory
from lenbatch.core.config import load_params

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import gpu_check  # noqa: E402


def test_refuses_without_cuda_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--no-install", "--out", str(tmp_path / "g")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3
    assert proc.stderr.strip().splitlines() == [
        "gpu-check: no CUDA device visible (torch.cuda.is_available() is False); run it on a GPU machine"]
    assert not (tmp_path / "g").exists()  # nothing written


def test_plan_runs_every_stage_and_strategy(tmp_path):
    steps = gpu_check.plan(tmp_path, install=True)
    names = [s["name"] for s in steps]
    assert names[0] == "install" and names[-1] == "compare"
    assert {"verify-fla-bfloat16", "verify-fla-float32", "tokenize", "stats", "boundaries", "plans",
            "profile"} <= set(names)
    assert [n for n in names if n.startswith("train-")] == [f"train-{s}" for s in gpu_check.STRATEGIES]
    fp32 = steps[names.index("verify-fla-float32")]
    assert fp32["env"] == {"TRITON_F32_DEFAULT": "ieee"} and "--backend" in fp32["cmd"]
    train = steps[names.index("train-packed")]
    assert train["env"] == {"LENBATCH_SHARE_GPU": "1"} and train["cmd"][train["cmd"].index("--nproc_per_node") + 1] == "3"
    assert all(0 < s["timeout"] <= 240 for s in steps)  # a hung step cannot eat the device budget


def test_configs_load_and_fit_one_h200(tmp_path):
    (tmp_path / "mid.yaml").write_text(yaml.safe_dump(gpu_check.MID))
    (tmp_path / "shapes.yaml").write_text(yaml.safe_dump(gpu_check.layer_shapes_config()))
    mid = load_params("params.yaml", str(tmp_path / "mid.yaml"))
    assert mid.train.nproc == 3 and mid.model.hidden_size == 2048 and mid.batching.token_budget == 16384
    memory.check_fits(mid, device_bytes=141 * 10**9, ranks_per_device=3)  # 3 ranks on one GPU
    shapes = load_params("params.yaml", str(tmp_path / "shapes.yaml")).model
    assert (shapes.hidden_size, shapes.linear_num_key_heads, shapes.linear_num_value_heads) == (5120, 16, 48)
    assert shapes.num_hidden_layers == 4 and shapes.layer_types[-1] == "full_attention"


def test_summary_reads_the_steps_outputs(tmp_path):
    (tmp_path / "verify-fla-bfloat16.log").write_text("verify-packing: PASS (relative tolerance 0.03)\n")
    (tmp_path / "verify-fla-float32.log").write_text("verify-packing: FAIL (absolute tolerance 0.0001)\n")
    run = tmp_path / "train" / "packed"
    run.mkdir(parents=True)
    run.joinpath("summary.json").write_text(json.dumps({"steps": 40, "useful_tokens_per_s": 123456.0,
                                                        "padding_efficiency": 1.0, "final_loss": 5.0,
                                                        "queue_wait_s_mean": 0.01, "credit_wait_s_mean": 0.2}))
    s = gpu_check.summarize(tmp_path, {"train-packed": 30.0}, failed="train-sortish")
    assert s["verify_packing_fla"] == {"bfloat16": "PASS", "float32": "FAIL"}
    assert list(s["train"]) == ["packed"] and s["failed_step"] == "train-sortish"
    text = gpu_check.render(s)
    assert text.startswith("gpu-check: FAILED at train-sortish") and "123,456 useful tok/s" in text
