"""The PagedAttention lab: its contract, its determinism, and its parameter errors."""

import pytest

from ai_evolution.labs import LabParamError, run_lab, without_volatile
from ai_evolution.labs.paged_attention import block_size_sweep

FAST = dict(num_requests=10, prompt_len=16, mean_output=16, max_model_len=128, kv_rows=2,
            paged_max_num_seqs=8, block_size=8, block_sizes=[1, 8, 64], system_len=32, user_len=4,
            prefix_requests=4, prefix_output=4, chat_turns=3, dc_requests=160, dc_prompt_len=64,
            dc_mean_output=32)


@pytest.fixture(scope="module")
def contract():
    return run_lab("paged_attention", seed=1, profile="ci", **FAST)


def test_paged_layout_uses_memory_better_and_admits_more(contract):
    f = contract["results"]["fragmentation"]
    assert f["outputs_identical"]
    assert f["paged"]["mean_utilization"] > f["contiguous"]["mean_utilization"]
    assert f["contiguous"]["peak_batch"] == 2 < f["paged"]["peak_batch"]
    assert f["paged"]["steps"] < f["contiguous"]["steps"]
    assert f["paged"]["output_tokens"] == f["contiguous"]["output_tokens"]


def test_prefix_cache_saves_prefill_and_chat_turns_hit(contract):
    p = contract["results"]["prefix"]
    assert p["without_cache"]["hit_tokens"] == 0
    assert p["with_cache"]["hit_tokens"] == 3 * 32  # 3 later requests x the 32-token system prompt
    assert p["with_cache"]["prefill_tokens"] + p["with_cache"]["hit_tokens"] == p["without_cache"]["prefill_tokens"]
    chat = contract["results"]["chat"]
    assert chat[0]["hit_tokens"] == 0
    assert all(t["hit_tokens"] >= chat[i]["prompt_tokens"] // 8 * 8 - 8 for i, t in enumerate(chat[1:]))


def test_eviction_study_loses_the_prefix_only_in_small_pools(contract):
    ev = contract["results"]["eviction"]
    assert ev[0]["hit_tokens"] == 0 and ev[-1]["hit_tokens"] == 32
    assert [r["num_blocks"] for r in ev] == sorted(r["num_blocks"] for r in ev)


def test_datacenter_paged_admits_more(contract):
    dc = contract["results"]["datacenter"]
    assert dc["paged"]["peak_batch"] > dc["contiguous"]["peak_batch"]


def test_same_seed_gives_the_same_contract_except_volatile_fields(contract):
    again = run_lab("paged_attention", seed=1, profile="ci", **FAST)
    assert without_volatile(again) == without_volatile(contract)


@pytest.mark.parametrize("lens,bs,waste,entries", [([16, 16], 16, 0.0, 1.0), ([17], 16, 15 / 32, 2.0),
                                                   ([1, 3], 4, 4 / 8, 1.0)])
def test_block_size_sweep_arithmetic(lens, bs, waste, entries):
    (row,) = block_size_sweep(lens, [bs])
    assert row["internal_waste"] == pytest.approx(waste) and row["mean_table_entries"] == entries


def test_bad_parameters_are_rejected_in_spanish():
    with pytest.raises(LabParamError, match="supera las 512 posiciones"):
        run_lab("paged_attention", profile="ci", max_model_len=1024)
    with pytest.raises(LabParamError, match="debe ser menor que max_model_len"):
        run_lab("paged_attention", profile="ci", prompt_len=200, max_model_len=128)
    with pytest.raises(LabParamError, match="block_size"):
        run_lab("paged_attention", profile="ci", block_size=0)
