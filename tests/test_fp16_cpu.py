"""The engine in fp16 on the CPU (torch's CPU half kernels): a T4 serves in fp16 (no bf16), so a
dtype bug there must show up here, without a GPU. In the batch-invariant mode (chapter 10), every
layout and scheduling feature gives each request the greedy tokens it gets served alone; without
the mode, 16-bit batches round differently and a near-tie can flip a token, so that promise is
only made with it."""

from __future__ import annotations

import random

import pytest
import torch

from ai_evolution.engine import LLM, SamplingParams
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
    alone = LLM(model, max_num_seqs=1, max_model_len=128, batch_invariant=True)
    refs = [o.token_ids for o in alone.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))]
    return model, prompts, refs


@pytest.mark.parametrize("name", CONFIGS)
def test_fp16_engine_gives_each_request_its_solo_greedy_tokens(half, name):
    model, prompts, refs = half
    llm = LLM(model, max_num_seqs=4, max_model_len=128, batch_invariant=True, **CONFIGS[name])
    outs = llm.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    assert [o.token_ids for o in outs] == refs
    usage = llm.engine.kv_usage()
    if name == "paged-preemption":
        assert usage["num_preemptions"] > 0
    if name != "contiguous":
        assert usage["prefix_hit_tokens"] > 0
    assert llm.engine.executor.cache.k.dtype == torch.float16


# The lab test modules keep each lab's small, fast parameters; reuse them so they stay in sync.
FAST_FROM = {"kv_cache": "test_lab_kv_cache", "continuous_batching": "test_lab_continuous_batching",
             "paged_attention": "test_lab_paged_attention", "scheduler": "test_lab_scheduler",
             "observability": "test_lab_observability", "speculative": "test_lab_speculative",
             "operations": "test_lab_operations"}


def fast_params(kind: str) -> dict:
    import importlib

    try:
        return dict(importlib.import_module(FAST_FROM[kind]).FAST)
    except (ImportError, AttributeError, KeyError):
        return {}


ENGINE_LABS = ("kv_cache", "continuous_batching", "paged_attention", "scheduler", "observability",
               "speculative", "operations")


@pytest.mark.slow  # a whole lab, a long soak or a sampling statistic: `make test` only
@pytest.mark.parametrize("kind", ENGINE_LABS)
def test_engine_labs_run_in_fp16_and_their_claims_hold(kind, monkeypatch):
    """``model_dtype="fp16"``: what ``auto`` picks on a T4. Every forward pass of the lab runs on
    fp16 weights, the contract validates and every claim agrees with its numbers."""
    import json

    from ai_evolution import claims
    from ai_evolution.labs import run_lab
    from ai_evolution.model.decoder import Transformer

    seen = set()
    forward = Transformer.hidden_states

    def spy(self, *args, **kwargs):
        seen.add(next(self.parameters()).dtype)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(Transformer, "hidden_states", spy)
    contract = run_lab(kind, seed=0, profile="ci", model_dtype="fp16", **fast_params(kind))
    assert seen == {torch.float16}
    assert contract["params"]["model_dtype"] == "fp16"
    assert claims.recheck_contract(contract) == []
    json.dumps(contract)  # the contract stays JSON


def test_auto_serves_fp32_on_the_cpu_and_the_devices_dtype_elsewhere(monkeypatch):
    from ai_evolution.labs import common

    assert common.served_dtype("auto", "cpu") == torch.float32
    assert common.served_dtype("fp16", "cpu") == torch.float16
    monkeypatch.setattr(common, "default_dtype", lambda device: torch.float16)  # a T4
    assert common.served_dtype("auto", "cuda") == torch.float16
