"""The machine fingerprint: the same in every process of one machine, another id when only a library differs,
machine.json rewritten only when its content changes, and no torch import on a CPU machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lenbatch_study.core import machine

REPO = Path(__file__).resolve().parents[2]
FLA_PYTHON = REPO / ".venv-fla" / "bin" / "python"  # the Makefile's second venv: the same torch, plus fla + triton
PRINT_ID = "from lenbatch_study.core import machine; print(machine.fingerprint()['id'])"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "src")}


def test_the_fingerprint_describes_this_machine_and_another_process_gets_the_same_id():
    fp = machine.fingerprint(threads=3)
    assert set(fp) == {"cpu", "memory_gib", "accelerator", "versions", "id", "threads"} and fp["threads"] == 3
    assert fp["cpu"]["logical_cores"] == os.cpu_count()
    assert 1 <= fp["cpu"]["usable_cores"] <= os.cpu_count()
    assert fp["memory_gib"] > 0
    assert fp["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    import torch
    import transformers

    assert fp["versions"]["torch"] == torch.__version__ and fp["versions"]["transformers"] == transformers.__version__
    assert (fp["accelerator"] is None) == (not torch.cuda.is_available())  # nothing invented without a GPU
    assert len(fp["id"]) == machine.ID_LENGTH and fp["id"] == machine.machine_id(fp)
    # threads are the process's own (a params key), not the machine's: the id leaves them out
    assert machine.fingerprint(threads=1)["id"] == fp["id"]
    # the vector ISA torch chose its kernels by is part of the CPU's identity (two "AMD EPYC" hosts,
    # one with AVX-512, gave losses 1 ulp apart): it agrees with what torch reports
    isa, cap = fp["cpu"]["vector_isa"], torch.backends.cpu.get_cpu_capability()
    if sys.platform.startswith("linux") and cap.startswith("AVX"):
        assert ("avx512f" in isa) == cap.startswith("AVX512") and ("avx2" in isa) == (cap != "DEFAULT"), (isa, cap)
    changed = {**fp, "cpu": {**fp["cpu"], "vector_isa": sorted(set(isa or []) | {"avx512f"})}}
    if changed["cpu"] != fp["cpu"]:
        assert machine.machine_id(changed) != fp["id"]
        assert machine.differences(fp, changed) and all(
            d.startswith("cpu.vector_isa.") for d in machine.differences(fp, changed)
        )
    other = subprocess.run([sys.executable, "-c", PRINT_ID], capture_output=True, text=True, env=_env(), timeout=120)
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() == fp["id"]


@pytest.mark.skipif(
    not FLA_PYTHON.exists(),
    reason="no .venv-fla (make install builds it: the same torch plus flash-linear-attention and triton)",
)
def test_only_a_library_version_changing_gives_another_id():
    """The Makefile's .venv-fla runs on this machine with the same torch and transformers, plus triton and
    flash-linear-attention: the hardware fields agree, the versions do not, and so does not the id."""
    code = "import json; from lenbatch_study.core import machine; print(json.dumps(machine.fingerprint()))"
    proc = subprocess.run([str(FLA_PYTHON), "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    there, here = json.loads(proc.stdout), machine.fingerprint()
    assert there["cpu"] == here["cpu"] and there["versions"]["torch"] == here["versions"]["torch"]
    assert there["versions"]["triton"] is not None and here["versions"]["triton"] is None
    assert there["id"] != here["id"]
    diff = machine.differences(here, there)
    assert any(d.startswith("versions.triton: None -> ") for d in diff) and not any(d.startswith("cpu.") for d in diff)


def test_machine_json_is_rewritten_only_when_its_content_changes(tmp_path):
    path = tmp_path / "machine" / "machine.json"
    fp = machine.fingerprint(threads=2)
    assert machine.write_if_changed(path, fp) is True
    data = path.read_bytes()
    body = json.loads(data)
    assert body["id"] == fp["id"] and "threads" not in body  # the file describes the machine, not a process
    assert data == (json.dumps(body, indent=2, sort_keys=True) + "\n").encode()  # canonical bytes
    os.utime(path, (1_000_000, 1_000_000))
    assert machine.write_if_changed(path, machine.fingerprint(threads=1)) is False
    assert path.stat().st_mtime == 1_000_000 and path.read_bytes() == data  # untouched: no tool sees a change
    changed = {**fp, "memory_gib": fp["memory_gib"] + 1}
    assert machine.write_if_changed(path, changed) is True
    assert json.loads(path.read_text())["id"] == machine.machine_id(changed) != fp["id"]
    assert not list(path.parent.glob(".*tmp"))  # written through a renamed temporary, none left


def test_lenbatch_machine_writes_once_then_leaves_the_file_alone(tmp_path):
    cmd = [sys.executable, "-m", "lenbatch_study", "machine", "--out", str(tmp_path)]
    first = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=120)
    assert first.returncode == 0, first.stderr
    mtime = (tmp_path / "machine.json").stat().st_mtime_ns
    second = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=120)
    assert second.returncode == 0 and "unchanged" in second.stderr, second.stderr
    assert (tmp_path / "machine.json").stat().st_mtime_ns == mtime
    assert json.loads((tmp_path / "machine.json").read_text())["id"] in first.stderr


@pytest.mark.skipif(
    Path("/proc/driver/nvidia").exists() or Path("/dev/kfd").exists(),
    reason="a GPU driver is present: the fingerprint asks torch there",
)
def test_on_a_machine_without_a_gpu_driver_the_fingerprint_imports_no_torch():
    code = (
        "import sys; from lenbatch_study.core import machine; fp = machine.fingerprint(); "
        "print(fp['accelerator'], 'torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["None", "False"]


def test_differences_and_describe_name_the_fields():
    fp = machine.fingerprint()
    other = json.loads(json.dumps(fp))
    other["versions"]["torch"] = "2.11.0"
    other["cpu"]["usable_cores"] = 64
    assert machine.differences(fp, other) == [
        f"cpu.usable_cores: {fp['cpu']['usable_cores']!r} -> 64",
        f"versions.torch: {fp['versions']['torch']!r} -> '2.11.0'",
    ]
    assert machine.differences(fp, fp) == []
    text = machine.describe(fp)
    assert fp["id"] in text and f"torch {fp['versions']['torch']}" in text and str(fp["cpu"]["model"]) in text


def test_changed_fields_names_every_differing_leaf_lists_included():
    """The one comparison the machine check and the checkpoint's params check share."""
    from lenbatch_study.core.machine import changed_fields

    a = {"model": {"dtype": "float32", "layers": [1, 2]}, "edges": None}
    b = {"model": {"dtype": "bfloat16", "layers": [1, 3, 4]}, "edges": None}
    assert changed_fields(a, b) == [
        "model.dtype: 'float32' -> 'bfloat16'",
        "model.layers.1: 2 -> 3",
        "model.layers.2: None -> 4",
    ]
    assert changed_fields(a, a) == []


def test_cpu_info_reads_cpuinfo_once_and_matches_the_one_field_readers(monkeypatch):
    reads = []
    real = machine._read
    monkeypatch.setattr(machine, "_read", lambda path: (reads.append(path), real(path))[1])
    info = machine.cpu_info()
    assert reads.count("/proc/cpuinfo") == 1
    assert info["model"] == machine.cpu_model() and info["vector_isa"] == machine.vector_isa()
