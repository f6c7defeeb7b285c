"""GPU facts: CUDA_VISIBLE_DEVICES, fp8 support, and NVML on a machine without a driver."""

from __future__ import annotations

import pytest

from supervisor.core.gpus import GpuDevice, GpuProcess, cuda_total_bytes, gpu_spec, interconnect, sm_count, visible
from supervisor.core.vllm import fp8_kv_supported
from supervisor.facts.nvml import NvmlProvider

GiB = 1 << 30


def dev(i: int, uuid: str, free_gib: float = 20.0) -> GpuDevice:
    total = 24 * GiB
    free = int(free_gib * GiB)
    procs = (GpuProcess(1234, "python", total - free),) if free < total else ()
    return GpuDevice(i, "NVIDIA GeForce RTX 4090", total, total - free, free, (8, 9), procs, uuid)


DEVICES = [dev(0, "GPU-aaaa1111-0000"), dev(1, "GPU-bbbb2222-0000", 10.0), dev(2, "GPU-aaab3333-0000")]


def test_visible_unset_means_all():
    assert visible(DEVICES, None) == DEVICES


def test_visible_by_index_keeps_cuda_order():
    assert [d.index for d in visible(DEVICES, "2,0")] == [2, 0]
    assert [d.index for d in visible(DEVICES, " 1 ")] == [1]


def test_visible_by_uuid_prefix():
    assert [d.index for d in visible(DEVICES, "GPU-bbbb")] == [1]
    assert [d.index for d in visible(DEVICES, "GPU-aaaa1111-0000,GPU-aaab")] == [0, 2]


def test_visible_stops_at_the_first_invalid_entry_like_cuda():
    assert [d.index for d in visible(DEVICES, "0,7,1")] == [0]
    assert visible(DEVICES, "GPU-aaa") == []          # ambiguous prefix
    assert visible(DEVICES, "") == []
    assert visible(DEVICES, "-1") == []
    assert [d.index for d in visible(DEVICES, "1,1,2")] == [1]   # a repeat is invalid too


@pytest.mark.parametrize("cc, version, mla, expected", [
    ((8, 6), "0.6.3", False, True),     # V0 converts in software
    ((8, 6), "0.9.2", False, True),     # V1 falls back to V0
    ((8, 6), "0.11.0", False, False),   # Triton needs native e4m3 (issue #26431)
    ((8, 9), "0.11.0", False, True),
    ((9, 0), "0.32.0", False, True),
    ((8, 6), "0.33.0", False, True),    # FlashInfer on sm80+
    ((8, 6), None, False, False),       # unknown version: only where every path works
    ((8, 9), None, False, True),
    ((8, 9), "0.32.0", True, False),    # MLA fp8 needs Hopper+
    ((9, 0), "0.32.0", True, True),
    ((9, 0), "0.9.2", True, False),
    ((6, 1), "0.6.3", False, False),    # below what vLLM supports at all
])
def test_fp8_kv_support_table(cc, version, mla, expected):
    assert fp8_kv_supported(cc, version, mla) is expected


def test_nvml_provider_without_a_driver_reports_why_and_returns_nothing():
    p = NvmlProvider()
    devices = p.snapshot()
    if devices:   # a machine with a GPU: the reader must have produced real facts
        d = devices[0]
        assert d.total_bytes > 0 and d.free_bytes <= d.total_bytes and d.name
        assert p.reason is None and p.available
        return
    assert p.reason and isinstance(p.reason, str)
    assert p.available is False
    assert p.snapshot() == []       # second call: no retry storm, same answer


# -- GPU models: CUDA's totals, not NVML's ---------------------------------------------------------

@pytest.mark.parametrize("name, nvml_mib, reserved_mib", [
    # nvidia-smi -q "FB Memory Usage" of real cards: CUDA's total is NVML's total less the driver's reserve
    ("NVIDIA H100 80GB HBM3", 81559, 479),
    ("NVIDIA H200", 143771, 614),
    ("NVIDIA L40S", 46068, 609),
    ("NVIDIA GeForce RTX 4080 SUPER", 16376, 434),
])
def test_a_gpu_name_gives_cudas_total_not_nvmls(name, nvml_mib, reserved_mib):
    expected_gib = round((nvml_mib - reserved_mib) / 1024, 2)
    assert cuda_total_bytes(name, nvml_mib << 20) / GiB == pytest.approx(expected_gib, abs=0.006)
    assert cuda_total_bytes(name) == cuda_total_bytes(name, nvml_mib << 20)      # the name alone


def test_an_80gb_h100_is_what_vllm_prints_for_it():
    # vLLM 0.19 on an H100 80GB HBM3: "Free memory on device (78.68/79.19 GiB) on startup" (calibration set 2)
    assert cuda_total_bytes("NVIDIA H100 80GB HBM3") / GiB == pytest.approx(79.19, abs=0.015)
    assert cuda_total_bytes("H100") == cuda_total_bytes("NVIDIA H100 80GB HBM3")


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA A10", "NVIDIA A10"), ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"),
    ("NVIDIA A100-PCIE-40GB", "NVIDIA A100-PCIE-40GB"), ("NVIDIA L4", "NVIDIA L4"), ("NVIDIA L40S", "NVIDIA L40S"),
    ("NVIDIA H20", "NVIDIA H20"), ("NVIDIA H200", "NVIDIA H200"), ("Tesla T4", "Tesla T4"),
])
def test_names_match_whole_words(name, expected):
    spec = gpu_spec(name)
    assert spec is not None and spec.name == expected


def test_a_total_that_is_not_the_models_is_taken_as_nvml_says():
    # a MIG slice of an H100 (nvidia-smi: 40448 MiB), or a card the table does not know
    assert cuda_total_bytes("NVIDIA H100 80GB HBM3", 40448 << 20) == 40448 << 20
    assert cuda_total_bytes("Some Future GPU", 12 << 30) == 12 << 30
    assert cuda_total_bytes("Some Future GPU") is None


def test_interconnect_classes():
    assert interconnect("NVIDIA H100 80GB HBM3") == "nvswitch"
    assert interconnect("NVIDIA A100-SXM4-80GB") == "nvlink"
    assert interconnect("NVIDIA L40S") == interconnect("NVIDIA GeForce RTX 4090") == "pcie"
    assert sm_count("NVIDIA H100 80GB HBM3") == 132 and sm_count("unknown") is None
