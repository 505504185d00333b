"""Weight-only quantization (chapter 7): formats, packing, error bounds, fused kernels against the
reference, exact byte counts, the engine serving a quantized model, and the memory and cost
model following the weight format.

No test asserts a duration: the machine is shared.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch import nn

from ai_evolution.engine import build_engine
from ai_evolution.generation import generate
from ai_evolution.model import ModelConfig, get_preset, random_model
from ai_evolution.model.memory import (GROUP_SIZES, linear_shapes, memory_budget,
                                       param_count, parse_weight_format, quantized_weight_bytes,
                                       weight_bytes)
from ai_evolution.model.quant import (FAST_PATH_RTOL, KERNELS, QuantizedLinear, dequantize_int4,
                                      dequantize_int8, kernels, model_bytes, pack_int4,
                                      quant_error, quantize_int4, quantize_int8, quantize_model,
                                      quantized_format, quantized_layers, set_backend, unpack_int4,
                                      weight_errors)
from ai_evolution.sim import (RooflineCostModel, SimExecutor, decode_step_cost, sim_engine,
                              weight_bytes_read)
from engine_helpers import PROPS, SMALL, greedy

pytestmark = pytest.mark.usefixtures("one_thread")

FORMATS = ("int8", "int4-g32", "int4-g64", "int4-g128", "int4-asym-g32", "int4-asym-g64",
           "int4-asym-g128")
# tiny-es: intermediate_size 704 is a multiple of 32 and 64, not of 128
TINY_FORMATS = ("int8", "int4-g64", "int4-asym-g32")


def seeded(shape, seed=0, scale=1.0, dtype=torch.float32):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


# --- formats and their names ------------------------------------------------------------------
@pytest.mark.parametrize("name,kind,group", [("int8", "int8", None), ("int4", "int4", 128),
                                             ("int4-g32", "int4", 32), ("INT4-ASYM-G64", "int4-asym", 64),
                                             ("int4-asym", "int4-asym", 128)])
def test_format_names_parse(name, kind, group):
    fmt = parse_weight_format(name)
    assert (fmt.kind, fmt.group_size) == (kind, group)
    assert parse_weight_format(fmt.name) == fmt


@pytest.mark.parametrize("name,group,words", [
    ("int3", None, ["'int3'", "int8, int4, int4-asym", "-g32, -g64, -g128"]),
    ("fp8", None, ["'fp8'", "int8, int4, int4-asym"]),
    ("int4", 16, ["group_size=16", "32, 64, 128"]),
    ("int4-g100", None, ["group_size=100", "32, 64, 128"]),
    ("int8", 64, ["int8", "por canal", "group_size=None"]),
    ("int4-g64", 32, ["group_size=64", "group_size=32"]),
])
def test_bad_formats_are_named_in_spanish_with_the_accepted_values(name, group, words):
    with pytest.raises(ValueError) as err:
        parse_weight_format(name, group)
    for w in words:
        assert w in str(err.value)


def test_group_size_that_does_not_divide_in_features_names_the_layer_and_the_sizes_that_do(tiny):
    with pytest.raises(ValueError) as err:
        quantize_model(tiny, "int4", group_size=128)
    msg = str(err.value)
    assert "model.layers.0.mlp.down_proj" in msg and "in_features=704" in msg
    assert "32, 64, 128" in msg and "dividen 704: 32, 64" in msg
    with pytest.raises(ValueError, match="in_features=100"):
        QuantizedLinear.from_linear(nn.Linear(100, 16), "int4-g32")
    with pytest.raises(ValueError, match="in_features=704"):
        weight_bytes(tiny.config, "fp32", weight_format="int4-g128")


# --- packing ------------------------------------------------------------------------------------
@settings(max_examples=50, **PROPS)
@given(n=st.integers(1, 6), half_k=st.integers(1, 40), seed=st.integers(0, 2**31 - 1))
def test_packing_two_per_byte_round_trips_exactly(n, half_k, seed):
    u = torch.randint(0, 16, (n, 2 * half_k), generator=torch.Generator().manual_seed(seed),
                      dtype=torch.uint8)
    packed = pack_int4(u)
    assert packed.dtype == torch.uint8 and packed.shape == (n, half_k)
    assert torch.equal(unpack_int4(packed), u)
    # column 2j in the high nibble, 2j + 1 in the low one
    assert torch.equal(packed, u[:, 0::2] * 16 + u[:, 1::2])


def test_packing_refuses_odd_widths_and_values_out_of_range():
    with pytest.raises(ValueError, match="K par"):
        pack_int4(torch.zeros(2, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="entre 0 y 15"):
        pack_int4(torch.full((2, 4), 16, dtype=torch.int32))


# --- round trip error bounds --------------------------------------------------------------------
@st.composite
def weights(draw, group=32):
    n = draw(st.integers(1, 6))
    k = group * draw(st.integers(1, 4))
    w = seeded((n, k), draw(st.integers(0, 2**31 - 1)), 10 ** draw(st.floats(-3, 3)))
    if draw(st.booleans()):
        w[draw(st.integers(0, n - 1))] = 0.0                         # an all-zero row
    if draw(st.booleans()):
        w[:, draw(st.integers(0, k - 1))] *= 100.0                   # an outlier column
    if draw(st.booleans()):
        w[draw(st.integers(0, n - 1)), :group] = draw(st.floats(-5, 5))  # a constant group
    return w


def _slop(w):
    """Float32 rounding of the division and product, relative to the largest weight."""
    return 1e-6 * w.abs().amax(dim=-1, keepdim=True) + 1e-30


@settings(max_examples=60, **PROPS)
@given(w=weights())
def test_int8_per_channel_error_is_at_most_half_a_scale(w):
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.shape == (w.shape[0],) and scale.dtype == w.dtype
    assert int(q.abs().max()) <= 127
    assert torch.allclose(scale, w.abs().amax(dim=1) / 127)
    err = (w - dequantize_int8(q, scale)).abs()
    assert bool((err <= scale[:, None] / 2 + _slop(w)).all())
    assert bool((dequantize_int8(q, scale)[w.abs().amax(dim=1) == 0] == 0).all())


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("group", GROUP_SIZES)
@settings(max_examples=25, **PROPS)
@given(data=st.data())
def test_int4_group_error_is_at_most_half_a_scale(symmetric, group, data):
    w = data.draw(weights(group))
    packed, scale, zero = quantize_int4(w, group, symmetric)
    n, k = w.shape
    assert packed.shape == (n, k // 2) and scale.shape == (n, k // group)
    assert (zero is None) == symmetric
    g = w.reshape(n, k // group, group)
    if symmetric:
        assert torch.allclose(scale, g.abs().amax(-1) / 7)
    else:
        assert torch.equal(zero, g.amin(-1))
        assert torch.allclose(scale, (g.amax(-1) - g.amin(-1)) / 15)
    w_hat = dequantize_int4(packed, scale, zero, group)
    err = (w - w_hat).abs().reshape(n, k // group, group)
    bound = scale[..., None] / 2 + _slop(w)[..., None]
    assert bool((err <= bound).all())


def test_smaller_groups_and_more_bits_give_smaller_errors():
    w = seeded((256, 1024), seed=7)
    rel = {f: quant_error(w, QuantizedLinear.from_linear(_linear(w), f).dequantize()).rel
           for f in ("int8", "int4-g32", "int4-g64", "int4-g128", "int4-asym-g128")}
    assert rel["int8"] < rel["int4-g32"] < rel["int4-g64"] < rel["int4-g128"]
    assert 0 < rel["int8"] < 0.01 and rel["int4-g128"] < 0.2
    e = quant_error(w, w.clone())
    assert e.max_abs == 0 and e.rel == 0
    zero = torch.zeros(2, 32)
    assert quant_error(zero, zero).rel == 0 and quant_error(zero, zero + 1).rel == float("inf")
    with pytest.raises(ValueError, match="formas no coinciden"):
        quant_error(w, w[:, :10])


def test_non_finite_or_badly_shaped_weights_are_refused():
    w = seeded((4, 64))
    w[1, 3] = float("nan")
    with pytest.raises(ValueError, match="no finitos"):
        quantize_int8(w)
    with pytest.raises(ValueError, match=r"\[out_features, in_features\]"):
        quantize_int4(seeded((64,)), 32)


def _linear(w: torch.Tensor, bias: torch.Tensor | None = None) -> nn.Linear:
    lin = nn.Linear(w.shape[1], w.shape[0], bias=bias is not None, dtype=w.dtype)
    with torch.no_grad():
        lin.weight.copy_(w)
        if bias is not None:
            lin.bias.copy_(bias)
    return lin


# --- the layer: reference, fused kernels, bytes -------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_reference_forward_is_dequantize_then_matmul(fmt):
    lin = _linear(seeded((48, 256), 1), seeded((48,), 2))
    layer = QuantizedLinear.from_linear(lin, fmt, backend="reference")
    x = seeded((2, 5, 256), 3)
    assert layer.kernel() == "dequant-matmul"
    assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.dequantize(), lin.bias))
    assert layer(x).shape == (2, 5, 48)


KERNEL_CASES = [(k, f, d) for k, f in (("int8pack-mm", "int8"), ("int4pack-mm-cpu", "int4-g32"),
                                       ("int4pack-mm-cpu", "int4-asym-g64"),
                                       ("int4pack-mm-cpu", "int4-g128"))
                for d in (torch.float32, torch.bfloat16, torch.float16)]


@pytest.mark.parametrize("kernel,fmt,dtype", KERNEL_CASES)
def test_fused_kernel_matches_the_reference_within_the_stated_tolerance(kernel, fmt, dtype):
    # out_features 40 is not a multiple of 16: the int4 kernels run on padded rows
    lin = _linear(seeded((40, 256), 11), seeded((40,), 12)).to(dtype)
    layer = QuantizedLinear.from_linear(lin, fmt)
    if layer._kernel_for(dtype) != kernel:
        pytest.skip(f"torch {torch.__version__} has no {kernel} for {dtype} on this device")
    for m in (1, 7, 64):
        x = seeded((m, 256), 13 + m, dtype=dtype)
        ref = layer.forward_with(x, "dequant-matmul").float()
        fast = layer.forward_with(x, kernel)
        assert fast.dtype == dtype and fast.shape == (m, 40)
        assert float((fast.float() - ref).abs().max()) <= FAST_PATH_RTOL[dtype] * float(ref.abs().max())


def test_fast_backend_picks_a_fused_kernel_only_where_it_is_vectorized():
    lin = _linear(seeded((32, 128), 5))
    layer = QuantizedLinear.from_linear(lin, "int8")
    assert layer.kernel(torch.float32) == "dequant-matmul"   # fp32 CPU kernels are scalar loops
    if layer._kernel_for(torch.bfloat16) is None:
        pytest.skip(f"torch {torch.__version__} has no int8 kernel on CPU")
    assert layer.kernel(torch.bfloat16) == "int8pack-mm"
    layer.backend = "reference"
    assert layer.kernel(torch.bfloat16) == "dequant-matmul"
    with pytest.raises(ValueError, match="aceptados: reference, fast"):
        layer.backend = "turbo"


def test_forward_with_names_unknown_and_missing_kernels():
    layer = QuantizedLinear.from_linear(_linear(seeded((16, 64), 0)), "int4-g32")
    x = seeded((1, 64), 1)
    with pytest.raises(ValueError, match="desconocido; aceptados: " + ", ".join(KERNELS)):
        layer.forward_with(x, "marlin")
    with pytest.raises(ValueError, match="int8pack-mm no está disponible"):
        layer.forward_with(x, "int8pack-mm")
    with pytest.raises(ValueError, match="in_features=64"):
        layer(seeded((1, 65), 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt", FORMATS)
def test_weight_bytes_are_exact(fmt, dtype):
    lin = _linear(seeded((48, 256), 1), seeded((48,), 2)).to(dtype)
    layer = QuantizedLinear.from_linear(lin, fmt)
    f = parse_weight_format(fmt)
    stored = sum(t.nbytes for t in layer.state_dict().values())
    assert layer.weight_bytes() == stored
    assert layer.weight_bytes() == f.linear_bytes(48, 256, dtype) + 48 * lin.bias.element_size()
    scale_b = torch.empty((), dtype=dtype).element_size()
    groups = 1 if f.group_size is None else 256 // f.group_size
    per_weight = 1 if f.bits == 8 else 0.5
    assert f.linear_bytes(48, 256, dtype) == 48 * 256 * per_weight + 48 * groups * scale_b * (
        1 if f.symmetric else 2)
    assert layer.held_bytes() >= layer.weight_bytes()


# --- the model ----------------------------------------------------------------------------------
def test_quantize_model_returns_a_copy_unless_inplace(small):
    before = {k: v.clone() for k, v in small.state_dict().items()}
    q = quantize_model(small, "int4-g32")
    assert q is not small and not quantized_layers(small)
    assert all(torch.equal(v, before[k]) for k, v in small.state_dict().items())
    names = [n for n, m in small.named_modules() if isinstance(m, nn.Linear)]
    assert sorted(quantized_layers(q)) == sorted(names) and "lm_head" in names
    assert quantized_format(q) == "int4-g32"
    assert q.model.embed_tokens.weight.dtype == torch.float32
    copy = random_model(SMALL, seed=3, init_std=0.2)
    assert quantize_model(copy, "int8", inplace=True) is copy and quantized_format(copy) == "int8"


def test_tied_embedding_stays_float_for_the_lookup_and_the_head_gets_its_own_copy(tiny):
    q = quantize_model(tiny, "int8")
    assert tiny.config.tie_word_embeddings
    assert torch.equal(q.model.embed_tokens.weight, tiny.model.embed_tokens.weight)
    assert isinstance(q.lm_head, QuantizedLinear) and isinstance(tiny.lm_head, nn.Linear)
    assert tiny.lm_head.weight is tiny.model.embed_tokens.weight  # the original is still tied


def test_quantizing_twice_or_badly_fails_in_spanish_and_leaves_the_model_usable(small):
    q = quantize_model(small, "int8")
    ids = torch.tensor([[1, 2, 3]])
    logits = q(ids)
    with pytest.raises(ValueError, match="ya está cuantizado.*int8"):
        quantize_model(q, "int4-g32", inplace=True)
    assert torch.equal(q(ids), logits) and quantized_format(q) == "int8"
    fresh = random_model(SMALL, seed=3, init_std=0.2)
    ref = fresh(ids)
    with pytest.raises(ValueError, match="in_features=96"):
        quantize_model(fresh, "int4-g64", inplace=True)   # down_proj has 96 inputs
    with torch.no_grad():
        fresh.model.layers[1].mlp.up_proj.weight[0, 0] = float("inf")
    with pytest.raises(ValueError, match="model.layers.1.mlp.up_proj.*no finitos"):
        quantize_model(fresh, "int8", inplace=True)
    assert not quantized_layers(fresh)
    with torch.no_grad():
        fresh.model.layers[1].mlp.up_proj.weight[0, 0] = small.model.layers[1].mlp.up_proj.weight[0, 0]
    assert torch.equal(fresh(ids), ref)
    with pytest.raises(ValueError, match="backend 'rapido' desconocido; aceptados: reference, fast"):
        quantize_model(small, "int8", backend="rapido")
    with pytest.raises(ValueError, match="no tiene capas cuantizadas"):
        set_backend(small, "fast")
    with pytest.raises(ValueError, match="no tiene capas nn.Linear"):
        quantize_model(nn.Sequential(nn.ReLU()), "int8")


def test_set_backend_switches_every_layer_and_weight_errors_cover_every_layer(small):
    q = quantize_model(small, "int4-asym-g32", backend="reference")
    assert kernels(q) == {"dequant-matmul": len(quantized_layers(q))}
    assert set_backend(q, "fast") is q and all(m.backend == "fast" for m in quantized_layers(q).values())
    errs = weight_errors(small, q)
    assert sorted(errs) == sorted(quantized_layers(q))
    assert all(0 < e.rel < 0.2 and e.max_abs > 0 for e in errs.values())
    e8 = weight_errors(small, quantize_model(small, "int8"))
    assert all(e8[n].rel < errs[n].rel for n in errs)


def test_casting_a_quantized_model_keeps_the_integers_and_drops_kernel_copies(small):
    q = quantize_model(small, "int8")
    layer = q.lm_head
    ints = layer.qweight.clone()
    x = seeded((2, SMALL.hidden_size), 4)
    layer(x.bfloat16())
    q.to(torch.bfloat16)
    assert torch.equal(layer.qweight, ints) and layer.scales.dtype == torch.bfloat16
    assert layer._fast == {} and layer(x.bfloat16()).dtype == torch.bfloat16


# --- bytes of the whole model: memory.py agrees with the tensors --------------------------------
QWEN_LIKE = ModelConfig(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                        intermediate_size=128, vocab_size=100, attention_bias=True,
                        o_proj_bias=False, qk_norm=True, model_type="qwen3",
                        max_position_embeddings=64)


@pytest.mark.parametrize("fmt", ["int8", "int4-g32", "int4-asym-g64"])
@pytest.mark.parametrize("config", [QWEN_LIKE, QWEN_LIKE.replace(tie_word_embeddings=True)],
                         ids=["untied", "tied"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_memory_weight_bytes_follow_the_quantized_tensors(config, fmt, dtype):
    model = random_model(config, seed=0, dtype=dtype)
    assert model_bytes(model) == weight_bytes(config, dtype)
    q = quantize_model(model, fmt)
    assert model_bytes(q) == weight_bytes(config, dtype, weight_format=fmt)
    assert sum(m.weight_bytes() for m in quantized_layers(q).values()) == (
        quantized_weight_bytes(config, fmt, dtype)
        + sum(m.bias.nbytes for m in quantized_layers(q).values() if m.bias is not None))


def test_linear_shapes_are_the_models_linears_and_the_cost_models_matmuls():
    from ai_evolution.sim import matmul_params
    for config in (QWEN_LIKE, get_preset("llama-3.1-8b"), get_preset("cpu-200m")):
        shapes = linear_shapes(config)
        assert sum(o * k for _, o, k in shapes) == matmul_params(config)
    model = random_model(QWEN_LIKE)
    got = [(n, m.out_features, m.in_features) for n, m in model.named_modules()
           if isinstance(m, nn.Linear)]
    assert sorted(got) == sorted(linear_shapes(QWEN_LIKE))


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_cost_model_reads_quantized_linears_and_float_embedding_rows(dtype):
    cfg = get_preset("cpu-200m")
    b = 2 if dtype == "bf16" else 4
    h, table = cfg.hidden_size, cfg.vocab_size * cfg.hidden_size
    for fmt in ("int8", "int4-g128", "int4-asym-g32"):
        f = parse_weight_format(fmt)
        linears = sum(f.linear_bytes(o, k, dtype) for _, o, k in linear_shapes(cfg))
        # untied: param_count holds the table and the head once each; the head is a linear
        norms = param_count(cfg) - sum(o * k for _, o, k in linear_shapes(cfg)[:-1]) - 2 * table
        for n in (1, 8):
            assert weight_bytes_read(cfg, dtype, n, weight_format=fmt) == linears + (norms + n * h) * b
        held = weight_bytes(cfg, dtype, weight_format=fmt)
        assert held == linears + (norms + table) * b
    full = decode_step_cost(cfg, 1, 100, dtype)
    q8 = decode_step_cost(cfg, 1, 100, dtype, weight_format="int8")
    q4 = decode_step_cost(cfg, 1, 100, dtype, weight_format="int4-g128")
    assert q8.flops == full.flops and q8.kv_bytes == full.kv_bytes
    assert q4.weight_bytes < q8.weight_bytes < full.weight_bytes
    # per linear weight: 1 byte + one scale per row (int8); 0,5 + one scale per 128 (int4-g128)
    assert q8.weight_bytes / full.weight_bytes == pytest.approx(1 / b, rel=0.01)
    assert q4.weight_bytes / full.weight_bytes == pytest.approx((0.5 + b / 128) / b, rel=0.01)
    with pytest.raises(ValueError, match="weight_format="):
        decode_step_cost(cfg, 1, 100, "int4-g128")
    # the nominal dtype names of chapter 1 keep their meaning: every parameter at that width
    assert decode_step_cost(cfg, 1, 100, "int8").weight_bytes == weight_bytes_read(cfg, "int8")


def test_memory_budget_and_simulator_follow_the_weight_format():
    cfg = get_preset("llama-3.1-8b")
    bf16 = memory_budget(cfg, 24e9, max_len=4096, dtype="bf16")
    q4 = memory_budget(cfg, 24e9, max_len=4096, dtype="bf16", weight_format="int4-g128")
    assert q4.weight_bytes == weight_bytes(cfg, "bf16", weight_format="int4-g128")
    assert q4.kv_bytes_per_token == bf16.kv_bytes_per_token
    assert q4.max_tokens > bf16.max_tokens
    cost = RooflineCostModel(bandwidth_bytes_per_s=1e12, peak_flops=1e15)
    plain, quant = SimExecutor(cfg, cost), SimExecutor(cfg, cost, weight_format="int4-g128")
    t, tq = plain.step_time_s([1], [100]), quant.step_time_s([1], [100])
    assert tq == pytest.approx(decode_step_cost(cfg, 1, 99, weight_format="int4-g128").bytes / 1e12)
    assert tq < t / 3
    with pytest.raises(ValueError, match="in_features=704"):
        SimExecutor(get_preset("tiny-es"), cost, weight_format="int4-g128")
    engines = {f: sim_engine(cfg, cost, 2, 256, weight_format=f) for f in (None, "int8")}
    for engine in engines.values():
        for _ in range(2):
            engine.add_request(list(range(50)), greedy(20))
        while engine.has_unfinished_requests():
            engine.step()
    decode = [h.end - h.start for h in engines["int8"].history[-5:]]
    assert decode == pytest.approx([decode_step_cost(cfg, 2, 50 + k, weight_format="int8").bytes
                                    / 1e12 for k in range(14, 19)])


# --- the engine serves a quantized model unchanged ----------------------------------------------
def _workload(vocab: int, n: int = 8, seed: int = 0):
    rng = random.Random(seed)
    return [([rng.randrange(vocab) for _ in range(rng.randint(1, 30))], rng.randint(1, 12))
            for _ in range(n)]


def _serve(model, items, layout: str) -> list[list[int]]:
    engine = build_engine(model, max_num_seqs=3, max_model_len=64, kv_layout=layout, block_size=8,
                          num_blocks=12 if layout == "paged" else None)
    for i, (p, n) in enumerate(items):
        engine.add_request(p, greedy(n), request_id=f"r{i}")
    while engine.has_unfinished_requests():
        engine.step()
    return [engine.requests[f"r{i}"].output_token_ids for i in range(len(items))]


@pytest.mark.parametrize("fmt", TINY_FORMATS)
def test_engine_greedy_equals_uncached_greedy_of_the_quantized_tiny_model(tiny, fmt):
    q = quantize_model(tiny, fmt)
    items = _workload(tiny.config.vocab_size)
    refs = [generate(q, p, n, cache=None)[0] for p, n in items]
    assert refs != [generate(tiny, p, n, cache=None)[0] for p, n in items]  # quantization shows
    for layout in ("contiguous", "paged"):
        assert _serve(q, items, layout) == refs, layout


@pytest.mark.parametrize("fmt", ["int8", "int4-asym-g32"])
def test_engine_greedy_equals_uncached_greedy_through_the_fused_kernels(small, fmt, monkeypatch):
    q = quantize_model(small, fmt)
    # fp32 keeps greedy decoding exact (bf16 is not, with or without quantization); use the fused
    # kernels in fp32 too, slow as they are on CPU
    monkeypatch.setattr(QuantizedLinear, "_fast_kernel_name", QuantizedLinear._kernel_for)
    used = kernels(q)
    if "dequant-matmul" in used:
        pytest.skip(f"torch {torch.__version__} has no fused {fmt} kernel here: {used}")
    items = _workload(SMALL.vocab_size, seed=1)
    refs = [generate(q, p, n, cache=None)[0] for p, n in items]
    for layout in ("contiguous", "paged"):
        assert _serve(q, items, layout) == refs, layout


def test_a_quantized_bf16_model_runs_the_fused_kernels_close_to_the_reference(tiny):
    q = quantize_model(copy.deepcopy(tiny).to(torch.bfloat16), "int4-g64")
    used = kernels(q)
    if "dequant-matmul" in used:
        pytest.skip(f"torch {torch.__version__} has no fused int4 kernel for bf16 here: {used}")
    ids = torch.tensor([_workload(tiny.config.vocab_size, 1, seed=2)[0][0]])
    with torch.inference_mode():
        fast = q(ids).float()
        set_backend(q, "reference")
        ref = q(ids).float()
    # six layers of bf16 rounding in two orders: close, not equal
    assert float((fast - ref).abs().max()) <= 0.05 * float(ref.abs().max())
    assert float((fast.argmax(-1) == ref.argmax(-1)).float().mean()) >= 0.9
