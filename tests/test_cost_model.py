"""The roofline arithmetic reproduces the course seed's numbers."""

import pytest

from ai_evolution.model import ModelConfig, get_preset, kv_bytes_per_token, param_count
from ai_evolution.sim import (RooflineCostModel, arithmetic_intensity, decode_step_cost,
                              efficiency, matmul_params, ridge_point, step_cost, time_floor_s,
                              weight_bytes_read)

H100_BW = 3.35e12
LAPTOP_BW, LAPTOP_PEAK = 273e9, 18e12


def test_llama31_8b_bf16_reads_15_gb_and_floors_at_4_5_ms_on_h100():
    cost = decode_step_cost(get_preset("llama-3.1-8b"), dtype="bf16")
    assert cost.weight_bytes == pytest.approx(15.0e9, rel=0.01)
    assert time_floor_s(cost.bytes, H100_BW) * 1e3 == pytest.approx(4.5, abs=0.05)


def test_seed_laptop_floor_efficiency_and_ridge():
    floor = time_floor_s(5.38e9, LAPTOP_BW)
    assert floor * 1e3 == pytest.approx(19.7, abs=0.05)
    assert efficiency(floor, 1 / 42.6) == pytest.approx(0.84, abs=0.005)
    assert ridge_point(LAPTOP_PEAK, LAPTOP_BW) == pytest.approx(66, abs=0.5)


def test_batch1_decode_of_a_4bit_8b_file_is_about_3_flop_per_byte():
    # The seed rounds 2 x 8e9 FLOP / 5.38e9 B; counting only matmul weights gives 2.8.
    flops = decode_step_cost(get_preset("llama-3.1-8b")).flops
    assert round(arithmetic_intensity(flops, 5.38e9)) == 3
    assert arithmetic_intensity(2 * 8e9, 5.38e9) == pytest.approx(3.0, abs=0.05)


def test_embedding_table_is_read_only_when_tied():
    untied = get_preset("llama-3.1-8b")
    tied = untied.replace(tie_word_embeddings=True)
    table = untied.vocab_size * untied.hidden_size * 2
    # untied: the table is gathered (one row) but the separate lm_head is read in full
    assert weight_bytes_read(untied, "bf16") == pytest.approx(
        (param_count(untied) * 2 - table) + untied.hidden_size * 2)
    assert weight_bytes_read(tied, "bf16") == pytest.approx(
        param_count(tied) * 2 + tied.hidden_size * 2)


def test_batching_shares_weight_bytes_but_multiplies_flops_and_kv():
    cfg = get_preset("llama-3.1-8b")
    one, many = decode_step_cost(cfg, 1, 1000), decode_step_cost(cfg, 32, 1000)
    assert many.flops == pytest.approx(32 * one.flops)
    assert many.kv_bytes == pytest.approx(32 * one.kv_bytes)
    assert many.weight_bytes - one.weight_bytes == 31 * cfg.hidden_size * 2
    assert many.intensity > 20 * one.intensity


def test_kv_bytes_cover_the_whole_context():
    cfg = get_preset("llama-2-7b")
    cost = decode_step_cost(cfg, 2, 99, dtype="fp16")
    assert cost.kv_bytes == 2 * 100 * kv_bytes_per_token(cfg, "fp16")


def test_prefill_chunk_attention_counts_causal_pairs():
    cfg = ModelConfig(num_layers=1, hidden_size=8, num_heads=2, num_kv_heads=1,
                      intermediate_size=16, vocab_size=10)
    # 3 new tokens after 2 cached: positions 2, 3, 4 see 3, 4, 5 keys = 12 pairs
    cost = step_cost(cfg, [3], [5])
    assert cost.flops == 2 * matmul_params(cfg) * 3 + 4 * 2 * 4 * 12


def test_step_cost_rejects_contexts_shorter_than_the_new_tokens():
    with pytest.raises(ValueError, match="q=4, c=3"):
        step_cost(get_preset("llama-2-7b"), [4], [3])


def test_cost_model_is_bandwidth_bound_at_batch1_and_compute_bound_at_large_batch():
    cfg = get_preset("llama-3.1-8b")
    model = RooflineCostModel(H100_BW, 989e12)
    b1 = decode_step_cost(cfg, 1, 512)
    assert model.step_time_s(b1) == pytest.approx(b1.bytes / H100_BW)
    big = step_cost(cfg, [4096], [4096])  # a long prefill
    assert model.step_time_s(big) == pytest.approx(big.flops / 989e12)


def test_calibration_fits_overhead_and_never_goes_negative():
    cfg = get_preset("llama-3.1-8b")
    model = RooflineCostModel(H100_BW, 989e12)
    cost = decode_step_cost(cfg)
    fitted = model.calibrated(cost, model.roofline_s(cost) + 0.002)
    assert fitted.overhead_s == pytest.approx(0.002)
    assert fitted.step_time_s(cost) == pytest.approx(model.roofline_s(cost) + 0.002)
    assert model.calibrated(cost, 1e-9).overhead_s == 0.0


def test_cost_model_rejects_non_positive_machine_numbers():
    with pytest.raises(ValueError, match="ancho de banda"):
        RooflineCostModel(0, 1e12)


def test_a_hybrids_decode_step_reads_kv_of_8_layers_and_its_state_once_per_sequence():
    from ai_evolution.model import get_preset
    cfg = get_preset("qwen3.5-9b")
    empty, full = decode_step_cost(cfg, 2, 0), decode_step_cost(cfg, 2, 4096)
    state = 50.25 * 2**20  # f32: 48 MiB of delta-rule matrices + 2,25 MiB of conv windows
    assert empty.state_bytes == full.state_bytes == 2 * 2 * state  # read + write, 2 sequences
    assert full.kv_bytes - empty.kv_bytes == 2 * 4096 * 32 * 1024  # 32 KiB per cached token
    assert full.flops - empty.flops == 4 * 8 * 16 * 256 * 4096 * 2  # 8 attention layers


def test_a_hybrids_predicted_decode_step_is_nearly_flat_in_context_and_a_transformers_grows():
    """Batch 1 on an H100's datasheet: 24 of Qwen3.5-9B's 32 layers read the same state at any
    context; Llama-3.1-8B reads four times more KV per token in all 32."""
    from ai_evolution.hardware import get_device_spec
    model = RooflineCostModel.from_device_spec(get_device_spec("h100-sxm"))
    hybrid, dense = get_preset("qwen3.5-9b"), get_preset("llama-3.1-8b")
    growth = {}
    for name, cfg in (("hybrid", hybrid), ("dense", dense)):
        t = [model.step_time_s(decode_step_cost(cfg, 1, c)) for c in (0, 1024, 4096, 16384)]
        assert t == sorted(t)
        growth[name] = [x / t[0] - 1 for x in t[1:]]
    assert growth["hybrid"][1] < 0.01           # +4096 tokens: under 1 % slower
    assert growth["dense"][1] > 0.03            # the transformer: over 3 %
    for h, d in zip(growth["hybrid"], growth["dense"]):
        assert d > 4 * h                        # everywhere, more than 4x the hybrid's growth
    # the linear layers' own cost is the same at every context: state bytes and FLOPs
    a, b = decode_step_cost(hybrid, 1, 0), decode_step_cost(hybrid, 1, 16384)
    assert a.state_bytes == b.state_bytes > 0
    assert (b.flops - a.flops) == 4 * hybrid.num_attention_layers * hybrid.num_heads * \
        hybrid.head_dim * 16384


def test_the_simulator_serves_a_hybrid_with_vllms_528_token_block():
    """Qwen3.5-9B at vLLM's block (state_page_block_size): a repeated prompt of 500 tokens never
    hits, one of 1 100 reuses its first two blocks (1 056 tokens)."""
    from ai_evolution.engine import KVCacheManager, SamplingParams
    from ai_evolution.hardware import get_device_spec
    from ai_evolution.model import state_page_block_size
    from ai_evolution.sim import sim_engine
    cfg = get_preset("qwen3.5-9b")
    block = state_page_block_size(cfg)
    model = RooflineCostModel.from_device_spec(get_device_spec("h100-sxm"))
    for length, hit in ((500, 0), (1100, 1056)):
        engine = sim_engine(cfg, model, 2, 4096, kv=KVCacheManager(16, block, 4096))
        prompt = list(range(length))
        for i in range(2):
            engine.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True))
            while engine.has_unfinished_requests():
                engine.step()
        assert engine.kv_usage()["prefix_hit_tokens"] == hit
        assert engine.kv_usage()["state_checkpoint_interval"] == block
    # a checkpoint saved or restored reads and writes one more whole state
    plain, copying = step_cost(cfg, [4], [1100]), step_cost(cfg, [4], [1100], num_state_copies=2)
    assert copying.state_bytes - plain.state_bytes == 2 * 2 * 50.25 * 2**20
    assert copying.flops == plain.flops
