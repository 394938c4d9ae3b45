"""The GPU path's pure parts, on CPU: each rank's peak memory from the config (issue 15, finding 6)
and fp32 master weights for the trained drafter under bf16 (finding 7)."""

from __future__ import annotations

import ast
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from lenbatch_study.models import memory
from lenbatch.loading.collate import collate
from lenbatch_study.runtime.synthetic import synthetic_sequences
from lenbatch_study.core.config import load_params
from lenbatch_study.runtime.runner import StepRunner
from lenbatch_study.corpus.seed_profile import seed_profile
from lenbatch_study.models import kernels
from lenbatch_study.runtime import runner as runner_mod
from lenbatch_study.runtime import transport

GB = 10**9
STUDY = "configs/qwen3.6-27b-8gpu.yaml"


def _study(**train):
    return load_params("params.yaml", STUDY, overrides={"train": train} if train else None)


def test_the_27b_setting_fits_an_h200_and_is_refused_on_an_80_gb_card():
    p = _study()
    target, drafter = memory.rank_memory(p)
    assert 26.5e9 < target.weights / 2 < 27.5e9  # Qwen3.6-27B in bf16: 27 B parameters x 2 bytes
    step = 49152 * 5 * 5120 * 2  # the 2.5 GB of features per step
    assert target.features == (8 + 1) * step and drafter.features == step
    assert drafter.optimizer > 0 and drafter.total < target.total
    memory.check_fits(p, device_bytes=141 * GB)
    # the retained target-layer outputs (4 of 5 at the last one's forward: ~2 GB at the budget) leave room
    # for one batch in flight on an 80 GB card
    with pytest.raises(
        ValueError,
        match=r"train\.queue_size 8 in flight.*batching\.token_budget 49152"
        r".*train\.queue_size <= 1 fits",
    ):
        memory.check_fits(p, device_bytes=80 * GB)
    memory.check_fits(_study(queue_size=1), device_bytes=80 * GB)  # the advice holds
    # one process with both roles: the drafter's memory on top, no queue of features
    both = memory.check_fits(p, device_bytes=141 * GB, single_process=True)
    assert both == (target, drafter)
    with pytest.raises(ValueError):
        memory.check_fits(_study(queue_size=2), device_bytes=80 * GB)  # and is the largest that does


@pytest.mark.parametrize("config", ["params.yaml", "configs/tiny.yaml", STUDY, "mixed"])
def test_the_closed_form_target_count_is_the_models(config):
    """memory.target_parameters (what the drafter rank reports without importing transformers' model,
    which imports fla) equals the Hugging Face decoder built on the meta device, + the lm_head. That
    rank_memory imports neither: tests/models/_fla_checks.py (runner_roles, in a process that has not)."""
    import dataclasses

    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextModel

    from lenbatch_study.models.target import hf_text_config

    files = ["params.yaml"] if config in ("params.yaml", "mixed") else ["params.yaml", config]
    m = load_params(*files).model
    if config == "mixed":  # every shape key away from the others, attention first, conv width 3
        m = dataclasses.replace(
            m,
            vocab_size=1000,
            hidden_size=48,
            intermediate_size=80,
            num_hidden_layers=3,
            layer_types=("full_attention", "linear_attention", "linear_attention"),
            num_attention_heads=6,
            num_key_value_heads=3,
            head_dim=24,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=10,
            linear_value_head_dim=14,
            linear_conv_kernel_dim=3,
            target_layers=(0, 2),
        )
    with torch.device("meta"):
        decoder = Qwen3_5TextModel(hf_text_config(m))
    assert memory.target_parameters(m) == sum(p.numel() for p in decoder.parameters()) + m.vocab_size * m.hidden_size


def test_ranks_sharing_a_device_add_up():
    p = load_params("params.yaml", "configs/tiny.yaml")
    # ranks sharing a device talk over gloo: a target rank's batches in flight are host copies, so its
    # device holds the one batch being computed
    target, drafter = memory.rank_memory(p, host_queue=True)
    alone, _ = memory.rank_memory(p)
    step = p.batching.token_budget * len(p.model.target_layers) * p.model.hidden_size * memory.BYTES[p.model.dtype]
    assert target.features == step and alone.features == (p.train.queue_size + 1) * step
    assert alone.total - target.total == p.train.queue_size * step > 0
    one = memory.check_fits(p, device_bytes=80 * GB, ranks_per_device=3)
    assert one == (target, drafter)
    assert memory.check_fits(p, device_bytes=80 * GB) == (alone, drafter)  # one rank per device: NCCL, on device
    need = drafter.total + 2 * target.total  # the drafter rank and two target ranks on one device
    have = memory.RESERVED_BYTES + need
    with pytest.raises(ValueError, match="lower batching.token_budget|train.queue_size <="):
        memory.check_fits(p, device_bytes=int(have / memory.USABLE_FRACTION) - 10**6, ranks_per_device=3)


def test_bf16_drafter_keeps_fp32_master_weights_and_the_target_stays_bf16(tmp_path, one_thread):
    cfg = copy.deepcopy(yaml.safe_load(open("configs/tiny.yaml")))
    cfg["model"]["dtype"] = "bfloat16"
    cfg["drafter"] = {**cfg.get("drafter", {}), "lr": 1e-5}
    path = tmp_path / "bf16.yaml"
    path.write_text(yaml.safe_dump(cfg))
    p = load_params("params.yaml", str(path))
    runner = StepRunner(p)
    assert {w.dtype for w in runner.target.parameters()} == {torch.bfloat16}
    assert {w.dtype for w in runner.drafter.parameters()} == {torch.float32}
    batch = collate(
        synthetic_sequences([40, 60, 30], vocab_size=p.model.vocab_size, seed=0),
        layout="padded",
        token_budget=1024,
        max_batch_size=8,
    )
    before = [w.detach().clone() for w in runner.drafter.parameters()]
    feats, _ = runner.target_step(batch)
    assert feats.dtype == torch.bfloat16
    loss, _ = runner.drafter_step(batch, feats, step=0)
    assert loss == loss and runner.last_output.loss.dtype == torch.float32
    after = list(runner.drafter.parameters())
    moved = sum(int((a != b.detach()).sum()) for a, b in zip(before, after))
    # bf16 storage would have kept most weights: an lr-1e-5 update is below half a bf16 ulp
    moved_bf16 = sum(int((a.bfloat16() != b.detach().bfloat16()).sum()) for a, b in zip(before, after))
    total = sum(a.numel() for a in before)
    assert moved > 0.9 * total and moved_bf16 < 0.2 * total


# --------------------------------------------------------------------------- issue 18: the GPU run's defects
# CUDA streams, a second GPU and Triton's compiler cannot exist on this CPU: where a test needs one it
# says so; everything else runs the real code on CPU (fla under Triton's interpreter in .venv-fla).


ROOT = Path(__file__).parents[2]
FLA_PYTHON = next(
    (
        str(p)
        for p in (Path(os.environ.get("LENBATCH_FLA_PYTHON", "/nonexistent")), ROOT / ".venv-fla" / "bin" / "python")
        if p.exists()
    ),
    None,
)
needs_fla = pytest.mark.skipif(FLA_PYTHON is None, reason="no .venv-fla (make install builds it)")


def _tiny(**sections):
    cfg = copy.deepcopy(yaml.safe_load(open(ROOT / "configs/tiny.yaml")))
    for k, v in sections.items():
        cfg.setdefault(k, {}).update(v)
    return load_params(str(ROOT / "params.yaml"), json.dumps(cfg))


def test_drafter_features_are_made_on_the_drafter_role_device():
    """Finding 3: the profile's drafter got host features against device weights. ``meta`` is a real
    torch device other than the host: the stand-in features must be made there."""
    from lenbatch_study.stages import profile

    p = _tiny()
    fdim = len(p.model.target_layers) * p.model.hidden_size
    got = profile.role_batches("drafter", p, torch.device("meta"))
    assert len(got) == len(profile.grid_points(p, quiet=True)) > 0
    for batch, feats in got:
        assert feats.device.type == "meta" and tuple(feats.shape) == (*batch.input_ids.shape, fdim)
    assert all(f is None for _, f in profile.role_batches("target", p, torch.device("meta")))


class _Stream:
    def __init__(self):
        self.synced = 0

    def synchronize(self):
        self.synced += 1


def test_step_boundaries_wait_on_the_compute_stream_never_the_device(monkeypatch):
    """Finding 4. No CUDA stream exists on this CPU, so torch.cuda.current_stream is replaced by a
    recorder and a device-wide torch.cuda.synchronize fails the test."""
    stream = _Stream()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)

    def device_wide(*a, **k):
        raise AssertionError("device-wide torch.cuda.synchronize: waits for NCCL's streams too")

    monkeypatch.setattr(torch.cuda, "synchronize", device_wide)
    runner_mod._sync(torch.device("cuda", 0))
    transport.settle(torch.device("cuda", 0))
    assert stream.synced == 2
    runner_mod._sync(torch.device("cpu"))
    assert stream.synced == 2


def test_no_device_wide_synchronize_anywhere_in_the_package():
    src = ROOT / "src"
    calls = []
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "synchronize"
                and ast.unparse(node.value) in ("torch.cuda", "cuda")
            ):
                calls.append(f"{path.relative_to(src)}:{node.lineno}")
    assert calls == []


def test_a_cuda_run_on_the_torch_fallback_is_refused_unless_asked():
    """Finding 5. The decision is made from (device, dtype): torch.device('cuda') is a descriptor,
    no GPU is touched. This venv has no fla, as a broken GPU install would not."""
    cuda = torch.device("cuda", 0)
    try:
        assert kernels.fla_problem().startswith("absent")
        with pytest.raises(ValueError, match=r"torch Gated DeltaNet fallback \(absent.*train\.kernels: torch"):
            kernels.select_kernels("auto", device=cuda, dtype=torch.bfloat16)
        with pytest.raises(ValueError, match=r"model\.dtype|absent"):
            kernels.select_kernels("auto", device=cuda, dtype=torch.float32)
        study = _study()  # the 8-GPU workflow's train and profile stages get the same refusal
        with pytest.raises(ValueError, match="train.kernels: torch"):
            kernels.select_kernels(study.train.kernels, device=cuda, dtype=torch.bfloat16)
        chosen = kernels.select_kernels("torch", device=cuda, dtype=torch.bfloat16)
        assert chosen["gated_delta_rule"] == chosen["conv"] == "torch" and chosen["requested"] == "torch"
        assert kernels.select_kernels("auto", device="cpu", dtype=torch.float32)["gated_delta_rule"] == "torch"
        with pytest.raises(ValueError, match="train.kernels must be one of auto, torch, fla"):
            kernels.select_kernels("triton", device="cpu", dtype=torch.float32)
    finally:
        kernels.set_kernel_backend("auto")


@needs_fla
def test_an_installed_but_broken_fla_is_reported_as_broken(tmp_path):
    """Finding 5: the real fla 0.6.0 package on the path of a Python without triton (this venv's)."""
    site = next((ROOT / ".venv-fla" / "lib").glob("python3*/site-packages"))
    (tmp_path / "fla").symlink_to(site / "fla")
    code = "from lenbatch_study.models import kernels; print(kernels.fla_problem())"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(tmp_path)])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().startswith("broken: ModuleNotFoundError") and "triton" in out.stdout


_FLA_LAYOUT = r"""
import json, torch
from lenbatch_study.models import kernels, varlen, fla_cpu
calls = []
real = kernels._fla_chunk()
def recording(**kw):
    calls.append({"q": list(kw["q"].shape), "cu": kw["cu_seqlens"].tolist()})
    return real(**kw)
kernels._fla_chunk = lambda: recording
gen = torch.Generator().manual_seed(0)
B, T, hk, hv, d = 3, 24, 1, 2, 16
q, k = torch.randn(B, T, hk, d, generator=gen), torch.randn(B, T, hk, d, generator=gen)
v = torch.randn(B, T, hv, d, generator=gen)
g, beta = -torch.rand(B, T, hv, generator=gen) * 0.5, torch.rand(B, T, hv, generator=gen)
segs = varlen.make_segments(torch.zeros(B, T, dtype=torch.long), attention_mask=torch.ones(B, T, dtype=torch.long))
varlen.set_kernel_backend("torch"); ref = varlen.chunk_gated_delta_rule(q, k, v, g, beta, segs)
varlen.set_kernel_backend("fla"); out = varlen.chunk_gated_delta_rule(q, k, v, g, beta, segs)
from fla.ops.gated_delta_rule import chunk_fwd
import triton.language as tl
chunk_fwd.SOLVE_TRIL_DOT_PRECISION = tl.constexpr("tf32")  # what fla 0.6.0 sets on sm >= 80
was = fla_cpu.force_ieee_solve()
import importlib; solve_tril = importlib.import_module("fla.ops.utils.solve_tril")
print(json.dumps({"calls": calls, "diff": float((out - ref).abs().max()), "shape": list(out.shape), "was": was,
                  "now": chunk_fwd.SOLVE_TRIL_DOT_PRECISION.value, "tril": solve_tril.DOT_PRECISION_AUTOTUNE_LIST}))
"""


@needs_fla
def test_padded_batches_reach_fla_as_one_row_and_fp32_checks_force_the_solve_to_ieee():
    """Findings 6 and 7 (fla under Triton's interpreter): a padded [3, 24] batch goes to fla as one row
    with boundaries at multiples of 24 (no kernel keyed on the batch size sees B > 1) and equals the
    torch path; force_ieee_solve turns fla's explicit TF32 triangular solve to IEEE."""
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
        "PYTHONPATH": str(ROOT / "src"),
        "FLA_TRIL_PRECISION": "ieee",
    }
    proc = subprocess.run([FLA_PYTHON, "-c", _FLA_LAYOUT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["calls"] == [{"q": [1, 72, 1, 16], "cu": [0, 24, 48, 72]}]
    assert r["shape"] == [3, 24, 2, 16] and r["diff"] < 1e-5
    assert (r["was"], r["now"]) == ("tf32", "ieee") and r["tril"] == ["ieee"]


@needs_fla
def test_the_only_explicit_tf32_in_fla_forward_kernels_is_the_one_forced():
    """Finding 7: TRITON_F32_DEFAULT=ieee reaches every tl.dot that leaves its precision to the default;
    in fla's forward kernels of the gated delta rule the only explicit precision is the triangular
    solve's SOLVE_TRIL_DOT_PRECISION (forced by force_ieee_solve) or IEEE itself."""
    site = next((ROOT / ".venv-fla" / "lib").glob("python3*/site-packages")) / "fla"
    # the modules of every kernel a forward runs (chunk_gated_delta_rule with cu_seqlens, causal_conv1d)
    files = [
        site / f
        for f in (
            "ops/gated_delta_rule/chunk_fwd.py",
            "ops/gated_delta_rule/wy_fast.py",
            "ops/gated_delta_rule/chunk.py",
            "ops/gated_delta_rule/gate.py",
            "ops/utils/cumsum.py",
            "ops/utils/solve_tril.py",
            "ops/common/chunk_delta_h.py",
            "ops/common/chunk_o.py",
            "ops/common/chunk_scaled_dot_kkt.py",
            "modules/norm/l2norm.py",
            "modules/causal_conv1d/ops.py",
        )
    ]
    explicit = set()
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("dot"):
                for kw in node.keywords:
                    if kw.arg in ("input_precision", "allow_tf32"):
                        explicit.add((f.name, kw.arg, ast.unparse(kw.value)))
    # solve_tril's DOT_PRECISION is autotuned over DOT_PRECISION_AUTOTUNE_LIST: ["ieee"] unless
    # FLA_TRIL_PRECISION says otherwise (the check's fp32 step sets it to ieee; asserted in the script above)
    assert {(n, a, v) for n, a, v in explicit if not (a == "allow_tf32" and v == "False")} == {
        ("chunk_fwd.py", "input_precision", "SOLVE_TRIL_DOT_PRECISION"),
        ("solve_tril.py", "input_precision", "DOT_PRECISION"),
    }, explicit


def test_drafter_windows_are_sequences_times_context_and_counted():
    """Finding 8: on the study's length profile at budget 49,152, a packed plan's drafter windows
    W = S x (longest + N) are 1.8-3.2 x T for most rows (the issue's figure; the busiest row, which the
    estimate uses, more), padded ones about T; the estimate grows with them."""
    import lenbatch as lb

    p = _study()
    lengths = seed_profile(40_000, seed=0).astype(np.int64)
    T = p.batching.token_budget
    ratios = {}
    for strategy in ("packed", "sorted", "random"):
        batches = lb.plan_epoch(lengths, strategy=strategy, epoch=0, seed=0, token_budget=T, max_batch_size=64)
        ratios[strategy] = np.percentile(memory.window_ratios(p, lengths, batches), [5, 50, 100])
    assert 1.8 <= ratios["packed"][0] and ratios["packed"][1] <= 3.2 < ratios["packed"][2], ratios
    assert ratios["sorted"][2] < 1.2 and ratios["random"][2] < 1.2  # padded: S x longest = computed tokens (+ N)
    w = memory.plan_window_tokens(
        p, lengths, lb.plan_epoch(lengths, strategy="packed", epoch=0, seed=0, token_budget=T, max_batch_size=64)
    )
    _, with_w = memory.rank_memory(p, window_tokens=w)
    _, without = memory.rank_memory(p, window_tokens=0)
    assert with_w.activations - without.activations == memory.drafter_window_bytes(p, w) > 4 * 2**30


def test_the_window_term_covers_what_a_drafter_step_keeps(one_thread):
    """Finding 8, measured on CPU: the bytes autograd keeps during a drafter forward on a packed row of
    many sequences exceed the old per-token estimate and stay within the new one."""
    from lenbatch_study.models.drafter import CE_CHUNK_ROWS

    p = _tiny(batching={"token_budget": 2048, "max_batch_size": 16}, drafter={"anchors_per_seq": 4})
    run = StepRunner(p)
    lengths = [128] * 16  # 16 sequences, 2,048 tokens, windows of up to 128 + 64 positions each
    batch = collate(
        synthetic_sequences(lengths, vocab_size=p.model.vocab_size, seed=0),
        layout="packed",
        token_budget=2048,
        max_batch_size=16,
    )
    feats, _ = run.target_step(batch)
    kept = []

    def pack(t):
        kept.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        anchors, valid = run.drafter.anchors_for(batch, anchors_per_seq=4, seed=0, epoch=0, step=0)
        run.drafter(feats.clone(), batch, anchors, valid, embed_tokens=run.embed_tokens, lm_head=run.lm_head)
    saved = sum(kept)
    _, est = memory.rank_memory(p, **memory.plan_memory_shape(p, np.array(lengths), [np.arange(16)]))
    ce = 3 * CE_CHUNK_ROWS * p.model.vocab_size * 4
    old = 2048 * p.model.hidden_size * 4 * (2 + 8 * p.drafter.num_layers)  # the per-token formula alone
    assert 2 * old < saved <= est.activations - ce <= 1.5 * saved, (old, saved, est.activations - ce)


def test_processes_ask_for_expandable_segments_and_a_users_choice_wins(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    runner_mod.configure_process(_tiny(train={"reuse_host_memory": False}))
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    runner_mod.configure_process(_tiny(train={"reuse_host_memory": False}))
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512"


def test_summary_keeps_compile_seconds_of_measured_steps_apart(tmp_path):
    """Finding 6: a compile inside a measured step is counted against that run, apart from warm-up."""
    from lenbatch_study.runtime.records import Recorder

    rec = Recorder(tmp_path / "steps.jsonl", kept=None)
    for i, c in enumerate([2.0, 0.5, 0.0, 0.25, 0.0]):
        rec.add(
            {
                "step": i,
                "epoch": 0,
                "t": float(i + 1),
                "useful_tokens": 10,
                "computed_tokens": 10,
                "target_s": 0.1,
                "drafter_s": 0.1,
                "queue_wait_s": 0.0,
                "credit_wait_s": 0.0,
                "loss": 1.0,
                "target_cpu_s": 0.1,
                "drafter_cpu_s": 0.1,
                "compile_s": c,
            }
        )
    s = rec.summary(
        params=_tiny(),
        strategy="sorted",
        warmup=2,
        world_size=1,
        target_ranks=1,
        resumed_from=None,
        total_steps=5,
        device={"kernel_backend": {"gated_delta_rule": "fla"}},
    )
    rec.close()
    assert (s["compile_s_warmup"], s["compile_s_measured"], s["measured_steps_with_compile"]) == (2.5, 0.25, 1)
    assert s["kernel_backend"] == {"gated_delta_rule": "fla"}
