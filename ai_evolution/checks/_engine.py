"""Helpers shared by the engine self-checks: run a workload and record what every step did."""

from __future__ import annotations

from ..engine import LLMEngine


def trace(engine: LLMEngine, items) -> list[tuple]:
    """Run ``items`` through ``engine`` and return, per executed step, (admitted, retired,
    [(request id, tokens)], preempted)."""
    steps = []
    original = engine.scheduler.schedule

    def traced():
        out = original()
        if not out.is_empty:
            steps.append((out.admitted, out.retired, [(s.request_id, s.num_tokens) for s in out.scheduled],
                          out.preempted))
        return out

    engine.scheduler.schedule = traced
    try:
        engine.run(items)
    finally:
        engine.scheduler.schedule = original
    return steps
