"""The serving engine of chapter 3: requests, scheduler, policies, KV slots and the model runner.

The engine must give every request exactly the tokens it would get alone (batching is a
throughput trick, never a change of output), keep its bookkeeping honest (one owner per KV row,
batches no wider than ``max_num_seqs``, every row free at the end), refuse bad input without
disturbing what is in flight, and fill a coherent timing record for every request.

No test asserts a duration: the machine is shared, so only orderings and identities of the
timestamps are checked.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from ai_evolution.engine import (LLM, BatchPlan, FinishReason, LLMEngine, ModelRunner, PolicyError,
                                 Request, RequestRejected, RequestStatus, SamplingParams, Scheduler,
                                 continuous_batching)
from ai_evolution.generation import generate
from ai_evolution.sim import RooflineCostModel, sim_engine
from engine_helpers import SMALL, greedy

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_LEN = 128
POLICIES = ("static", "continuous")
WIDTHS = (1, 3, 8)
NUM_REQUESTS = 16
SMALL_LEN = 32


# --- fixtures and helpers -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def workload(tiny):
    """16 (prompt, max_tokens) pairs with prompts of 1..60 tokens and 1..30 new tokens (both ends
    included), and each one's solo, uncached greedy continuation."""
    rng = random.Random(0)
    vocab = tiny.config.vocab_size
    lens = [1, 60] + [rng.randint(1, 60) for _ in range(NUM_REQUESTS - 2)]
    news = [30, 1] + [rng.randint(1, 30) for _ in range(NUM_REQUESTS - 2)]
    items = [([rng.randrange(vocab) for _ in range(n)], m) for n, m in zip(lens, news)]
    refs = [generate(tiny, p, m, cache=None)[0] for p, m in items]
    return items, refs


class StepClock:
    """A ``ModelRunner`` whose clock counts steps (1 s each) instead of reading the wall: online
    arrivals then give the same schedule on every machine."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner, self.t = runner, 0.0

    def now(self) -> float:
        return self.t

    def idle_until(self, t: float) -> None:
        self.t = max(self.t, t)

    def execute(self, out):
        tokens = self.runner.execute(out)
        self.t += 1.0
        return tokens


def make_engine(model, max_num_seqs: int, policy="continuous", max_model_len: int = MAX_LEN,
                eos_token_id: int | None = None, step_clock: bool = False) -> LLMEngine:
    runner = ModelRunner(model, max_num_seqs, max_model_len)
    return LLMEngine(Scheduler(max_num_seqs, max_model_len, policy),
                     StepClock(runner) if step_clock else runner, model.config.vocab_size,
                     eos_token_id)


def drain(engine: LLMEngine) -> None:
    """Step until every request has finished, then retire the last ones (as ``run`` does)."""
    while engine.has_unfinished_requests():
        engine.step()
    engine.retire_finished()


def check_bookkeeping(engine: LLMEngine) -> None:
    """Invariants of the step history and the KV placement, for any policy and workload."""
    sched, hist = engine.scheduler, engine.history
    width = sched.max_num_seqs
    assert [h.step for h in hist] == list(range(len(hist)))
    owner_of_slot: dict[int, str] = {}
    slot_of: dict[str, int] = {}
    left: set[str] = set()
    computed: dict[str, int] = {}
    for h in hist:
        assert 1 <= h.batch_size <= width, f"step {h.step}: batch of {h.batch_size} > {width}"
        assert h.num_blocks == width and len(h.holders) <= width
        assert len(set(h.holders.values())) == len(h.holders), f"step {h.step}: a row has two owners {h.holders}"
        assert all(0 <= s < width for s in h.holders.values())
        ids = [e.request_id for e in h.scheduled]
        assert len(set(ids)) == len(ids)
        # a request keeps one row while it holds it, and never comes back once it has left
        for rid, slot in h.holders.items():
            assert rid not in left, f"{rid} holds a row again after leaving"
            assert slot_of.setdefault(rid, slot) == slot, f"{rid} moved from row {slot_of[rid]} to {slot}"
        for rid in set(owner_of_slot.values()) - set(h.holders):
            left.add(rid)
        owner_of_slot = {s: r for r, s in h.holders.items()}
        for e in h.scheduled:
            r = engine.requests[e.request_id]
            assert h.holders[e.request_id] == e.first_block
            assert r.arrival_time <= h.start
            before = computed.get(e.request_id, 0)
            # a prefill runs the whole prompt at once; every later step adds exactly one token
            if before == 0:
                assert e.is_prefill and e.num_tokens == e.context_len == r.num_prompt_tokens
            else:
                assert not e.is_prefill and e.num_tokens == 1 and e.context_len == before + 1
            assert e.context_len <= sched.max_model_len
            computed[e.request_id] = e.context_len
    for a, b in zip(hist, hist[1:]):
        assert a.start <= a.end <= b.start, "steps overlap or are out of order"
    assert sched.kv.num_free == width and not sched.kv.holders and not sched.running
    assert not sched.waiting


def check_timing(engine: LLMEngine, req: Request) -> None:
    """The request's timing record is ordered and agrees with the steps that produced it."""
    assert req.is_finished and req.finish_time is not None
    steps = [h for h in engine.history if any(e.request_id == req.request_id for e in h.scheduled)]
    n = len(req.output_token_ids)
    assert len(req.token_times) == n
    assert req.token_times == sorted(req.token_times)
    if req.finish_reason is FinishReason.ABORT:
        assert req.token_times == [h.end for h in steps][:n]
        return
    # one token per step, stamped at the end of the step that computed it
    assert len(steps) == n and req.token_times == [h.end for h in steps]
    assert req.first_scheduled_time == steps[0].start
    assert req.arrival_time <= req.first_scheduled_time <= req.first_token_time <= req.finish_time
    assert req.first_token_time == req.token_times[0] and req.finish_time == req.token_times[-1]
    assert req.ttft == req.first_token_time - req.arrival_time
    assert req.e2e_latency == req.finish_time - req.arrival_time
    assert req.itls == [b - a for a, b in zip(req.token_times, req.token_times[1:])]
    if n == 1:
        assert req.tpot is None
    else:
        assert req.tpot == pytest.approx((req.token_times[-1] - req.token_times[0]) / (n - 1))
        assert req.tpot == pytest.approx(sum(req.itls) / (n - 1))


@pytest.fixture(scope="module")
def served(tiny, workload):
    """(policy, max_num_seqs) -> the engine after serving the workload, added in a shuffled order."""
    items, _ = workload
    out = {}
    for policy in POLICIES:
        for width in WIDTHS:
            engine = make_engine(tiny, width, policy)
            order = list(range(len(items)))
            random.Random(width).shuffle(order)
            for i in order:
                prompt, n = items[i]
                engine.add_request(prompt, greedy(n), request_id=f"r{i}")
            drain(engine)
            out[policy, width] = engine
    return out


# --- 1. exactness -----------------------------------------------------------------------------------
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("policy", POLICIES)
def test_every_request_gets_its_solo_greedy_tokens(served, workload, policy, width):
    items, refs = workload
    engine = served[policy, width]
    for i, ((prompt, n), ref) in enumerate(zip(items, refs)):
        req = engine.requests[f"r{i}"]
        assert req.output_token_ids == ref, f"request {i} (prompt {len(prompt)}, {n} tokens)"
        assert req.finish_reason is FinishReason.LENGTH and len(req.output_token_ids) == n
    check_bookkeeping(engine)


@pytest.mark.parametrize("policy", POLICIES)
def test_online_arrivals_get_their_solo_tokens(tiny, workload, policy):
    items, refs = workload
    # bunched and staggered arrivals, given out of time order, and one after a long idle gap
    times = [0, 0, 0.5, 2, 2, 3.5, 7, 7.25, 11, 12, 12, 13, 20, 21, 30, 1000]
    random.Random(5).shuffle(times)
    engine = make_engine(tiny, 3, policy, step_clock=True)
    arrivals = [(t, p, greedy(n)) for t, (p, n) in zip(times, items)]
    reqs = engine.run(arrivals)
    assert [r.prompt_token_ids for r in reqs] == [p for p, _ in items]  # in the order given
    assert [r.arrival_time for r in reqs] == times
    for r, ref in zip(reqs, refs):
        assert r.output_token_ids == ref
        check_timing(engine, r)
    last = reqs[times.index(1000)]
    assert last.first_scheduled_time == 1000.0  # the clock jumped over the idle gap
    assert [h.start for h in engine.history].count(1000.0) == 1
    check_bookkeeping(engine)


def test_wall_clock_arrivals_get_their_solo_tokens(tiny, workload):
    items, refs = workload
    times = [0.004 * ((7 * i) % len(items)) for i in range(len(items))]
    engine = make_engine(tiny, 3, "continuous")
    reqs = engine.run([(t, p, greedy(n)) for t, (p, n) in zip(times, items)])
    assert [r.output_token_ids for r in reqs] == refs
    for r in reqs:
        check_timing(engine, r)
    check_bookkeeping(engine)


@pytest.mark.parametrize("policy", POLICIES)
def test_requests_added_between_steps_get_their_solo_tokens(tiny, workload, policy):
    items, refs = workload
    engine = make_engine(tiny, 3, policy)
    waves = [range(0, 4), range(4, 9), range(9, len(items))]
    for wave, steps in zip(waves, (2, 5, 0)):
        for i in wave:
            engine.add_request(items[i][0], greedy(items[i][1]), request_id=f"r{i}")
        for _ in range(steps):
            engine.step()
    drain(engine)
    assert [engine.requests[f"r{i}"].output_token_ids for i in range(len(items))] == refs
    check_bookkeeping(engine)


@st.composite
def online_workloads(draw):
    n = draw(st.integers(1, 8))
    items = [(draw(st.lists(st.integers(0, SMALL.vocab_size - 1), min_size=1, max_size=20)),
              draw(st.integers(1, SMALL_LEN - 21))) for _ in range(n)]
    times = draw(st.lists(st.sampled_from([0.0, 0.0, 1.0, 2.5, 4.0, 9.0]), min_size=n, max_size=n))
    return items, times


@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(work=online_workloads(), policy=st.sampled_from(POLICIES), width=st.integers(1, 4))
def test_property_random_online_workloads_match_solo_generate(small, work, policy, width):
    items, times = work
    engine = make_engine(small, width, policy, max_model_len=SMALL_LEN, step_clock=True)
    reqs = engine.run([(t, p, greedy(n)) for t, (p, n) in zip(times, items)])
    for r, (p, n) in zip(reqs, items):
        assert r.output_token_ids == generate(small, p, n, cache=None)[0]
        check_timing(engine, r)
    check_bookkeeping(engine)


@pytest.mark.parametrize("policy", POLICIES)
def test_seeded_sampling_is_the_same_whatever_shares_the_batch(tiny, workload, policy):
    items, _ = workload
    rng = random.Random(11)
    params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=rng.choice([0.6, 1.0, 1.5]),
                             top_k=rng.choice([None, 1, 5, 50]), top_p=rng.choice([None, 0.5, 0.9, 1.0]),
                             seed=100 + i) for i, (_, n) in enumerate(items[:12])]
    params[3] = greedy(items[3][1])  # a greedy request among the sampled ones
    prompts = [p for p, _ in items[:12]] + [items[0][0]]
    params.append(params[0])  # the same prompt and seed twice in one batch
    refs = [generate(tiny, p, sp.max_tokens, cache="contiguous", temperature=sp.temperature,
                     top_k=sp.top_k, top_p=sp.top_p, seed=sp.seed)[0] for p, sp in zip(prompts, params)]
    assert len({tuple(r) for r in refs}) > 3  # the samples are not all the same
    for width, shuffle_seed in ((3, 1), (8, 2)):
        order = list(range(len(prompts)))
        random.Random(shuffle_seed).shuffle(order)
        outs = LLM(tiny, max_num_seqs=width, max_model_len=MAX_LEN, policy=policy).generate(
            [prompts[i] for i in order], [params[i] for i in order])
        for o, i in zip(outs, order):
            assert o.token_ids == refs[i], f"request {i} with width {width}: {params[i]}"
    assert refs[0] == refs[-1]


# --- 2. EOS, stop tokens and max_model_len ------------------------------------------------------
def first_new_index(tokens: list[int], start: int) -> int:
    """The first index >= start whose token does not appear earlier."""
    return next(i for i in range(start, len(tokens)) if tokens[i] not in tokens[:i])


def test_eos_and_stop_tokens_end_a_request_and_are_kept(tiny, workload):
    prompt = workload[0][3][0]
    ref = generate(tiny, prompt, 24, cache=None)[0]
    k = first_new_index(ref, 3)           # the token we declare EOS
    j = first_new_index(ref, k + 3)       # a later stop token
    engine = make_engine(tiny, 5, eos_token_id=ref[k])
    other_prompt, other_n = workload[0][5]
    reqs = {
        "eos": engine.add_request(prompt, SamplingParams(max_tokens=24)),
        "ignore": engine.add_request(prompt, SamplingParams(max_tokens=24, ignore_eos=True)),
        "stop": engine.add_request(prompt, SamplingParams(max_tokens=24, ignore_eos=True,
                                                          stop_token_ids=[ref[j]])),
        "both": engine.add_request(prompt, SamplingParams(max_tokens=24, stop_token_ids=[ref[j]])),
        "other": engine.add_request(other_prompt, greedy(other_n)),
    }
    drain(engine)
    assert reqs["eos"].output_token_ids == ref[:k + 1] and reqs["eos"].finish_reason is FinishReason.STOP
    assert reqs["ignore"].output_token_ids == ref and reqs["ignore"].finish_reason is FinishReason.LENGTH
    assert reqs["stop"].output_token_ids == ref[:j + 1] and reqs["stop"].finish_reason is FinishReason.STOP
    assert reqs["both"].output_token_ids == ref[:k + 1] and reqs["both"].finish_reason is FinishReason.STOP
    assert reqs["other"].output_token_ids == workload[1][5]
    for r in reqs.values():
        check_timing(engine, r)
    check_bookkeeping(engine)


def test_llm_uses_the_models_eos_and_honours_stop_token_ids(tiny):
    llm = LLM(tiny, max_num_seqs=2, max_model_len=64)
    assert llm.engine.eos_token_id == tiny.config.eos_token_id == 1
    ref = generate(tiny, [5, 6, 7], 20, cache=None)[0]
    stop = ref[first_new_index(ref, 2)]
    out, = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=20, stop_token_ids=[stop]))
    assert out.token_ids == ref[:ref.index(stop) + 1] and out.finish_reason is FinishReason.STOP


@pytest.mark.parametrize("policy", POLICIES)
def test_a_request_that_fills_max_model_len_finishes_with_length(tiny, workload, policy):
    items, refs = workload
    engine = make_engine(tiny, 3, policy, max_model_len=40)
    p30, p39 = (items[1][0] * 2)[:30], (items[1][0] * 2)[:39]
    long30 = engine.add_request(p30, greedy(100))
    long39 = engine.add_request(p39, greedy(5))
    short = engine.add_request(items[2][0][:10], greedy(items[2][1]))
    drain(engine)
    assert long30.output_token_ids == generate(tiny, p30, 10, cache=None)[0]
    assert long39.output_token_ids == generate(tiny, p39, 1, cache=None)[0]
    for r in (long30, long39):
        assert r.finish_reason is FinishReason.LENGTH and r.num_tokens == 40
    assert short.output_token_ids == generate(tiny, items[2][0][:10], items[2][1], cache=None)[0]
    check_bookkeeping(engine)


# --- 3. bad input ------------------------------------------------------------------------------------
V = 4054  # tiny-es's vocabulary (checked in the tests that use it)

BAD_PROMPTS = {
    "empty": ([], ["vacío", "al menos un token"]),
    "too-long": ([3] * MAX_LEN, [f"{MAX_LEN} tokens", f"max_model_len es {MAX_LEN}", f"máximo {MAX_LEN - 1}"]),
    "way-too-long": ([3] * (MAX_LEN + 50), ["max_model_len", f"máximo {MAX_LEN - 1}"]),
    "id-too-big": ([3, 4, V], ["token 2", f"({V})", "vocabulario", f"0..{V - 1}"]),
    "id-negative": ([-1, 4], ["token 0", "(-1)", f"0..{V - 1}"]),
    "id-float": ([3, 4.0], ["token 1", "4.0", f"0..{V - 1}"]),
    "id-bool": ([True, 4], ["token 0", "True", f"0..{V - 1}"]),
    "text-without-tokenizer": ("hola", ["lista de ids de token"]),
    "none": (None, ["lista de ids de token", f"0..{V - 1}", "NoneType"]),
    "number": (7, ["lista de ids de token", "int"]),
}

BAD_PARAMS = {
    "max_tokens-0": (dict(max_tokens=0), ["max_tokens", "entero >= 1", "0"]),
    "max_tokens-negative": (dict(max_tokens=-3), ["max_tokens", "entero >= 1", "-3"]),
    "max_tokens-float": (dict(max_tokens=2.5), ["max_tokens", "entero >= 1", "2.5"]),
    "temperature-negative": (dict(temperature=-0.5), ["temperature", ">= 0", "voraz", "-0.5"]),
    "temperature-nan": (dict(temperature=math.nan), ["temperature", "finito", "nan"]),
    "temperature-inf": (dict(temperature=math.inf), ["temperature", "finito", "inf"]),
    "top_p-0": (dict(top_p=0.0), ["top_p", "(0, 1]", "0.0"]),
    "top_p-big": (dict(top_p=1.5), ["top_p", "(0, 1]", "1.5"]),
    "top_p-negative": (dict(top_p=-0.1), ["top_p", "(0, 1]"]),
    "top_k-0": (dict(top_k=0), ["top_k", "entero >= 1", "None"]),
    "seed-float": (dict(seed=1.5), ["seed", "entero"]),
    "stop-negative": (dict(stop_token_ids=[-2]), ["stop_token_ids", "-2", "vocabulario", "enteros >= 0"]),
}


@pytest.mark.parametrize("name", BAD_PARAMS)
def test_bad_sampling_params_are_rejected_with_a_spanish_message(name):
    kwargs, words = BAD_PARAMS[name]
    with pytest.raises(RequestRejected) as info:
        SamplingParams(**kwargs)
    for w in words:
        assert w in str(info.value), str(info.value)


def test_every_problem_of_a_sampling_params_is_named():
    with pytest.raises(RequestRejected) as info:
        SamplingParams(max_tokens=0, temperature=-1, top_p=2)
    msg = str(info.value)
    assert "max_tokens" in msg and "temperature" in msg and "top_p" in msg


def snapshot(engine: LLMEngine):
    s = engine.scheduler
    return ([r.request_id for r in s.waiting], [r.request_id for r in s.running], s.kv.holders,
            s.kv.num_free, sorted(engine.requests), len(engine.history),
            {i: (list(r.output_token_ids), r.num_computed_tokens, r.status)
             for i, r in engine.requests.items()})


def test_rejected_requests_leave_the_engine_as_it_was(tiny, workload):
    items, refs = workload
    assert tiny.config.vocab_size == V
    engine = make_engine(tiny, 3, "continuous")
    for i in range(5):
        engine.add_request(items[i][0], greedy(items[i][1]))  # ids "0".."4"
    for _ in range(3):
        engine.step()
    bad_calls = [dict(prompt_token_ids=p) for p, _ in BAD_PROMPTS.values()]
    bad_calls += [
        dict(prompt_token_ids=[3, 4], params=SamplingParams(stop_token_ids=[V + 1])),
        dict(prompt_token_ids=[3, 4], params={"max_tokens": 3}),
        dict(prompt_token_ids=[3, 4], request_id="2"),  # duplicate of a running request
        dict(prompt_token_ids=[3, 4], request_id="0"),
    ]
    expected = [w for _, w in BAD_PROMPTS.values()] + [
        ["stop_token_ids", f"{V + 1}", f"0..{V - 1}"], ["SamplingParams", "dict"],
        ["ya existe", "request_id='2'", "None"], ["ya existe", "request_id='0'", "engine.requests"]]
    for call, words in zip(bad_calls, expected):
        before = snapshot(engine)
        with pytest.raises(RequestRejected) as info:
            engine.add_request(**call)
        for w in words:
            assert w in str(info.value), (call, str(info.value))
        assert snapshot(engine) == before, call
        if engine.has_unfinished_requests():
            engine.step()  # the requests in flight keep going between rejections
    late = engine.add_request(items[5][0], greedy(items[5][1]))
    assert late.request_id == "5"  # no rejected request consumed an id
    drain(engine)
    assert [engine.requests[str(i)].output_token_ids for i in range(6)] == refs[:6]
    check_bookkeeping(engine)


def test_llm_generate_answers_every_prompt_in_order(tiny, workload):
    items, refs = workload
    prompts = [items[0][0], [], items[1][0], [0, V], None, items[2][0], [5] * MAX_LEN, "texto",
               items[3][0], items[4][0]]
    params = [greedy(n) for n in (items[0][1], 4, items[1][1], 4, 4, items[2][1], 4, 4)]
    params += [SamplingParams(max_tokens=3, stop_token_ids=[V]), {"max_tokens": 2}]
    outs = LLM(tiny, max_num_seqs=3, max_model_len=MAX_LEN).generate(prompts, params)
    assert len(outs) == len(prompts)
    good = {0: refs[0], 2: refs[1], 5: refs[2]}
    why = {1: "vacío", 3: "vocabulario", 4: "lista de ids", 6: "max_model_len", 7: "tokenizador",
           8: "stop_token_ids", 9: "SamplingParams"}
    for i, o in enumerate(outs):
        assert o.finished
        if i in good:
            assert o.error is None and o.token_ids == good[i] and o.finish_reason is FinishReason.LENGTH
        else:
            assert o.finish_reason is FinishReason.REJECTED and o.token_ids == [], i
            assert why[i] in o.error, (i, o.error)
    assert outs[3].prompt_token_ids == [0, V]


# --- 4. policies ----------------------------------------------------------------------------------
@pytest.mark.parametrize("width", [3, 8])
def test_static_batching_holds_rows_until_the_whole_batch_finishes(served, width):
    engine = served["static", width]
    hist, reqs = engine.history, engine.requests
    batches = []
    for h in hist:
        holders = set(h.holders)
        running = {e.request_id for e in h.scheduled}
        # every holder that is not computing has finished: it only keeps its row
        assert running <= holders and all(reqs[r].finish_time <= h.start for r in holders - running)
        if not batches or holders != batches[-1]:
            if batches:
                # a new batch only once every member of the previous one is done, and none stays
                assert not holders & batches[-1]
                assert all(reqs[r].finish_time <= h.start for r in batches[-1])
            batches.append(holders)
            assert all(e.is_prefill for e in h.scheduled)  # the whole batch joins at once
        else:
            assert not any(e.is_prefill for e in h.scheduled)  # nobody joins meanwhile
    assert len(batches) == math.ceil(NUM_REQUESTS / width)
    assert all(len(b) == width for b in batches[:-1])
    assert any(len(h.holders) > h.batch_size for h in hist)  # some rows were held idle
    # each batch lasts as long as its longest member
    assert len(hist) == sum(max(reqs[r].sampling_params.max_tokens for r in b) for b in batches)


@pytest.mark.parametrize("width", WIDTHS)
def test_continuous_batching_refills_a_row_as_soon_as_it_frees(served, width):
    engine = served["continuous", width]
    hist, reqs = engine.history, engine.requests
    for h in hist:
        running = {e.request_id for e in h.scheduled}
        assert set(h.holders) == running  # no finished request keeps a row
        not_yet_admitted = [r for r in reqs.values() if r.first_scheduled_time > h.start]
        if not_yet_admitted:
            assert len(h.holders) == width  # someone waits, so no row is left empty
    for a, b in zip(hist, hist[1:]):
        finished = {r for r in a.holders if reqs[r].finish_time <= a.end}
        assert not finished & set(b.holders)
    if width == 1:
        assert len(hist) == sum(r.sampling_params.max_tokens for r in reqs.values())


@pytest.mark.parametrize("width", WIDTHS)
def test_continuous_never_takes_more_steps_than_static(served, width):
    static, cont = len(served["static", width].history), len(served["continuous", width].history)
    if width == 1:
        assert cont == static
    else:
        assert cont < static  # mixed output lengths: static waits for each batch's longest


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(lens=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 20)), min_size=1, max_size=14),
       width=st.integers(1, 5))
def test_property_continuous_never_takes_more_steps_than_static(lens, width):
    steps = {}
    for policy in POLICIES:
        engine = sim_engine(SMALL, RooflineCostModel(1e9, 1e12), width, SMALL_LEN + 30, policy)
        engine.run([(0.0, [1] * p, greedy(n)) for p, n in lens])
        steps[policy] = len(engine.history)
        assert engine.scheduler.kv.num_free == width
    assert steps["continuous"] <= steps["static"]
    if width == 1:
        assert steps["continuous"] == steps["static"] == sum(n for _, n in lens)


def retire_everyone(running, waiting, max_num_seqs):
    return BatchPlan(retire=list(running), admit=list(waiting[:max_num_seqs]))


def admit_a_stranger(running, waiting, max_num_seqs):
    stranger = Request("intrusa", [1, 2], SamplingParams())
    return BatchPlan(admit=[stranger])


def overfill(running, waiting, max_num_seqs):
    return BatchPlan(admit=list(waiting[:max_num_seqs + 1]))


def admit_twice(running, waiting, max_num_seqs):
    return BatchPlan(admit=[waiting[0], waiting[0]])


def retire_a_stranger(running, waiting, max_num_seqs):
    return BatchPlan(retire=[Request("fantasma", [1], SamplingParams())])


def return_none(running, waiting, max_num_seqs):
    return None


def return_a_tuple(running, waiting, max_num_seqs):
    return ([], list(waiting))


BAD_POLICIES = {
    "retires-unfinished": (retire_everyone, ["retire", "aún no han terminado", "is_finished"]),
    "admits-a-stranger": (admit_a_stranger, ["admit", "'intrusa'", "cola (waiting)"]),
    "retires-a-stranger": (retire_a_stranger, ["retire", "'fantasma'", "lote (running)"]),
    "overfills": (overfill, ["max_num_seqs es 2", "3 peticiones"]),
    "admits-twice": (admit_twice, ["admit", "repite"]),
    "returns-none": (return_none, ["BatchPlan", "NoneType"]),
    "returns-a-tuple": (return_a_tuple, ["BatchPlan", "tuple"]),
}


@pytest.mark.parametrize("name", BAD_POLICIES)
def test_a_policy_with_a_bad_plan_raises_policy_error(tiny, name):
    policy, words = BAD_POLICIES[name]
    engine = make_engine(tiny, 2, policy, max_model_len=32)
    for i in range(4):
        engine.add_request([3 + i, 4, 5], greedy(4))
    with pytest.raises(PolicyError) as info:
        for _ in range(3):  # retire_everyone only goes wrong once something runs
            engine.step()
    for w in words:
        assert w in str(info.value), str(info.value)
    # the plan was refused before it touched the batch or the KV rows
    s = engine.scheduler
    assert len(s.running) + s.kv.num_free == 2 and set(s.kv.holders) == {r.request_id for r in s.running}
    assert len(s.waiting) + len(s.running) == 4


def test_a_policy_that_admits_nobody_is_refused_instead_of_hanging(tiny):
    engine = make_engine(tiny, 2, lambda running, waiting, n: BatchPlan(), max_model_len=32)
    engine.add_request([3, 4], greedy(2))
    with pytest.raises(PolicyError, match="pendientes"):
        engine.step()


def test_unknown_policy_name_lists_the_accepted_ones():
    with pytest.raises(ValueError, match="static, continuous"):
        Scheduler(2, 32, "fifo")


def test_a_custom_policy_can_be_plugged_in(tiny, workload):
    items, refs = workload

    def newest_first(running, waiting, max_num_seqs):
        plan = continuous_batching(running, waiting, max_num_seqs)
        free = max_num_seqs - (len(running) - len(plan.retire))
        return BatchPlan(retire=plan.retire, admit=list(reversed(waiting))[:free])

    engine = make_engine(tiny, 3, newest_first)
    assert engine.scheduler.policy_name == "newest_first"
    for i, (p, n) in enumerate(items[:8]):
        engine.add_request(p, greedy(n), request_id=f"r{i}")
    drain(engine)
    assert {e.request_id for e in engine.history[0].scheduled} == {"r7", "r6", "r5"}
    assert [engine.requests[f"r{i}"].output_token_ids for i in range(8)] == refs[:8]
    check_bookkeeping(engine)


# --- 5. timing records and abort -----------------------------------------------------------------
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("policy", POLICIES)
def test_timing_records_are_ordered_and_consistent(served, policy, width):
    engine = served[policy, width]
    for req in engine.requests.values():
        check_timing(engine, req)
        m = req.sampling_params.max_tokens
        assert len(req.output_token_ids) == m


def test_step_outputs_report_the_requests_that_got_a_token(tiny, workload):
    items, _ = workload
    engine = make_engine(tiny, 2)
    a = engine.add_request(items[0][0], greedy(3))
    b = engine.add_request(items[1][0], greedy(1))
    c = engine.add_request(items[2][0], greedy(2))
    first = engine.step()
    assert [o.request_id for o in first] == [a.request_id, b.request_id]
    assert first[1].finished and first[1].finish_reason is FinishReason.LENGTH
    assert first[0].metrics["ttft"] == a.ttft and first[0].metrics["num_prompt_tokens"] == len(items[0][0])
    second = engine.step()  # b's row goes to c
    assert [o.request_id for o in second] == [a.request_id, c.request_id]
    assert engine.history[1].holders == {a.request_id: 0, c.request_id: 1}


@pytest.mark.parametrize("policy", POLICIES)
def test_abort_a_waiting_and_a_running_request(tiny, workload, policy):
    items, refs = workload
    engine = make_engine(tiny, 2, policy)
    reqs = [engine.add_request(p, greedy(n), request_id=f"r{i}") for i, (p, n) in enumerate(items[:5])]
    # r0 (30 tokens) and r1 (1 token) start; under continuous r2 takes r1's row at the next step
    for _ in range(3):
        engine.step()
    running = reqs[0]
    assert running.status is RequestStatus.RUNNING and len(running.output_token_ids) == 3
    waiting = reqs[4]
    assert waiting.status is RequestStatus.WAITING
    held_row = engine.scheduler.kv.holders["r0"]
    queued = {r.request_id for r in engine.scheduler.waiting} - {"r4"}
    engine.abort_request("r4")
    engine.abort_request("r0")
    engine.abort_request("no-such-request")  # unknown ids are ignored
    for r in (running, waiting):
        assert r.status is RequestStatus.FINISHED and r.finish_reason is FinishReason.ABORT
        assert r.finish_time is not None
    assert waiting not in engine.scheduler.waiting and waiting.output_token_ids == []
    assert running.output_token_ids == refs[0][:3]
    engine.step()
    last = engine.history[-1]
    assert "r0" not in {e.request_id for e in last.scheduled}
    if policy == "continuous":
        assert "r0" not in last.holders  # the row was freed at once and given to the next request
        owner = {s: r for r, s in last.holders.items()}[held_row]
        assert owner in queued
    drain(engine)
    engine.abort_request("r1")  # finished already: nothing changes
    assert reqs[1].finish_reason is FinishReason.LENGTH
    assert all(e.request_id != "r4" for h in engine.history for e in h.scheduled)
    assert waiting.first_scheduled_time is None and waiting.ttft is None
    for i in (1, 2, 3):
        assert reqs[i].output_token_ids == refs[i]
    assert len(running.output_token_ids) == 3  # nothing more after the abort
    for r in reqs:
        check_timing(engine, r)
    check_bookkeeping(engine)


def test_llm_generate_takes_one_prompt_or_a_batch_in_any_form(tiny, workload):
    items, refs = workload
    llm = LLM(tiny, max_num_seqs=2, max_model_len=MAX_LEN)
    (p0, n0), (p2, n2) = items[0], items[2]
    one = llm.generate(p0, greedy(n0))
    assert len(one) == 1 and one[0].token_ids == refs[0]
    as_tensor = llm.generate(torch.tensor(p2), greedy(n2))
    assert len(as_tensor) == 1 and as_tensor[0].token_ids == refs[2]
    batch = llm.generate(torch.tensor([p2[:5], p2[5:10]]), greedy(3))
    assert [o.token_ids for o in batch] == [generate(tiny, p, 3, cache=None)[0] for p in (p2[:5], p2[5:10])]
    # a bad first prompt does not turn the batch into one prompt
    outs = llm.generate([None, p0, torch.tensor(7)], [greedy(2), greedy(n0), greedy(2)])
    assert len(outs) == 3 and outs[1].token_ids == refs[0]
    assert outs[0].finish_reason is outs[2].finish_reason is FinishReason.REJECTED
    assert "lista de ids" in outs[0].error and outs[0].prompt_token_ids == []


def test_run_checks_every_arrival_before_serving_any(tiny):
    engine = make_engine(tiny, 2)
    good = (0.0, [5, 6, 7], greedy(2))
    for bad, words in (((0.0, [], greedy(2)), "vacío"), ((-1.0, [5], greedy(2)), "llegada"),
                       ((0.0, [5], {"max_tokens": 2}), "SamplingParams")):
        with pytest.raises(RequestRejected, match=rf"llegada 1: .*{words}"):
            engine.run([good, bad])
        assert not engine.requests and not engine.history  # nothing was added or run
    (req,) = engine.run([good])
    assert req.output_token_ids == generate(tiny, [5, 6, 7], 2, cache=None)[0]


# --- the step record names who joined, left and was preempted -------------------------------------
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_step_records_who_joined_left_and_was_preempted(tiny, workload, policy, layout):
    """Every request is admitted once plus once per preemption, retired exactly once (by a step's
    plan or by ``retire_finished`` at the end), and what the records say matches the counters."""
    from ai_evolution.engine import build_engine

    items, _ = workload
    # paged and tight: 12 blocks of 8 tokens for up to 4 requests of up to 90 tokens -> preemptions
    engine = build_engine(tiny, max_num_seqs=4, max_model_len=MAX_LEN, policy=policy,
                          kv_layout=layout, block_size=8,
                          num_blocks=12 if layout == "paged" else None)
    reqs = engine.run([(0.0, p, greedy(m)) for p, m in items])
    ids = [r.request_id for r in reqs]
    admitted = [rid for rec in engine.history for rid in rec.admitted]
    preempted = [rid for rec in engine.history for rid in rec.preempted]
    assert len(preempted) == engine.kv_usage()["num_preemptions"]
    if layout == "paged":
        assert preempted, "the tight paged cache should have preempted someone"
    for rid in ids:
        assert admitted.count(rid) == 1 + preempted.count(rid), rid
    retired = [rid for rec in engine.history for rid in rec.retired]
    # run() retired the rest with retire_finished(): a second call finds nobody
    assert engine.retire_finished() == []
    assert sorted(set(retired)) == sorted(retired) and set(retired) <= set(ids)
    assert engine.kv_usage()["blocks_used"] == 0 and engine.num_running == engine.num_waiting == 0
    for rec in engine.history:
        for rid in rec.retired:  # a retired request holds nothing after its step's plan
            assert rid not in rec.holders and engine.requests[rid].finish_time <= rec.start


def test_retire_finished_frees_what_static_batching_holds(tiny):
    """Static batching keeps finished members' rows until the batch ends; ``retire_finished`` is
    that end, named: it frees them, and only them."""
    engine = make_engine(tiny, 2, policy="static")
    short = engine.add_request([1, 2, 3], greedy(1))
    long = engine.add_request([4, 5, 6], greedy(6))
    engine.step()
    engine.step()
    assert short.is_finished and not long.is_finished
    assert short.request_id in engine.history[-1].holders  # held idle by the static batch
    assert engine.num_running == 1 and engine.num_waiting == 0
    assert engine.retire_finished() == [short.request_id]
    assert engine.scheduler.kv.holders == {long.request_id: engine.history[-1].holders[long.request_id]}
    drain(engine)
    assert engine.scheduler.kv.holders == {}
