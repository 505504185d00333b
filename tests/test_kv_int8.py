"""The int8 KV cache (chapter 7): a scale per token and head, about half the bytes of fp16,
the same attention steps over it, and the engine's output equal to the generator's on the same
int8 cache (contiguous and paged, with preemption)."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings, strategies as st

from ai_evolution.engine import LLM, SamplingParams
from ai_evolution.engine.runner import BlockKVCache
from ai_evolution.generation import generate
from ai_evolution.model import get_preset, kv_bytes_per_token, load_model, memory_budget
from ai_evolution.model.attention import ContiguousKVCache, cached_attention
from ai_evolution.model.kv_quant import Int8KV, quantize_rows

pytestmark = pytest.mark.usefixtures("one_thread")


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(rows=st.integers(1, 6), d=st.sampled_from([1, 8, 64]), scale=st.floats(1e-3, 1e3),
       seed=st.integers(0, 1000))
def test_quantize_rows_errs_at_most_half_a_step_per_row(rows, d, scale, seed):
    x = torch.randn(rows, 3, d, generator=torch.Generator().manual_seed(seed)) * scale
    x[0, 0] = 0.0  # an all-zero head: scale clamps, values stay 0
    q, s = quantize_rows(x)
    assert q.dtype == torch.int8 and s.shape == x.shape[:-1] and int(q.abs().max()) <= 127
    err = (q.float() * s[..., None] - x).abs()
    assert bool((err <= s[..., None] / 2 + 1e-6 * scale).all())
    assert float(err[0, 0].max()) == 0.0


def test_cached_attention_over_int8_matches_float_within_the_quantization_error():
    torch.manual_seed(0)
    B, H, Hkv, T, D, S = 2, 4, 2, 5, 16, 12
    q, k, v = torch.randn(B, H, T, D), torch.randn(B, Hkv, T, D), torch.randn(B, Hkv, T, D)
    pos = torch.arange(T).expand(B, T)
    ref = cached_attention(q, k, v, torch.zeros(B, Hkv, S, D), torch.zeros(B, Hkv, S, D), pos)
    kq, vq = Int8KV((B, Hkv, S, D), torch.float32, "cpu"), Int8KV((B, Hkv, S, D), torch.float32, "cpu")
    got = cached_attention(q, k, v, kq, vq, pos)
    assert kq.values.dtype == torch.int8 and bool((kq.values[:, :, :T] != 0).any())
    diff = float((got - ref).abs().max())
    assert 0 < diff < 0.05  # int8 rounding shows, but stays small


def test_int8_cache_bytes_are_the_memory_arithmetic(tiny):
    cfg = tiny.config
    c = ContiguousKVCache(cfg, 2, 100, kv_dtype="int8")
    assert c.nbytes == kv_bytes_per_token(cfg, "int8", scale_dtype="fp32") * 2 * 100
    full = ContiguousKVCache(cfg, 2, 100)
    assert c.nbytes / full.nbytes == pytest.approx((cfg.head_dim + 4) / (4 * cfg.head_dim))
    b = BlockKVCache(cfg, 10, 16, dtype=torch.float16, kv_dtype="int8")
    assert b.nbytes == kv_bytes_per_token(cfg, "int8", scale_dtype="fp16") * 10 * 16
    # against fp16/bf16: about half (one 2-byte scale per head of 128 numbers: 130 / 256)
    llama = get_preset("llama-3.1-8b")
    ratio = kv_bytes_per_token(llama, "int8", scale_dtype="bf16") / kv_bytes_per_token(llama, "bf16")
    assert ratio == pytest.approx(130 / 256)
    more = memory_budget(llama, 80e9, max_len=4096, kv_dtype="int8", kv_scale_dtype="bf16")
    base = memory_budget(llama, 80e9, max_len=4096)
    assert more.max_tokens == pytest.approx(base.max_tokens * 256 / 130, rel=1e-3)


def test_bad_kv_dtype_is_named_with_the_accepted_values(tiny):
    with pytest.raises(ValueError, match="kv_dtype='int4'.*aceptados"):
        generate(tiny, [1, 2, 3], 2, kv_dtype="int4")
    with pytest.raises(ValueError, match="necesita cache='contiguous'"):
        generate(tiny, [1, 2, 3], 2, cache=None, kv_dtype="int8")
    with pytest.raises(ValueError, match="aceptados"):
        LLM(tiny, max_model_len=64, kv_dtype="fp4")


@pytest.fixture(scope="module")
def shipped():
    model = load_model("tiny-es")
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 4000) for _ in range(rng.randint(3, 40))] for _ in range(6)]
    return model, prompts, [generate(model, p, 16, kv_dtype="int8")[0] for p in prompts]


@pytest.mark.parametrize("kw", [dict(kv_layout="contiguous"),
                                dict(kv_layout="paged", block_size=4, num_blocks=30)],
                         ids=["contiguous", "paged-preemption"])
def test_engine_on_an_int8_cache_gives_the_generators_int8_tokens(shipped, kw):
    model, prompts, refs = shipped
    llm = LLM(model, max_num_seqs=4, max_model_len=128, kv_dtype="int8", **kw)
    outs = llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
    assert [o.token_ids for o in outs] == refs
    assert llm.engine.executor.cache.k[0].dtype == torch.int8
    if kw["kv_layout"] == "paged":
        assert llm.engine.kv_usage()["num_preemptions"] > 0
