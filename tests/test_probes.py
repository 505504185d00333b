"""Datasheet presets and the machine probes (bandwidth, matmul, decode-shaped linears).

Probe sizes here are tiny (a few MB, two repetitions): these tests pin down the shape and the
validation of the results, never a timing threshold, because the CI machine is shared and noisy.
"""

import json
import math

import pytest
import torch

from ai_evolution import hardware
from ai_evolution.hardware import DeviceSpec, ProbeResult

SMALL = 2 * 2**20  # bytes: fast on a 2-core CPU


# ---- presets ---------------------------------------------------------------------------------

def test_h100_preset_has_datasheet_bandwidth_and_dense_bf16_peak():
    h100 = hardware.get_device_spec("h100-sxm")
    assert h100.bandwidth_bytes_per_s == 3.35e12
    assert h100.peak_flops["bf16"] == 989e12  # dense; 1979e12 is the sparsity figure
    assert h100.memory_bytes == 80e9 and h100.has_bf16


def test_h200_has_more_memory_and_bandwidth_but_h100_compute():
    h100, h200 = hardware.get_device_spec("h100-sxm"), hardware.get_device_spec("h200")
    assert h200.memory_bytes == 141e9 and h200.bandwidth_bytes_per_s == 4.8e12
    assert h200.peak_flops == h100.peak_flops


def test_t4_has_no_bf16_and_320_gbps():
    t4 = hardware.get_device_spec("t4")
    assert t4.has_bf16 is False
    assert "bf16" not in t4.peak_flops
    assert t4.bandwidth_bytes_per_s == 320e9


def test_seed_laptop_bandwidth_is_the_measured_273_gbps():
    laptop = hardware.get_device_spec("apple-m5-pro-laptop")
    assert laptop.bandwidth_bytes_per_s == 273e9
    assert "seed" in laptop.source


def test_every_preset_is_cited_and_in_si_units():
    for key, spec in hardware.DEVICE_PRESETS.items():
        assert isinstance(spec, DeviceSpec)
        assert spec.source, key
        assert spec.bandwidth_bytes_per_s > 1e11, key  # bytes/s, not GB/s
        assert all(v > 1e12 for v in spec.peak_flops.values()), key  # FLOP/s, not TFLOP/s
        assert set(spec.peak_flops) <= {"fp32", "tf32", "fp16", "bf16", "fp8", "int8"}, key


def test_generations_of_the_memory_wall_are_cited_oldest_first_and_in_si_units():
    years = [year for year, _ in hardware.GENERATIONS]
    assert years == sorted(years) and len(set(years)) == len(years)
    for year, spec in hardware.GENERATIONS:
        assert spec.source and spec.bandwidth_bytes_per_s > 1e11, year
        assert spec.peak_flops["fp16"] > 1e12, year  # the figure compares fp16 peaks


def test_lookup_ignores_case_and_unknown_name_lists_known_ones():
    assert hardware.get_device_spec("H100-SXM") is hardware.DEVICE_PRESETS["h100-sxm"]
    with pytest.raises(KeyError, match="desconocido") as info:
        hardware.get_device_spec("b200")
    for key in hardware.DEVICE_PRESETS:
        assert key in str(info.value)


# ---- probes ----------------------------------------------------------------------------------

def _assert_well_formed(result: ProbeResult, repeats: int) -> None:
    assert len(result.samples) == repeats
    assert all(math.isfinite(s) and s > 0 for s in result.samples)
    assert math.isfinite(result.median) and result.median > 0
    assert result.min <= result.median <= result.max
    json.dumps(result.to_dict())


@pytest.mark.parametrize("kind", ["read", "copy"])
def test_bandwidth_probe_returns_positive_finite_gbps(kind):
    result = hardware.measure_bandwidth("cpu", size_bytes=SMALL, kind=kind, repeats=2,
                                        progress=False)
    _assert_well_formed(result, repeats=2)
    assert result.unit == "GB/s"
    assert result.params["kind"] == kind
    assert result.params["bytes_per_call"] == SMALL * (1 if kind == "read" else 2)


def test_matmul_probe_returns_positive_finite_gflops():
    result = hardware.measure_matmul("cpu", n=128, repeats=2, progress=False)
    _assert_well_formed(result, repeats=2)
    assert result.unit == "GFLOP/s"
    assert result.params["n"] == 128 and result.params["dtype"] == "float32"


def test_matmul_probe_runs_bf16_on_cpu():
    result = hardware.measure_matmul("cpu", dtype=torch.bfloat16, n=64, repeats=1,
                                     progress=False)
    _assert_well_formed(result, repeats=1)


def test_decode_probe_returns_one_result_per_row_count():
    rows = (1, 4, 16)
    results = hardware.measure_decode_matmul("cpu", k=256, n=512, rows=rows, repeats=2,
                                             working_set_bytes=SMALL, progress=False)
    assert [r.params["rows"] for r in results] == list(rows)
    for r in results:
        _assert_well_formed(r, repeats=2)
        assert r.unit == "ms"
        assert r.params["weight_gbps"] > 0 and r.params["gflops"] > 0
        # enough distinct matrices to cover the requested working set
        assert r.params["working_set_bytes"] >= SMALL
        assert r.params["num_matrices"] == SMALL // (256 * 512 * 4)


def test_warmup_zero_still_measures():
    result = hardware.measure_bandwidth("cpu", size_bytes=SMALL, repeats=1, warmup=0,
                                        progress=False)
    _assert_well_formed(result, repeats=1)


def test_probe_summary_quick_is_json_serializable():
    summary = hardware.probe_summary("cpu", quick=True)
    text = json.dumps(summary)
    assert json.loads(text)["dtype"] == "float32"
    assert summary["bandwidth_read_gbps"] > 0 and summary["matmul_gflops"] > 0
    assert summary["quick"] is True and summary["measured"] is True


def test_available_memory_is_positive_on_cpu():
    available = hardware.available_memory_bytes("cpu")
    assert available is None or available > 0


# ---- validation: Spanish errors that name the bad value and the accepted ones ----------------

def test_bad_bandwidth_kind_lists_read_and_copy():
    with pytest.raises(ValueError, match="'write'.*'read', 'copy'"):
        hardware.measure_bandwidth("cpu", size_bytes=SMALL, kind="write")


def test_unsupported_dtype_names_the_supported_ones():
    with pytest.raises(ValueError, match="float16.*no está soportado.*float32, bfloat16"):
        hardware.measure_matmul("cpu", dtype=torch.float16, n=64)
    with pytest.raises(ValueError, match="float16"):
        hardware.measure_decode_matmul("cpu", dtype=torch.float16, k=64, n=64, rows=(1,))


@pytest.mark.parametrize("size", [0, -1, 1.5])
def test_non_positive_or_fractional_size_is_rejected(size):
    with pytest.raises(ValueError, match="size_bytes debe ser un entero positivo"):
        hardware.measure_bandwidth("cpu", size_bytes=size)


def test_size_smaller_than_one_element_is_rejected():
    with pytest.raises(ValueError, match="menor que un elemento"):
        hardware.measure_bandwidth("cpu", size_bytes=2, dtype=torch.float32)


@pytest.mark.parametrize("kwargs, name", [({"n": 0}, "n"), ({"repeats": 0}, "repeats"),
                                          ({"warmup": -1}, "warmup")])
def test_matmul_rejects_non_positive_sizes(kwargs, name):
    with pytest.raises(ValueError, match=f"{name} debe ser"):
        hardware.measure_matmul("cpu", **kwargs)


@pytest.mark.parametrize("rows", [(), (1, 0), (2, -4)])
def test_decode_rejects_empty_or_non_positive_rows(rows):
    with pytest.raises(ValueError, match="rows"):
        hardware.measure_decode_matmul("cpu", k=64, n=64, rows=rows)
