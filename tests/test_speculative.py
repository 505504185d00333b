"""Speculative decoding: greedy and sampling verification, the plain two-model loop, the shipped
draft model, and the cost model's prediction of the speedup."""

import itertools
import json
import math

import pytest
import torch

from ai_evolution.generation import generate
from ai_evolution.model import ModelConfig, get_preset, load_model, load_tokenizer, param_count
from ai_evolution.model.checkpoint import load_pretrained, random_model
from ai_evolution.model.sampling import pick_tokens, token_probs
from ai_evolution.model.shipped_models import shipped_model_dir, shipped_names
from ai_evolution.sim.cost_model import (RooflineCostModel, best_k, break_even_batch,
                                         expected_tokens_per_step, predict_speculation_h100,
                                         speculation_vs_batch, speculative_speedup, speculative_step)
from ai_evolution.speculative import (SpecStep, SpeculativeOutput, acceptance_probs, chi_square_gof,
                                      greedy_accept, output_distribution, pooled, rejection_sample,
                                      residual_distribution, speculative_generate)

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = ModelConfig(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, intermediate_size=96,
                    vocab_size=97, max_position_embeddings=128)
SMALL_DRAFT = ModelConfig(num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1, intermediate_size=48,
                          vocab_size=97, max_position_embeddings=128)


# --- greedy verification -----------------------------------------------------------------------
@pytest.mark.parametrize("draft,target,expected", [
    ([5, 6, 7], [5, 6, 7, 8], (3, 8)),        # all kept: the bonus is the target's token after d_2
    ([5, 6, 7], [4, 6, 7, 8], (0, 4)),        # none kept: the target's own first token
    ([5, 6, 7], [5, 6, 9, 8], (2, 9)),        # the correction at the first disagreement
    ([5, 6, 7], [5, 9, 7, 8], (1, 9)),        # agreement after a disagreement does not count
    ([5], [5, 2], (1, 2)),
    ([], [3], (0, 3)),                        # nothing drafted: a plain decode step
])
def test_greedy_accept(draft, target, expected):
    assert greedy_accept(draft, target) == expected
    assert greedy_accept(torch.tensor(draft, dtype=torch.long), torch.tensor(target)) == expected


def test_greedy_accept_needs_k_plus_one_target_tokens():
    with pytest.raises(ValueError, match="k \\+ 1 = 3"):
        greedy_accept([1, 2], [1, 2])
    with pytest.raises(ValueError, match="entero"):
        greedy_accept([1.5], [1, 2])


# --- sampling verification: exact distributions ------------------------------------------------
def _random_dist(gen, vocab, zeros=0):
    w = torch.rand(vocab, generator=gen, dtype=torch.float64) ** 3
    if zeros:
        w[torch.randperm(vocab, generator=gen)[:zeros]] = 0
    return w / w.sum()


def _enumerated_output(p, q):
    """P(emitted = x), enumerating what the draft proposes: kept with acceptance_probs, else a
    resample from residual_distribution (the pieces rejection_sample uses)."""
    a, r = acceptance_probs(p, q), residual_distribution(p, q)
    out = torch.zeros_like(p)
    for d in range(len(q)):
        out[d] += q[d] * a[d]
        out += q[d] * (1 - a[d]) * r
    return out


@pytest.mark.parametrize("vocab,zeros_p,zeros_q", [(2, 0, 0), (3, 0, 1), (5, 2, 0), (6, 2, 2), (8, 0, 3)])
def test_output_distribution_is_exactly_the_target(vocab, zeros_p, zeros_q):
    gen = torch.Generator().manual_seed(vocab)
    for _ in range(20):
        p, q = _random_dist(gen, vocab, zeros_p), _random_dist(gen, vocab, zeros_q)
        torch.testing.assert_close(_enumerated_output(p, q), p, rtol=0, atol=1e-12)
        torch.testing.assert_close(output_distribution(p, q), p, rtol=0, atol=1e-12)
    p = _random_dist(gen, vocab)
    torch.testing.assert_close(output_distribution(p, p.clone()), p, rtol=0, atol=1e-12)  # nothing rejected


def test_acceptance_and_residual_by_hand():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
    q = torch.tensor([0.25, 0.6, 0.0, 0.15], dtype=torch.float64)
    torch.testing.assert_close(acceptance_probs(p, q), torch.tensor([1.0, 0.5, 1.0, 0.0], dtype=torch.float64))
    # max(0, p - q) = [0.25, 0, 0.2, 0], normalized by 0.45
    torch.testing.assert_close(residual_distribution(p, q),
                               torch.tensor([0.25, 0, 0.2, 0], dtype=torch.float64) / 0.45)


def test_rejection_sample_with_one_hot_distributions_is_greedy_accept():
    gen = torch.Generator().manual_seed(0)
    vocab = 6
    for k in (1, 2, 4):
        for _ in range(30):
            draft = torch.randint(0, 3, (k,), generator=gen).tolist()
            target = torch.randint(0, 3, (k + 1,), generator=gen).tolist()
            q = torch.nn.functional.one_hot(torch.tensor(draft), vocab).double()
            p = torch.nn.functional.one_hot(torch.tensor(target), vocab).double()
            assert rejection_sample(draft, q, p, gen) == greedy_accept(draft, target)


def test_token_probs_is_what_pick_tokens_samples_from():
    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(1))
    greedy = token_probs(logits, 0.0)
    assert torch.equal(greedy.argmax(-1), logits.argmax(-1)) and torch.equal(greedy.sum(-1), torch.ones(3))
    probs = token_probs(logits, 0.7, top_k=4, top_p=0.9)
    assert ((probs > 0).sum(-1) <= 4).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(3))
    for seed in range(5):
        a = pick_tokens(logits, 0.7, 4, 0.9, torch.Generator().manual_seed(seed))
        b = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed))[:, 0]
        assert torch.equal(a, b)


# --- sampling verification: statistics on the sampler ------------------------------------------
def test_chi_square_gof_by_hand():
    assert chi_square_gof([25, 25, 50], [0.25, 0.25, 0.5]) == {
        "statistic": 0.0, "dof": 2, "p_value": 1.0, "num_samples": 100}
    r = chi_square_gof([10, 20], [0.5, 0.5])  # (5^2/15) x 2 = 10/3, one degree of freedom
    assert math.isclose(r["statistic"], 10 / 3) and r["dof"] == 1
    assert math.isclose(r["p_value"], math.erfc(math.sqrt(10 / 3 / 2)), rel_tol=1e-9)
    assert chi_square_gof([3, 1], [1.0, 0.0])["p_value"] == 0.0  # a count where p is 0


def _counts(tokens, vocab):
    return torch.bincount(torch.tensor(tokens, dtype=torch.long), minlength=vocab)


def _draw(p_rows, q_rows, n, seed):
    """n verifications of drafts sampled from q_rows: (num_accepted, next_token) each."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        draft = [int(torch.multinomial(q, 1, generator=gen)) for q in q_rows]
        out.append((draft, rejection_sample(draft, q_rows, p_rows, gen)))
    return out


def test_rejection_sampling_first_token_is_distributed_as_p():
    """k = 1 on a 6-token vocabulary where the draft is far from the target: the emitted token
    passes a chi-square test against p (seeded, so the p-value is fixed) and fails against q."""
    gen = torch.Generator().manual_seed(7)
    p = _random_dist(gen, 6).float()[None].repeat(2, 1)
    q = _random_dist(gen, 6).float()[None]
    n = 8000
    draws = _draw(p, q, n, seed=11)
    first = [draft[0] if acc >= 1 else nxt for draft, (acc, nxt) in draws]
    result = chi_square_gof(_counts(first, 6), p[0])
    assert result["num_samples"] == n
    assert result["p_value"] > 0.01, result
    # The same samples against the draft's distribution: the test has the power to see a mistake.
    assert chi_square_gof(_counts(first, 6), q[0])["p_value"] < 1e-6
    # A sampler that keeps every draft emits q, and the test catches it.
    assert chi_square_gof(_counts([d[0] for d, _ in draws], 6), p[0])["p_value"] < 1e-6


def test_rejection_sampling_later_positions_and_bonus_are_distributed_as_p():
    """k = 2: given d_0 kept, the second emitted token follows p_1; given both kept, the bonus
    follows p_2 (the draft is half the target, half noise, so that both events are common)."""
    gen = torch.Generator().manual_seed(3)
    p = torch.stack([_random_dist(gen, 5) for _ in range(3)]).float()
    q = torch.stack([0.5 * p[i] + 0.5 * _random_dist(gen, 5).float() for i in range(2)])
    draws = _draw(p, q, 8000, seed=5)
    second = [draft[1] if acc >= 2 else nxt for draft, (acc, nxt) in draws if acc >= 1]
    bonus = [nxt for _, (acc, nxt) in draws if acc == 2]
    for tokens, row in ((second, p[1]), (bonus, p[2])):
        result = chi_square_gof(_counts(tokens, 5), row)
        assert result["num_samples"] > 1500 and result["p_value"] > 0.01, result


# --- the plain speculative loop ----------------------------------------------------------------
@pytest.fixture(scope="module")
def small_target():
    return random_model(SMALL, seed=3, init_std=0.2)


@pytest.fixture(scope="module")
def small_drafts(small_target):
    """A random smaller draft (rarely agrees) and a noisy copy of the target (often agrees,
    sometimes not: exercises partial acceptance and the roll-back)."""
    noisy = random_model(SMALL, seed=3, init_std=0.2)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.01)
    return {"random": random_model(SMALL_DRAFT, seed=4, init_std=0.2), "noisy": noisy}


@pytest.fixture(scope="module")
def tiny_draft():
    return load_pretrained("tiny-es-draft")


def _prompts(vocab, lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("draft_name", ["random", "noisy"])
def test_greedy_speculation_equals_generate_random_models(small_target, small_drafts, draft_name, k):
    draft = small_drafts[draft_name]
    for prompt in _prompts(SMALL.vocab_size, (1, 6, 19)):
        ref = generate(small_target, prompt, 24)[0]
        out = speculative_generate(small_target, draft, prompt, 24, k)
        assert out.tokens == ref
        assert sum(s.emitted for s in out.steps) + 1 == len(ref)
        assert all(s.drafted <= k for s in out.steps)


def test_noisy_draft_gets_partial_acceptance(small_target, small_drafts):
    prompts = _prompts(SMALL.vocab_size, (1, 6, 19))
    runs = [speculative_generate(small_target, small_drafts["noisy"], p, 24, 4) for p in prompts]
    pool = pooled(runs)
    assert 0.2 < pool.alpha < 0.99  # some kept, some rejected: the roll-back path ran
    assert any(0 < s.accepted < s.drafted for s in pool.steps)
    # The draft's cache is rolled back too: every proposal is the draft's own greedy
    # continuation of the committed text, as if it had started from scratch.
    draft = small_drafts["noisy"]
    for prompt, run in zip(prompts, runs):
        committed = prompt + run.tokens[:1]
        for step in run.steps:
            if step.drafted:
                assert list(step.proposed) == generate(draft, committed, step.drafted, cache=None)[0]
            committed += run.tokens[len(committed) - len(prompt):][:step.emitted]


@pytest.mark.parametrize("k", [1, 2, 4])
def test_greedy_speculation_equals_generate_tiny_es(tiny, tiny_draft, k):
    tok = load_tokenizer("tiny-es")
    for text in ("La", "La caché KV", "Un modelo de lenguaje genera un token cada vez y el lote crece"):
        prompt = tok.encode(text, add_bos=True)
        ref = generate(tiny, prompt, 40, eos_token_id=tok.eos_token_id)[0]
        assert speculative_generate(tiny, tiny_draft, prompt, 40, k, eos_token_id=tok.eos_token_id).tokens == ref


def test_draft_equal_to_target_keeps_everything(small_target):
    out = speculative_generate(small_target, small_target, [5, 6, 7], 23, 4)
    assert out.tokens == generate(small_target, [5, 6, 7], 23)[0]
    assert out.alpha == 1.0 and out.acceptance_by_position() == [1.0] * 4
    assert out.tokens_per_step == 5.0 and out.steps[:-1] == [SpecStep(4, 4, 5)] * 4
    assert out.steps[-1] == SpecStep(drafted=1, accepted=1, emitted=2)   # only 2 tokens were left
    assert out.target_forwards == 6 and out.draft_forwards == 1 + 17


def test_eos_inside_an_accepted_run_stops_there(small_target):
    prompt = [5, 6, 7]
    ref = generate(small_target, prompt, 30)[0]
    # A token whose first appearance is strictly inside a run of kept drafts (k = 4, all kept).
    j = next(j for j, t in enumerate(ref) if t not in ref[:j] and j % 5 not in (0, 1))
    eos = ref[j]
    expected = generate(small_target, prompt, 30, eos_token_id=eos)[0]
    assert expected == ref[:j + 1]
    out = speculative_generate(small_target, small_target, prompt, 30, 4, eos_token_id=eos)
    assert out.tokens == expected
    assert out.steps[-1].accepted == 4 and out.steps[-1].emitted < 5


@pytest.mark.slow  # a whole lab, a long soak or a sampling statistic: `make test` only
def test_sampled_speculation_is_seeded_and_distributed_as_the_target():
    """Vocabulary 8: the second generated token's frequencies over 3000 seeded runs against its
    exact distribution sum_t1 p(t1 | prompt) p(t2 | prompt, t1), computed with the target alone."""
    cfg = ModelConfig(num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1, intermediate_size=48,
                      vocab_size=8, max_position_embeddings=16)
    target = random_model(cfg, seed=1, init_std=0.5)
    draft = random_model(cfg, seed=2, init_std=0.5)
    prompt = [3, 1]
    with torch.no_grad():
        p1 = target(torch.tensor([prompt]))[0, -1].softmax(-1).double()
        seconds = torch.stack([target(torch.tensor([prompt + [t]]))[0, -1].softmax(-1).double() for t in range(8)])
    exact = p1 @ seconds
    a = speculative_generate(target, draft, prompt, 4, 2, temperature=1.0, seed=9)
    assert a.tokens == speculative_generate(target, draft, prompt, 4, 2, temperature=1.0, seed=9).tokens
    n = 3000
    second = [speculative_generate(target, draft, prompt, 3, 2, temperature=1.0, seed=s).tokens[1] for s in range(n)]
    result = chi_square_gof(_counts(second, 8), exact)
    assert result["num_samples"] == n and result["p_value"] > 0.01, result
    assert chi_square_gof(_counts(second, 8), seconds[0])["p_value"] < 1e-6  # it does tell them apart


def test_sampling_with_the_target_as_draft_keeps_everything(small_target):
    out = speculative_generate(small_target, small_target, [4, 5], 21, 4, temperature=0.8, seed=0)
    # p and q differ only by rounding (one token per draft forward, k + 1 per verification)
    assert out.alpha >= 0.99 and len(out.tokens) == 21


def test_statistics_by_hand():
    out = SpeculativeOutput(tokens=[], k=3, steps=[SpecStep(3, 3, 4), SpecStep(3, 1, 2), SpecStep(3, 0, 1),
                                                   SpecStep(2, 2, 3)])
    # examined: 3 + 2 + 1 + 2 = 8, kept 6
    assert out.alpha == 6 / 8
    assert out.acceptance_by_position() == [3 / 4, 2 / 3, 1 / 1]
    assert out.mean_accepted == 6 / 4
    assert out.tokens_per_step == (4 + 2 + 1) / 3   # the 2-token step does not count
    assert math.isnan(SpeculativeOutput(tokens=[1], k=2).alpha)
    both = pooled([out, SpeculativeOutput(tokens=[], k=3, steps=[SpecStep(3, 0, 1)])])
    assert both.alpha == 6 / 9 and len(both.steps) == 5
    with pytest.raises(ValueError, match="mismo k"):
        pooled([out, SpeculativeOutput(tokens=[], k=2)])


def test_bad_input_is_refused_in_spanish(small_target, small_drafts):
    with pytest.raises(ValueError, match="k \\(tokens propuestos por paso\\) debe ser un entero >= 1"):
        speculative_generate(small_target, small_drafts["random"], [1, 2], 4, 0)
    with pytest.raises(ValueError, match="entero >= 1"):
        speculative_generate(small_target, small_drafts["random"], [1, 2], 4, True)
    other = random_model(SMALL_DRAFT.replace(vocab_size=50), seed=0)
    with pytest.raises(ValueError, match="vocabulario de 50 tokens y el objetivo de 97"):
        speculative_generate(small_target, other, [1, 2], 4, 2)
    with pytest.raises(ValueError, match="un solo prompt"):
        speculative_generate(small_target, small_drafts["random"], [[1, 2], [3]], 4, 2)


# --- the shipped draft -------------------------------------------------------------------------
def test_shipped_draft_loads_by_name_and_shares_the_tokenizer(tiny, tiny_draft):
    assert "tiny-es-draft" in shipped_names()
    folder = shipped_model_dir("tiny-es-draft")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "training.json", "README.md"):
        assert (folder / name).is_file(), name
    assert (folder / "tokenizer.json").read_bytes() == (shipped_model_dir("tiny-es") / "tokenizer.json").read_bytes()
    assert load_tokenizer("tiny-es-draft").vocab_size == tiny.config.vocab_size == tiny_draft.config.vocab_size
    assert tiny_draft.num_parameters() * 4 < tiny.num_parameters()
    assert get_preset("tiny-es-draft").num_layers == tiny_draft.config.num_layers
    assert load_model("tiny-es-draft").config == tiny_draft.config
    record = json.loads((folder / "training.json").read_text())
    assert record["model"] == "tiny-es-draft"
    assert record["results"]["final_val_loss"] < record["results"]["uniform_loss"]
    per_k = record["acceptance_vs_target"]["per_k"]
    assert all(v["equals_plain_greedy"] and 0 < v["alpha"] < 1 for v in per_k.values())


# --- the cost model ----------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_expected_tokens_per_step_limits_and_closed_form(k):
    assert expected_tokens_per_step(0.0, k) == 1.0
    assert expected_tokens_per_step(1.0, k) == k + 1
    assert math.isclose(expected_tokens_per_step(1 - 1e-12, k), k + 1, rel_tol=1e-9)
    for alpha in (0.1, 0.5, 0.9):
        assert math.isclose(expected_tokens_per_step(alpha, k), (1 - alpha ** (k + 1)) / (1 - alpha), rel_tol=1e-12)
    values = [expected_tokens_per_step(a / 20, k) for a in range(21)]
    assert all(b > a for a, b in zip(values, values[1:]))          # grows with alpha
    assert expected_tokens_per_step(0.7, k + 1) > expected_tokens_per_step(0.7, k)


def test_expected_tokens_refuses_bad_input():
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens_per_step(1.2, 2)
    with pytest.raises(ValueError, match="k \\(tokens propuestos"):
        expected_tokens_per_step(0.5, 0)


def test_speedup_formula_and_best_k():
    assert math.isclose(speculative_speedup(0.8, 4, 0.1), (1 - 0.8 ** 5) / 0.2 / 1.4)
    assert best_k(0.0, 0.05) == 1                 # nothing is ever kept: draft as little as possible
    assert best_k(0.9, 0.0) == 16                 # a free draft: as many as allowed
    for alpha, c in itertools.product((0.5, 0.8, 0.95), (0.02, 0.1, 0.3)):
        k = best_k(alpha, c)
        assert all(speculative_speedup(alpha, k, c) >= speculative_speedup(alpha, j, c) for j in range(1, 17))
    assert best_k(0.8, 0.02) > best_k(0.8, 0.3)   # a cheaper draft pays for longer proposals


def test_llama_3_2_1b_preset():
    cfg = get_preset("llama-3.2-1b")
    assert cfg.vocab_size == get_preset("llama-3.1-8b").vocab_size
    assert 1.2e9 < param_count(cfg) < 1.3e9      # "1.23B" on the model card
    assert "meta-llama/Llama-3.2-1B" in cfg.source


def test_h100_speedup_shrinks_with_batch():
    steps = predict_speculation_h100(0.8, 4, batch_sizes=(1, 256), context_len=128)
    one, big = steps
    assert one.speedup > 1.5 and one.speedup > big.speedup
    assert not one.verify_compute_bound and big.verify_compute_bound
    assert big.speedup < 1 and break_even_batch(steps) == 256
    # At batch 1 the verification costs about one decode step (it reads the same weights), so the
    # roofline reduces to Leviathan's formula with the measured cost ratio.
    assert math.isclose(one.verify_s, one.target_step_s, rel_tol=0.01)
    assert math.isclose(one.speedup, speculative_speedup(0.8, 4, one.cost_ratio), rel_tol=0.01)
    assert math.isclose(one.step_s, one.draft_s + one.verify_s)


def test_speculative_step_counts_k_draft_steps_and_one_verification():
    cost = RooflineCostModel(bandwidth_bytes_per_s=1e12, peak_flops=1e14, overhead_s=1e-3)
    target, draft = get_preset("llama-3.1-8b"), get_preset("llama-3.2-1b")
    s = speculative_step(cost, target, draft, 0.7, 3, batch_size=2, context_len=100)
    # Each step pays the fixed overhead: 3 draft steps + 1 verification.
    s0 = speculative_step(RooflineCostModel(1e12, 1e14), target, draft, 0.7, 3, batch_size=2, context_len=100)
    assert math.isclose(s.step_s - s0.step_s, 4e-3)
    assert speculation_vs_batch(cost, target, draft, 0.7, 3, [2], context_len=100) == [s]
    with pytest.raises(ValueError, match="vocabulario"):
        speculative_step(cost, target, get_preset("mistral-7b-v0.3"), 0.7, 3)
