"""The token budget of chapter 5: chunked prefill and preemption by recompute under a budget.

A budget changes *when* each token is computed, never *which* token: every request must get exactly
the tokens it would get alone, whatever the budget, the KV layout, the pool size or the policy.
At every step the scheduler computes at most ``max_num_batched_tokens`` tokens, serves the running
requests (oldest first) before it admits anyone, splits a prompt that does not fit into chunks
that follow each other and sample nothing until the last one, and, when the paged cache runs out,
preempts the newest running request, which goes back to the head of the queue and later
recomputes everything it had (less what the prefix cache still holds).

``Watch`` checks every ``schedule()`` call as it happens; ``check_runs`` checks each request's
steps and timing record afterwards. No test asserts a duration: the machine is shared.
"""

from __future__ import annotations

import copy
import math
import random

import pytest
from hypothesis import given, settings, strategies as st

from ai_evolution.engine import (LLM, ContiguousKVManager, FinishReason, KVCacheManager, LLMEngine,
                                 ModelRunner, PolicyError, Request, RequestStatus, Scheduler,
                                 build_engine, newest_unfinished, tokens_for)
from ai_evolution.model.tokenizer import load_tokenizer
from ai_evolution.sim import SimExecutor, sim_engine, step_cost
from engine_helpers import PROPS, COST, SMALL, cdiv, check_done, greedy, schedule, solo

pytestmark = pytest.mark.usefixtures("one_thread")

POLICIES = ("static", "continuous")
MAX_LEN = 96      # tiny-es
SMALL_LEN = 40    # the small random model


# --- fixtures and helpers -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def workload(tiny):
    """10 requests on tiny-es: prompts of 1..60 tokens (most longer than the small budgets), 1..16
    new tokens, two seeded samples; with each one's solo, uncached continuation."""
    rng = random.Random(5)
    vocab = tiny.config.vocab_size
    lens = [60, 1, 45, 3, 33, 17, 52, 8, 25, 40]
    items = []
    for i, n in enumerate(lens):
        params = greedy(rng.randint(1, 16) if i else 16)
        if i in (2, 7):
            params = greedy(params.max_tokens, temperature=1.0, top_k=50, top_p=0.9, seed=30 + i)
        items.append(([rng.randrange(vocab) for _ in range(n)], params))
    return items, [solo(tiny, p, sp) for p, sp in items]


def oldest_unfinished(running):
    """A victim_fn that preempts the *oldest* running request instead of the newest."""
    return next(r for r in running if not r.is_finished)


class Watch:
    """Wraps ``engine.scheduler.schedule`` and checks every call as it returns:

    - no more tokens than the budget; a request never gets more than it needs, and without
      chunked prefill never less (no partial prompt);
    - the running requests come first, in join order, then the admissions in queue order; nobody
      is admitted while a running request got no tokens; with the default split
      (``exact_split``) every request gets exactly ``tokens_for(need, what is left, chunked)``;
    - a step that preempts admits nobody; the victims are the newest (or, with
      ``victim="oldest"``, the oldest) unfinished running requests; they go to the head of the
      queue in their old order, hold no KV and have forgotten what they computed; the counters
      add up (``preempted_tokens`` = what the victims had computed);
    - an admitted request starts at its prefix-cache hit (0 without prefix caching).

    It logs every preemption in ``events``: (step before which it happened, request id, tokens it
    had computed, tokens it had generated, its block table)."""

    def __init__(self, engine: LLMEngine, victim: str = "newest", exact_split: bool = True) -> None:
        self.engine, self.victim, self.exact_split = engine, victim, exact_split
        self.events: list[tuple[int, str, int, int, list[int]]] = []
        self.admissions: list[tuple[int, str, int, list[int]]] = []  # (step, id, start, block table)
        sched = engine.scheduler
        inner = sched._plan_once  # each planning round (schedule() may plan several)

        def watched():
            before = self._state()
            out = inner()
            self._check(out, before)
            return out

        sched._plan_once = watched

    def _state(self) -> dict:
        s = self.engine.scheduler
        return dict(unfinished=[r.request_id for r in s.running if not r.is_finished],
                    need={r.request_id: r.num_tokens - r.num_computed_tokens for r in s.running},
                    computed={r.request_id: r.num_computed_tokens for r in s.running},
                    outputs={r.request_id: len(r.output_token_ids) for r in s.running},
                    tables={r.request_id: s.kv.block_table(r.request_id) for r in s.running},
                    waiting=[r.request_id for r in s.waiting], preemptions=s.num_preemptions,
                    preempted_tokens=s.preempted_tokens, hits=getattr(s.kv, "hit_tokens", 0))

    def _check(self, out, b: dict) -> None:
        s = self.engine.scheduler
        budget, chunked = s.max_num_batched_tokens, s.enable_chunked_prefill
        got = {x.request_id: x for x in out.scheduled}
        assert len(got) == len(out.scheduled)
        if budget is not None:
            assert out.num_tokens <= budget, f"step {out.step}: {out.num_tokens} tokens > {budget}"
        for x in out.scheduled:
            r = self.engine.requests[x.request_id]
            assert 1 <= x.num_tokens and x.context_len <= r.num_tokens <= s.max_model_len
            if not chunked:  # a whole prompt (or recompute) at once, or one decode token
                assert x.context_len == r.num_tokens, f"step {out.step}: partial prompt for {r.request_id}"
        # preemptions
        k = len(out.preempted)
        assert s.num_preemptions - b["preemptions"] == k
        assert s.preempted_tokens - b["preempted_tokens"] == sum(b["computed"][v] for v in out.preempted)
        if k:
            assert not out.admitted, f"step {out.step} preempted {out.preempted} and admitted {out.admitted}"
            expected = b["unfinished"][::-1][:k] if self.victim == "newest" else b["unfinished"][:k]
            assert list(out.preempted) == expected
            assert [r.request_id for r in s.waiting][:k] == list(out.preempted[::-1])  # head, old order
            for v in out.preempted:
                r = self.engine.requests[v]
                assert r.status is RequestStatus.PREEMPTED and r.num_computed_tokens == 0
                assert r not in s.running and v not in s.kv.holders and v not in got
                self.events.append((out.step, v, b["computed"][v], b["outputs"][v], b["tables"][v]))
        # running first (join order), then the admissions (queue order)
        survivors = [rid for rid in b["unfinished"] if rid not in out.preempted]
        assert [x.request_id for x in out.scheduled] == [rid for rid in survivors if rid in got] + list(out.admitted)
        assert list(out.admitted) == b["waiting"][:len(out.admitted)]
        if out.admitted:
            left_out = [rid for rid in survivors if rid not in got]
            assert not left_out, f"step {out.step} admitted {out.admitted} before serving {left_out}"
        for rid in survivors:
            if rid in got:
                assert got[rid].start == b["computed"][rid]  # it goes on where it stopped
        hit_tokens = 0
        for rid in out.admitted:
            x = got[rid]
            if s.kv.prefix_caching:
                assert x.start % s.kv.block_size == 0 and x.start < self.engine.requests[x.request_id].num_tokens
            else:
                assert x.start == 0
            hit_tokens += x.start
            self.admissions.append((out.step, rid, x.start, list(x.block_ids)))
        assert getattr(s.kv, "hit_tokens", 0) - b["hits"] == hit_tokens
        if self.exact_split and self.victim == "newest":
            left = math.inf if budget is None else budget
            for rid in survivors:
                n = tokens_for(b["need"][rid], left, chunked)
                assert (got[rid].num_tokens if rid in got else 0) == n, (out.step, rid)
                left -= n
            for rid in out.admitted:
                x = got[rid]
                n = tokens_for(self.engine.requests[x.request_id].num_tokens - x.start, left, chunked)
                assert x.num_tokens == n >= 1, (out.step, rid)
                left -= n
            # continuous batching over free rows stops admitting only when the budget says so
            if (s.policy_name == "continuous" and isinstance(s.kv, ContiguousKVManager) and s.waiting
                    and len(s.running) < s.max_num_seqs):
                assert tokens_for(s.waiting[0].num_tokens, left, chunked) == 0

    def preempted_before(self, rid: str) -> list[int]:
        return [step for step, v, *_ in self.events if v == rid]


def watch(engine: LLMEngine, **kw) -> LLMEngine:
    engine.watch = Watch(engine, **kw)
    return engine


def drain(engine: LLMEngine) -> None:
    """Step to the end; after every step, exactly the requests whose step completed their pending
    tokens got a token (stamped at the end of the step) and the others (chunks) got nothing."""
    paged = isinstance(engine.scheduler.kv, KVCacheManager)
    while engine.has_unfinished_requests():
        before = {rid: len(r.output_token_ids) for rid, r in engine.requests.items()}
        outs = engine.step()
        h = engine.history[-1]
        grew = {rid for rid, r in engine.requests.items() if len(r.output_token_ids) != before[rid]}
        assert {o.request_id for o in outs} == grew
        for e in h.scheduled:
            r = engine.requests[e.request_id]
            if e.request_id in grew:
                assert len(r.output_token_ids) == before[e.request_id] + 1
                assert e.context_len == r.num_tokens - 1 and r.token_times[-1] == h.end
            else:
                assert e.context_len < r.num_tokens and len(r.token_times) == before[e.request_id]
        if paged:
            engine.scheduler.kv.check_invariants()
    engine.retire_finished()


def check_runs(engine: LLMEngine) -> None:
    """Each request's steps: contiguous chunks (a chunk starts where the previous one ended,
    except at admission, where it starts at the prefix-cache hit), a token exactly
    when a step completes all its pending tokens (so the first one, the TTFT, at the end of the
    step with the prompt's last chunk), never beyond its tokens, and a timing record that agrees."""
    sched, w = engine.scheduler, engine.watch
    B = sched.kv.block_size
    assert [h.step for h in engine.history] == list(range(len(engine.history)))
    for rid, r in engine.requests.items():
        pending = sorted(w.preempted_before(rid))
        assert len(pending) == r.num_preemptions
        computed, outputs, restart = 0, 0, True  # admitted: starts at its prefix-cache hit
        times, first_token_step, first_start = [], None, None
        for h in engine.history:
            while pending and pending[0] <= h.step:
                pending.pop(0)
                restart = True
            e = next((e for e in h.scheduled if e.request_id == rid), None)
            if e is None:
                continue
            first_start = h.start if first_start is None else first_start
            start = e.context_len - e.num_tokens
            if restart:  # (re)computes from the cached prefix (whole blocks), or from 0
                assert start % B == 0 and (start == 0 or sched.kv.prefix_caching), (rid, h.step, start)
                restart = False
            else:
                assert start == computed, (rid, h.step, start, computed)
            total = r.num_prompt_tokens + outputs
            assert e.context_len <= total and e.is_prefill == (start < r.num_prompt_tokens)
            if e.context_len == total:
                if outputs == 0:
                    first_token_step = h
                    assert e.context_len == r.num_prompt_tokens  # the prompt's last chunk
                outputs += 1
                times.append(h.end)
            computed = e.context_len
        assert not pending and not restart
        assert r.is_finished and outputs == len(r.output_token_ids) == r.sampling_params.max_tokens
        assert r.token_times == times and r.first_scheduled_time == first_start
        assert r.first_token_time == first_token_step.end and r.finish_time == times[-1]
        assert r.ttft == r.first_token_time - r.arrival_time
    assert sum(r.num_preemptions for r in engine.requests.values()) == sched.num_preemptions


def check_end(engine: LLMEngine) -> None:
    sched = engine.scheduler
    if isinstance(sched.kv, KVCacheManager):
        check_done(engine)
    else:
        assert all(r.is_finished for r in engine.requests.values())
        assert not sched.running and not sched.waiting and sched.kv.num_free == sched.max_num_seqs
    check_runs(engine)


def serve(engine: LLMEngine, items) -> list[Request]:
    reqs = [engine.add_request(p, sp, request_id=f"r{i}") for i, (p, sp) in enumerate(items)]
    drain(engine)
    check_end(engine)
    return reqs


def paged(model, width, max_len, budget, bs, num_blocks, caching=True, policy="continuous",
          chunked=True, **plugins) -> LLMEngine:
    """An engine on the real model with paged KV, built from its parts (to plug in a
    ``token_fn`` or a ``victim_fn``)."""
    kv = KVCacheManager(num_blocks, bs, max_len, caching)
    sched = Scheduler(width, max_len, policy, kv=kv, max_num_batched_tokens=budget,
                      enable_chunked_prefill=chunked, **plugins)
    return LLMEngine(sched, ModelRunner.for_kv(model, kv), model.config.vocab_size)


def tight_blocks(items, bs: int, max_len: int, extra: int = 0) -> int:
    """A pool where the longest request fits alone (with ``extra`` tokens to spare)."""
    return cdiv(max(min(len(p) + sp.max_tokens, max_len) for p, sp in items) + extra, bs)


# --- 1. exactness ---------------------------------------------------------------------------------
def test_tokens_for_splits_the_budget():
    assert tokens_for(5, 10, False) == tokens_for(5, 10, True) == tokens_for(5, 5, False) == 5
    assert tokens_for(5, math.inf, False) == 5
    assert tokens_for(5, 3, True) == 3 and tokens_for(5, 3, False) == 0
    assert tokens_for(5, 0, True) == tokens_for(5, 0, False) == 0
    assert tokens_for(1, 1, True) == 1


# (policy, layout, budget, block size, pool, prefix caching); pool "tight": the longest fits alone
TINY_CASES = [
    ("continuous", "contiguous", 7, None, None, None),
    ("static", "contiguous", 20, None, None, None),
    ("continuous", "paged", 7, 4, "tight", True),
    ("continuous", "paged", 33, 16, "tight", False),
    ("static", "paged", 100, 4, "tight", True),
    ("continuous", "paged", 2, 1, "roomy", True),
    ("static", "paged", 250, 8, "tight", False),
]


@pytest.mark.parametrize("case", TINY_CASES, ids=lambda c: "-".join(map(str, c)))
def test_tiny_requests_get_their_solo_tokens_under_a_budget(tiny, workload, case):
    policy, layout, budget, bs, pool, caching = case
    items, refs = workload
    kw = {}
    if layout == "paged":
        kw = dict(kv_layout="paged", block_size=bs, enable_prefix_caching=caching,
                  num_blocks=tight_blocks(items, bs, MAX_LEN, 4) if pool == "tight" else None)
    engine = watch(build_engine(tiny, max_num_seqs=4, max_model_len=MAX_LEN, policy=policy,
                                max_num_batched_tokens=budget, enable_chunked_prefill=True, **kw))
    assert engine.scheduler.max_num_batched_tokens == budget and engine.scheduler.enable_chunked_prefill
    reqs = serve(engine, items)
    for i, (r, ref) in enumerate(zip(reqs, refs)):
        assert r.output_token_ids == ref, f"request {i} ({len(r.prompt_token_ids)} tokens, {r.sampling_params})"
        assert r.finish_reason is FinishReason.LENGTH
    chunks = [e for h in engine.history for e in h.scheduled
              if e.context_len < engine.requests[e.request_id].num_prompt_tokens]
    if budget < 60:
        assert chunks, "no prompt was split"
    if pool == "tight":
        assert engine.scheduler.num_preemptions > 0
    else:
        assert engine.scheduler.num_preemptions == 0


@st.composite
def budget_workloads(draw):
    tok = st.integers(0, SMALL.vocab_size - 1)
    prefix = draw(st.lists(tok, min_size=4, max_size=12))
    items = []
    for i in range(draw(st.integers(2, 8))):
        shared = draw(st.booleans())
        prompt = (prefix if shared else []) + draw(st.lists(tok, min_size=0 if shared else 1, max_size=16))
        n = draw(st.integers(1, 10))
        if draw(st.integers(0, 5)) == 0:  # now and then a seeded sample
            params = greedy(n, temperature=draw(st.sampled_from([0.7, 1.3])), top_k=draw(st.sampled_from([None, 20])),
                            seed=draw(st.integers(0, 1000)))
        else:
            params = greedy(n)
        items.append((prompt, params))
    budget = draw(st.one_of(st.integers(1, 12), st.sampled_from([17, 40, 1000])))
    layout = draw(st.sampled_from(["contiguous", "paged", "paged"]))
    bs = draw(st.sampled_from([1, 2, 4, 8]))
    need = tight_blocks(items, bs, SMALL_LEN)
    num_blocks = need + draw(st.integers(0, 1) if draw(st.booleans()) else st.integers(0, 2 * need))
    return items, budget, layout, bs, num_blocks


@settings(max_examples=40, **PROPS)
@given(work=budget_workloads(), policy=st.sampled_from(POLICIES), width=st.integers(1, 4),
       caching=st.booleans())
def test_property_budgeted_engine_matches_solo_generate(small, work, policy, width, caching):
    items, budget, layout, bs, num_blocks = work
    engine = watch(build_engine(small, max_num_seqs=width, max_model_len=SMALL_LEN, policy=policy,
                                kv_layout=layout, block_size=bs, num_blocks=num_blocks,
                                enable_prefix_caching=caching, max_num_batched_tokens=budget,
                                enable_chunked_prefill=True))
    reqs = serve(engine, items)
    for r, (p, sp) in zip(reqs, items):
        assert r.output_token_ids == solo(small, p, sp), (len(p), sp)


def test_nothing_is_lost_when_the_pool_is_far_too_small(small, tiny):
    """Twelve requests at once on a pool that holds only the longest of them: everybody finishes
    with its own tokens, after many preemptions, some of them in the middle of a prompt."""
    mid_prompt = 0
    for seed, (budget, bs, caching, width) in enumerate([(3, 4, True, 6), (8, 2, False, 8),
                                                        (17, 4, True, 4), (40, 8, False, 12),
                                                        (5, 1, True, 5)]):
        rng = random.Random(seed)
        items = [([rng.randrange(SMALL.vocab_size) for _ in range(rng.randint(5, 26))],
                  greedy(rng.randint(3, 12))) for _ in range(12)]
        num_blocks = tight_blocks(items, bs, SMALL_LEN)
        engine = watch(build_engine(small, max_num_seqs=width, max_model_len=SMALL_LEN,
                                    kv_layout="paged", block_size=bs, num_blocks=num_blocks,
                                    enable_prefix_caching=caching, max_num_batched_tokens=budget,
                                    enable_chunked_prefill=True))
        reqs = serve(engine, items)
        for r, (p, sp) in zip(reqs, items):
            assert r.output_token_ids == solo(small, p, sp), (seed, r.request_id)
        s = engine.scheduler
        assert s.num_preemptions > 0 and s.preempted_tokens > 0, seed
        assert engine.kv_usage()["num_preemptions"] == s.num_preemptions
        mid_prompt += sum(1 for _, _, computed, outputs, _ in engine.watch.events if outputs == 0 and computed)
    assert mid_prompt > 0, "no request was preempted in the middle of its prompt"
    # and on tiny-es, with seeded samples among the requests
    rng = random.Random(9)
    items = [([rng.randrange(tiny.config.vocab_size) for _ in range(rng.randint(10, 40))],
              greedy(rng.randint(3, 10), **({"temperature": 1.0, "seed": i} if i % 3 == 0 else {})))
             for i in range(8)]
    engine = watch(build_engine(tiny, max_num_seqs=8, max_model_len=MAX_LEN, kv_layout="paged",
                                block_size=4, num_blocks=tight_blocks(items, 4, MAX_LEN),
                                max_num_batched_tokens=11, enable_chunked_prefill=True))
    reqs = serve(engine, items)
    assert [r.output_token_ids for r in reqs] == [solo(tiny, p, sp) for p, sp in items]
    assert engine.scheduler.num_preemptions > 0


# --- 2. the budget, step by step -------------------------------------------------------------------
def test_a_long_prompt_is_chunked_alongside_the_others_decodes(small):
    """A budget of 8: a running request keeps decoding while a 30-token prompt arrives in chunks
    of what is left (7 each); only the chunk that completes the prompt samples."""
    rng = random.Random(1)
    short = [rng.randrange(97) for _ in range(5)]
    long = [rng.randrange(97) for _ in range(30)]
    engine = watch(build_engine(small, max_num_seqs=2, max_model_len=SMALL_LEN,
                                max_num_batched_tokens=8, enable_chunked_prefill=True))
    a = engine.add_request(short, greedy(8), request_id="a")
    engine.step()
    b = engine.add_request(long, greedy(3), request_id="b")
    drain(engine)
    check_end(engine)
    steps = [[(e.request_id, e.num_tokens, e.context_len) for e in h.scheduled] for h in engine.history]
    assert steps[:6] == [[("a", 5, 5)], [("a", 1, 6), ("b", 7, 7)], [("a", 1, 7), ("b", 7, 14)],
                         [("a", 1, 8), ("b", 7, 21)], [("a", 1, 9), ("b", 7, 28)],
                         [("a", 1, 10), ("b", 2, 30)]]
    hist = engine.history
    assert b.first_scheduled_time == hist[1].start and b.first_token_time == hist[5].end
    assert b.token_times[0] == hist[5].end and len(b.token_times) == 3
    assert a.output_token_ids == solo(small, short, greedy(8))
    assert b.output_token_ids == solo(small, long, greedy(3))


def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room(small):
    """Budget 40 = max_model_len, no chunking: a 36-token prompt that does not fit in what the
    step has left waits for the next one instead of being split."""
    rng = random.Random(2)
    prompts = [[rng.randrange(97) for _ in range(n)] for n in (6, 6, 6, 36)]
    engine = watch(build_engine(small, max_num_seqs=4, max_model_len=SMALL_LEN,
                                max_num_batched_tokens=SMALL_LEN, enable_chunked_prefill=False))
    reqs = [engine.add_request(p, greedy(n)) for p, n in zip(prompts, (6, 6, 6, 3))]
    drain(engine)
    check_end(engine)
    first = [(h.step, [(e.request_id, e.num_tokens) for e in h.scheduled]) for h in engine.history[:2]]
    # step 0: the three short prompts (18 tokens) leave 22, too few for the 36-token one
    assert first[0] == (0, [("0", 6), ("1", 6), ("2", 6)])
    # step 1: three decodes leave 37: the long prompt goes in whole
    assert first[1] == (1, [("0", 1), ("1", 1), ("2", 1), ("3", 36)])
    for r, p in zip(reqs, prompts):
        assert r.output_token_ids == solo(small, p, r.sampling_params)


def test_budget_one_computes_one_token_per_step(small):
    rng = random.Random(3)
    items = [([rng.randrange(97) for _ in range(n)], greedy(m)) for n, m in ((4, 3), (6, 2), (1, 4))]
    engine = watch(build_engine(small, max_num_seqs=3, max_model_len=SMALL_LEN,
                                max_num_batched_tokens=1, enable_chunked_prefill=True))
    reqs = serve(engine, items)
    assert all(h.num_tokens == 1 and h.batch_size == 1 for h in engine.history)
    # every token computed exactly once, the oldest request first
    assert len(engine.history) == sum(len(p) + sp.max_tokens - 1 for p, sp in items)
    order = [h.scheduled[0].request_id for h in engine.history]
    assert order == ["r0"] * 6 + ["r1"] * 7 + ["r2"] * 4
    assert [r.output_token_ids for r in reqs] == [solo(small, p, sp) for p, sp in items]


def test_the_constructor_refuses_a_budget_it_cannot_honour():
    with pytest.raises(ValueError) as info:
        Scheduler(4, 64, max_num_batched_tokens=32)
    for w in ("sin prefill troceado", "max_num_batched_tokens (32)", "max_model_len (64)",
              "enable_chunked_prefill"):
        assert w in str(info.value), str(info.value)
    for bad in (32.0, "64", True, 0, -3):
        with pytest.raises(ValueError, match=r"max_num_batched_tokens debe ser un entero >= 1 o None"):
            Scheduler(4, 64, max_num_batched_tokens=bad, enable_chunked_prefill=True)
    # accepted: no budget, a budget of max_model_len, any budget with chunking
    assert Scheduler(4, 64).max_num_batched_tokens is None
    assert Scheduler(4, 64, max_num_batched_tokens=64).max_num_batched_tokens == 64
    assert Scheduler(4, 64, max_num_batched_tokens=1, enable_chunked_prefill=True).enable_chunked_prefill


def test_build_engine_and_llm_refuse_it_too(tiny):
    with pytest.raises(ValueError, match="sin prefill troceado"):
        build_engine(tiny, max_num_seqs=2, max_model_len=64, max_num_batched_tokens=16)
    with pytest.raises(ValueError, match="debe ser un entero"):
        LLM(tiny, max_model_len=64, max_num_batched_tokens=16.5, enable_chunked_prefill=True)


def test_llm_with_chunked_prefill_generates_exact_greedy_text(tiny):
    tok = load_tokenizer("tiny-es")
    texts = ["Había una vez un pequeño pueblo junto al río, donde todos los días",
             "El tren", "La ciudad estaba en silencio cuando la lluvia empezó a caer sobre los tejados"]
    params = [greedy(n) for n in (12, 5, 9)]
    llm = LLM(tiny, tokenizer=tok, max_num_seqs=2, max_model_len=MAX_LEN, max_num_batched_tokens=6,
              enable_chunked_prefill=True, kv_layout="paged", block_size=4)
    watch(llm.engine)
    outs = llm.generate(texts, params)
    assert max(len(tok.encode(t, add_bos=True)) for t in texts) > 12  # chunked over 3+ steps
    for text, sp, o in zip(texts, params, outs):
        ref = solo(tiny, tok.encode(text, add_bos=True), sp)
        assert o.error is None and o.token_ids == ref and o.text == tok.decode(ref)
    assert max(h.num_tokens for h in llm.engine.history) <= 6
    check_end(llm.engine)


# --- 3. preemption ---------------------------------------------------------------------------------
@pytest.mark.parametrize("caching", (True, False), ids=("cache", "nocache"))
def test_preempted_request_goes_first_and_recomputes_what_it_had(small, caching):
    """A and B grow in a 10-block pool (4 tokens a block) until A finds no block: B, the newest, is
    preempted, goes back in front of C, and nobody is admitted in that step although C would fit.
    B comes back before C and recomputes its prompt and its tokens. With prefix caching it starts
    after its first blocks, still cached, found in the same physical blocks (and it needs them
    all at once, so it waits for A to finish); without, it starts from 0 as soon as its first
    chunk fits, and A's growth may preempt it again."""
    rng = random.Random(4)
    pa, pb, pc = ([rng.randrange(97) for _ in range(n)] for n in (12, 12, 2))
    engine = watch(paged(small, width=2, max_len=SMALL_LEN, budget=10, bs=4, num_blocks=10,
                         caching=caching))
    a = engine.add_request(pa, greedy(20), request_id="A")
    b = engine.add_request(pb, greedy(20), request_id="B")
    c = engine.add_request(pc, greedy(2), request_id="C")
    drain(engine)
    check_end(engine)
    w, s, hist = engine.watch, engine.scheduler, engine.history
    victims = [v for _, v, *_ in w.events]
    assert set(victims) == {"B"} and b.num_preemptions == len(victims) and a.num_preemptions == 0
    assert s.num_preemptions == len(victims) and s.preempted_tokens == sum(ev[2] for ev in w.events)
    step, _, computed, outputs, old_table = w.events[0]
    assert computed == 12 + outputs - 1 and outputs > 0 and len(old_table) == cdiv(computed, 4)
    # the step that preempted (it ran A alone) left a place free for C, and C was not admitted
    assert [e.request_id for e in hist[step].scheduled] == ["A"]
    assert "C" not in hist[step].holders and len(hist[step].holders) == 1
    # B came back before C (head of the queue) and recomputed prompt + generated tokens
    returns = [(at, start, table) for at, rid, start, table in w.admissions if rid == "B"][1:]
    c_first = next(at for at, rid, *_ in w.admissions if rid == "C")
    assert len(returns) == len(victims) and step < returns[0][0] < c_first
    for (back, start, table), (pre, *_) in zip(returns, w.events):
        entry = next(e for e in hist[back].scheduled if e.request_id == "B")
        assert pre < back and entry.context_len - entry.num_tokens == start
    back, start, table = returns[0]
    if caching:
        assert len(victims) == 1 and start > 0, "B's first blocks should still be cached"
        assert table[:start // 4] == old_table[:start // 4]  # the same physical blocks
        assert all(hist[back].start > t for t in a.token_times)  # it waited for A to finish
        assert engine.kv_usage()["prefix_hit_tokens"] >= start
        # from its return, B recomputes everything it had (prompt + tokens) before it samples again
        after = [(h, e) for h in hist[back:] for e in h.scheduled if e.request_id == "B"]
        k = next(i for i, (_, e) in enumerate(after) if e.context_len == 12 + outputs)
        assert sum(e.num_tokens for _, e in after[:k + 1]) == 12 + outputs - start
        assert b.token_times[outputs] == after[k][0].end and b.token_times[outputs - 1] < after[0][0].start
    else:
        assert all(start == 0 for _, start, _ in returns)
    for r, p, n in ((a, pa, 20), (b, pb, 20), (c, pc, 2)):
        assert r.output_token_ids == solo(small, p, greedy(n))


# --- 4. plug-ins -----------------------------------------------------------------------------------
def test_a_token_fn_equal_to_tokens_for_gives_the_same_schedule(small):
    rng = random.Random(6)
    items = [([rng.randrange(97) for _ in range(rng.randint(3, 25))], greedy(rng.randint(2, 9)))
             for _ in range(7)]
    nb = tight_blocks(items, 2, SMALL_LEN, 6)
    calls = []

    def same_split(want, budget, chunked):
        calls.append((want, budget, chunked))
        return tokens_for(want, budget, chunked)

    default = watch(paged(small, 3, SMALL_LEN, 9, 2, nb))
    custom = watch(paged(small, 3, SMALL_LEN, 9, 2, nb, token_fn=same_split))
    for e in (default, custom):
        serve(e, items)
    assert calls and all(c is True for _, _, c in calls)
    assert schedule(custom) == schedule(default) and default.scheduler.num_preemptions > 0
    assert custom.watch.events == default.watch.events
    for rid, r in default.requests.items():
        assert custom.requests[rid].output_token_ids == r.output_token_ids == solo(small, *items[int(rid[1:])])


def test_a_token_fn_with_small_chunks_still_gives_exact_outputs(small):
    rng = random.Random(7)
    items = [([rng.randrange(97) for _ in range(rng.randint(3, 25))], greedy(rng.randint(2, 9)))
             for _ in range(5)]

    def chunks_of_three(want, budget, chunked):
        return min(tokens_for(want, budget, chunked), 3)

    engine = watch(paged(small, 3, SMALL_LEN, 20, 4, 30, token_fn=chunks_of_three), exact_split=False)
    reqs = serve(engine, items)
    assert max(e.num_tokens for h in engine.history for e in h.scheduled) == 3
    assert [r.output_token_ids for r in reqs] == [solo(small, p, sp) for p, sp in items]


BAD_SPLITS = {
    "too-many": (lambda want, budget, chunked: want + 1, "2"),
    "over-budget": (lambda want, budget, chunked: want, "30"),
    "negative": (lambda want, budget, chunked: -1, "-1"),
    "float": (lambda want, budget, chunked: float(tokens_for(want, budget, chunked)), "4.0"),
    "bool": (lambda want, budget, chunked: True, "True"),
}


@pytest.mark.parametrize("name", BAD_SPLITS)
def test_a_bad_token_fn_raises_policy_error(small, name):
    fn, shown = BAD_SPLITS[name]
    want = 30 if name == "over-budget" else (1 if name == "too-many" else 4)
    engine = paged(small, 2, SMALL_LEN, 4 if name == "over-budget" else 8, 4, 20, token_fn=fn)
    engine.add_request(list(range(want)), greedy(3))
    with pytest.raises(PolicyError) as info:
        engine.step()
    msg = str(info.value)
    for w in ("el reparto de tokens devolvió", shown, "debe ser un entero entre 0 y"):
        assert w in msg, msg
    assert not engine.history


def test_a_victim_fn_that_takes_the_oldest_still_gives_exact_outputs(small):
    rng = random.Random(8)
    items = [([rng.randrange(97) for _ in range(rng.randint(4, 20))], greedy(rng.randint(4, 12)))
             for _ in range(6)]
    nb = tight_blocks(items, 4, SMALL_LEN, 4)
    default = watch(paged(small, 4, SMALL_LEN, 12, 4, nb))
    oldest = watch(paged(small, 4, SMALL_LEN, 12, 4, nb, victim_fn=oldest_unfinished), victim="oldest")
    assert default.scheduler.victim_fn is newest_unfinished
    for e in (default, oldest):
        reqs = serve(e, items)
        assert [r.output_token_ids for r in reqs] == [solo(small, p, sp) for p, sp in items]
        assert e.scheduler.num_preemptions > 0
    assert schedule(oldest) != schedule(default)
    assert [v for _, v, *_ in oldest.watch.events] != [v for _, v, *_ in default.watch.events]


def test_a_bad_victim_raises_policy_error(small):
    """Static batching keeps a finished request's blocks until its batch ends: A (one token) has
    finished while B grows; when B finds no block, a victim_fn that names A, a request from
    nowhere or a copy of B (equal to B, but not B) is refused, and B is still in the batch."""
    for victim_fn, shown in ((lambda running: running[0], "'A'"),
                             (lambda running: Request("intrusa", [1], greedy(1)), "'intrusa'"),
                             (lambda running: None, "None"),
                             (lambda running: copy.copy(newest_unfinished(running)), "'B'")):
        engine = paged(small, 2, SMALL_LEN, 40, 4, 8, policy="static", victim_fn=victim_fn)
        engine.add_request(list(range(12)), greedy(1), request_id="A")
        engine.add_request(list(range(20, 32)), greedy(20), request_id="B")
        with pytest.raises(PolicyError) as info:
            for _ in range(30):
                engine.step()
        msg = str(info.value)
        assert "la víctima elegida" in msg and shown in msg and "no es una petición en curso sin terminar" in msg
        assert engine.requests["A"].is_finished and not engine.requests["B"].is_finished
        assert any(r is engine.requests["B"] for r in engine.scheduler.running)


# --- 5. the simulator ------------------------------------------------------------------------------
SIM_CASES = [("continuous", 16, True, 4, True), ("continuous", 5, True, 4, False),
             ("static", 48, True, 16, True), ("continuous", MAX_LEN, False, 4, True)]


@pytest.mark.parametrize("case", SIM_CASES, ids=lambda c: "-".join(map(str, c)))
def test_simulator_makes_the_budgeted_engines_decisions(tiny, workload, case):
    policy, budget, chunked, bs, caching = case
    items = [(p, greedy(sp.max_tokens)) for p, sp in workload[0]]  # the simulator samples nothing
    nb = tight_blocks(items, bs, MAX_LEN, 8)
    real = watch(build_engine(tiny, max_num_seqs=4, max_model_len=MAX_LEN, policy=policy,
                              kv_layout="paged", block_size=bs, num_blocks=nb,
                              enable_prefix_caching=caching, max_num_batched_tokens=budget,
                              enable_chunked_prefill=chunked))
    sim = watch(sim_engine(tiny.config, COST, 4, MAX_LEN, policy, kv=KVCacheManager(nb, bs, MAX_LEN, caching),
                           max_num_batched_tokens=budget, enable_chunked_prefill=chunked))
    assert isinstance(sim.executor, SimExecutor)
    assert (sim.scheduler.max_num_batched_tokens, sim.scheduler.enable_chunked_prefill) == (budget, chunked)
    for e in (real, sim):
        serve(e, items)
    assert schedule(sim) == schedule(real) and len(sim.history) > 1
    assert [h.holders for h in sim.history] == [h.holders for h in real.history]
    assert sim.watch.events == real.watch.events and sim.watch.admissions == real.watch.admissions
    ru, su = real.kv_usage(), sim.kv_usage()
    for key in ("num_preemptions", "preempted_tokens", "prefix_hit_tokens", "prefix_queried_tokens",
                "evictions"):
        assert ru[key] == su[key], key
    assert su["num_preemptions"] > 0
    if chunked:
        assert any(e.context_len < sim.requests[e.request_id].num_prompt_tokens
                   for h in sim.history for e in h.scheduled)
    for rid, r in real.requests.items():
        s = sim.requests[rid]
        assert s.num_preemptions == r.num_preemptions
        assert len(s.token_times) == len(r.token_times) == r.sampling_params.max_tokens
    # the clock charges exactly the tokens of each step: chunks, recomputes and decodes
    expected = [COST.step_time_s(step_cost(tiny.config, h.query_lens, h.context_lens)) for h in sim.history]
    assert sim.executor.step_times == pytest.approx(expected, rel=1e-12)
    assert all(h.num_tokens <= budget for h in sim.history)
