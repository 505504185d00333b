"""Speculative decoding inside the engine (chapter 9): a draft proposes k tokens per step, the
target verifies them in the request's decode step, and the output is the target's greedy output
token for token, whatever the draft (itself: every proposal accepted; a random model: almost
none), on every KV layout, with a token budget, chunked prefill, preemption, stop tokens and
requests that do not speculate (sampled) in the same batch."""

from __future__ import annotations

import random

import pytest
import torch

from ai_evolution.engine import SamplingParams, build_engine
from ai_evolution.generation import generate
from ai_evolution.model import get_preset, load_model, random_model

pytestmark = pytest.mark.usefixtures("one_thread")

LAYOUTS = {
    "contiguous": dict(kv_layout="contiguous"),
    "paged": dict(kv_layout="paged", block_size=4),
    "paged-tight": dict(kv_layout="paged", block_size=4, num_blocks=24),
    "chunked": dict(kv_layout="paged", block_size=4, max_num_batched_tokens=10,
                    enable_chunked_prefill=True),
}


@pytest.fixture(scope="module")
def target():
    return load_model("tiny-es")


@pytest.fixture(scope="module")
def work(target):
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 4000) for _ in range(rng.randint(2, 30))] for _ in range(6)]
    return prompts, [generate(target, p, 18)[0] for p in prompts]


def drafts(target):
    return {"itself": target,
            "random": random_model(get_preset("tiny-es").replace(num_layers=1, name="r"), seed=1)}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("draft_name", ["itself", "random"])
def test_speculative_engine_gives_the_targets_greedy_tokens(target, work, layout, draft_name):
    prompts, refs = work
    engine = build_engine(target, max_num_seqs=3, max_model_len=96,
                          draft_model=drafts(target)[draft_name], num_speculative_tokens=3,
                          **LAYOUTS[layout])
    reqs = engine.run([(0.0, p, SamplingParams(max_tokens=18, ignore_eos=True)) for p in prompts])
    assert [r.output_token_ids for r in reqs] == refs
    proposed = sum(r.num_draft_tokens for r in reqs)
    accepted = sum(r.num_accepted_tokens for r in reqs)
    assert proposed > 0
    if draft_name == "itself":
        assert accepted == proposed  # the target agrees with itself
        plain = build_engine(target, max_num_seqs=3, max_model_len=96, **LAYOUTS[layout])
        plain.run([(0.0, p, SamplingParams(max_tokens=18, ignore_eos=True)) for p in prompts])
        assert len(engine.history) < len(plain.history)
    else:
        assert accepted < proposed / 4
    if layout == "paged-tight":
        assert engine.kv_usage()["num_preemptions"] > 0
    if LAYOUTS[layout].get("max_num_batched_tokens"):
        assert all(h.num_tokens <= 10 for h in engine.history)
    assert engine.kv_usage()["blocks_used"] == 0
    verified = [e.num_draft_tokens for h in engine.history for e in h.scheduled]
    assert sum(verified) == proposed


def test_stop_tokens_inside_an_accepted_run_end_the_request_there(target, work):
    prompts, refs = work
    # the 5th greedy token of each prompt is its stop token: accepted runs must stop at it
    stops = [ref[4] for ref in refs]
    engine = build_engine(target, max_num_seqs=3, max_model_len=96, draft_model=target,
                          num_speculative_tokens=4)
    reqs = engine.run([(0.0, p, SamplingParams(max_tokens=18, ignore_eos=True, stop_token_ids=[s]))
                       for p, s in zip(prompts, stops)])
    for r, ref, s in zip(reqs, refs, stops):
        assert r.output_token_ids == ref[:ref.index(s) + 1]
        assert r.finish_reason.value == "stop"


def test_sampled_requests_do_not_speculate_and_keep_their_seeded_tokens(target, work):
    prompts, refs = work
    sampled = SamplingParams(max_tokens=10, temperature=0.8, seed=7, ignore_eos=True)
    alone = build_engine(target, max_num_seqs=3, max_model_len=96)
    solo = alone.run([(0.0, prompts[0], sampled)])[0].output_token_ids
    engine = build_engine(target, max_num_seqs=3, max_model_len=96, draft_model=target,
                          num_speculative_tokens=3)
    reqs = engine.run([(0.0, prompts[0], sampled),
                       (0.0, prompts[1], SamplingParams(max_tokens=18, ignore_eos=True))])
    assert reqs[0].output_token_ids == solo and reqs[0].num_draft_tokens == 0
    assert reqs[1].output_token_ids == refs[1] and reqs[1].num_draft_tokens > 0


def test_a_draft_with_another_vocabulary_or_a_bad_k_is_refused_in_spanish(target):
    other = random_model(get_preset("tiny-es").replace(vocab_size=100, num_layers=1, name="o"))
    with pytest.raises(ValueError, match="deben compartir tokenizador"):
        build_engine(target, max_num_seqs=2, max_model_len=64, draft_model=other)
    with pytest.raises(ValueError, match="num_speculative_tokens .* entero >= 1"):
        build_engine(target, max_num_seqs=2, max_model_len=64, draft_model=target,
                     num_speculative_tokens=0)
