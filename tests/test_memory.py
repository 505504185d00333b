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


# --- hybrid decoders: KV for attention layers only, a fixed state per sequence ------------------
def test_qwen35_9b_kv_counts_only_its_8_attention_layers():
    from ai_evolution.model.memory import (conv_state_bytes, recurrent_state_bytes,
                                           state_bytes_per_sequence)
    cfg = get_preset("qwen3.5-9b")
    assert (cfg.num_attention_layers, cfg.num_linear_layers) == (8, 24)
    assert cfg.attention_layer_ids == (3, 7, 11, 15, 19, 23, 27, 31)
    # 2 (K, V) x 8 layers x 4 KV heads x 256 dims x 2 bytes = 32 KiB, the seed's figure.
    assert kv_bytes_per_token(cfg, "bf16") == 32 * 1024
    # 24 layers x 32 value heads x 128 x 128 x 4 bytes (f32) = 48 MiB, the seed's figure.
    assert recurrent_state_bytes(cfg) == 48 * 2**20
    # 24 layers x (2 x 16 x 128 + 32 x 128) channels x 3 past inputs x 4 bytes = 2,25 MiB.
    assert conv_state_bytes(cfg) == 24 * 8192 * 3 * 4 == 2.25 * 2**20
    assert state_bytes_per_sequence(cfg) == 50.25 * 2**20
    assert state_bytes_per_sequence(cfg, "bf16") == 50.25 * 2**20 / 2
    # The main part of the state weighs as much as 1 536 tokens of KV.
    assert recurrent_state_bytes(cfg) / kv_bytes_per_token(cfg, "bf16") == 1536
    assert state_bytes_per_sequence(get_preset("llama-3.1-8b")) == 0


def test_qwen35_9b_has_about_nine_billion_parameters():
    # Embeddings and head 2 x 248320 x 4096; 32 MLPs of 3 x 4096 x 12288; 8 attention layers
    # (q_proj doubled by the gate); 24 linear layers; norms, conv, dt_bias, A_log.
    n = param_count(get_preset("qwen3.5-9b"))
    assert 8.9e9 < n < 9.0e9, n


def test_memory_budget_pays_the_state_once_per_sequence():
    cfg = get_preset("qwen3.5-9b")
    short = memory_budget(cfg, 80e9, max_len=10, weights_bytes=20e9)
    long = memory_budget(cfg, 80e9, max_len=10_000, weights_bytes=20e9)
    state = 50.25 * 2**20
    assert short.state_bytes_per_sequence == state
    assert short.static_slots == math.floor(60e9 / (10 * 32 * 1024 + state))
    assert long.static_slots == math.floor(60e9 / (10_000 * 32 * 1024 + state))
    # At 10 tokens the state is almost all of a sequence's memory: without it, 160x more fit.
    assert math.floor(60e9 / (10 * 32 * 1024)) > 160 * short.static_slots


def test_the_checkpoint_pool_comes_out_of_the_budget_first():
    cfg = get_preset("qwen3.5-9b")
    state = 50.25 * 2**20
    pooled = memory_budget(cfg, 80e9, max_len=1000, weights_bytes=20e9, num_state_checkpoints=64)
    assert pooled.state_checkpoint_bytes == 64 * state
    assert pooled.static_slots == math.floor((60e9 - 64 * state) / (1000 * 32 * 1024 + state))
    with pytest.raises(ValueError, match="num_state_checkpoints debe ser un entero >= 0"):
        memory_budget(cfg, 80e9, max_len=1000, num_state_checkpoints=-1)
    with pytest.raises(ValueError, match="puntos de control del estado .* no queda sitio"):
        memory_budget(cfg, 24e9, max_len=1000, num_state_checkpoints=200)


def test_vllms_hybrid_block_of_528_tokens_is_one_state_page_of_kv():
    """vLLM grows a hybrid's block until one attention layer's KV block weighs at least one
    linear layer's state (f32 recurrent, bf16 conv): 2 048 KiB + 48 KiB over 4 KiB per token is
    524 tokens, rounded up to a multiple of 16."""
    from ai_evolution.model.memory import state_page_block_size
    cfg = get_preset("qwen3.5-9b")
    assert state_page_block_size(cfg) == 528
    assert state_page_block_size(cfg, conv_dtype="float32") == 544  # 2 144 KiB / 4 KiB = 536
    assert state_page_block_size(cfg, alignment=1) == 524
    assert state_page_block_size(get_preset("llama-3.1-8b")) == 0


def test_sequences_that_fit_count_weights_kv_and_state():
    from ai_evolution.model.memory import sequences_that_fit, state_bytes_per_sequence
    for gb in (24, 80):
        for context in (16, 4096):
            fits = {name: sequences_that_fit(name, gb, context)
                    for name in ("qwen3.5-9b", "llama-3.1-8b")}
            for name, f in fits.items():
                cfg = get_preset(name)
                per_seq = kv_bytes_per_token(cfg, "bf16") * context + state_bytes_per_sequence(cfg)
                assert f.bytes_per_sequence == per_seq and f.weights_fit
                assert f.sequences == math.floor((gb * 1e9 - weight_bytes(cfg, "bf16")) / per_seq)
            hybrid, dense = fits["qwen3.5-9b"].sequences, fits["llama-3.1-8b"].sequences
            # short contexts: the hybrid's 50 MiB state per sequence loses; long: its 1/4 KV wins
            assert (hybrid < dense) if context == 16 else (hybrid > 2 * dense), (gb, context)
    small = sequences_that_fit("qwen3.5-9b", 16, 1024)
    assert small.sequences == 0 and not small.weights_fit  # 17,9 GB of weights
    with pytest.raises(ValueError, match="context_len debe ser un entero >= 1"):
        sequences_that_fit("qwen3.5-9b", 24, 0)
    with pytest.raises(ValueError, match="gpu_memory_gb debe ser un número > 0"):
        sequences_that_fit("qwen3.5-9b", -1, 10)
