"""The scheduler lab: its contract, its determinism, and its parameter errors."""

import pytest

from ai_evolution.labs import LabParamError, run_lab, without_volatile

FAST = dict(max_model_len=256, decoders=3, decoder_prompt=2, decode_tokens=40, long_prompt=96, warmup_steps=2,
            budgets=[8, 128], dc_decoders=8, dc_long_prompt=1024, dc_budgets=[128, 1040],
            pressure_requests=10, pressure_mean_output=16, pressure_max_num_seqs=6,
            pool_blocks=[64, 12])


@pytest.fixture(scope="module")
def contract():
    return run_lab("scheduler", seed=4, profile="ci", **FAST)


def test_small_budgets_delay_the_long_prompt_and_bound_the_step(contract):
    t = contract["results"]["tradeoff"]
    # 3 decoders (still decoding throughout) take 3 of 8 tokens: the prompt needs ceil(96 / 5) steps
    assert t["ttft_steps"] == [-(-96 // 5), 1]
    assert t["max_step_tokens"][0] <= 8 and t["max_step_tokens"][1] == 96 + 3


def test_simulated_tradeoff_goes_both_ways(contract):
    lo, hi = contract["results"]["tradeoff_sim"]["rows"]
    assert lo["ttft_s"] > hi["ttft_s"] and lo["itl_p99_s"] < hi["itl_p99_s"]
    assert hi["ttft_steps"] == 1


def test_a_small_pool_preempts_but_changes_no_token(contract):
    p = contract["results"]["preemption"]
    assert p["outputs_identical"]
    big, small = p["rows"]
    assert big["num_preemptions"] == 0 and small["num_preemptions"] > 0
    # what preemption threw away is computed again, except what the prefix cache gives back
    assert (small["computed_tokens"] + small["prefix_hit_tokens"] - small["preempted_tokens"]
            == big["computed_tokens"] + big["prefix_hit_tokens"])


def test_same_seed_gives_the_same_contract_except_volatile_fields(contract):
    assert without_volatile(run_lab("scheduler", seed=4, profile="ci", **FAST)) == without_volatile(contract)


def test_bad_parameters_are_rejected_in_spanish():
    with pytest.raises(LabParamError, match="no cabe la petición más larga"):
        run_lab("scheduler", profile="ci", **{**FAST, "pool_blocks": [2]})
    with pytest.raises(LabParamError, match="long_prompt"):
        run_lab("scheduler", profile="ci", **{**FAST, "long_prompt": 300})
