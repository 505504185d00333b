"""Helpers shared by the engine test files (test_engine, test_paged_kv, test_sim_executor,
test_token_budget): one copy of each, imported by name."""

from __future__ import annotations

from hypothesis import HealthCheck

from ai_evolution.engine import LLMEngine, SamplingParams
from ai_evolution.generation import generate
from ai_evolution.model.config import ModelConfig
from ai_evolution.sim import RooflineCostModel

# A small random model with grouped-query attention, for the property tests (cheap references).
SMALL = ModelConfig(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, intermediate_size=96,
                    vocab_size=97, max_position_embeddings=64)
# Tiny-es (5 M parameters, ~10 MB in bf16) on a modest machine: decode steps are bound by the
# bandwidth, long prefills by the peak, and both overheads count.
COST = RooflineCostModel(bandwidth_bytes_per_s=50e9, peak_flops=2e11, overhead_s=2e-3,
                         overhead_per_seq_s=1e-4, name="prueba")


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kw)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def solo(model, prompt, params: SamplingParams) -> list[int]:
    """The request's tokens when it runs alone, without any KV cache."""
    return generate(model, prompt, params.max_tokens, cache=None, temperature=params.temperature,
                    top_k=params.top_k, top_p=params.top_p, seed=params.seed)[0]


def schedule(engine: LLMEngine) -> list[tuple]:
    """Per step: (request_id, slot, num_tokens, context_len) of every scheduled request."""
    return [tuple((e.request_id, e.first_block, e.num_tokens, e.context_len) for e in h.scheduled)
            for h in engine.history]


def check_done(engine: LLMEngine) -> None:
    """Paged KV: every request finished, every block back in the pool, nobody left anywhere."""
    sched, kv = engine.scheduler, engine.scheduler.kv
    assert all(r.is_finished for r in engine.requests.values())
    assert not sched.running and not sched.waiting
    assert not kv.tables and kv.tables_per_block() == {}
    assert kv.num_free == kv.pool.num_free == kv.num_blocks
    kv.check_invariants()
    usage = engine.kv_usage()
    assert usage["blocks_used"] == 0 and usage["reserved_token_slots"] == 0


# Hypothesis settings of the engine property tests: reproducible, no example database.
PROPS = dict(derandomize=True, database=None, deadline=None,
             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class PoisonedExecutor:
    """Wraps an executor: a step that computes a request whose prompt starts with ``marker``
    raises, as a kernel bug triggered by one request's data would. ``inner`` is the original."""

    def __init__(self, inner, marker: int) -> None:
        self.inner, self.marker = inner, marker
        self.poisoned: set[str] = set()  # ids of the requests whose prompt starts with marker

    def now(self):
        return self.inner.now()

    def idle_until(self, t):
        self.inner.idle_until(t)

    def execute(self, out):
        # the step is a snapshot: a request's first token is in the step that starts at 0
        self.poisoned |= {s.request_id for s in out.scheduled
                          if s.start == 0 and s.token_ids[0] == self.marker}
        if any(s.request_id in self.poisoned for s in out.scheduled):
            raise RuntimeError("fallo simulado del núcleo (device-side assert)")
        return self.inner.execute(out)
