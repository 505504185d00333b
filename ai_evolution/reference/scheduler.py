"""Reference answer of the scheduler lab (chapter 5): the preemption victim of each rule."""

from __future__ import annotations

from typing import Sequence

from ..engine import Request, newest_unfinished


# The victim rules of the exercise: name -> what it preempts (Spanish, shown to the student).
VICTIM_RULES = {
    "newest": "la admitida más recientemente (la regla de vLLM: prioridad al primero que llegó)",
    "fewest_computed": "la que tiene menos tokens calculados (la que menos trabajo tira)",
    "most_computed": "la que tiene más tokens calculados (la que más bloques libera de una vez)",
}


def reference_victim(running: Sequence[Request], rule: str) -> Request:
    """The unfinished request of ``running`` (in admission order) that ``rule`` preempts; a tie
    in computed tokens goes to the most recently admitted. The autograder's reference for the
    victim exercise."""
    if rule not in VICTIM_RULES:
        raise ValueError(f"regla de víctima {rule!r} desconocida; aceptadas: "
                         f"{', '.join(VICTIM_RULES)}")
    if rule == "newest":
        return newest_unfinished(running)
    live = [(k, r) for k, r in enumerate(running) if not r.is_finished]
    sign = 1 if rule == "most_computed" else -1
    return max(live, key=lambda kr: (sign * kr[1].num_computed_tokens, kr[0]))[1]

