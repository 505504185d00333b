"""Tiled attention with the online softmax (model.flash) and the IO model (sim.attention_io)."""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from engine_helpers import PROPS
from hypothesis import given, settings, strategies as st

from ai_evolution.generation import generate
from ai_evolution.model.attention import ContiguousKVCache, cached_attention, gather_blocks
from ai_evolution.model.flash import (IOCounter, combine_partials, finish_state,
                                      flash_attention, flash_cached_attention, gather_paged_kv,
                                      init_state, merge_states, naive_attention,
                                      online_softmax_update, paged_flash_attention,
                                      partial_attention, peak_memory_bytes, random_qkv,
                                      split_k_attention)
from ai_evolution.sim.attention_io import (best_tiles, flash_io, flash_io_for_memory, naive_io,
                                           theorem2_orders, working_set_bytes)

FP32_ATOL = 2e-5      # attention outputs of unit-scale inputs, fp32 tiles vs fp64 reference
LOGITS_FP32_ATOL = 1e-4
# ~6 fp16 ulps at |logit| ~ 13 (tiny-es); the fp16 reference itself is 1.4e-2 away from fp32
LOGITS_FP16_ATOL = 5e-2

pytestmark = pytest.mark.usefixtures("one_thread")


def sdpa(q, k, v, causal, q_positions=None):
    """Reference with an explicit mask (SDPA's is_causal aligns top-left, ours bottom-right)."""
    S, T = k.shape[2], q.shape[2]
    mask = None
    if causal:
        pos = torch.arange(S - T, S) if q_positions is None else q_positions
        mask = (torch.arange(S)[None, None, :] <= pos[..., :, None]).reshape(-1, 1, T, S)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


shapes = st.tuples(st.integers(1, 2), st.sampled_from([(1, 1), (2, 1), (4, 2), (6, 3)]),
                   st.integers(1, 40), st.integers(0, 25), st.sampled_from([4, 8, 16]),
                   st.integers(1, 48), st.integers(1, 48), st.booleans(), st.integers(0, 10_000))


@settings(max_examples=60, **PROPS)
@given(shapes)
def test_tiled_equals_naive_and_sdpa(case):
    """Tile sizes that do and do not divide N, T = 1 decodes, a cached prefix (T < S), GQA."""
    B, (H, Hkv), T, prefix, D, bq, bk, causal, seed = case
    q, k, v = random_qkv(B, H, Hkv, T, T + prefix, D, seed=seed, dtype=torch.float64)
    ref = sdpa(q, k, v, causal)
    out = flash_attention(q.float(), k.float(), v.float(), causal=causal, block_q=bq, block_k=bk)
    assert out.dtype == torch.float32 and out.shape == q.shape
    assert (out.double() - ref).abs().max() < FP32_ATOL
    assert (naive_attention(q, k, v, causal=causal) - ref).abs().max() < 1e-12


def test_per_row_positions_and_gqa_head_mapping():
    """Rows at different positions; query head h reads KV head h // (H // Hkv)."""
    q, k, v = random_qkv(2, 4, 2, 3, 20, 8, seed=1, dtype=torch.float64)
    pos = torch.tensor([[4, 5, 6], [17, 18, 19]])
    ref = sdpa(q, k, v, True, pos)
    out = flash_attention(q, k, v, causal=True, q_positions=pos, block_q=2, block_k=3)
    assert (out - ref).abs().max() < 1e-12
    assert (naive_attention(q, k, v, causal=True, q_positions=pos) - ref).abs().max() < 1e-12
    # heads 2, 3 belong to KV head 1: new keys in KV head 0 leave them alone and change heads 0, 1
    k2 = k.clone()
    k2[:, 0] = torch.randn(k2[:, 0].shape, dtype=k.dtype, generator=torch.Generator().manual_seed(9))
    out2 = flash_attention(q, k2, v, causal=True, q_positions=pos, block_q=2, block_k=3)
    assert torch.equal(out2[:, 2:], out[:, 2:]) and not torch.allclose(out2[:, :2], out[:, :2])


# --- the one-tile update ----------------------------------------------------------------------

def forgot_rescale(m, l, o, scores, v):
    m_new = torch.maximum(m, scores.amax(-1))
    safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
    p = torch.exp(scores - safe[..., None])
    return m_new, torch.exp(m - safe) * l + p.sum(-1), o + p @ v        # o not rescaled


def max_not_updated(m, l, o, scores, v):
    first = torch.where(torch.isneginf(m), scores.amax(-1), m)          # keeps the first tile's max
    p = torch.exp(scores - first[..., None])
    return first, torch.nan_to_num(l) + p.sum(-1), o + p @ v


def fold(update, scores, v, tile):
    state = init_state(scores.shape[:-1], v.shape[-1])
    for j in range(0, scores.shape[-1], tile):
        state = update(*state, scores[..., j:j + tile], v[..., j:j + tile, :])
    return finish_state(*state)


@settings(max_examples=40, **PROPS)
@given(st.integers(1, 30), st.integers(1, 12), st.integers(1, 9), st.integers(0, 10_000))
def test_update_equals_softmax_of_concatenated_tiles(n_keys, rows, tile, seed):
    g = torch.Generator().manual_seed(seed)
    scores = 3 * torch.randn(2, rows, n_keys, generator=g)
    v = torch.randn(2, n_keys, 5, generator=g)
    direct = torch.softmax(scores.double(), -1) @ v.double()
    assert (fold(online_softmax_update, scores, v, tile).double() - direct).abs().max() < 1e-5


def test_update_state_is_exact_running_max_and_sum():
    g = torch.Generator().manual_seed(0)
    scores, v = torch.randn(4, 10, generator=g), torch.randn(10, 3, generator=g)
    m, l, o = init_state((4,), 3)
    m, l, o = online_softmax_update(m, l, o, scores[:, :6], v[:6])
    m, l, o = online_softmax_update(m, l, o, scores[:, 6:], v[6:])
    assert torch.equal(m, scores.amax(-1))
    assert torch.allclose(l, torch.exp(scores - m[:, None]).sum(-1))
    assert torch.allclose(o, torch.exp(scores - m[:, None]) @ v)


@pytest.mark.parametrize("wrong", [forgot_rescale, max_not_updated])
def test_wrong_updates_are_caught(wrong):
    """A second tile whose max is 199 above the first's: forgetting to rescale the earlier output
    gives a different attention; keeping the first tile's max is exact only until exp(s - m)
    overflows (float32 above ~88), so this case makes it overflow."""
    scores = torch.tensor([[0.0, 1.0, 200.0, 2.0]])
    v = torch.arange(8.0).reshape(4, 2)
    direct = torch.softmax(scores, -1) @ v
    assert torch.allclose(fold(online_softmax_update, scores, v, 2), direct)
    assert not torch.allclose(fold(wrong, scores, v, 2), direct, atol=1e-3)


def test_fully_masked_tile_keeps_the_state():
    m, l, o = init_state((1,), 2)
    state = online_softmax_update(m, l, o, torch.full((1, 3), -math.inf), torch.ones(3, 2))
    assert all(torch.isfinite(t[~torch.isneginf(t)]).all() for t in state)
    state = online_softmax_update(*state, torch.tensor([[1.0]]), torch.tensor([[2.0, 3.0]]))
    assert torch.equal(finish_state(*state), torch.tensor([[2.0, 3.0]]))


# --- extreme logits ----------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
def test_fp16_extreme_logits_online_does_not_overflow(causal):
    q, k, v = random_qkv(1, 4, 2, 48, 48, 16, seed=5, dtype=torch.float16, scores_around=1e4)
    ref = naive_attention(q.double(), k.double(), v.double(), causal=causal)
    naive = naive_attention(q, k, v, causal=causal, stable=False)
    assert not torch.isfinite(naive).all()                      # exp(1e4) overflows
    out = flash_attention(q, k, v, causal=causal, block_q=16, block_k=12)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    assert (out.double() - ref).abs().max() < 1e-2             # fp16 rounding of outputs ~ |v| <= 4
    split = split_k_attention(q[:, :, -1:], k, v, num_splits=5, causal=causal)
    assert torch.isfinite(split).all() and (split.double() - ref[:, :, -1:]).abs().max() < 1e-2


def test_fp16_unit_scale_is_as_close_as_fp16_allows():
    q, k, v = random_qkv(2, 4, 2, 40, 40, 16, seed=6, dtype=torch.float16)
    ref = naive_attention(q.double(), k.double(), v.double(), causal=True)
    out = flash_attention(q, k, v, causal=True, block_q=16, block_k=12)
    # fp32 inside; only the final cast to fp16 rounds: half an ulp, at most 2**-11 |out|
    assert ((out.double() - ref).abs() <= 2.0 ** -11 * ref.abs() + 1e-6).all()


# --- split-K / flash-decoding -------------------------------------------------------------------

@settings(max_examples=30, **PROPS)
@given(st.integers(1, 80), st.integers(1, 3), st.integers(1, 12), st.integers(1, 16), st.booleans(),
       st.integers(0, 999))
def test_split_k_equals_one_pass(S, T, splits, bk, causal, seed):
    q, k, v = random_qkv(2, 4, 2, min(T, S), S, 8, seed=seed)
    one_pass = flash_attention(q, k, v, causal=causal, block_k=bk)
    assert (split_k_attention(q, k, v, num_splits=splits, causal=causal, block_k=bk)
            - one_pass).abs().max() < 1e-5


def test_combine_is_order_free_and_matches_one_state():
    q, k, v = random_qkv(1, 2, 1, 3, 30, 8, seed=2)
    chunks = [(0, 7), (7, 19), (19, 30)]
    parts = [partial_attention(q, k, v, a, b) for a, b in chunks]
    whole = finish_state(*partial_attention(q, k, v, 0, 30))
    assert (combine_partials(parts) - whole).abs().max() < 1e-6
    assert (combine_partials(parts[::-1]) - whole).abs().max() < 1e-6
    assert (finish_state(*merge_states(parts[0], parts[1]))
            - finish_state(*partial_attention(q, k, v, 0, 19))).abs().max() < 1e-6


# --- paged KV -----------------------------------------------------------------------------------

def paged_copy(k, v, block_size, num_blocks, seed):
    """The contiguous [B, Hkv, S, D] K/V written into a shuffled block pool; the block tables."""
    B, Hkv, S, D = k.shape
    n = -(-S // block_size)
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))[: B * n]
    tables = perm.reshape(B, n)
    kc = torch.randn(num_blocks, Hkv, block_size, D)          # stale data everywhere else
    vc = torch.randn(num_blocks, Hkv, block_size, D)
    for b in range(B):
        for j in range(n):
            a, z = j * block_size, min((j + 1) * block_size, S)
            kc[tables[b, j], :, : z - a] = k[b, :, a:z]
            vc[tables[b, j], :, : z - a] = v[b, :, a:z]
    return kc, vc, tables


@pytest.mark.parametrize("T,causal", [(1, True), (5, True), (4, False)])
def test_paged_equals_contiguous(T, causal):
    q, k, v = random_qkv(3, 4, 2, T, 23, 8, seed=7)
    kc, vc, tables = paged_copy(k, v, block_size=4, num_blocks=40, seed=1)
    assert torch.equal(gather_paged_kv(kc, tables, 23), k)
    assert torch.equal(gather_blocks(kc, tables[0], 23), k[0])  # one request's table
    lens = torch.tensor([23, 17, 9])                           # rows hold different lengths
    io = IOCounter()
    out = paged_flash_attention(q, kc, vc, tables, lens, causal=causal, block_q=2, io=io)
    for b, n in enumerate(lens.tolist()):
        ref = sdpa(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], causal)
        assert (out[b:b + 1] - ref).abs().max() < 1e-5
    # one block per row and KV head per key tile: the IO model's count for the longest row
    assert io.k_read == 3 * 2 * flash_io(23, 8, 2, 4, causal=causal, n_queries=T).k_read


# --- inside the model ---------------------------------------------------------------------------

def test_flash_cached_attention_writes_cache_like_reference():
    q, k, v = random_qkv(2, 4, 2, 3, 3, 8, seed=3)
    pos = torch.tensor([[4, 5, 6], [0, 1, 2]])
    caches = [(torch.randn(2, 2, 10, 8, generator=torch.Generator().manual_seed(0)),
               torch.randn(2, 2, 10, 8, generator=torch.Generator().manual_seed(1))) for _ in range(2)]
    ref = cached_attention(q, k, v, *caches[0], pos)
    out = flash_cached_attention(q, k, v, *caches[1], pos, block_q=2, block_k=3)
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
    assert (out - ref).abs().max() < 1e-5


@pytest.mark.parametrize("model_name", ["tiny", "small"])
def test_greedy_generation_identical(model_name, request):
    model = request.getfixturevalue(model_name)
    prompts = [list(range(5, 40)), [7, 3, 9, 11, 2, 4, 5, 6, 8, 10, 12]]
    ref = generate(model, prompts, 16)
    assert generate(model, prompts, 16, attn_fn=flash_cached_attention) == ref
    odd = functools.partial(flash_cached_attention, block_q=7, block_k=5)
    assert generate(model, prompts, 16, attn_fn=odd) == ref


@pytest.mark.parametrize("dtype,atol", [(torch.float32, LOGITS_FP32_ATOL), (torch.float16, LOGITS_FP16_ATOL)])
def test_logits_match_reference(tiny, dtype, atol):
    model = type(tiny)(tiny.config)
    model.load_state_dict(tiny.state_dict())
    model = model.to(dtype).eval()
    ids = torch.tensor([list(range(5, 45))])
    attn = functools.partial(flash_cached_attention, block_q=16, block_k=12)
    with torch.inference_mode():
        ref = model(ids, kv_cache=ContiguousKVCache(model.config, 1, 64, dtype=dtype)).float()
        out = model(ids, kv_cache=ContiguousKVCache(model.config, 1, 64, dtype=dtype), attn_fn=attn).float()
    assert (out - ref).abs().max() < atol


# --- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,message", [
    (dict(block_q=0), "block_q debe ser un entero >= 1"),
    (dict(block_k=0), "block_k debe ser un entero >= 1"),
    (dict(block_k=2.5), "block_k debe ser un entero >= 1"),
])
def test_bad_tiles_are_refused_in_spanish(kwargs, message):
    q, k, v = random_qkv(1, 2, 1, 4, 4, 8)
    with pytest.raises(ValueError, match=message):
        flash_attention(q, k, v, **kwargs)


def test_bad_shapes_are_refused_in_spanish():
    q, k, v = random_qkv(1, 3, 2, 4, 4, 8)
    with pytest.raises(ValueError, match="no se pueden agrupar"):
        flash_attention(q, k, v)
    q, k, v = random_qkv(1, 2, 1, 4, 4, 8)
    with pytest.raises(ValueError, match="dimensión de cabeza de q \\(8\\) no coincide"):
        flash_attention(q, k[..., :4], v[..., :4])
    with pytest.raises(ValueError, match="dimensión de cabeza"):
        flash_cached_attention(q, k[..., :4], v[..., :4], torch.zeros(1, 1, 8, 4),
                               torch.zeros(1, 1, 8, 4), torch.arange(4)[None])
    with pytest.raises(ValueError, match="k_new y v_new deben ser"):
        flash_cached_attention(q, k[:, :, :2], v[:, :, :2], torch.zeros(1, 1, 8, 8),
                               torch.zeros(1, 1, 8, 8), torch.arange(4)[None])
    with pytest.raises(ValueError, match="no cabe en una caché KV"):
        flash_cached_attention(q, k, v, torch.zeros(1, 1, 3, 8), torch.zeros(1, 1, 3, 8),
                               torch.arange(4)[None])
    with pytest.raises(ValueError, match="ningún bloque cabe"):
        best_tiles(1024, 128, 100)


# --- the IO model --------------------------------------------------------------------------------

@settings(max_examples=40, **PROPS)
@given(st.integers(1, 70), st.integers(1, 70), st.integers(1, 40), st.integers(1, 40), st.booleans())
def test_io_model_counts_what_the_loop_moves(n, n_q, bq, bk, causal):
    n_q = min(n_q, n)
    q, k, v = random_qkv(1, 1, 1, n_q, n, 4)
    io = IOCounter()
    flash_attention(q, k, v, causal=causal, block_q=bq, block_k=bk, io=io)
    model = flash_io(n, 4, bq, bk, causal=causal, n_queries=n_q)
    assert (io.q_read, io.k_read, io.v_read, io.o_write, io.score_elements) == (
        model.q_read, model.k_read, model.v_read, model.o_write, model.score_elements)
    assert model.s_write == model.p_read == 0


def test_io_model_follows_theorem_2():
    d, M = 64, 100 * 1024
    naive = {n: naive_io(n, d) for n in (1024, 4096, 16384)}
    tiled = {n: flash_io_for_memory(n, d, M) for n in (1024, 4096, 16384)}
    for n in naive:
        assert tiled[n].hbm_bytes < naive[n].hbm_bytes
        assert working_set_bytes(tiled[n].block_q, tiled[n].block_k, d) <= M
    # quadrupling N multiplies naive's N^2 term (S and P written and read) by 16
    s_p = {n: io.s_write + io.s_read + io.p_write + io.p_read for n, io in naive.items()}
    assert s_p[4096] == 16 * s_p[1024] == 4 * 4096 ** 2
    # doubling M roughly halves the tiled traffic once the N^2 d^2 / M term dominates
    n = 16384
    for m in (32 * 1024, 64 * 1024, 128 * 1024):
        ratio = flash_io_for_memory(n, d, 2 * m).hbm_bytes / flash_io_for_memory(n, d, m).hbm_bytes
        assert 0.45 < ratio < 0.6
    # tiled bytes / (N^2 d^2 / M) stays within a constant band across N and M
    consts = [flash_io_for_memory(n, d, m).elements / theorem2_orders(n, d, m / 2)["flash"]
              for n in (4096, 16384) for m in (32 * 1024, 128 * 1024)]
    assert max(consts) / min(consts) < 1.5
    # a small N with a tiny fast memory: tiling does not pay (K, V read once per 1-row tile)
    assert flash_io(64, 128, 1, 1).hbm_bytes > naive_io(64, 128).hbm_bytes


def test_io_model_flops_and_causal_skipping():
    n, d = 1000, 32
    full, causal = flash_io(n, d, 100, 100), flash_io(n, d, 100, 100, causal=True)
    assert full.matmul_flops == naive_io(n, d).matmul_flops == 4 * n * n * d
    # causal skips the tiles above the diagonal: 55 of the 100 tile pairs are visited
    assert causal.score_elements == 55 * 100 * 100 and causal.k_read == 55 * 100 * d
    decode = flash_io(n, d, 64, 100, n_queries=1)
    assert decode.k_read == n * d and decode.q_read == d


# --- measured memory ------------------------------------------------------------------------------

def test_peak_memory_naive_holds_the_score_matrix():
    q, k, v = random_qkv(1, 2, 2, 512, 512, 16)
    _, naive_peak = peak_memory_bytes(lambda: naive_attention(q, k, v))
    _, tiled_peak = peak_memory_bytes(lambda: flash_attention(q, k, v, block_q=64, block_k=64))
    s_bytes = 2 * 512 * 512 * 4
    assert naive_peak >= 2 * s_bytes                      # S (or exp(S)) and P live together
    assert tiled_peak < s_bytes / 4
