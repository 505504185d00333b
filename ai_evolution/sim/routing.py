"""Routing over N simulated replicas (chapter 13): the router's own policies
(``router.policies``) in front of N simulated engines, each with the real scheduler and its own
paged KV cache with prefix caching, on the simulator's clock.

``simulate_routing(policy, workload, num_replicas, make_engine)`` replays a workload
(``WorkItem``s) as the HTTP router would: at each arrival every replica is advanced to that time,
the policy sees each replica's outstanding requests (running + waiting) and the prompt's block
hashes, and the request joins the chosen replica. It reports

- ``hit_rate``: prompt tokens served from a replica's prefix cache / prompt tokens looked up
  (the same counters the server exports on ``/metrics``);
- ``reusable_tokens`` and ``reusable_hit_fraction``: tokens of each prompt that an EARLIER
  prompt already had (its leading full blocks whose chain hash was seen before, never the whole
  prompt: the last token is always computed) and the share of those the fleet found cached. A
  perfect router gets 1; round-robin over N replicas, on prefixes held by one replica each, 1/N;
- ``ttft_p50_s``, ``ttft_p99_s``, ``throughput_tok_s`` (``metrics.summarize``), and how often
  each reason (``prefix_hit``, ``load_guard``...) decided.

Simulated time: deterministic for a seed, and as good as the cost model.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Sequence

from ..engine.kv_cache import KVCacheManager
from ..metrics import summarize
from ..router.policies import POLICIES, make_policy, prefix_blocks
from .capacity import Replica
from .cost_model import RooflineCostModel
from .executor import sim_engine


def routing_engine_factory(config, cost_model: RooflineCostModel, *, max_num_seqs: int = 32,
                           max_model_len: int = 4096, num_blocks: int = 4096,
                           block_size: int = 16) -> Callable[[], object]:
    """A factory of simulated replicas: the real scheduler, a paged KV cache of ``num_blocks``
    blocks with prefix caching, ``cost_model`` for the clock."""
    def make():
        kv = KVCacheManager(num_blocks, block_size, max_model_len, enable_prefix_caching=True)
        return sim_engine(config, cost_model, max_num_seqs, max_model_len, kv=kv)
    return make


def reusable_tokens(workload: Sequence, block_size: int) -> list[int]:
    """Per item, the tokens of its prompt that an earlier item's prompt began with, in whole
    blocks, at most ``len(prompt) - 1`` (what a perfect prefix cache could serve)."""
    seen: set[bytes] = set()
    out = []
    for item in workload:
        prompt = item[1]
        chain = prefix_blocks(prompt, block_size, max_blocks=max(1, len(prompt) // block_size))
        usable = (len(prompt) - 1) // block_size
        n = 0
        for h in chain[:usable]:
            if h not in seen:
                break
            n += 1
        out.append(n * block_size)
        seen.update(chain)
    return out


def simulate_routing(policy, workload: Sequence, num_replicas: int,
                     make_engine: Callable[[], object], *, block_size: int = 16,
                     max_blocks: int = 256) -> dict:
    """Route ``workload`` over ``num_replicas`` fresh replicas with ``policy`` (a name in
    ``router.POLICIES`` or a policy object); see the module's docstring for what it reports."""
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"num_replicas debe ser un entero >= 1; se recibió {num_replicas!r}")
    if isinstance(policy, str):
        policy = make_policy(policy)
    fleet = [Replica(make_engine(), 0.0) for _ in range(num_replicas)]
    for r in fleet:
        r.engine.executor.idle_until(0.0)
    everyone = list(range(num_replicas))
    requests, reasons, served = [], Counter(), [0] * num_replicas
    for item in sorted(workload, key=lambda w: w[0]):
        t, prompt, params = item[0], item[1], item[2]
        for r in fleet:
            r.advance(t)
        choice = policy.choose(prefix_blocks(prompt, block_size, max_blocks),
                               [r.load for r in fleet], everyone)
        reasons[choice.reason] += 1
        served[choice.index] += 1
        requests.append(fleet[choice.index].engine.add_request(prompt, params, arrival_time=t))
    for r in fleet:
        r.drain()
    usage = [r.engine.kv_usage() for r in fleet]
    hits = sum(u["prefix_hit_tokens"] for u in usage)
    queried = sum(u["prefix_queried_tokens"] for u in usage)
    reusable = sum(reusable_tokens(sorted(workload, key=lambda w: w[0]), block_size))
    summary = summarize(requests)
    return {"policy": policy.name, "num_replicas": num_replicas, "requests": len(requests),
            "hit_rate": hits / queried if queried else 0.0, "hit_tokens": hits,
            "queried_tokens": queried, "reusable_tokens": reusable,
            "reusable_hit_fraction": hits / reusable if reusable else float("nan"),
            "ttft_p50_s": summary["ttft_p50_s"], "ttft_p99_s": summary["ttft_p99_s"],
            "throughput_tok_s": summary["throughput_tok_s"], "duration_s": summary["duration_s"],
            "reasons": dict(reasons), "requests_per_replica": served}


def compare_policies(workload: Sequence, replica_counts: Sequence[int],
                     make_engine: Callable[[], object], policies: Sequence[str] = POLICIES,
                     policy_factory: Callable[[str], object] = make_policy,
                     **options) -> list[dict]:
    """``simulate_routing`` for every policy and replica count (a fresh fleet and a fresh policy
    each time, ``policy_factory(name)``: a lab passes one that builds a student's rule), one row
    per pair, in the order given."""
    return [simulate_routing(policy_factory(p), workload, n, make_engine, **options)
            for n in replica_counts for p in policies]


def routing_study(seed: int = 0, replica_counts: Sequence[int] = (2, 4, 8), *,
                  model: str = "llama-3.1-8b", device: str = "h100-sxm",
                  policies: Sequence[str] = POLICIES, sessions_per_replica: int = 40,
                  rate_per_replica: float = 12.0, system_prompts_per_replica: int = 4,
                  system_len: int = 1536, turns: int = 3, turn_len: int = 128,
                  output_len: int = 64, num_blocks: int = 2048, max_num_seqs: int = 32,
                  max_model_len: int = 4096,
                  policy_factory: Callable[[str], object] = make_policy) -> dict:
    """The chapter's comparison: for each replica count N, a workload that grows with N (N x
    ``sessions_per_replica`` conversations of ``turns`` turns over N x
    ``system_prompts_per_replica`` system prompts, N x ``rate_per_replica`` requests/s, seeded by
    ``seed``), routed by every policy over N simulated ``device``s serving ``model`` from the
    datasheet roofline, each with ``num_blocks`` KV blocks of 16 tokens (a cache that cannot hold
    every system prompt: where a router's choice decides what is cached). Returns
    ``{"settings": {...}, "rows": [simulate_routing's dict per (N, policy)]}``."""
    from ..hardware import get_device_spec
    from ..loadgen.shared_prefix import prefix_sharing_workload
    from ..model.presets import get_preset
    config = get_preset(model)
    make = routing_engine_factory(config, RooflineCostModel.from_device_spec(get_device_spec(device)),
                                  max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                                  num_blocks=num_blocks)
    rows = []
    for n in replica_counts:
        workload = prefix_sharing_workload(
            n * sessions_per_replica, n * rate_per_replica, config.vocab_size, seed,
            num_system_prompts=n * system_prompts_per_replica, system_len=system_len, turns=turns,
            turn_len=turn_len, output_len=output_len)
        rows += compare_policies(workload, [n], make, policies, policy_factory)
    settings = dict(seed=seed, model=model, device=device, sessions_per_replica=sessions_per_replica,
                    rate_per_replica=rate_per_replica,
                    system_prompts_per_replica=system_prompts_per_replica, system_len=system_len,
                    turns=turns, turn_len=turn_len, output_len=output_len, num_blocks=num_blocks,
                    block_size=16, max_num_seqs=max_num_seqs)
    return {"settings": settings, "rows": rows}


__all__ = ["compare_policies", "reusable_tokens", "routing_engine_factory", "routing_study",
           "simulate_routing"]
