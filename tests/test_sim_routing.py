"""Routing over N simulated replicas: round-robin finds a prefix held by one replica 1/N of the
time; prefix-affinity finds it almost always; the workload and the accounting on values."""

import math

import pytest

from ai_evolution.hardware import get_device_spec
from ai_evolution.loadgen.shared_prefix import prefix_sharing_workload
from ai_evolution.model.presets import get_preset
from ai_evolution.sim.cost_model import RooflineCostModel
from ai_evolution.sim.routing import (compare_policies, reusable_tokens, routing_engine_factory,
                                      simulate_routing)

CONFIG = get_preset("llama-3.1-8b")
MAKE = routing_engine_factory(CONFIG, RooflineCostModel.from_device_spec(get_device_spec("h100-sxm")),
                              max_model_len=1024, num_blocks=4096)


def test_workload_turns_extend_their_session_and_system_prompts_are_shared():
    wl = prefix_sharing_workload(6, 5.0, 1000, seed=1, num_system_prompts=2, system_len=32,
                                 turns=3, turn_len=8, output_len=2)
    assert len(wl) == 18
    assert [w.arrival_time for w in wl] == sorted(w.arrival_time for w in wl)
    lengths = sorted({len(w.prompt_token_ids) for w in wl})
    assert lengths == [40, 48, 56]
    assert len({tuple(w.prompt_token_ids[:32]) for w in wl}) == 2
    by_start = {}
    for w in wl:   # a longer turn begins with a shorter turn of its own session
        by_start.setdefault(tuple(w.prompt_token_ids[:40]), set()).add(len(w.prompt_token_ids))
    assert sorted(len(v) for v in by_start.values()) == [3] * 6
    assert min(t for w in wl for t in w.prompt_token_ids) >= 1   # 0 is the simulator's token
    again = prefix_sharing_workload(6, 5.0, 1000, seed=1, num_system_prompts=2, system_len=32,
                                    turns=3, turn_len=8, output_len=2)
    assert [w.prompt_token_ids for w in again] == [w.prompt_token_ids for w in wl]
    with pytest.raises(ValueError, match="turns"):
        prefix_sharing_workload(6, 5.0, 1000, seed=1, turns=0)


def test_reusable_tokens_counts_whole_blocks_seen_before_never_the_whole_prompt():
    from ai_evolution.loadgen.workload import WorkItem
    a, b = list(range(1, 33)), list(range(1, 17)) + [99] * 20
    items = [WorkItem(0.0, a, None), WorkItem(1.0, a, None), WorkItem(2.0, b, None)]
    assert reusable_tokens(items, 16) == [0, 16, 16]   # a again: 31 tokens usable -> one block


@pytest.mark.parametrize("num_replicas", [2, 4])
def test_round_robin_finds_a_one_replica_prefix_one_time_in_n(num_replicas):
    """Second turns whose only reusable prefix is their own first turn, held by the replica that
    served it: round-robin's share of those tokens found cached is 1/N within four binomial
    standard deviations; prefix-affinity finds (nearly) all."""
    sessions = 160
    wl = prefix_sharing_workload(sessions, 20.0, CONFIG.vocab_size, seed=0, system_len=0, turns=2,
                                 turn_len=64, output_len=2)
    rr = simulate_routing("round-robin", wl, num_replicas, MAKE)
    pa = simulate_routing("prefix-affinity", wl, num_replicas, MAKE)
    p = 1 / num_replicas
    sd = math.sqrt(p * (1 - p) / sessions)
    assert rr["reusable_tokens"] == sessions * 64
    assert abs(rr["reusable_hit_fraction"] - p) <= 4 * sd, rr
    assert pa["reusable_hit_fraction"] >= 0.95, pa
    assert pa["reasons"].get("prefix_hit", 0) >= 0.95 * sessions
    assert sum(rr["requests_per_replica"]) == 2 * sessions


def test_compare_policies_rows_and_determinism():
    wl = prefix_sharing_workload(24, 40.0, CONFIG.vocab_size, seed=2, num_system_prompts=4,
                                 system_len=128, turns=2, turn_len=32, output_len=4)
    rows = compare_policies(wl, [2, 4], MAKE)
    assert [(r["num_replicas"], r["policy"]) for r in rows] == [
        (n, p) for n in (2, 4) for p in ("round-robin", "least-outstanding", "prefix-affinity")]
    for r in rows:
        assert 0 <= r["hit_rate"] <= 1 and r["ttft_p50_s"] <= r["ttft_p99_s"]
        assert r["throughput_tok_s"] > 0 and r["requests"] == len(wl)
    by = {(r["num_replicas"], r["policy"]): r for r in rows}
    assert by[(4, "prefix-affinity")]["hit_rate"] > by[(4, "round-robin")]["hit_rate"]
    assert compare_policies(wl, [2], MAKE)[0] == rows[0]
    with pytest.raises(ValueError, match="num_replicas"):
        simulate_routing("round-robin", wl, 0, MAKE)


def test_routing_study_at_n8_prefix_affinity_keeps_the_hits_round_robin_loses():
    """A small version of the chapter's study: with a cache that cannot hold every system prompt
    on every replica, round-robin's hit rate falls as N grows and prefix-affinity's does not."""
    from ai_evolution.sim.routing import routing_study
    study = routing_study(0, (2, 8), policies=("round-robin", "prefix-affinity"),
                          sessions_per_replica=10, system_prompts_per_replica=2, system_len=512,
                          turns=2, turn_len=64, output_len=8, num_blocks=512)
    by = {(r["num_replicas"], r["policy"]): r for r in study["rows"]}
    assert by[(8, "round-robin")]["hit_rate"] < by[(2, "round-robin")]["hit_rate"]
    assert by[(8, "prefix-affinity")]["hit_rate"] > by[(8, "round-robin")]["hit_rate"]
    assert by[(8, "prefix-affinity")]["ttft_p50_s"] <= by[(8, "round-robin")]["ttft_p50_s"]
    assert study["settings"]["num_blocks"] == 512
