"""Workloads whose prompts share prefixes: what a router's policy decides the fate of (chapter 13).

``prefix_sharing_workload`` draws ``num_sessions`` conversations. Each session starts with one
of ``num_system_prompts`` system prompts (``system_len`` tokens, shared by every session that
drew it) and has ``turns`` turns; turn ``k`` (1-based) sends the system prompt plus the session's
first ``k`` user messages (``turn_len`` tokens each), so it extends turn ``k - 1``'s prompt, as a
chat client resends the history. The turns of all sessions are interleaved at random (each
session's turns in order) and arrive as a Poisson stream of ``rate`` requests/s.

- ``turns=1``: a pure shared-system-prompt workload;
- ``system_len=0, turns=2``: each second turn can reuse only its own first turn's prompt, held by
  the one replica that served it: round-robin over N replicas finds it there 1/N of the time.

Same seed, same workload.
"""

from __future__ import annotations

import numpy as np

from ..engine.request import SamplingParams
from .arrivals import poisson_arrivals
from .workload import WorkItem


def _positive(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} debe ser un entero >= {minimum}; se recibió {value!r}")
    return value


def prefix_sharing_workload(num_sessions: int, rate: float, vocab_size: int, seed: int, *,
                            num_system_prompts: int = 4, system_len: int = 256, turns: int = 1,
                            turn_len: int = 32, output_len: int = 8) -> list[WorkItem]:
    """The workload described in the module's docstring: ``num_sessions x turns`` ``WorkItem``s
    in arrival order (no scheduling tags). Token ids are drawn
    from ``[1, vocab_size)`` (0 is left out: the simulator's placeholder token)."""
    _positive("num_sessions", num_sessions)
    _positive("num_system_prompts", num_system_prompts)
    _positive("system_len", system_len, 0)
    _positive("turns", turns)
    _positive("turn_len", turn_len)
    _positive("output_len", output_len)
    _positive("vocab_size", vocab_size, 2)
    rng = np.random.default_rng(seed)
    systems = [rng.integers(1, vocab_size, system_len).tolist() for _ in range(num_system_prompts)]
    system_of = rng.integers(0, num_system_prompts, num_sessions).tolist()
    messages = [[rng.integers(1, vocab_size, turn_len).tolist() for _ in range(turns)]
                for _ in range(num_sessions)]
    order = rng.permutation(np.repeat(np.arange(num_sessions), turns)).tolist()
    arrivals = poisson_arrivals(len(order), rate, seed + 1)
    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0.0)
    seen = [0] * num_sessions
    items = []
    for t, s in zip(arrivals, order):
        seen[s] += 1
        prompt = list(systems[system_of[s]])
        for m in messages[s][:seen[s]]:
            prompt += m
        items.append(WorkItem(t, prompt, params))
    return items


__all__ = ["prefix_sharing_workload"]
