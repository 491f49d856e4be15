"""Portable kernels: which pins a machine takes, that every command and this suite run under them,
and that the shipped reference run comes out bit for bit (the determinism contract)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tasks import determinism
from tasks.determinism import (
    PORTABLE_KERNELS,
    cpu_flags,
    cpu_vendor,
    kernels_in_effect,
    portable_kernels,
)

ROOT = Path(__file__).resolve().parents[2]
PINNED = kernels_in_effect(torch.backends.cpu.get_cpu_capability())["runtime.portable_kernels"]
needs_pins = pytest.mark.skipif(
    PINNED != "true", reason="this CPU cannot take the portable kernel pins (no AVX2 and FMA)"
)


def test_cpu_flags_are_read_from_the_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\nbugs\t\t: none\n")
    assert cpu_flags(info) == {"fpu", "sse2", "avx2", "fma"}
    assert cpu_flags(tmp_path / "missing") == set()  # macOS, a container without /proc


def test_the_cpu_maker_is_read_from_the_vendor_line(tmp_path):
    """MKL's branch depends on it (tasks.determinism): a run is tagged with it."""
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n")
    assert cpu_vendor(info) == "AuthenticAMD"
    assert cpu_vendor(tmp_path / "missing") == "unknown"
    assert kernels_in_effect("AVX2")["runtime.cpu_vendor"] == cpu_vendor()


def test_only_a_cpu_with_avx2_and_fma_takes_the_pins(monkeypatch):
    monkeypatch.delenv(determinism.SWITCH, raising=False)
    assert portable_kernels({"avx2", "fma", "avx512f"}) == PORTABLE_KERNELS
    assert portable_kernels({"avx2"}) == {}  # ATen's AVX2 kernels would crash without FMA
    assert portable_kernels({"sse4_2"}) == {}
    monkeypatch.setenv(determinism.SWITCH, "0")
    assert portable_kernels({"avx2", "fma"}) == {}


def test_a_value_the_user_set_wins(monkeypatch):
    monkeypatch.delenv(determinism.SWITCH, raising=False)
    monkeypatch.setattr(determinism, "cpu_flags", lambda: {"avx2", "fma"})
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    for key in ("MKL_CBWR", "ONEDNN_MAX_CPU_ISA"):
        monkeypatch.delenv(key, raising=False)
    determinism.pin_kernels()
    assert os.environ["ATEN_CPU_CAPABILITY"] == "default"
    assert os.environ["MKL_CBWR"] == "COMPATIBLE" and os.environ["ONEDNN_MAX_CPU_ISA"] == "AVX2"


def test_the_compiler_is_pinned_on_any_cpu_unless_switched_off(monkeypatch):
    """Inductor's deterministic mode is not a CPU matter: a machine without AVX2 takes it too."""
    monkeypatch.setattr(determinism, "cpu_flags", lambda: {"sse4_2"})
    for switch in ("1", "0"):
        monkeypatch.setenv(determinism.SWITCH, switch)
        monkeypatch.delenv("TORCHINDUCTOR_DETERMINISTIC", raising=False)
        monkeypatch.delenv("MKL_CBWR", raising=False)
        determinism.pin_kernels()
        pinned = os.environ.get("TORCHINDUCTOR_DETERMINISTIC")
        assert pinned == ("1" if switch == "1" else None) and "MKL_CBWR" not in os.environ


def test_a_run_is_tagged_portable_only_under_all_three_pins(monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setattr(determinism, "cpu_vendor", lambda: "AuthenticAMD")
    pinned = kernels_in_effect("AVX2")
    assert pinned["runtime.portable_kernels"] == "true"
    assert pinned["runtime.rounding"] == "COMPATIBLE"  # whatever the maker
    assert kernels_in_effect("AVX512")["runtime.portable_kernels"] == "false"
    assert kernels_in_effect("AVX512")["runtime.rounding"] == "unpinned"
    monkeypatch.setenv("MKL_CBWR", "AVX2")  # the earlier pin: the maker's bits
    tags = kernels_in_effect("AVX2")
    assert tags["runtime.portable_kernels"] == "false"
    assert tags["runtime.rounding"] == "AVX2@AuthenticAMD"
    monkeypatch.delenv("MKL_CBWR")
    tags = kernels_in_effect("AVX2")
    assert tags["runtime.mkl_cbwr"] == "native" and tags["runtime.rounding"] == "unpinned"


@pytest.mark.parametrize(
    ("kernels", "key"),
    [
        ({"runtime.mkl_cbwr": "COMPATIBLE", "runtime.cpu_vendor": "GenuineIntel"}, "COMPATIBLE"),
        ({"runtime.mkl_cbwr": "COMPATIBLE", "runtime.cpu_vendor": "AuthenticAMD"}, "COMPATIBLE"),
        ({"runtime.mkl_cbwr": "AVX2", "runtime.cpu_vendor": "GenuineIntel"}, "AVX2@GenuineIntel"),
        ({"runtime.mkl_cbwr": "native", "runtime.cpu_vendor": "GenuineIntel"}, None),
        ({"runtime.mkl_cbwr": "AUTO", "runtime.cpu_vendor": "GenuineIntel"}, None),
        ({"runtime.mkl_cbwr": "AVX2", "runtime.cpu_vendor": "unknown"}, None),
        ({"runtime.mkl_cbwr": "compatible", "runtime.cpu_vendor": "unknown"}, "COMPATIBLE"),
        (
            {"runtime.mkl_cbwr": "BRANCH=AVX2", "runtime.cpu_vendor": "AuthenticAMD"},
            "AVX2@AuthenticAMD",
        ),
        ({"runtime.mkl_cbwr": "COMPATIBLE", "runtime.cpu_capability": "AVX512"}, None),
        ({"runtime.mkl_cbwr": "COMPATIBLE", "runtime.onednn_isa": "native"}, None),
    ],
)
def test_rounding_names_the_maker_only_where_mkls_branch_is_the_makers(kernels, key):
    pinned = {"runtime.cpu_capability": "AVX2", "runtime.onednn_isa": "AVX2"}
    assert determinism.rounding({**pinned, **kernels}) == key


@needs_pins
def test_this_suite_runs_on_the_pinned_kernels():
    """conftest pins them before torch is imported, as the dapo entry point does."""
    assert torch.backends.cpu.get_cpu_capability() == "AVX2"


@pytest.mark.slow
@needs_pins
def test_the_dapo_entry_point_pins_the_kernels_before_torch_loads():
    env = {k: v for k, v in os.environ.items() if not k.startswith(tuple(PORTABLE_KERNELS))}
    code = (
        "from flows.environment import apply_defaults; apply_defaults()\n"
        "import torch, os; print(torch.backends.cpu.get_cpu_capability(), os.environ['MKL_CBWR'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["AVX2", "COMPATIBLE"]


@pytest.mark.slow
@needs_pins
def test_the_chain_reference_run_reproduces_the_release_bit_for_bit(tmp_path):
    """The determinism contract: 5 RL steps of the chain preset from its shipped checkpoint end
    in the final weights the release recorded for the portable kernels, on any x86-64 machine
    with AVX2 and FMA, whatever its maker (a
    change to the trainer's numerics changes them too: re-ship with `dapo model build -c
    configs/chain.yaml --ship tiny-chain`, checkpoints/README.md; after a change of the pins,
    record the new rounding's digest with `dapo model check -c configs/chain.yaml --record`)."""
    from flows.models import check_reference
    from tasks.params import load_params

    cfg = load_params(None, [ROOT / "configs" / "chain.yaml"])
    r = check_reference(cfg, tmp_path)
    assert r.want, f"no reference recorded for {r.key} (got {r.got}): see the docstring"
    assert r.reproduced, (r.got, r.want)
