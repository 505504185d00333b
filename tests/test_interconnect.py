"""The interconnect in the cost model: datasheet links, the ring all-reduce, and tensor-parallel
steps of Llama-3.1-70B on H100s, on values."""

import pytest

from ai_evolution.hardware import DEVICE_PRESETS, get_device_spec
from ai_evolution.model import kv_bytes_per_token, param_count
from ai_evolution.model.presets import get_preset
from ai_evolution.sim.cost_model import RooflineCostModel, decode_step_cost
from ai_evolution.sim.interconnect import (GPU_MEMORY_UTILIZATION, Interconnect,
                                          allreduce_bytes_per_step, interconnect_of, kv_share,
                                          ring_allreduce_s, tp_decode_step, tp_sweep)

H100 = get_device_spec("h100-sxm")
LLAMA70 = get_preset("llama-3.1-70b")


def test_datasheet_links_are_per_direction_halves_of_the_printed_totals():
    assert H100.nvlink_bytes_per_s == 900e9 / 2 and H100.pcie_bytes_per_s == 128e9 / 2
    assert get_device_spec("a100-80gb").nvlink_bytes_per_s == 600e9 / 2
    assert get_device_spec("t4").nvlink_bytes_per_s is None
    for spec in DEVICE_PRESETS.values():
        if spec.nvlink_bytes_per_s or spec.pcie_bytes_per_s:
            assert "datasheet" in spec.interconnect_source
    with pytest.raises(ValueError, match="no publica ancho de banda nvlink; tiene: pcie"):
        interconnect_of(get_device_spec("l4"), "nvlink")
    with pytest.raises(ValueError, match="los aceptados son: nvlink, pcie"):
        interconnect_of(H100, "infiniband")


def test_ring_allreduce_time_on_values():
    link = Interconnect("x", 1e9, 0.0)
    assert ring_allreduce_s(1e6, 1, link) == 0.0
    assert ring_allreduce_s(1e6, 2, link) == pytest.approx(1e-3)          # 2 (1/2) m / BW
    assert ring_allreduce_s(1e6, 4, link) == pytest.approx(1.5e-3)        # 2 (3/4) m / BW
    assert ring_allreduce_s(1e6, 8, Interconnect("y", 1e9, 1e-5)) == pytest.approx(1.75e-3 + 1e-5)
    with pytest.raises(ValueError, match="world_size"):
        ring_allreduce_s(1.0, 0, link)


def test_allreduce_bytes_per_step_is_two_per_layer_of_tokens_times_hidden():
    assert allreduce_bytes_per_step(LLAMA70, 32, "bf16") == 2 * 80 * 8192 * 32 * 2
    step = tp_decode_step(LLAMA70, H100, 2, 32, 128)
    assert step.allreduce_bytes_per_step == 2 * 80 * 8192 * 32 * 2
    link = interconnect_of(H100, "nvlink")
    assert step.allreduce_s == pytest.approx(160 * ring_allreduce_s(32 * 8192 * 2, 2, link))


def test_tp1_is_the_plain_roofline_and_tp_divides_the_bytes():
    one = tp_decode_step(LLAMA70, H100, 1, 8, 1024)
    plain = RooflineCostModel.from_device_spec(H100).roofline_s(decode_step_cost(LLAMA70, 8, 1024))
    assert one.allreduce_s == 0 and one.step_s == pytest.approx(plain)
    four = tp_decode_step(LLAMA70, H100, 4, 8, 1024)
    assert four.weight_bytes_per_gpu == pytest.approx(one.weight_bytes_per_gpu / 4)
    assert four.kv_bytes_per_gpu == pytest.approx(one.kv_bytes_per_gpu / 4)
    assert four.flops_per_gpu == pytest.approx(one.flops_per_gpu / 4)
    assert kv_share(LLAMA70, 16) == 1 / 8          # 8 KV heads: beyond 8 GPUs, replicated
    with pytest.raises(ValueError, match="no divide las 64 cabezas"):
        tp_decode_step(LLAMA70, H100, 3, 1, 16)


def test_llama70b_on_h100_weights_fit_from_tp2_and_tp_pays_on_nvlink():
    weights = param_count(LLAMA70) * 2
    assert weights > GPU_MEMORY_UTILIZATION * H100.memory_bytes      # TP=1 cannot hold it
    steps = {tp: tp_decode_step(LLAMA70, H100, tp, 1, 2048) for tp in (1, 2, 4, 8)}
    assert [s.fits for s in steps.values()] == [False, True, True, True]
    times = [steps[tp].step_s for tp in (2, 4, 8)]
    assert times == sorted(times, reverse=True)                      # each doubling is faster
    held = steps[2].memory_per_gpu_bytes
    assert held == pytest.approx(weights / 2 + kv_bytes_per_token(LLAMA70, "bf16") * 2049 / 2)


def test_pcie_costs_more_than_nvlink_and_grows_with_the_batch():
    nv = tp_decode_step(LLAMA70, H100, 8, 256, 2048, "nvlink")
    pc = tp_decode_step(LLAMA70, H100, 8, 256, 2048, "pcie")
    assert nv.compute_s == pc.compute_s and pc.allreduce_s > nv.allreduce_s
    assert pc.comm_fraction > 0.5 > nv.comm_fraction           # the batch's messages dominate PCIe
    small = tp_decode_step(LLAMA70, H100, 8, 1, 2048, "pcie")
    assert small.comm_fraction < pc.comm_fraction


def test_sweep_rows_cover_every_combination():
    rows = tp_sweep(LLAMA70, H100, tps=(1, 2), batch_sizes=(1, 4), context_len=128)
    assert [(r["link"], r["tp"], r["batch_size"]) for r in rows] == [
        (l, t, b) for l in ("nvlink", "pcie") for t in (1, 2) for b in (1, 4)]
    assert all(r["tokens_per_s"] == pytest.approx(r["batch_size"] / r["step_s"]) for r in rows)


def test_fit_allreduce_recovers_a_ring_link_from_exact_times():
    from ai_evolution.hardware.allreduce import fit_allreduce
    link = Interconnect("x", 2e9, 3e-5)
    rows = [{"bytes": b, "world_size": 2, "median_s": ring_allreduce_s(b, 2, link)}
            for b in (4096, 65536, 2**20)]
    fitted = fit_allreduce(rows)
    assert fitted.latency_s == pytest.approx(3e-5, rel=1e-6)
    assert fitted.bandwidth_bytes_per_s == pytest.approx(2e9, rel=1e-6)
    with pytest.raises(ValueError, match="dos tamaños"):
        fit_allreduce(rows[:1])


def test_measured_gloo_allreduce_on_two_processes():
    from ai_evolution.hardware.allreduce import fit_allreduce, measure_allreduce
    rows = measure_allreduce((4096, 2**20), repeats=3, warmup=1)
    assert [r["bytes"] for r in rows] == [4096, 2**20]
    for r in rows:
        assert len(r["times_s"]) == 3 and 0 < r["min_s"] <= r["median_s"]
        assert r["busbw_bytes_per_s"] == pytest.approx(r["algbw_bytes_per_s"])  # p = 2: factor 1
    link = fit_allreduce(rows)
    assert link.latency_s >= 0 and link.bandwidth_bytes_per_s > 0
    with pytest.raises(ValueError, match="world_size"):
        measure_allreduce((4096,), world_size=1)


def test_tp_scaling_from_the_smallest_tp_that_fits():
    from ai_evolution.sim.interconnect import tp_scaling
    rows = tp_sweep(LLAMA70, H100, batch_sizes=(1, 256), context_len=2048)
    scaling = tp_scaling(rows)
    first = {(s["link"], s["batch_size"]): s for s in scaling if s["tp"] == s["min_tp"]}
    assert first[("nvlink", 1)]["min_tp"] == 2 and first[("nvlink", 256)]["min_tp"] == 8
    assert all(s["speedup"] == 1 and s["per_gpu_efficiency"] == 1 for s in first.values())
    eight = {(s["link"], s["batch_size"]): s for s in scaling if s["tp"] == 8}
    assert eight[("nvlink", 1)]["speedup"] > eight[("pcie", 1)]["speedup"] > 1
    assert eight[("pcie", 1)]["per_gpu_efficiency"] < eight[("nvlink", 1)]["per_gpu_efficiency"] < 1
    assert {s["tp"] for s in scaling if s["batch_size"] == 256} == {8}   # TP < 8 cannot hold it
    assert tp_scaling(tp_sweep(LLAMA70, H100, tps=(1,), batch_sizes=(1,))) == []  # nothing fits
