"""The simulator replays the engine's own scheduler on simulated time, and the cost model it uses
can be fitted to measured steps.

The simulator is only worth its predictions if it makes the *same* decisions as the real engine:
same requests in the same KV rows with the same token counts at every step. Its clock must be
exactly the sum of the cost model's step times (plus the idle waits for online arrivals).
"""

from __future__ import annotations

import math
import random
import re

import pytest
import torch

from ai_evolution.engine import FinishReason, LLMEngine, ModelRunner, SamplingParams, Scheduler
from ai_evolution.model import get_preset
from ai_evolution.sim import (SIM_TOKEN, RooflineCostModel, SimExecutor, StepCost, fit_cost_model,
                              sim_engine, step_cost)
from engine_helpers import COST, schedule

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_LEN = 96
POLICIES = ("static", "continuous")
LATE = 5.0  # seconds: far beyond the busy period of the online workload


@pytest.fixture(scope="module")
def items(tiny):
    """12 (prompt, max_tokens) pairs: prompts of 1..60 tokens, 1..20 new tokens each."""
    rng = random.Random(7)
    vocab = tiny.config.vocab_size
    lens = [1, 60] + [rng.randint(1, 60) for _ in range(10)]
    news = [20, 1] + [rng.randint(1, 20) for _ in range(10)]
    return [([rng.randrange(vocab) for _ in range(n)], m) for n, m in zip(lens, news)]


def params(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


class CostClock:
    """The real model on the simulator's clock: tokens from ``ModelRunner``, time from the cost
    model. Online arrivals then reach the real engine exactly when they reach the simulated one."""

    def __init__(self, runner: ModelRunner, sim: SimExecutor) -> None:
        self.runner, self.sim = runner, sim

    def now(self) -> float:
        return self.sim.now()

    def idle_until(self, t: float) -> None:
        self.sim.idle_until(t)

    def execute(self, out):
        tokens = self.runner.execute(out)
        self.sim.execute(out)
        return tokens


def real_engine(model, width: int, policy: str, clock: bool = False) -> LLMEngine:
    runner = ModelRunner(model, width, MAX_LEN)
    executor = CostClock(runner, SimExecutor(model.config, COST)) if clock else runner
    return LLMEngine(Scheduler(width, MAX_LEN, policy), executor, model.config.vocab_size,
                     model.config.eos_token_id)


def drain(engine: LLMEngine) -> None:
    while engine.has_unfinished_requests():
        engine.step()
    engine.retire_finished()


def cost_of(config, h, dtype="bf16") -> float:
    return COST.step_time_s(step_cost(config, h.query_lens, h.context_lens, dtype))


@pytest.fixture(scope="module")
def offline(tiny, items):
    """(policy, width) -> (real engine, simulated engine), both fed the workload in one shuffled order."""
    order = list(range(len(items)))
    random.Random(3).shuffle(order)
    out = {}
    for policy in POLICIES:
        for width in (1, 3, 5):
            real = real_engine(tiny, width, policy)
            sim = sim_engine(tiny.config, COST, width, MAX_LEN, policy)
            for engine in (real, sim):
                for i in order:
                    engine.add_request(items[i][0], params(items[i][1]), request_id=f"r{i}")
                drain(engine)
            out[policy, width] = real, sim
    return out


# --- the same schedule ------------------------------------------------------------------------
@pytest.mark.parametrize("width", (1, 3, 5))
@pytest.mark.parametrize("policy", POLICIES)
def test_simulator_makes_the_real_engines_decisions(offline, items, policy, width):
    real, sim = offline[policy, width]
    assert len(sim.history) > 1
    assert schedule(sim) == schedule(real)
    assert [h.holders for h in sim.history] == [h.holders for h in real.history]
    for i, (_, n) in enumerate(items):
        r, s = real.requests[f"r{i}"], sim.requests[f"r{i}"]
        assert s.output_token_ids == [SIM_TOKEN] * n and len(r.output_token_ids) == n
        assert r.finish_reason is s.finish_reason is FinishReason.LENGTH
    assert sim.scheduler.kv.num_free == width


@pytest.mark.parametrize("width", (1, 3, 5))
@pytest.mark.parametrize("policy", POLICIES)
def test_simulated_clock_is_the_sum_of_the_cost_models_step_times(offline, tiny, policy, width):
    _, sim = offline[policy, width]
    expected = [cost_of(tiny.config, h) for h in sim.history]
    assert all(t > 0 for t in expected)
    assert sim.executor.clock == pytest.approx(math.fsum(expected), rel=1e-12)
    assert sim.executor.step_times == pytest.approx(expected, rel=1e-12)
    assert [h.duration for h in sim.history] == pytest.approx(expected, rel=1e-12)
    assert sim.history[0].start == 0.0
    for a, b in zip(sim.history, sim.history[1:]):
        assert b.start == a.end  # offline: no idle time between steps
    # every token is stamped with the simulated end of the step that produced it
    for r in sim.requests.values():
        ends = [h.end for h in sim.history if any(e.request_id == r.request_id for e in h.scheduled)]
        assert r.token_times == ends and r.finish_time == ends[-1]


def test_simulated_time_follows_the_dtype_and_the_cost_model(tiny, items):
    def clock(dtype, cost=COST):
        engine = sim_engine(tiny.config, cost, 3, MAX_LEN, "continuous", dtype=dtype)
        engine.run([(0.0, p, params(n)) for p, n in items])
        return engine.executor.clock, len(engine.history)

    bf16, steps = clock("bf16")
    fp32, steps32 = clock("fp32")
    assert steps32 == steps and fp32 > bf16  # twice the bytes to read per step
    slower, _ = clock("bf16", RooflineCostModel(25e9, 1e11, 4e-3, overhead_per_seq_s=2e-4))
    assert slower == pytest.approx(2 * bf16, rel=1e-9)  # every term of the model doubled


def test_simulated_ttft_is_at_least_the_prefill_step(offline, tiny):
    for (policy, width), (_, sim) in offline.items():
        for r in sim.requests.values():
            prefill = COST.step_time_s(step_cost(tiny.config, [r.num_prompt_tokens], [r.num_prompt_tokens]))
            assert r.ttft >= prefill * (1 - 1e-12), (policy, width, r.request_id)
            assert r.e2e_latency >= r.ttft
    # the first request served alone: its TTFT is exactly its prefill step
    _, sim = offline["continuous", 1]
    first = sim.requests[sim.history[0].scheduled[0].request_id]
    assert first.ttft == pytest.approx(
        COST.step_time_s(step_cost(tiny.config, [first.num_prompt_tokens], [first.num_prompt_tokens])),
        rel=1e-12)


# --- online arrivals ----------------------------------------------------------------------------
def arrivals(items) -> list[tuple]:
    times = [0.0, 0.0, 0.004, 0.01, 0.011, 0.03, 0.05, 0.08, 0.12, 0.2, LATE, LATE + 0.003]
    return [(t, p, params(n)) for t, (p, n) in zip(times, items)]


@pytest.mark.parametrize("policy", POLICIES)
def test_online_arrivals_give_the_real_engine_the_simulated_schedule(tiny, items, policy):
    real = real_engine(tiny, 3, policy, clock=True)
    sim = sim_engine(tiny.config, COST, 3, MAX_LEN, policy)
    got_real, got_sim = real.run(arrivals(items)), sim.run(arrivals(items))
    assert schedule(real) == schedule(sim)
    assert [r.arrival_time for r in got_real] == [r.arrival_time for r in got_sim]
    assert [r.first_token_time for r in got_real] == [r.first_token_time for r in got_sim]
    assert [len(r.output_token_ids) for r in got_real] == [n for _, n in items]
    assert real.executor.sim.clock == sim.executor.clock


@pytest.mark.parametrize("policy", POLICIES)
def test_idle_time_advances_the_simulated_clock_to_the_next_arrival(tiny, items, policy):
    sim = sim_engine(tiny.config, COST, 3, MAX_LEN, policy)
    reqs = sim.run(arrivals(items))
    late = reqs[-2]
    assert late.arrival_time == LATE and late.first_scheduled_time == LATE
    before = [h for h in sim.history if h.end <= LATE]
    after = [h for h in sim.history if h.start >= LATE]
    assert len(before) + len(after) == len(sim.history)  # no step straddles the idle gap
    assert before[-1].end < LATE and after[0].start == LATE
    busy = math.fsum(cost_of(tiny.config, h) for h in sim.history)
    idle = sim.history[0].start + math.fsum(b.start - a.end for a, b in zip(sim.history, sim.history[1:]))
    assert sim.executor.clock == pytest.approx(busy + idle, rel=1e-12)
    assert sim.executor.clock == pytest.approx(LATE + math.fsum(cost_of(tiny.config, h) for h in after),
                                               rel=1e-12)
    # the clock only jumps to an arrival: every gap ends when some request arrives
    arrived = {r.arrival_time for r in reqs}
    for a, b in zip(sim.history, sim.history[1:]):
        if b.start > a.end:
            assert b.start in arrived
    for r in reqs:
        assert r.arrival_time <= r.first_scheduled_time <= r.first_token_time <= r.finish_time


def test_with_free_rows_a_request_joins_the_first_step_after_it_arrives(tiny, items):
    sim = sim_engine(tiny.config, COST, len(items), MAX_LEN, "continuous")
    reqs = sim.run(arrivals(items))
    starts = [h.start for h in sim.history]
    for r in reqs:
        assert r.first_scheduled_time == min(s for s in starts if s >= r.arrival_time)


# --- fitting the cost model ------------------------------------------------------------------------
PEAK_GRID = torch.logspace(6, 16, 401, dtype=torch.float64).tolist()  # fit_cost_model's candidates
BW = 2e12


def synthetic_costs() -> list[StepCost]:
    """Decode steps of 1..64 sequences (bandwidth-bound) and long prefills (compute-bound), some
    mixed, on a 8B model."""
    cfg = get_preset("llama-3.1-8b")
    costs = [step_cost(cfg, [1] * b, [512] * b) for b in (1, 2, 4, 8, 16, 32, 64)]
    costs += [step_cost(cfg, [p], [p]) for p in (64, 256, 1024, 2048)]
    costs += [step_cost(cfg, [128] + [1] * b, [128] + [700] * b) for b in (3, 12)]
    return costs


@pytest.mark.parametrize("peak, rel_peak, rel_overhead", [
    (PEAK_GRID[320], 1e-9, 1e-6),  # 1e14 FLOP/s, on the fit's grid: recovered exactly
    (3.3e14, 0.03, 0.05),          # between grid points (6 % apart): within half a step
    (7.7e13, 0.03, 0.05),
])
def test_fit_recovers_a_known_cost_model(peak, rel_peak, rel_overhead):
    truth = RooflineCostModel(BW, peak, overhead_s=3e-3, overhead_per_seq_s=2e-4)
    costs = synthetic_costs()
    compute_bound = [c.flops / peak > c.bytes / BW for c in costs]
    assert any(compute_bound) and not all(compute_bound)
    fit = fit_cost_model(costs, [truth.step_time_s(c) for c in costs], BW, name="ajuste")
    assert fit.name == "ajuste" and fit.bandwidth_bytes_per_s == BW
    assert fit.peak_flops == pytest.approx(peak, rel=rel_peak)
    assert fit.overhead_s == pytest.approx(3e-3, rel=rel_overhead)
    assert fit.overhead_per_seq_s == pytest.approx(2e-4, rel=rel_overhead)
    for c in costs:
        assert fit.step_time_s(c) == pytest.approx(truth.step_time_s(c), rel=rel_overhead)


def test_fit_with_one_batch_size_puts_all_the_overhead_in_the_fixed_term():
    cfg = get_preset("llama-3.1-8b")
    truth = RooflineCostModel(BW, PEAK_GRID[320], overhead_s=1e-3, overhead_per_seq_s=5e-4)
    costs = [step_cost(cfg, [1] * 4, [c] * 4) for c in (100, 1000, 4000)]
    fit = fit_cost_model(costs, [truth.step_time_s(c) for c in costs], BW)
    assert fit.overhead_per_seq_s == 0.0
    assert fit.overhead_s == pytest.approx(1e-3 + 4 * 5e-4, rel=1e-6)


@pytest.mark.parametrize("costs, times, words", [
    ([], [], "no pueden estar vacías"),
    ("two", [1e-3], "misma longitud"),
    ("two", [1e-3, 2e-3, 3e-3], "misma longitud"),
    ("two", [1e-3, 0.0], "> 0"),
    ("two", [-1e-3, 1e-3], "> 0"),
    ("two", [1e-3, math.nan], "finitos"),
    ("two", [math.inf, 1e-3], "finitos"),
])
def test_fit_rejects_bad_input(costs, times, words):
    if costs == "two":
        cfg = get_preset("llama-3.1-8b")
        costs = [step_cost(cfg, [1], [10]), step_cost(cfg, [1, 1], [10, 10])]
    with pytest.raises(ValueError, match=re.escape(words)):
        fit_cost_model(costs, times, BW)


# --- speculative steps (chapter 9) ---------------------------------------------------------------
def spec_work(items):
    return [(0.0, p, params(max(m, 6))) for p, m in items[:6]]


def test_speculative_simulation_with_every_draft_kept_makes_the_real_engines_decisions(tiny, items):
    from ai_evolution.engine import build_engine
    from ai_evolution.sim import SimSpeculation

    real = build_engine(tiny, max_num_seqs=3, max_model_len=MAX_LEN, draft_model=tiny,
                        num_speculative_tokens=3)  # the target drafts for itself: all kept
    real.run(spec_work(items))
    sim = sim_engine(tiny.config, COST, 3, MAX_LEN, speculation=SimSpeculation(1.0, 3))
    sim.run(spec_work(items))
    assert schedule(sim) == schedule(real)
    assert [e.num_draft_tokens for h in sim.history for e in h.scheduled] == \
        [e.num_draft_tokens for h in real.history for e in h.scheduled]
    assert sim.executor.num_accepted == sim.executor.num_drafts > 0


def test_speculative_simulation_draws_the_acceptance_it_is_given(tiny, items):
    from ai_evolution.sim import SimSpeculation
    from ai_evolution.sim.speculation import expected_tokens_per_step

    alpha, k = 0.6, 4
    sim = sim_engine(tiny.config, COST, 8, MAX_LEN, speculation=SimSpeculation(alpha, k, seed=1))
    reqs = sim.run([(0.0, p[:20], params(60)) for p, _ in items])
    ex = sim.executor
    assert ex.num_accepted / ex.num_examined == pytest.approx(alpha, abs=0.04)
    # tokens per verification of k drafts: the formula's, within the draws' noise
    full = [kept + 1 for drafted, kept in ex.verifications if drafted == k]
    assert len(full) > 250
    assert sum(full) / len(full) == pytest.approx(expected_tokens_per_step(alpha, k), rel=0.06)
    assert all(len(r.output_token_ids) == 60 for r in reqs)
    none = sim_engine(tiny.config, COST, 8, MAX_LEN, speculation=SimSpeculation(0.0, k))
    assert none.run([(0.0, items[2][0], params(10))])[0].num_accepted_tokens == 0


def test_a_draft_models_proposals_cost_its_decode_steps_and_ngrams_cost_nothing(tiny, items):
    from ai_evolution.model import get_preset
    from ai_evolution.sim import SimSpeculation

    draft = get_preset("tiny-es").replace(num_layers=1, name="draft")
    runs = {}
    for name, cfg in (("ngram", None), ("draft", draft)):
        sim = sim_engine(tiny.config, COST, 3, MAX_LEN, speculation=SimSpeculation(0.5, 3, cfg))
        sim.run(spec_work(items))
        runs[name] = sim
    assert schedule(runs["ngram"]) == schedule(runs["draft"])  # same seed, same decisions
    plain = sum(cost_of(tiny.config, h) for h in runs["ngram"].history)
    assert runs["ngram"].executor.now() == pytest.approx(plain)
    drafting = sum(COST.step_time_s(step_cost(draft, [1], [e.context_len - e.num_tokens + j + 1]))
                   for h in runs["draft"].history for e in h.scheduled
                   for j in range(e.num_draft_tokens))
    assert drafting > 0
    assert runs["draft"].executor.now() == pytest.approx(plain + drafting)


@pytest.mark.parametrize("alpha, k, words", [(1.5, 2, "alpha .* entre 0 y 1"),
                                             (0.5, 0, "num_speculative_tokens .* entero >= 1")])
def test_sim_speculation_refuses_bad_values_in_spanish(alpha, k, words):
    from ai_evolution.sim import SimSpeculation

    with pytest.raises(ValueError, match=words):
        SimSpeculation(alpha, k)
