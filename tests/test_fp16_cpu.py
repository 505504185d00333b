"""The engine in fp16 on the CPU (torch's CPU half kernels): a T4 serves in fp16 (no bf16), so a
dtype bug there must show up here, without a GPU. Every layout and scheduling feature gives the
same greedy tokens as chapter 1's generator on the same fp16 weights."""

from __future__ import annotations

import random

import pytest
import torch

from ai_evolution.engine import LLM, SamplingParams
from ai_evolution.generation import generate
from ai_evolution.model import load_model

pytestmark = pytest.mark.usefixtures("one_thread")

CONFIGS = {
    "contiguous": dict(kv_layout="contiguous"),
    "paged": dict(kv_layout="paged", block_size=4),
    "paged-preemption": dict(kv_layout="paged", block_size=4, num_blocks=20),
    "chunked": dict(kv_layout="paged", block_size=4, max_num_batched_tokens=16,
                    enable_chunked_prefill=True),
}


@pytest.fixture(scope="module")
def half():
    model = load_model("tiny-es", dtype=torch.float16)
    assert next(model.parameters()).dtype == torch.float16
    rng = random.Random(0)
    system = [rng.randrange(3, 4000) for _ in range(12)]  # a shared prefix: prefix-cache hits
    prompts = [system + [rng.randrange(3, 4000) for _ in range(rng.randint(1, 30))] for _ in range(8)]
    refs = [generate(model, p, 12)[0] for p in prompts]
    return model, prompts, refs


@pytest.mark.parametrize("name", CONFIGS)
def test_fp16_engine_gives_the_generators_greedy_tokens(half, name):
    model, prompts, refs = half
    llm = LLM(model, max_num_seqs=4, max_model_len=128, **CONFIGS[name])
    outs = llm.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    assert [o.token_ids for o in outs] == refs
    usage = llm.engine.kv_usage()
    if name == "paged-preemption":
        assert usage["num_preemptions"] > 0
    if name != "contiguous":
        assert usage["prefix_hit_tokens"] > 0
    assert llm.engine.executor.cache.k.dtype == torch.float16
