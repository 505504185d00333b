"""Measuring fair share from an engine's step history (chapter 12).

Everything here reads ``engine.history`` (what each step computed, who joined) and the requests'
arrival times, never the policy's own counters, so it judges any scheduling policy the same way:

- ``service_per_step``: the weighted tokens each tenant was served in each step (prompt tokens
  computed x ``input_weight``, tokens sampled x ``output_weight``: VTC's cost function);
- ``backlog_per_step``: which tenants had requests waiting when each step was planned;
- ``max_service_gap``: the largest service difference between two tenants over any run of
  consecutive steps in which both were backlogged (what VTC's bound speaks of);
- ``idle_while_backlogged``: steps that left a place of the batch empty while a request waited
  (a work-conserving scheduler has none, with one KV row per request).
"""

from __future__ import annotations

from itertools import combinations
from typing import Mapping, Sequence


def admission_steps(history) -> dict[str, int]:
    """Request id -> the step that admitted it (the first time)."""
    out: dict[str, int] = {}
    for h in history:
        for rid in h.admitted:
            out.setdefault(rid, h.step)
    return out


def service_per_step(history, tenant_of: Mapping[str, object], input_weight: float = 1.0,
                     output_weight: float = 2.0) -> list[dict]:
    """Per step, tenant -> weighted tokens served: a prefill's computed tokens x
    ``input_weight`` and one sampled token x ``output_weight`` per scheduled request (without
    chunked prefill or speculation, every scheduled request samples exactly one token)."""
    out = []
    for h in history:
        served: dict = {}
        for e in h.scheduled:
            t = tenant_of[e.request_id]
            cost = (input_weight * e.num_tokens if e.is_prefill else 0.0) + output_weight
            served[t] = served.get(t, 0.0) + cost
        out.append(served)
    return out


def backlog_per_step(history, requests: Sequence) -> list[set]:
    """Per step, the tenants with a request that had arrived and was still waiting when the step
    was planned (it was admitted in that step or later). ``requests``: objects with
    ``request_id``, ``arrival_time`` and a ``tenant`` (see ``tagged``)."""
    admitted = admission_steps(history)
    out = []
    for h in history:
        out.append({r.tenant for r in requests
                    if r.arrival_time <= h.start and admitted.get(r.request_id, 1 << 62) >= h.step})
    return out


def max_service_gap(history, requests: Sequence, input_weight: float = 1.0,
                    output_weight: float = 2.0) -> float:
    """The largest |service(f) - service(g)| over any run of consecutive steps in which both
    tenants f and g were backlogged (0 when no two tenants ever were at once)."""
    tenant_of = {r.request_id: r.tenant for r in requests}
    served = service_per_step(history, tenant_of, input_weight, output_weight)
    backlog = backlog_per_step(history, requests)
    tenants = sorted({r.tenant for r in requests}, key=str)
    worst = 0.0
    for f, g in combinations(tenants, 2):
        lo = hi = d = 0.0  # running difference and its range over the current run
        for s, b in zip(served, backlog):
            if f in b and g in b:
                d += s.get(f, 0.0) - s.get(g, 0.0)
                lo, hi = min(lo, d), max(hi, d)
                worst = max(worst, hi - lo)
            else:
                lo = hi = d = 0.0
    return worst


def idle_while_backlogged(history, requests: Sequence, max_num_seqs: int) -> list[int]:
    """Steps whose batch had fewer than ``max_num_seqs`` requests although a request that had
    arrived was still waiting after the step's admissions."""
    admitted = admission_steps(history)
    return [h.step for h in history
            if len(h.holders) < max_num_seqs and any(
                r.arrival_time <= h.start and admitted.get(r.request_id, 1 << 62) > h.step
                for r in requests)]


class Tagged:
    """A request seen with its tenant (``request_id``, ``arrival_time``, ``tenant``)."""

    __slots__ = ("request_id", "arrival_time", "tenant")

    def __init__(self, request_id: str, arrival_time: float, tenant) -> None:
        self.request_id, self.arrival_time, self.tenant = request_id, arrival_time, tenant


def tagged(requests: Sequence, tenants: Sequence) -> list[Tagged]:
    """The engine's requests (as ``engine.run`` returns them) paired with their tenants."""
    return [Tagged(r.request_id, r.arrival_time, t) for r, t in zip(requests, tenants)]


__all__ = ["Tagged", "admission_steps", "backlog_per_step", "idle_while_backlogged",
           "max_service_gap", "service_per_step", "tagged"]
