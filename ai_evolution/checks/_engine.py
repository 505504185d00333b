"""Helpers shared by the engine self-checks: run a workload and record what every step did."""

from __future__ import annotations

from ..engine import LLMEngine
from ..model import ModelConfig
from ..sim import RooflineCostModel

# A toy machine and model for checking schedules on the simulator: only the order of events
# matters, not the time.
TOY_COST = RooflineCostModel(1e9, 1e12, overhead_s=1e-3, name="toy")
TOY_CONFIG = ModelConfig(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                         intermediate_size=128, vocab_size=100, name="toy")


def trace(engine: LLMEngine, items) -> list[tuple]:
    """Run ``items`` through ``engine`` and return, per executed step, (admitted, retired,
    [(request id, tokens)], preempted), as the engine's history records them."""
    first = len(engine.history)
    engine.run(items)
    return [(list(rec.admitted), list(rec.retired), [(e.request_id, e.num_tokens) for e in rec.scheduled],
             list(rec.preempted)) for rec in engine.history[first:]]
