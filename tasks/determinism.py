"""Which CPU kernels compute a run, so that every x86-64 machine with AVX2 computes the same bits.

Standard library only: the ``dapo`` entry point pins these before torch is imported (torch, MKL
and oneDNN read them once, at load). What they pin, and what no setting pins, is in
docs/determinism.md:

- ATen's kernel level (``ATEN_CPU_CAPABILITY``): its AVX-512 kernels reduce in another order than
  its AVX2 ones, so an AVX-512 machine and an AVX2 one round differently from the first step;
- MKL's code path (``MKL_CBWR``, Conditional Numerical Reproducibility): torch's CPU wheel does
  its matrix products in MKL, which otherwise picks a path per CPU (and per matrix shape on AMD),
  and runs the path it is told to on Intel CPUs alone unless that path is ``COMPATIBLE``;
- oneDNN's instruction set (``ONEDNN_MAX_CPU_ISA``);
- and on any machine, Inductor's deterministic mode (``TORCHINDUCTOR_DETERMINISTIC``): on a GPU,
  ``torch.compile``d code times a few candidate kernels on first use and keeps the fastest, so
  two processes (a run and its resumption, the trainer and its rollout process) could pick
  different ones and round differently; in that mode it picks by rule.

AVX2 is the newest level every x86-64 CPU of the last decade has. ``DAPO_PORTABLE_KERNELS=0``
leaves each library to its own choice (faster on some CPUs, and machine-specific).

MKL's branch is ``COMPATIBLE`` (one SSE2 code path without approximate instructions): MKL
documents it as the one branch besides ``AUTO`` that runs on every maker's CPU, and the only one
that computes the same on all of them; its faster branches (``AVX2``) run on Intel CPUs alone,
an AMD CPU running MKL's ``AUTO`` for AMD in their place (docs/determinism.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

MAKER_INDEPENDENT_MKL = "COMPATIBLE"
"""MKL's one branch that computes the same on every maker's CPU: under any other, MKL runs the
branch on Intel CPUs and its ``AUTO`` branch for the CPU on others, so the bits are the maker's."""
PORTABLE_KERNELS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": MAKER_INDEPENDENT_MKL,
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}
REPRODUCIBLE_COMPILER = {"TORCHINDUCTOR_DETERMINISTIC": "1"}
SWITCH = "DAPO_PORTABLE_KERNELS"


CPUINFO = Path("/proc/cpuinfo")


def _cpuinfo_field(name: str, cpuinfo: Path) -> str | None:
    """The first CPU's ``name`` field in ``cpuinfo`` (Linux); None where it cannot be read."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == name:
                return value.strip()
    except OSError:
        pass
    return None


def cpu_flags(cpuinfo: Path = CPUINFO) -> set[str]:
    """The CPU's feature flags (Linux); empty where they cannot be read."""
    return set((_cpuinfo_field("flags", cpuinfo) or "").split())


def cpu_vendor(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's maker as the CPU names itself (``GenuineIntel``, ``AuthenticAMD``); ``unknown``
    where it cannot be read."""
    return _cpuinfo_field("vendor_id", cpuinfo) or "unknown"


def portable_kernels(flags: set[str] | None = None) -> dict[str, str]:
    """The pins this machine can take: all of them on a CPU with AVX2 and FMA (ATen's AVX2
    kernels use both and would crash without them), none elsewhere or when switched off."""
    if os.environ.get(SWITCH, "1") == "0":
        return {}
    flags = cpu_flags() if flags is None else flags
    return dict(PORTABLE_KERNELS) if {"avx2", "fma"} <= flags else {}


def kernel_pins(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables :func:`pin_kernels` sets on this machine under ``env`` (none when
    switched off)."""
    env = os.environ if env is None else env
    if env.get(SWITCH, "1") == "0":
        return {}
    return portable_kernels() | REPRODUCIBLE_COMPILER


def pin_kernels() -> None:
    """Set the pins this machine can take (a value already set wins), before torch is imported."""
    for key, value in kernel_pins().items():
        os.environ.setdefault(key, value)


def kernels_in_effect(cpu_capability: str) -> dict[str, str]:
    """What decided this process's CPU rounding, as a run's tags: ATen's level as torch reports
    it (``cpu_capability``), MKL's and oneDNN's settings, whether all three are the portable
    pins (``runtime.portable_kernels``), the CPU's maker, and what of all this decides the bits
    (``runtime.rounding``, :func:`rounding`: two runs compare bit for bit when it matches)."""
    mkl = os.environ.get("MKL_CBWR", "")
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "")
    portable = (
        cpu_capability.upper() == PORTABLE_KERNELS["ATEN_CPU_CAPABILITY"].upper()
        and mkl == PORTABLE_KERNELS["MKL_CBWR"]
        and isa == PORTABLE_KERNELS["ONEDNN_MAX_CPU_ISA"]
    )
    tags = {
        "runtime.cpu_capability": cpu_capability,
        "runtime.mkl_cbwr": mkl or "native",
        "runtime.onednn_isa": isa or "native",
        "runtime.portable_kernels": str(portable).lower(),
        "runtime.inductor_deterministic": os.environ.get("TORCHINDUCTOR_DETERMINISTIC", "0"),
        "runtime.cpu_vendor": cpu_vendor(),
    }
    return {**tags, "runtime.rounding": rounding(tags) or "unpinned"}


def rounding(kernels: Mapping[str, str]) -> str | None:
    """What decides a run's bits on this CPU, from its kernel tags (:func:`kernels_in_effect`):
    MKL's branch, and the CPU's maker where that branch is not :data:`MAKER_INDEPENDENT_MKL`
    (``COMPATIBLE``, ``AVX2@AuthenticAMD``). Two runs of one computation on pinned ATen and
    oneDNN levels are the same bits when this is; None off those pins, under MKL's own choice
    (unset, or ``AUTO``), or where the maker cannot be read: bits of this machine's alone. The key
    a reference digest is recorded under."""
    pinned = PORTABLE_KERNELS
    levels = (kernels.get("runtime.cpu_capability", "").upper(), kernels.get("runtime.onednn_isa"))
    mkl = kernels.get("runtime.mkl_cbwr", "native").upper().removeprefix("BRANCH=")
    vendor = kernels.get("runtime.cpu_vendor", "unknown")
    if levels != (pinned["ATEN_CPU_CAPABILITY"].upper(), pinned["ONEDNN_MAX_CPU_ISA"]):
        return None
    if mkl == MAKER_INDEPENDENT_MKL:
        return mkl
    if mkl in ("NATIVE", "AUTO") or vendor == "unknown":  # MKL's choice for this very CPU
        return None
    return f"{mkl}@{vendor}"
