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


def test_sampled_requests_speculate_beside_greedy_ones_and_repeat_with_their_seed(target, work):
    prompts, refs = work
    sampled = SamplingParams(max_tokens=10, temperature=0.8, seed=7, ignore_eos=True)

    def run():
        engine = build_engine(target, max_num_seqs=3, max_model_len=96, draft_model=target,
                              num_speculative_tokens=3)
        return engine.run([(0.0, prompts[0], sampled),
                           (0.0, prompts[1], SamplingParams(max_tokens=18, ignore_eos=True))])

    reqs = run()
    assert reqs[0].num_draft_tokens > 0 and len(reqs[0].output_token_ids) == 10
    # the draft is the target itself: p = q, so rejection sampling keeps every proposal
    assert reqs[0].num_accepted_tokens == reqs[0].num_draft_tokens
    assert reqs[1].output_token_ids == refs[1] and reqs[1].num_draft_tokens > 0
    assert run()[0].output_token_ids == reqs[0].output_token_ids  # same seed, same tokens


def test_a_draft_with_another_vocabulary_or_a_bad_k_is_refused_in_spanish(target):
    other = random_model(get_preset("tiny-es").replace(vocab_size=100, num_layers=1, name="o"))
    with pytest.raises(ValueError, match="deben compartir tokenizador"):
        build_engine(target, max_num_seqs=2, max_model_len=64, draft_model=other)
    with pytest.raises(ValueError, match="num_speculative_tokens .* entero >= 1"):
        build_engine(target, max_num_seqs=2, max_model_len=64, draft_model=target,
                     num_speculative_tokens=0)


# --- n-gram (prompt lookup) proposals ------------------------------------------------------------
def test_ngram_propose_copies_what_followed_the_most_recent_longest_match():
    from ai_evolution.engine.drafter import ngram_propose

    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    # the suffix [2, 3] last occurred at 5..6, followed by 7, 8, 5
    assert ngram_propose(tokens, 3, 1, 2) == [7, 8, 5]
    assert ngram_propose(tokens, 2, 1, 2) == [7, 8]
    # a longer window: [5, 2, 3] occurs nowhere earlier; the 2-gram still matches
    assert ngram_propose(tokens, 3, 2, 3) == [7, 8, 5]
    assert ngram_propose(tokens, 3, 3, 3) == []
    # near the end of the context the proposal is shorter
    assert ngram_propose([4, 6, 4], 3, 1, 1) == [6, 4]
    assert ngram_propose([4], 3, 1, 1) == []
    # the longest match wins over a more recent shorter one
    assert ngram_propose([5, 6, 1, 9, 6, 2, 5, 6], 1, 1, 2) == [1]


def text_prompts(count: int = 6, length: int = 20) -> list[list[int]]:
    """Prompts of the corpus's held-out text: tiny-es's greedy output repeats some of its own
    short n-grams, so a window from 1 token finds proposals and the target keeps some."""
    from ai_evolution.labs.speculative import held_out_prompts

    return held_out_prompts("tiny-es", count, length)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ngram_speculation_gives_the_targets_greedy_tokens_beside_sampled_requests(target, layout):
    prompts = text_prompts()
    refs = [generate(target, p, 18)[0] for p in prompts]
    sampled = SamplingParams(max_tokens=8, temperature=0.9, seed=3, ignore_eos=True)
    solo = build_engine(target, max_num_seqs=3, max_model_len=96, **LAYOUTS[layout])
    solo_sampled = solo.run([(0.0, prompts[0], sampled)])[0].output_token_ids
    engine = build_engine(target, max_num_seqs=3, max_model_len=96, **LAYOUTS[layout],
                          speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                              "prompt_lookup_min": 1, "prompt_lookup_max": 3})
    arrivals = [(0.0, p, SamplingParams(max_tokens=18, ignore_eos=True)) for p in prompts]
    reqs = engine.run(arrivals[:2] + [(0.0, prompts[0], sampled)] + arrivals[2:])
    sampled_req = reqs.pop(2)
    assert [r.output_token_ids for r in reqs] == refs
    assert len(sampled_req.output_token_ids) == 8 and sampled_req.output_token_ids[0] == solo_sampled[0]
    proposed = sum(r.num_draft_tokens for r in reqs)
    accepted = sum(r.num_accepted_tokens for r in reqs)
    assert proposed > 0 and 0 < accepted <= proposed
    verified = [e.num_draft_tokens for h in engine.history for e in h.scheduled]
    assert sum(verified) == proposed and max(verified) <= 3
    if layout == "paged-tight":
        assert engine.kv_usage()["num_preemptions"] > 0
    if LAYOUTS[layout].get("max_num_batched_tokens"):
        assert all(h.num_tokens <= 10 for h in engine.history)
    assert engine.kv_usage()["blocks_used"] == 0


def test_ngram_speculation_reuses_cached_prefixes_and_stays_exact(target):
    shared = text_prompts(1, 24)[0]
    prompts = [shared + [11 + i, 12 + i] for i in range(4)]
    refs = [generate(target, p, 12)[0] for p in prompts]
    engine = build_engine(target, max_num_seqs=2, max_model_len=96, kv_layout="paged", block_size=4,
                          speculative_config={"method": "ngram", "prompt_lookup_min": 1,
                                              "prompt_lookup_max": 2, "num_speculative_tokens": 2})
    reqs = engine.run([(0.0, p, SamplingParams(max_tokens=12, ignore_eos=True)) for p in prompts])
    assert [r.output_token_ids for r in reqs] == refs
    assert engine.kv_usage()["prefix_hit_tokens"] > 0
    assert sum(r.num_draft_tokens for r in reqs) > 0


def test_llm_takes_an_ngram_speculative_config(target):
    from ai_evolution.engine import LLM

    prompts = text_prompts(3, 12)
    plain = LLM(target).generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True))
    llm = LLM(target, speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                          "prompt_lookup_max": 2})
    spec = llm.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True))
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert llm.engine.drafter.prompt_lookup_min == 2  # one end of the window sets the other


@pytest.mark.parametrize("config, words", [
    ({"method": "eagle"}, "method='eagle' no está soportado; aceptados: ngram, draft_model"),
    ({}, "necesita method"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens .* entero >= 1"),
    ({"method": "ngram", "prompt_lookup_min": 0}, "prompt_lookup_min .* entero >= 1"),
    ({"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2},
     "ventana .* prompt_lookup_min \\(4\\) debe ser <= prompt_lookup_max \\(2\\)"),
    ({"method": "ngram", "model": "tiny-es-draft"}, "no usa modelo borrador"),
    ({"method": "draft_model"}, "necesita model"),
    ({"model": "tiny-es-draft", "prompt_lookup_max": 3}, "solo valen con method='ngram'"),
])
def test_a_bad_speculative_config_is_refused_in_spanish(config, words):
    from ai_evolution.engine.config import EngineConfig

    with pytest.raises(ValueError, match=words):
        EngineConfig(speculative_config=config)


def test_the_server_takes_vllms_speculative_config_flag():
    from ai_evolution.engine.config import SpeculativeConfig
    from ai_evolution.server.__main__ import engine_config, parser

    args = parser().parse_args(["--speculative-config",
                                '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'])
    assert engine_config(args).speculative_config == SpeculativeConfig(
        method="ngram", num_speculative_tokens=3, prompt_lookup_min=4, prompt_lookup_max=4)
    with pytest.raises(SystemExit, match="no es válido: method='x' no está soportado"):
        engine_config(parser().parse_args(["--speculative-config", '{"method": "x"}']))


# --- sampled requests: rejection sampling in the engine -------------------------------------------
def tiny_vocab_model(seed: int, vocab: int = 6, init_std: float = 0.5):
    """A random one-layer model over a tiny vocabulary, with sharp enough distributions (a large
    init) that a draft of another seed disagrees with it often."""
    from ai_evolution.model.checkpoint import random_model

    config = get_preset("tiny-es").replace(vocab_size=vocab, num_layers=1, hidden_size=32,
                                           num_heads=2, num_kv_heads=1, head_dim=16,
                                           intermediate_size=64, name=f"v{vocab}-{seed}",
                                           max_position_embeddings=32)
    return random_model(config, seed=seed, init_std=init_std)


def exact_pair_distribution(model, prompt, temperature):
    """P(t1, t2) of plain sampling after ``prompt``: p(t1) p(t2 | t1), flattened ``[V * V]``."""
    from ai_evolution.model.sampling import token_probs

    with torch.inference_mode():
        first = token_probs(model(torch.tensor([prompt]))[0, -1].float(), temperature)
        rows = [first[t] * token_probs(model(torch.tensor([prompt + [t]]))[0, -1].float(), temperature)
                for t in range(len(first))]
    return torch.cat(rows).double()


INIT_STD = 0.3  # flat enough that proposals are often neither sure nor hopeless


@pytest.mark.slow  # a whole lab, a long soak or a sampling statistic: `make test` only
@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_sampled_speculation_emits_the_targets_distribution(method):
    vocab, temperature, n = 6, 1.0, 4000
    target = tiny_vocab_model(1, vocab, init_std=INIT_STD)
    # the model's own greedy text, twice: the n-gram proposes what followed the last token there
    prompt = generate(target, [1], 7)[0] * 2
    spec = ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1,
             "prompt_lookup_max": 2} if method == "ngram" else
            {"model": tiny_vocab_model(2, vocab, init_std=INIT_STD), "num_speculative_tokens": 2})
    engine = build_engine(target, max_num_seqs=64, max_model_len=32, speculative_config=spec)
    reqs = engine.run([(0.0, prompt, SamplingParams(max_tokens=3, temperature=temperature,
                                                     seed=i, ignore_eos=True))
                       for i in range(n)])
    pairs = torch.tensor([r.output_token_ids[0] * vocab + r.output_token_ids[1] for r in reqs])
    counts = torch.bincount(pairs, minlength=vocab * vocab)
    want = exact_pair_distribution(target, prompt, temperature)
    # the second token came from a verification (one draft: the third is the last), some
    # proposals kept, some rejected
    proposed = sum(r.num_draft_tokens for r in reqs)
    accepted = sum(r.num_accepted_tokens for r in reqs)
    assert proposed > n // 4 and 0 < accepted < 0.9 * proposed
    assert pooled_gof(counts, want, n) > 1e-3
    # control: the same test tells a wrong distribution (the first token's, reused) apart
    wrong = want.view(vocab, vocab).sum(1, keepdim=True) * want.view(vocab, vocab).sum(0)
    assert pooled_gof(counts, wrong.flatten(), n) < 1e-3


def pooled_gof(counts, probs, n: int) -> float:
    """Chi-square p-value with the cells expected fewer than 5 times pooled into one (the test's
    approximation needs it)."""
    from ai_evolution.speculative import chi_square_gof

    small = probs * n < 5
    c = torch.cat([counts[~small].double(), counts[small].double().sum()[None]])
    p = torch.cat([probs[~small], probs[small].sum()[None]])
    return chi_square_gof(c, p)["p_value"]
