"""The Qwen3.5-style hybrid decoder (Gated DeltaNet + attention), checked against transformers."""

from __future__ import annotations

import pytest
import torch

from ai_evolution.model.attention import ContiguousKVCache
from ai_evolution.model.checkpoint import load_pretrained, random_model, save_pretrained
from ai_evolution.model.config import ModelConfig
from ai_evolution.model.memory import linear_shapes, param_count
from ai_evolution.model.linear_attention import (LinearAttentionState, gated_delta_chunked,
                                                 gated_delta_recurrent)
from test_model import hf_model  # every parameter random: norms, A_log, dt_bias, conv included

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

BASE = dict(num_layers=4, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=16,
            intermediate_size=48, vocab_size=97, model_type="qwen3_5_text", qk_norm=True,
            attn_output_gate=True, zero_centered_norm=True, partial_rotary_factor=0.25,
            rope_theta=10000.0, rms_norm_eps=1e-6,
            layer_types=("linear_attention", "full_attention", "linear_attention",
                         "full_attention"),
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
            linear_value_head_dim=6, linear_conv_kernel_dim=4)
HYBRID = ModelConfig(**BASE)
# Three linear layers then one attention layer (Hugging Face's default pattern), a tied head,
# attention biases and one value head per key head.
VARIANT = ModelConfig(**{**BASE, "tie_word_embeddings": True, "attention_bias": True,
                         "o_proj_bias": True, "linear_num_value_heads": 2,
                         "partial_rotary_factor": 0.5,
                         "layer_types": ("linear_attention",) * 3 + ("full_attention",)})
CONFIGS = {"alternating": HYBRID, "three-to-one": VARIANT}


def random_ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, BASE["vocab_size"], (batch, length),
                         generator=torch.Generator().manual_seed(seed))


def assert_close(ours: torch.Tensor, ref: torch.Tensor, rel: float = 1e-5) -> None:
    diff = (ours - ref).abs().max().item()
    assert diff <= rel * max(1.0, ref.abs().max().item()), f"max |diff| = {diff}"


@pytest.fixture(scope="module")
def hf_checkpoints(tmp_path_factory):
    out = {}
    for name, config in CONFIGS.items():
        folder = tmp_path_factory.mktemp(f"hf-{name}")
        model = hf_model(config)
        model.save_pretrained(folder)
        out[name] = (folder, model)
    return out


# --- logits against transformers -----------------------------------------------------------------
@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_transformers_after_loading_its_checkpoint(name, hf_checkpoints):
    folder, hf = hf_checkpoints[name]
    ours = load_pretrained(folder)
    assert ours.config.layer_kinds == CONFIGS[name].layer_kinds
    ids = random_ids(2, 70)  # more than one 64-token chunk, the last one padded
    with torch.no_grad():
        assert_close(ours(ids), hf(ids).logits)


def test_transformers_loads_our_checkpoint_and_matches(tmp_path):
    ours = random_model(HYBRID, seed=3, init_std=0.2)
    save_pretrained(ours, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    assert type(hf).__name__ == "Qwen3_5ForCausalLM"
    ids = random_ids(1, 20, seed=1)
    with torch.no_grad():
        assert_close(ours(ids), hf(ids).logits)


def test_state_dict_round_trip_is_exact(tmp_path):
    model = random_model(VARIANT, seed=5, init_std=0.2)
    save_pretrained(model, tmp_path)
    loaded = load_pretrained(tmp_path)
    assert loaded.config.replace(name="custom", source="") == model.config
    mine, theirs = model.state_dict(), loaded.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    ids = random_ids(2, 9)
    with torch.no_grad():
        assert torch.equal(model(ids), loaded(ids))


def test_random_hybrid_norms_start_at_the_identity():
    model = random_model(HYBRID, seed=0)
    layer = model.model.layers[0]
    assert torch.count_nonzero(layer.input_layernorm.weight) == 0            # 1 + w, w = 0
    assert torch.all(layer.linear_attn.norm.weight == 1)                     # plain w = 1
    assert torch.count_nonzero(model.model.layers[1].self_attn.q_norm.weight) == 0


# --- chunked form (prefill) against recurrent form (decode) ----------------------------------------
def delta_inputs(B=2, T=11, H=3, Dk=5, Dv=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(B, T, H, Dk, generator=gen), dim=-1) * Dk ** -0.5
    k = torch.nn.functional.normalize(torch.randn(B, T, H, Dk, generator=gen), dim=-1)
    v = torch.randn(B, T, H, Dv, generator=gen)
    g = -torch.rand(B, T, H, generator=gen)            # decays in (e^-1, 1]
    beta = torch.rand(B, T, H, generator=gen)
    state = torch.randn(B, H, Dk, Dv, generator=gen)
    return q, k, v, g, beta, state


@pytest.mark.parametrize("chunk_size", [1, 4, 11, 64])
def test_chunked_delta_rule_equals_the_recurrence(chunk_size):
    q, k, v, g, beta, state = delta_inputs()
    out_r, final_r = gated_delta_recurrent(q, k, v, g, beta, state)
    out_c, final_c = gated_delta_chunked(q, k, v, g, beta, state, chunk_size=chunk_size)
    assert out_c.shape == out_r.shape == v.shape
    assert_close(out_c, out_r)
    assert_close(final_c, final_r)


def test_delta_rule_writes_what_the_state_mispredicts():
    """With no decay and beta = 1, a key written once then read back returns its value."""
    k = torch.zeros(1, 1, 1, 4)
    k[..., 0] = 1.0
    v = torch.tensor([[[[2.0, -1.0, 0.5]]]])
    out, state = gated_delta_recurrent(k, k, v, torch.zeros(1, 1, 1), torch.ones(1, 1, 1))
    assert torch.equal(out, v)
    # Writing the same key again with the same value changes nothing: the error is zero.
    out2, state2 = gated_delta_recurrent(k, k, v, torch.zeros(1, 1, 1), torch.ones(1, 1, 1), state)
    assert torch.equal(state2, state)


def test_decode_token_by_token_equals_one_uncached_pass():
    model = random_model(HYBRID, seed=2, init_std=0.2)
    ids = random_ids(2, 12, seed=4)
    with torch.no_grad():
        full = model(ids)
        kv = ContiguousKVCache(HYBRID, batch_size=2, max_len=12)
        state = LinearAttentionState(HYBRID, batch_size=2)
        steps = [model(ids[:, t:t + 1], torch.full((2, 1), t), kv_cache=kv, state=state)
                 for t in range(12)]
    assert_close(torch.cat(steps, dim=1), full)


def test_prefill_in_chunks_carries_the_state():
    model = random_model(HYBRID, seed=2, init_std=0.2)
    for layer in model.model.layers:
        if layer.is_linear:
            layer.linear_attn.chunk_size = 4  # several delta-rule chunks inside each piece
    ids = random_ids(1, 17, seed=6)
    with torch.no_grad():
        full = model(ids)
        kv = ContiguousKVCache(HYBRID, batch_size=1, max_len=17)
        state = LinearAttentionState(HYBRID, batch_size=1)
        pieces, start = [], 0
        for size in (5, 7, 1, 4):
            pos = torch.arange(start, start + size)[None]
            pieces.append(model(ids[:, start:start + size], pos, kv_cache=kv, state=state))
            start += size
    assert_close(torch.cat(pieces, dim=1), full)


def test_state_size_does_not_grow_with_the_context():
    state = LinearAttentionState(HYBRID, batch_size=3)
    before = state.nbytes
    model = random_model(HYBRID, seed=0)
    kv = ContiguousKVCache(HYBRID, batch_size=3, max_len=30)
    with torch.no_grad():
        model(random_ids(3, 30), kv_cache=kv, state=state)
    assert state.nbytes == before
    assert state.recurrent.abs().sum() > 0 and state.conv.abs().sum() > 0
    # The KV cache has one entry per attention layer only.
    assert kv.k.shape[0] == HYBRID.num_attention_layers == 2


def test_parameter_arithmetic_matches_the_modules():
    for config in CONFIGS.values():
        model = random_model(config, seed=0)
        assert param_count(config) == model.num_parameters()
        linears = [(n, m.out_features, m.in_features) for n, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear)]
        assert [(n, o, k) for n, o, k in linear_shapes(config)] == linears


# --- configuration ---------------------------------------------------------------------------------
def test_a_plain_transformer_has_no_linear_layers():
    plain = ModelConfig(num_layers=3, hidden_size=32, num_heads=4, num_kv_heads=2,
                        intermediate_size=48, vocab_size=97)
    assert plain.layer_kinds == ("full_attention",) * 3
    assert plain.attention_layer_ids == (0, 1, 2) and not plain.is_hybrid
    assert plain.rotary_dim == plain.head_dim


def test_config_json_of_the_multimodal_wrapper_reads_its_text_config():
    hf = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
          "text_config": {**HYBRID.to_hf_config(), "layer_types": None,
                          "full_attention_interval": 2}}
    del hf["text_config"]["layer_types"]
    config = ModelConfig.from_hf_config(hf, name="wrapped")
    assert config.model_type == "qwen3_5_text"
    assert config.layer_kinds == HYBRID.layer_kinds  # interval 2: layers 1 and 3 attend
    assert config.partial_rotary_factor == 0.25 and config.attn_output_gate and config.qk_norm


@pytest.mark.parametrize("changes, message", [
    ({"layer_types": ("linear_attention", "mamba", "linear_attention", "full_attention")},
     r"layer_types\[1\]='mamba' no es un tipo de capa conocido; aceptados: full_attention, "
     r"linear_attention"),
    ({"layer_types": ("linear_attention", "full_attention")}, r"layer_types tiene 2 entradas pero num_layers=4"),
    ({"linear_num_value_heads": 3}, r"linear_num_value_heads=3 debe ser múltiplo de linear_num_key_heads=2"),
    ({"linear_key_head_dim": None}, r"linear_key_head_dim debe ser un entero positivo"),
    ({"partial_rotary_factor": 0.1}, r"partial_rotary_factor=0.1 deja 1 dimensiones rotadas"),
])
def test_bad_hybrid_configs_name_the_problem(changes, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**{**BASE, **changes})


def test_a_hybrid_needs_both_caches_or_neither():
    model = random_model(HYBRID, seed=0)
    kv = ContiguousKVCache(HYBRID, batch_size=1, max_len=4)
    with pytest.raises(ValueError, match="pase kv_cache= y state= juntos"):
        model(random_ids(1, 4), kv_cache=kv)
    plain = random_model(ModelConfig(num_layers=1, hidden_size=32, num_heads=4, num_kv_heads=2,
                                     intermediate_size=48, vocab_size=97))
    with pytest.raises(ValueError, match="no tiene ninguna"):
        plain(random_ids(1, 4), state=LinearAttentionState(HYBRID, batch_size=1))


# --- the engine serves it: a state slot per request beside the KV blocks ---------------------------
def hybrid_workload(seed: int = 0, n: int = 7):
    """Prompts of 1..20 tokens and 1..8 new tokens each."""
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 21, (n,), generator=gen).tolist()
    news = torch.randint(1, 9, (n,), generator=gen).tolist()
    return [(random_ids(1, p, seed=seed * 100 + i)[0].tolist(), m)
            for i, (p, m) in enumerate(zip(lens, news))]


@pytest.fixture(scope="module")
def served_hybrid():
    from ai_evolution.generation import generate
    model = random_model(HYBRID, seed=7, init_std=0.2)
    items = hybrid_workload()
    refs = [generate(model, p, m, cache=None)[0] for p, m in items]
    return model, items, refs


def serve_greedy(model, items, max_num_seqs: int, max_model_len: int, **options):
    """An engine that has served ``items`` ((prompt, new tokens) pairs, ids ``r0``, ``r1``...)
    greedily to the end."""
    from ai_evolution.engine import SamplingParams
    from ai_evolution.engine.config import build_engine
    engine = build_engine(model, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                          decode_graphs=None, **options)
    for i, (prompt, n) in enumerate(items):
        engine.add_request(prompt, SamplingParams(max_tokens=n, ignore_eos=True), request_id=f"r{i}")
    while engine.has_unfinished_requests():
        engine.step()
    engine.retire_finished()
    return engine


@pytest.mark.parametrize("options", [
    dict(kv_layout="contiguous"),
    dict(kv_layout="paged", block_size=4, enable_prefix_caching=False),
    # chunked prefill: prompts split across steps, the state carried from chunk to chunk
    dict(kv_layout="paged", block_size=4, enable_prefix_caching=False,
         max_num_batched_tokens=6, enable_chunked_prefill=True),
    # few blocks: requests are preempted and recompute their state from zeros
    dict(kv_layout="paged", block_size=4, num_blocks=9, enable_prefix_caching=False,
         max_num_batched_tokens=8, enable_chunked_prefill=True),
], ids=["contiguous", "paged", "chunked", "preempted"])
def test_engine_batched_greedy_tokens_equal_solo_uncached_decoding(served_hybrid, options):
    model, items, refs = served_hybrid
    engine = serve_greedy(model, items, 3, 32, **options)
    for i, ref in enumerate(refs):
        assert engine.requests[f"r{i}"].output_token_ids == ref, f"request {i}"
    kv = engine.scheduler.kv
    kv.check_invariants()
    assert kv.num_state_slots == 3 and sorted(kv._free) == [0, 1, 2]  # every slot came back
    if "num_blocks" in options:
        assert engine.scheduler.num_preemptions > 0
    if "max_num_batched_tokens" in options:
        # some prompt was split: a chunk ended before the prompt did, the next one carried on
        assert any(e.is_prefill and e.context_len < engine.requests[e.request_id].num_prompt_tokens
                   for h in engine.history for e in h.scheduled)


def test_engine_refuses_what_a_hybrid_cannot_do_yet():
    from ai_evolution.engine.config import build_engine
    model = random_model(HYBRID, seed=0)
    # (prefix caching is served with state checkpoints: tests/test_hybrid_prefix_cache.py)
    with pytest.raises(ValueError, match="decodificación especulativa no está disponible"):
        build_engine(model, max_num_seqs=2, max_model_len=16, speculative_config={
            "method": "ngram", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="decode_graphs='eager' no está disponible para un "
                                         "modelo híbrido"):
        build_engine(model, max_num_seqs=2, max_model_len=16, decode_graphs="eager")


def test_generate_with_a_cache_equals_generate_without_for_prompts_of_different_lengths():
    from ai_evolution.generation import generate
    model = random_model(HYBRID, seed=7, init_std=0.2)
    prompts = [p for p, _ in hybrid_workload(seed=1, n=4)]
    assert len({len(p) for p in prompts}) > 1
    assert generate(model, prompts, 6) == generate(model, prompts, 6, cache=None)


def test_a_multimodal_qwen35_checkpoint_loads_its_text_decoder(tmp_path, hf_checkpoints):
    """Qwen3.5's Hub checkpoints wrap the decoder: model.language_model.*, plus a vision tower
    (model.visual.*) and an MTP head (mtp.*) that the text decoder ignores."""
    import json
    from safetensors.torch import load_file, save_file
    folder, hf = hf_checkpoints["alternating"]
    state = load_file(str(folder / "model.safetensors"))
    wrapped = {("model.language_model." + k.removeprefix("model.") if k.startswith("model.")
                else k): v for k, v in state.items()}
    wrapped["model.visual.patch_embed.proj.weight"] = torch.zeros(2, 2)
    wrapped["mtp.fc.weight"] = torch.zeros(2, 2)
    save_file(wrapped, str(tmp_path / "model.safetensors"))
    text = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
         "text_config": text}))
    ours = load_pretrained(tmp_path)
    ids = random_ids(1, 12)
    with torch.no_grad():
        assert_close(ours(ids), hf(ids).logits)
