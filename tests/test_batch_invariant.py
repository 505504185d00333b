"""Chapter 10's batch-invariant mode: one request's logits, bit for bit, whatever the batch.

Without the mode the bits change with the batch (measured here, so these tests can fail); with
it, the logits of every request are ``torch.equal`` to the ones it gets alone, in fp32, bf16 and
fp16, for batch sizes 1 to 32, other orders, chunked prefill, preemption and prefix hits, and
greedy and seeded sampled tokens are equal."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from ai_evolution.engine import LLM, EngineConfig, SamplingParams
from ai_evolution.engine.batch_invariant import (BatchInvariantKernels, generate_with_logits,
                                                 split_attention, tiled_linear)
from ai_evolution.model import load_model

pytestmark = pytest.mark.usefixtures("one_thread")

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
NUM_PROMPTS, MAX_TOKENS = 10, 6


def _params(i: int) -> SamplingParams:
    """Even prompts greedy, odd ones sampled with their own seed: both kinds share each batch."""
    if i % 2:
        return SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.9, seed=100 + i)
    return SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)


def _prompts():
    rng = random.Random(0)
    system = [rng.randrange(3, 4000) for _ in range(20)]  # a shared prefix: prefix-cache hits
    return [system + [rng.randrange(3, 4000) for _ in range(rng.randint(1, 30))]
            for _ in range(NUM_PROMPTS)]


@pytest.fixture(scope="module", params=list(DTYPES))
def case(request):
    """A dtype's model, the prompts, and each prompt's (tokens, logits) served alone."""
    model = load_model("tiny-es", dtype=DTYPES[request.param])
    prompts = _prompts()
    alone = LLM(model, max_num_seqs=1, max_model_len=128, batch_invariant=True)
    solo = [generate_with_logits(alone, [p], _params(i))[0] for i, p in enumerate(prompts)]
    return request.param, model, prompts, solo


# name -> (engine settings, order of the prompts, copies of the prompt list)
LAYOUTS = {
    "batch-2": (dict(max_num_seqs=2), None, 1),
    "batch-5-reversed": (dict(max_num_seqs=5), "reversed", 1),
    "batch-32-identical-copies": (dict(max_num_seqs=32), None, 4),
    "paged-prefix-hits-shuffled": (dict(max_num_seqs=8, kv_layout="paged", block_size=4), "shuffled", 1),
    "chunked-prefill": (dict(max_num_seqs=8, kv_layout="paged", block_size=4,
                             max_num_batched_tokens=16, enable_chunked_prefill=True), None, 1),
    "preemption": (dict(max_num_seqs=8, kv_layout="paged", block_size=4, num_blocks=24,
                        enable_prefix_caching=False), None, 1),
}


def _serve(model, prompts, layout: str, batch_invariant: bool):
    options, order, copies = LAYOUTS[layout]
    index = list(range(len(prompts))) * copies
    if order == "reversed":
        index.reverse()
    elif order == "shuffled":
        random.Random(1).shuffle(index)
    llm = LLM(model, max_model_len=128, batch_invariant=batch_invariant, **options)
    outs = generate_with_logits(llm, [prompts[i] for i in index], [_params(i) for i in index])
    return index, outs, llm.engine.kv_usage()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_mode_gives_each_request_its_solo_logits_bit_for_bit(case, layout):
    name, model, prompts, solo = case
    index, outs, usage = _serve(model, prompts, layout, batch_invariant=True)
    for i, (tokens, logits) in zip(index, outs):
        assert len(tokens) == MAX_TOKENS, (name, layout, i)  # no request failed on the way
        assert torch.equal(logits, solo[i][1]), (name, layout, i, (logits - solo[i][1]).abs().max())
        assert tokens == solo[i][0], (name, layout, i)
    if layout == "preemption":
        assert usage["num_preemptions"] > 0
    if layout == "paged-prefix-hits-shuffled":
        assert usage["prefix_hit_tokens"] > 0


def test_without_the_mode_the_bits_depend_on_the_batch(case):
    """The difference the mode removes exists: some request's logits in a batch of 5 are not the
    ones it gets alone, in every dtype on this CPU (fp32: the GEMV/GEMM switch of the linears;
    bf16 and fp16: attention over a padded key length with another kernel)."""
    name, model, prompts, _ = case
    alone = LLM(model, max_num_seqs=1, max_model_len=128)
    solo = [generate_with_logits(alone, [p], _params(i))[0] for i, p in enumerate(prompts)]
    index, outs, _ = _serve(model, prompts, "batch-5-reversed", batch_invariant=False)
    worst = max((logits - solo[i][1]).abs().max().item() for i, (_, logits) in zip(index, outs))
    assert worst > 0, f"{name}: sin el modo, los logits ya no dependen del lote en esta CPU"


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_tiled_linear_keeps_a_rows_bits_wherever_it_sits(dtype):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(384, 256, generator=gen).to(DTYPES[dtype])
    x = torch.randn(40, 256, generator=gen).to(DTYPES[dtype])
    alone = tiled_linear(x[:1], w)[0]
    for m in (2, 3, 8, 13, 32, 40):
        for at in {0, m // 2, m - 1}:
            rows = x[:m].clone()
            rows[[0, at]] = rows[[at, 0]]
            assert torch.equal(tiled_linear(rows, w)[at], alone), (dtype, m, at)


def test_plain_fp32_linear_changes_a_rows_bits_with_the_batch():
    """Why tiling is needed here: the BLAS reduces one row (GEMV) in another order than many."""
    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(1024, 1024, generator=gen), torch.randn(8, 1024, generator=gen)
    assert not torch.equal(F.linear(x[:1], w)[0], F.linear(x, w)[0])


def test_split_attention_is_attention_and_ignores_everything_but_its_own_query():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 5, 16, generator=gen)
    k, v = torch.randn(3, 2, 70, 16, generator=gen), torch.randn(3, 2, 70, 16, generator=gen)
    pos = torch.tensor([[60, 61, 62, 63, 64]] * 3)
    out = split_attention(q, k, v, pos, split_keys=8)
    mask = (torch.arange(70)[None, None] <= pos[..., None])[:, None]
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # each query alone, over only its visible keys (fewer splits): the same bits
    for t in range(5):
        for keys in (61 + t, 70):
            one = split_attention(q[1:2, :, t:t + 1], k[1:2, :, :keys], v[1:2, :, :keys],
                                  pos[1:2, t:t + 1], split_keys=8)
            assert torch.equal(one[0, :, 0], out[1, :, t]), (t, keys)
    # a prefill chunk of 16 queries against each of them alone, with the default split
    q16, pos16 = torch.randn(1, 4, 16, 16, generator=gen), torch.arange(24, 40)[None]
    full = split_attention(q16, k[:1, :, :40], v[:1, :, :40], pos16)
    for t in range(16):
        one = split_attention(q16[:, :, t:t + 1], k[:1, :, :25 + t], v[:1, :, :25 + t], pos16[:, t:t + 1])
        assert torch.equal(one[0, :, 0], full[0, :, t]), t


def test_a_students_matmul_runs_every_linear_of_the_engine():
    calls = []

    def linear(x, weight, bias=None):
        calls.append(x.shape[0])
        return F.linear(x, weight, bias)

    model = load_model("tiny-es")
    llm = LLM(model, max_model_len=64, kernels=BatchInvariantKernels(linear=linear, tile_rows=4),
              batch_invariant=True)
    llm.generate([[5, 6, 7, 8, 9]], SamplingParams(max_tokens=2, ignore_eos=True))
    assert calls and set(calls) == {4}


def test_with_tile_rows_none_the_students_matmul_alone_decides_the_linears_bits():
    """tile_rows=None hands the student's linear every row of the step: a row-at-a-time matmul
    keeps a request's fp32 logits bit-equal alone and in a batch; the whole-batch F.linear does
    not where this CPU's kernels change the sum with the number of rows (measured here in fp32:
    GEMV for one row, GEMM for several; in bf16 this CPU's linears happen to keep the bits, and
    the batch changes them through attention)."""
    from ai_evolution.reference.determinism import reference_invariant_linear

    seen = []

    def row_by_row(x, weight, bias=None):
        seen.append(x.shape[0])
        return reference_invariant_linear(x, weight, bias)

    model = load_model("tiny-es", dtype=torch.float32)
    prompts = _prompts()
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)

    def logits(linear, batch):
        llm = LLM(model, max_num_seqs=len(batch), max_model_len=128, batch_invariant=True,
                  kernels=BatchInvariantKernels(linear=linear, tile_rows=None))
        return generate_with_logits(llm, batch, params)[0][1]

    assert torch.equal(logits(row_by_row, prompts[:1]), logits(row_by_row, prompts))
    assert max(seen) > 1  # the step's rows arrived together: the function did the work
    if torch.equal(logits(F.linear, prompts[:1]), logits(F.linear, prompts)):
        pytest.skip("on this CPU the whole-batch fp32 F.linear happened to keep the bits here")


def test_tile_rows_is_an_integer_or_none():
    assert BatchInvariantKernels(tile_rows=None).tile_rows is None
    with pytest.raises(ValueError, match="entero >= 1 o None"):
        BatchInvariantKernels(tile_rows=0)


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_batch_invariant_must_be_a_bool(bad):
    with pytest.raises(ValueError, match="batch_invariant debe ser True o False"):
        EngineConfig(batch_invariant=bad)


def test_the_mode_refuses_graphs_and_a_device_it_was_not_made_for():
    with pytest.raises(ValueError, match="no es compatible con batch_invariant"):
        EngineConfig(batch_invariant=True, decode_graphs="eager")
    model = load_model("tiny-es").to("meta")
    with pytest.raises(ValueError, match="dispositivos aceptados: cpu, cuda"):
        LLM(model, max_model_len=64, batch_invariant=True)


def test_the_server_has_a_flag_for_the_mode(monkeypatch):
    from ai_evolution.server.__main__ import engine_config, parser

    assert engine_config(parser().parse_args(["--batch-invariant"])).batch_invariant
    assert not engine_config(parser().parse_args([])).batch_invariant
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    assert parser().parse_args([]).batch_invariant
