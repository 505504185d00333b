"""The roofline lab: its contract, the departure point, and its parameter errors."""

import pytest

from ai_evolution.labs import LabParamError, run_lab, without_volatile
from ai_evolution.sim import departure_batch

FAST = dict(model="tiny-es", prompt_len=32, context_len=16, decode_tokens=4, batch_sizes=[1, 2],
            repeats=1)


@pytest.fixture(scope="module")
def contract():
    return run_lab("roofline", seed=1, profile="ci", **FAST)


def test_contract_reports_machine_floor_and_batching_curve(contract):
    r = contract["results"]
    assert r["machine"]["bandwidth_read_gbps"] > 0 and r["machine"]["matmul_gflops"] > 0
    assert r["floor"]["floor_b1_ms"] > 0 and r["floor"]["efficiency"] > 0
    assert len(r["batching"]["measured_ms"]) == len(r["batching"]["predicted_ms"]) == 2
    # the prediction is calibrated on the batch-1 step
    assert r["batching"]["predicted_ms"][0] == pytest.approx(r["batching"]["measured_ms"][0])
    assert r["datasheet"]["h100_llama31_8b_bf16_floor_ms"] == pytest.approx(4.5, abs=0.05)


def test_same_seed_gives_the_same_contract_except_volatile_fields(contract):
    again = run_lab("roofline", seed=1, profile="ci", **FAST)
    assert without_volatile(again) == without_volatile(contract)
    assert "machine" not in without_volatile(contract)["results"]


@pytest.mark.parametrize("measured,expected", [
    ([1.0, 1.1, 1.3, 2.0], 8),     # 1.3 is within 25 % of 1.2; 2.0 is not
    ([1.0, 1.0, 1.0, 1.0], None),  # never departs
    ([1.0, 1.3, 1.0, 2.0], 2),     # the first departure counts, even if it comes back
    ([1.0, 1.25, 1.5, 2.0], 8),    # exactly at the tolerance (1.25, 1.5) is not a departure
])
def test_departure_batch_is_the_first_relative_excess(measured, expected):
    assert departure_batch([1, 2, 4, 8], measured, [1.0, 1.0, 1.2, 1.2], 0.25) == expected


def test_departure_batch_rejects_unsorted_batches():
    with pytest.raises(ValueError, match="ordenada"):
        departure_batch([2, 1], [1, 1], [1, 1], 0.1)


def test_sequences_longer_than_the_model_are_rejected_in_spanish():
    with pytest.raises(LabParamError, match="posiciones del modelo tiny-es"):
        run_lab("roofline", profile="ci", model="tiny-es", prompt_len=4096, repeats=1)


def test_bad_batch_list_names_accepted_values():
    with pytest.raises(LabParamError, match="batch_sizes"):
        run_lab("roofline", profile="ci", batch_sizes="1,cero")
