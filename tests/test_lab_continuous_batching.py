"""The continuous-batching lab: its contract, its determinism, and its parameter errors."""

import pytest

from ai_evolution.labs import LabParamError, run_lab, without_volatile
from ai_evolution.labs.continuous_batching import workload

FAST = dict(num_requests=12, prompt_len=8, mean_output=8, caps=[2, 48], max_num_seqs=4,
            validation_widths=[1, 4], dc_requests=64, dc_caps=[8, 1024], dc_max_num_seqs=16)


@pytest.fixture(scope="module")
def contract():
    return run_lab("continuous_batching", seed=2, profile="ci", **FAST)


def test_both_policies_give_the_same_tokens_and_continuous_takes_fewer_steps(contract):
    m = contract["results"]["measured"]
    assert m["outputs_identical"] == [True, True]
    # cap 2: every output is 1 or 2 tokens, the batches drain together; cap 48: a long tail
    assert m["steps"]["continuous"][-1] < m["steps"]["static"][-1]
    assert all(c <= s for c, s in zip(m["steps"]["continuous"], m["steps"]["static"]))
    assert m["idle_held_fraction"]["continuous"] == [0.0, 0.0]
    assert m["idle_held_fraction"]["static"][-1] > 0.2
    assert m["mean_batch"]["continuous"][-1] > m["mean_batch"]["static"][-1]


def test_simulator_validation_and_datacenter_study_are_reported(contract):
    r = contract["results"]
    v = r["simulator_validation"]
    assert [w["max_num_seqs"] for w in v["widths"]] == [1, 4]
    assert v["max_abs_error"] == max(abs(w["error"]) for w in v["widths"])
    runs = r["datacenter"]["runs"]
    assert [run["cap"] for run in runs] == [8, 1024]
    assert runs[-1]["throughput_ratio"] > 1.5 and runs[-1]["throughput_ratio"] > runs[0]["throughput_ratio"]
    assert runs[-1]["continuous"]["steps"] < runs[-1]["static"]["steps"]


def test_same_seed_gives_the_same_contract_except_volatile_fields(contract):
    again = run_lab("continuous_batching", seed=2, profile="ci", **FAST)
    assert without_volatile(again) == without_volatile(contract)
    assert "measured_timing" not in without_volatile(contract)["results"]


def test_workload_is_seeded_and_capped():
    a = workload(50, 4, 20, 16, 100, seed=1)
    assert a == workload(50, 4, 20, 16, 100, seed=1)
    assert a != workload(50, 4, 20, 16, 100, seed=2)
    lengths = [w.params.max_tokens for w in a]
    assert max(lengths) == 16 and min(lengths) >= 1
    assert all(len(w.prompt_token_ids) == 4 and w.params.ignore_eos for w in a)


@pytest.mark.parametrize("params,accepted", [
    ({"model": "gpt-5"}, "tiny-es"),
    ({"dc_device": "tpu"}, "h100-sxm"),
    ({"caps": "0,8"}, ">= 1"),
])
def test_bad_parameters_name_the_accepted_values(params, accepted):
    with pytest.raises(LabParamError, match=accepted):
        run_lab("continuous_batching", profile="ci", **params)


def test_caps_longer_than_the_model_are_rejected_in_spanish():
    with pytest.raises(LabParamError, match="supera las 512 posiciones"):
        run_lab("continuous_batching", profile="ci", prompt_len=32, caps=[600])
