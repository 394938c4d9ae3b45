"""The machine a measurement was made on: one fingerprint, computed the same way everywhere.

Every machine-dependent output (the profile grid, each training run's ``summary.json``, the quality
stage's timings, the GPU check's summary) records :func:`fingerprint`; ``compare`` refuses to
predict runs from a profile of another machine (:func:`differences` names what changed), and
``lenbatch machine`` writes it to ``results/machine/machine.json`` (:func:`write_if_changed`) so the
workflow can make it a dependency of the measuring stages: same machine, same bytes, nothing reruns.

Fields (``None`` where this machine does not tell; nothing is guessed):

- ``cpu``: ``model`` (``/proc/cpuinfo``'s model name, macOS ``sysctl``, else ``platform.processor()``),
  ``arch`` (``platform.machine()``), ``logical_cores`` (``os.cpu_count()``), ``usable_cores`` (the
  CPU affinity of this process), ``quota_cores`` (a cgroup CPU quota in cores; ``None``: unlimited),
  ``vector_isa`` (the vector extensions the CPU reports, sorted: ``avx2``, ``avx512f``, ``amx_tile``, ARM's
  ``sve``...: torch picks its CPU kernels by them, so two hosts that both call themselves "AMD EPYC" but
  differ in AVX-512 give different step times and losses that differ in the last bits);
- ``memory_gib``: physical memory (GiB, one decimal: the same VM keeps it across reboots);
- ``accelerator``: ``None`` without a usable CUDA (or ROCm) device, else ``kind``, ``count``,
  ``devices`` (``model``, ``memory_gib``, ``capability`` of each visible device), ``driver`` (the
  NVIDIA kernel module's version from ``/proc/driver/nvidia/version``) and ``runtime`` (the CUDA or
  HIP version torch was built with);
- ``versions``: ``python``, ``torch``, ``transformers``, ``triton``, ``flash-linear-attention`` and
  ``fla-core`` (its kernels since fla 0.3), read from the installed distributions' metadata (no import);
- ``id``: the first 12 hex digits of the SHA-256 of those four fields as canonical JSON: any change of
  hardware or of a library version (a new torch changes step times) gives another id;
- ``threads`` (only where a process records its own: the torch intra-op threads its steps used). It
  is a params key (``train.threads``, ``quality.threads``), checked with the params, so not in ``id``.

How the accelerator is found is the same in every process: torch is asked (imported if it is not
yet) only where a GPU driver is present (``/proc/driver/nvidia`` or ``/dev/kfd``); elsewhere no GPU
can be usable, so a CPU machine answers ``None`` without importing torch. Cost: a few file reads and
metadata look-ups, ~20 ms; on a GPU machine also ``import torch`` and one device query per GPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

# The libraries whose versions change step times (distribution names, as pip knows them).
VERSION_PACKAGES = ("torch", "transformers", "triton", "flash-linear-attention", "fla-core")
# The fields the id covers (everything but the id itself and a process's own threads).
IDENTITY_KEYS = ("cpu", "memory_gib", "accelerator", "versions")
ID_LENGTH = 12


def _read(path: str) -> Optional[str]:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def cpu_model(cpuinfo: Optional[str] = None) -> Optional[str]:
    """The CPU's model name: ``/proc/cpuinfo`` (Linux; ``cpuinfo``: its text, read here when None), ``sysctl``
    (macOS), else ``platform.processor()``."""
    info = cpuinfo if cpuinfo is not None else _read("/proc/cpuinfo")
    if info:
        for key in ("model name", "Model", "Hardware", "cpu model"):
            m = re.search(rf"^{key}\s*:\s*(.+)$", info, flags=re.MULTILINE)
            if m and m.group(1).strip():
                return m.group(1).strip()
    if sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
            )
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or None


# The /proc/cpuinfo flags that choose torch's CPU kernels (x86 "flags", ARM "Features").
_VECTOR_FLAG = re.compile(r"^(sse4_2|avx|avx2|fma|f16c|avx512\w*|avx_vnni\w*|amx\w*|asimd\w*|sve\d*|sme\d*|i8mm|bf16)$")


def vector_isa(cpuinfo: Optional[str] = None) -> Optional[list[str]]:
    """The vector extensions of the first CPU in ``/proc/cpuinfo`` (module doc; ``cpuinfo``: its text, read
    here when None), sorted; None where the system does not list flags (macOS, Windows)."""
    info = cpuinfo if cpuinfo is not None else _read("/proc/cpuinfo")
    if not info:
        return None
    for line in info.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return sorted({f for f in value.split() if _VECTOR_FLAG.match(f)})
    return None


def cpu_quota() -> Optional[float]:
    """Cores a cgroup CPU quota allows (``cpu.max`` of cgroup v2, ``cfs_quota_us`` of v1); None: no quota."""
    v2 = _read("/sys/fs/cgroup/cpu.max")
    if v2:
        quota, _, period = v2.strip().partition(" ")
    else:
        quota = (_read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") or "").strip()
        period = (_read("/sys/fs/cgroup/cpu/cpu.cfs_period_us") or "").strip()
    try:
        q, p = int(quota), int(period)
    except ValueError:  # "max" (v2) or no cgroup file: no quota
        return None
    return round(q / p, 2) if q > 0 and p > 0 else None


def cpu_info() -> dict[str, Any]:
    """``model``, ``arch``, ``logical_cores``, ``usable_cores``, ``quota_cores``, ``vector_isa`` (module doc)."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows: no affinity
        usable = os.cpu_count()
    cpuinfo = _read("/proc/cpuinfo") or ""  # read once for the model and the flags ("": none, as on macOS)
    return {
        "model": cpu_model(cpuinfo),
        "arch": platform.machine() or None,
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "quota_cores": cpu_quota(),
        "vector_isa": vector_isa(cpuinfo),
    }


def memory_gib() -> Optional[float]:
    """Physical memory in GiB (one decimal), from ``sysconf``; None where the system does not say."""
    try:
        return round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def nvidia_driver() -> Optional[str]:
    """The NVIDIA kernel module's version (``/proc/driver/nvidia/version``), None without one."""
    text = _read("/proc/driver/nvidia/version")
    m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9][0-9.]*)", text or "")
    return m.group(1) if m else None


def _gpu_driver_present() -> bool:
    return Path("/proc/driver/nvidia").exists() or Path("/dev/kfd").exists()


def accelerator_info() -> Optional[dict[str, Any]]:
    """The visible CUDA/ROCm devices as torch sees them, None when torch can use none (module doc)."""
    torch = sys.modules.get("torch")
    if torch is None:
        if not _gpu_driver_present():
            return None
        try:
            import torch
        except ImportError:
            return None
    if not torch.cuda.is_available():
        return None
    devices = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        devices.append(
            {
                "model": props.name,
                "memory_gib": round(props.total_memory / 2**30, 1),
                "capability": f"{props.major}.{props.minor}",
            }
        )
    hip = getattr(torch.version, "hip", None)
    return {
        "kind": "rocm" if hip else "cuda",
        "count": len(devices),
        "devices": devices,
        "driver": nvidia_driver(),
        "runtime": hip or torch.version.cuda,
    }


def versions() -> dict[str, Optional[str]]:
    """Python and the :data:`VERSION_PACKAGES` versions (None: not installed); no package is imported."""
    out: dict[str, Optional[str]] = {"python": platform.python_version()}
    for name in VERSION_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def machine_id(fp: dict[str, Any]) -> str:
    """First :data:`ID_LENGTH` hex digits of SHA-256 over the :data:`IDENTITY_KEYS` fields (canonical JSON)."""
    ident = {k: fp.get(k) for k in IDENTITY_KEYS}
    blob = json.dumps(ident, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:ID_LENGTH]


def fingerprint(*, threads: Optional[int] = None) -> dict[str, Any]:
    """This machine's fingerprint (module doc); ``threads``: the intra-op threads of the recording process."""
    fp: dict[str, Any] = {
        "cpu": cpu_info(),
        "memory_gib": memory_gib(),
        "accelerator": accelerator_info(),
        "versions": versions(),
    }
    fp["id"] = machine_id(fp)
    if threads is not None:
        fp["threads"] = int(threads)
    return fp


def canonical_bytes(fp: dict[str, Any]) -> bytes:
    """The bytes of ``machine.json``: the identity fields and the id, sorted keys, indent 2, final newline
    (a process's ``threads`` left out: the file describes the machine)."""
    body = {k: fp.get(k) for k in IDENTITY_KEYS}
    body["id"] = machine_id(fp)
    return (json.dumps(body, indent=2, sort_keys=True) + "\n").encode()


def write_if_changed(path: str | Path, fp: Optional[dict[str, Any]] = None) -> bool:
    """Write ``fp`` (default: this machine's) to ``path`` unless the file already holds those bytes.

    Returns whether it wrote. An unchanged file keeps its modification time, so neither DVC (content
    hash) nor Snakemake (mtime) sees a change on the machine that wrote it. Written whole (a temporary
    file renamed into place). Cost: one read, at most one write."""
    path = Path(path)
    data = canonical_bytes(fp if fp is not None else fingerprint())
    try:
        if path.read_bytes() == data:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return True


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(d, list):
        out = {}
        for i, v in enumerate(d):
            out.update(_flatten(v, f"{prefix}{i}."))
        return out if d else {prefix.rstrip("."): []}
    return {prefix.rstrip("."): d}


def changed_fields(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """``field: a -> b`` for every leaf of two nested mappings that differs (``versions.torch: '2.11.0' ->
    '2.13.0'``, a list item as ``edges.3``), sorted. Kept here, standard library only, because this module
    is also loaded by path (benchmarks/gpu_check.py); the checkpoint's params check uses it too."""
    fa, fb = _flatten(a), _flatten(b)
    return [f"{k}: {fa.get(k)!r} -> {fb.get(k)!r}" for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """``field: a -> b`` for every identity field that differs (:func:`changed_fields`)."""
    return changed_fields({k: a.get(k) for k in IDENTITY_KEYS}, {k: b.get(k) for k in IDENTITY_KEYS})


def describe(fp: dict[str, Any]) -> str:
    """One line for a report: CPU, cores, memory, accelerator, the library versions and the id."""
    c = fp.get("cpu") or {}
    cores = c.get("usable_cores")
    quota = f", quota {c['quota_cores']:g} cores" if c.get("quota_cores") else ""
    text = f"{c.get('model') or 'unknown CPU'} ({cores} usable of {c.get('logical_cores')} cores{quota})"
    if fp.get("memory_gib") is not None:
        text += f", {fp['memory_gib']:g} GiB memory"
    acc = fp.get("accelerator")
    if acc:
        models = sorted({d["model"] for d in acc["devices"]})
        mem = acc["devices"][0]["memory_gib"] if acc["devices"] else None
        text += (
            f", {acc['count']} x {' / '.join(models)} ({mem:g} GiB; driver {acc.get('driver')}, "
            f"{acc['kind'].upper()} {acc.get('runtime')})"
        )
    else:
        text += ", no accelerator"
    v = fp.get("versions") or {}
    libs = ", ".join(f"{k} {val}" for k, val in v.items() if val is not None)
    absent = [k for k, val in v.items() if val is None]
    text += f"; {libs}" + (f" ({', '.join(absent)} not installed)" if absent else "")
    if fp.get("threads") is not None:
        text += f"; {fp['threads']} thread(s) per process"
    return text + f"; machine id {fp.get('id')}"


__all__ = [
    "IDENTITY_KEYS",
    "VERSION_PACKAGES",
    "accelerator_info",
    "canonical_bytes",
    "changed_fields",
    "cpu_info",
    "describe",
    "differences",
    "fingerprint",
    "machine_id",
    "versions",
    "write_if_changed",
]
