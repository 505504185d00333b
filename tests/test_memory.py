"""Memory arithmetic reproduces the worked numbers the course quotes."""

import math

import pytest
import torch

from ai_evolution.model import (ModelConfig, dtype_bytes, get_preset, kv_bytes, kv_bytes_per_token,
                                memory_budget, param_count, preset_names, weight_bytes)


def test_llama31_8b_bf16_is_128_kib_per_token():
    assert kv_bytes_per_token(get_preset("llama-3.1-8b"), "bf16") == 128 * 1024


def test_llama2_7b_fp16_is_half_a_mib_per_token_and_2_15_gb_at_4096():
    cfg = get_preset("llama-2-7b")
    assert kv_bytes_per_token(cfg, "fp16") == 0.5 * 2**20
    assert round(kv_bytes(cfg, 4096, dtype="fp16") / 1e9, 2) == 2.15


def test_24gb_gpu_with_7b_fp16_static_vs_paged():
    cfg = get_preset("llama-2-7b")
    b = memory_budget(cfg, 24e9, max_len=4096, typical_len=512, dtype="fp16", weights_bytes=14e9)
    assert b.static_slots == 4
    assert b.on_demand_sequences == 37
    gqa = memory_budget(cfg.replace(num_kv_heads=8), 24e9, max_len=4096, typical_len=512,
                        dtype="fp16", weights_bytes=14e9)
    # The seed rounds 37 x 4 = 148; the exact division gives 149.
    assert gqa.on_demand_sequences in (148, 149)


def test_exact_7b_weights_are_close_to_the_nominal_14_gb():
    assert weight_bytes(get_preset("llama-2-7b"), "fp16") == pytest.approx(14e9, rel=0.04)


def test_h100_llama31_8b_fits_about_116_requests_of_4096():
    b = memory_budget(get_preset("llama-3.1-8b"), 85.5e9, max_len=4096, utilization=0.92,
                      dtype="bf16")
    assert b.static_slots == 116


@pytest.mark.parametrize("name,params_m", [("llama-2-7b", 6738), ("llama-3.1-8b", 8030),
                                           ("qwen3-0.6b", 596), ("smollm2-135m", 134.5)])
def test_param_counts_match_published_sizes(name, params_m):
    assert param_count(get_preset(name)) / 1e6 == pytest.approx(params_m, rel=0.005)


def test_gqa_divides_kv_bytes_by_the_group_size():
    cfg = get_preset("llama-2-7b")
    assert kv_bytes_per_token(cfg.replace(num_kv_heads=8), "fp16") * 4 == kv_bytes_per_token(cfg, "fp16")


def test_dtype_bytes_accepts_names_and_torch_dtypes():
    assert dtype_bytes("bf16") == dtype_bytes(torch.bfloat16) == 2
    assert dtype_bytes(torch.float32) == 4
    assert dtype_bytes("int4") == 0.5
    with pytest.raises(ValueError, match="desconocido; aceptados"):
        dtype_bytes("fp12")


def test_budget_rejects_weights_that_do_not_fit():
    with pytest.raises(ValueError, match="no caben"):
        memory_budget(get_preset("llama-3.1-70b"), 24e9, max_len=4096, utilization=0.9)


def test_budget_rejects_bad_utilization():
    with pytest.raises(ValueError, match="utilization"):
        memory_budget(get_preset("llama-2-7b"), 80e9, max_len=4096, utilization=1.5)


def test_config_rejects_heads_not_multiple_of_kv_heads():
    with pytest.raises(ValueError, match="múltiplo de num_kv_heads"):
        ModelConfig(num_layers=2, hidden_size=96, num_heads=6, num_kv_heads=4,
                    intermediate_size=128, vocab_size=100)


def test_from_hf_config_names_supported_model_types():
    with pytest.raises(ValueError, match="llama, mistral, qwen2, qwen3"):
        ModelConfig.from_hf_config({"model_type": "gpt2", "n_layer": 2})


def test_hf_config_round_trip_keeps_every_field():
    for name in preset_names():
        if name == "tiny-es":
            continue
        cfg = get_preset(name)
        back = ModelConfig.from_hf_config(cfg.to_hf_config(), name=cfg.name)
        assert back.replace(source=cfg.source) == cfg, name


def test_unknown_preset_lists_known_ones():
    with pytest.raises(KeyError, match="llama-3.1-8b"):
        get_preset("gpt-5")


def test_memory_grows_linearly_in_tokens_and_batch():
    cfg = get_preset("qwen3-0.6b")
    assert math.isclose(kv_bytes(cfg, 100, 3, "fp16"), 300 * kv_bytes_per_token(cfg, "fp16"))
