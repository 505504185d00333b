"""Scheduling policies in the one scheduler (chapter 12): FCFS, vLLM's priority, VTC fair share.

A policy changes who runs when, never the tokens; VTC keeps the service difference between
backlogged tenants within its bound and stays work-conserving (property tests, in the
simulator); FCFS with a flooder breaks the bound (so the check can fail)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ai_evolution.engine import (EngineConfig, KVCacheManager, RequestRejected, SamplingParams,
                                 build_engine)
from ai_evolution.engine.scheduling_policy import (PriorityPolicy, SchedulingPolicy, VTCPolicy,
                                                   make_scheduling_policy, vtc_bound)
from ai_evolution.fairness import idle_while_backlogged, max_service_gap, tagged
from ai_evolution.sim import sim_engine
from engine_helpers import COST, PROPS, SMALL, greedy, solo

pytestmark = pytest.mark.usefixtures("one_thread")


def sim(max_num_seqs=2, max_model_len=64, policy="fcfs", **kw):
    return sim_engine(SMALL, COST, max_num_seqs, max_model_len, scheduling_policy=policy, **kw)


# --- configuration and validation --------------------------------------------------------------
@pytest.mark.parametrize("value", ["fifo", "", 3, SchedulingPolicy()])
def test_engine_config_refuses_an_unknown_scheduling_policy_naming_the_accepted_ones(value):
    with pytest.raises(ValueError, match="aceptadas: fcfs, priority, vtc"):
        EngineConfig(scheduling_policy=value)


def test_a_factory_that_makes_no_policy_is_refused():
    with pytest.raises(ValueError, match="debe crear una SchedulingPolicy; creó dict"):
        make_scheduling_policy(dict)


@pytest.mark.parametrize("tags, words", [
    ({"priority": 1.5}, "priority debe ser un entero"),
    ({"priority": True}, "priority debe ser un entero"),
    ({"priority": 2**63}, "priority debe ser un entero entre"),
    ({"tenant": ""}, "tenant debe ser None o un nombre de 1 a 128"),
    ({"tenant": 7}, "tenant debe ser None o un nombre"),
    ({"tenant": "x" * 129}, "tenant debe ser None o un nombre"),
])
def test_bad_tags_are_rejected_in_spanish_and_change_nothing(tags, words):
    engine = sim(policy="vtc")
    with pytest.raises(RequestRejected, match=words):
        engine.add_request([5, 6, 7], greedy(2), **tags)
    assert not engine.requests and not engine.scheduler.waiting
    assert not engine.scheduler.scheduling.priority and not engine.scheduler.scheduling.queued


def test_run_names_the_arrival_with_unknown_tags_and_adds_nothing():
    engine = sim()
    with pytest.raises(RequestRejected, match="llegada 1: etiquetas de planificación desconocidas"):
        engine.run([(0.0, [5, 6], greedy(2)), (0.0, [5, 6], greedy(2), {"prio": 1})])
    assert not engine.requests


# --- priority (vLLM's semantics) ----------------------------------------------------------------
def test_priority_admits_the_lowest_value_first_then_the_earliest_arrival():
    engine = sim(max_num_seqs=1, policy="priority")
    items = [(0.0, [5, 6, 7], greedy(2), {"priority": p}) for p in (2, 0, 1, 0)]
    reqs = engine.run(items)
    order = [rid for h in engine.history for rid in h.admitted]
    # all are queued before the first step: by (priority, arrival)
    assert order == [reqs[i].request_id for i in (1, 3, 2, 0)]
    fcfs = sim(max_num_seqs=1, policy="fcfs")
    fcfs.run(items)
    assert [rid for h in fcfs.history for rid in h.admitted] == ["0", "1", "2", "3"]


def test_priority_preempts_the_highest_value_then_the_latest_arrival():
    policy = PriorityPolicy()
    running = [SimpleReq(t) for t in (0.0, 1.0, 2.0, 3.0)]
    for r, p in zip(running, (5, 9, 9, 1)):
        policy.on_arrival(r, p)
    assert policy.victim(running) is running[2]
    running[2].is_finished = True
    assert policy.victim(running) is running[1]
    assert SchedulingPolicy().victim(running) is running[3]  # FCFS: the newest


class SimpleReq:
    """A stand-in with what the victim rules read (hashable by identity, as ``Request``)."""

    def __init__(self, arrival_time, num_prompt_tokens=4):
        self.arrival_time, self.num_prompt_tokens, self.is_finished = arrival_time, num_prompt_tokens, False


def test_paged_preemption_under_priority_takes_the_low_priority_request():
    items = [(0.0, [5] * 6, greedy(10), {"priority": p}) for p in (0, 1, 0)]
    first_victim = {}
    for policy in ("priority", "fcfs"):
        kv = KVCacheManager(num_blocks=6, block_size=4, max_model_len=64, enable_prefix_caching=False)
        engine = sim(max_num_seqs=3, policy=policy, kv=kv)
        reqs = engine.run(items)
        victims = [rid for h in engine.history for rid in h.preempted]
        first_victim[policy] = reqs[[r.request_id for r in reqs].index(victims[0])]
        assert reqs[0].num_preemptions == 0  # the first, highest-priority request never yields
    assert first_victim["priority"].request_id == "1"  # priority 1: the lowest priority
    assert first_victim["fcfs"].request_id == "2"  # the newest


# --- exactness ----------------------------------------------------------------------------------
def test_every_policy_gives_every_request_its_solo_tokens(small):
    rng = np.random.default_rng(0)
    items = []
    for i in range(7):
        prompt = rng.integers(3, SMALL.vocab_size, int(rng.integers(3, 12))).tolist()
        params = greedy(int(rng.integers(3, 12))) if i % 2 else SamplingParams(
            max_tokens=int(rng.integers(3, 12)), temperature=0.8, seed=i, ignore_eos=True)
        items.append((0.01 * (i // 3), prompt, params,
                      {"priority": int(rng.integers(0, 3)), "tenant": "ab"[i % 3 == 0]}))
    expected = [solo(small, p, sp) for _, p, sp, _ in items]
    for policy in ("fcfs", "priority", "vtc"):
        kv = KVCacheManager(num_blocks=7, block_size=4, max_model_len=64)
        engine = build_engine(small, EngineConfig(max_num_seqs=3, max_model_len=64,
                                                  scheduling_policy=policy), kv=kv)
        reqs = engine.run(items)
        assert [r.output_token_ids for r in reqs] == expected, policy
        assert engine.scheduler.num_preemptions > 0, policy  # the memory was really short


# --- VTC ----------------------------------------------------------------------------------------
def test_vtc_admits_the_polite_tenant_ahead_of_a_flooders_backlog():
    flood = [(0.0, [5] * 8, greedy(6), {"tenant": "flood"}) for _ in range(12)]
    polite = [(0.05, [6] * 8, greedy(6), {"tenant": "polite"})]
    waits = {}
    for policy in ("fcfs", "vtc"):
        engine = sim(max_num_seqs=2, policy=policy)
        reqs = engine.run(flood + polite)
        waits[policy] = reqs[-1].ttft
    assert waits["vtc"] < waits["fcfs"] / 3


def test_vtc_lifts_a_returning_tenants_counter_to_the_backlogged_minimum():
    policy = VTCPolicy()
    a1, a2, b1 = SimpleReq(0.0, 10), SimpleReq(0.0, 10), SimpleReq(1.0, 10)
    policy.on_arrival(a1, tenant="a")
    policy.on_arrival(a2, tenant="a")
    policy.on_admitted(a1)
    policy.on_output_tokens(a1, 5)
    assert policy.counters["a"] == 10 + 2 * 5
    policy.on_arrival(b1, tenant="b")  # b joins while a is backlogged: lifted to a's counter
    assert policy.counters["b"] == 20
    policy.on_admitted(a2)  # a leaves the queue
    policy.on_admitted(b1)  # b leaves the queue last
    assert policy.last_left == "b" and policy.counters["b"] == 30
    c1 = SimpleReq(2.0, 4)
    policy.on_arrival(c1, tenant="c")  # empty queue: lifted to the last tenant that left
    assert policy.counters["c"] == 30 and policy.served.get("c", 0) == 0


def flood_workload(seed, n_flood, n_polite, rate_ratio, prompt_max, out_max):
    rng = np.random.default_rng(seed)
    items, tenants = [], []
    for tenant, n, gap in (("flood", n_flood, 0.002), ("polite", n_polite, 0.002 * rate_ratio)):
        t = 0.0
        for _ in range(n):
            t += rng.exponential(gap)
            items.append((t, rng.integers(3, 90, int(rng.integers(1, prompt_max + 1))).tolist(),
                          greedy(int(rng.integers(1, out_max + 1))), {"tenant": tenant}))
            tenants.append(tenant)
    return items, tenants


@settings(max_examples=25, **PROPS)
@given(seed=st.integers(0, 10**6), n_tenants=st.integers(2, 4), n=st.integers(5, 30),
       width=st.integers(1, 4), prompt_max=st.integers(1, 12), out_max=st.integers(1, 12))
def test_vtc_service_gap_between_backlogged_tenants_stays_within_the_bound(
        seed, n_tenants, n, width, prompt_max, out_max):
    rng = np.random.default_rng(seed)
    items, tenants = [], []
    for k in range(n):
        tenant = f"t{int(rng.integers(0, n_tenants))}"
        items.append((float(rng.exponential(0.003) * k),
                      rng.integers(3, 90, int(rng.integers(1, prompt_max + 1))).tolist(),
                      greedy(int(rng.integers(1, out_max + 1))), {"tenant": tenant}))
        tenants.append(tenant)
    max_model_len = prompt_max + out_max + 1
    engine = sim(max_num_seqs=width, max_model_len=max_model_len, policy="vtc")
    reqs = engine.run(items)
    seen = tagged(reqs, tenants)
    bound = vtc_bound(prompt_max, engine.scheduler.kv.capacity_tokens)
    assert max_service_gap(engine.history, seen) <= bound
    # work conservation: never a free place while a request waits
    assert idle_while_backlogged(engine.history, seen, width) == []


def test_fcfs_breaks_the_bound_with_a_flooder_and_vtc_keeps_it():
    items, tenants = flood_workload(1, n_flood=80, n_polite=10, rate_ratio=8, prompt_max=8, out_max=8)
    gaps = {}
    for policy in ("fcfs", "vtc"):
        engine = sim(max_num_seqs=2, max_model_len=17, policy=policy)
        reqs = engine.run(items)
        gaps[policy] = max_service_gap(engine.history, tagged(reqs, tenants))
        bound = vtc_bound(8, engine.scheduler.kv.capacity_tokens)
    assert gaps["vtc"] <= bound < gaps["fcfs"]


def test_llm_generate_takes_vllms_priority_list_and_keeps_the_tokens(tiny):
    from ai_evolution.engine import LLM
    prompts = ["La caché KV", "El planificador", "Un tenant"]
    plain = LLM(tiny, tokenizer="tiny-es", max_num_seqs=1).generate(prompts, SamplingParams(max_tokens=5))
    llm = LLM(tiny, tokenizer="tiny-es", max_num_seqs=1, scheduling_policy="priority")
    outs = llm.generate(prompts, SamplingParams(max_tokens=5), priority=[2, 0, 1])
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    order = [rid for h in llm.engine.history for rid in h.admitted]
    assert order == [outs[i].request_id for i in (1, 2, 0)]
    with pytest.raises(ValueError, match="priority debe ser una lista con un entero por prompt"):
        llm.generate(prompts, priority=[1])
    bad = llm.generate(["Hola"], priority=[1.5])[0]
    assert bad.finish_reason.value == "rejected" and "priority debe ser un entero" in bad.error


# --- VTC with paged KV and preemption -------------------------------------------------------------
@settings(max_examples=15, **PROPS)
@given(seed=st.integers(0, 10**6), n=st.integers(3, 16), blocks=st.integers(8, 16))
def test_vtc_with_preemption_returns_every_block_and_counts_the_service_it_gave(seed, n, blocks):
    from engine_helpers import check_done
    rng = np.random.default_rng(seed)
    items, tenants = [], []
    for k in range(n):
        tenant = f"t{int(rng.integers(0, 3))}"
        items.append((float(rng.exponential(0.002) * k), rng.integers(3, 90, int(rng.integers(1, 12))).tolist(),
                      greedy(int(rng.integers(1, 12))), {"tenant": tenant}))
        tenants.append(tenant)
    kv = KVCacheManager(num_blocks=blocks, block_size=4, max_model_len=32)
    engine = sim(max_num_seqs=4, max_model_len=32, policy="vtc", kv=kv)
    reqs = engine.run(items)
    check_done(engine)
    policy = engine.scheduler.scheduling
    assert not policy.queued and not policy.priority and not policy.tenant  # nothing left behind
    for t in set(tenants):  # each prompt charged once, each generated token once
        mine = [r for r, x in zip(reqs, tenants) if x == t]
        assert policy.served[t] == sum(r.num_prompt_tokens + 2 * len(r.output_token_ids) for r in mine)


def test_the_vtc_admission_rule_is_a_plug_in_checked_by_the_scheduler():
    from ai_evolution.engine import PolicyError
    flood = [(0.0, [5] * 8, greedy(6), {"tenant": "flood"}) for _ in range(12)]
    polite = [(0.05, [6] * 8, greedy(6), {"tenant": "polite"})]
    most_served = lambda counters, backlogged: max(backlogged, key=counters.__getitem__)  # noqa: E731
    waits = {}
    for name, pick in (("least", None), ("most", most_served)):
        engine = sim(max_num_seqs=2, policy=lambda pick=pick: VTCPolicy(pick_fn=pick))
        waits[name] = engine.run(flood + polite)[-1].ttft
    assert waits["least"] < waits["most"] / 3  # the wrong rule starves the polite tenant again
    engine = sim(max_num_seqs=2, policy=lambda: VTCPolicy(pick_fn=lambda c, b: "nadie"))
    engine.add_request([5, 6], greedy(2), tenant="a")
    with pytest.raises(PolicyError, match="devolvió 'nadie', que no es un tenant con peticiones en cola"):
        engine.step()
