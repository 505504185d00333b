"""A step as values: what the scheduler hands an executor, and what the executor gives back.

``SchedulerOutput`` is a frozen snapshot taken when the step is planned: for every scheduled
request, the token ids to compute now, the position of the first one, the blocks their K/V go to
and the draft tokens among them. The executor (the real ``ModelRunner``, the simulator's
``SimExecutor``) reads nothing else: no live ``Request`` crosses the seam. It answers with a
``StepResult`` of the same shape for plain, chunked and speculative steps: the sampled token ids
of every request whose pending tokens the step completed, and the error of every request whose
part failed. Only the scheduler turns that result into request state
(``Scheduler.update_from_output``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .request import SamplingParams


@dataclass(frozen=True)
class ScheduledRequest:
    """One request in this step: compute ``token_ids`` at positions ``start, start + 1, ...``,
    whose K/V go to the blocks of ``block_ids`` (its whole block table). The last
    ``len(draft_token_ids)`` of them are a draft model's tokens (speculative decoding), verified
    in this same forward pass. ``samples``: the step completes the request's pending tokens, so
    it yields a token (a prompt chunk that stops short samples nothing). ``state_slot``: with a
    hybrid model, the slot of the request's fixed state (``engine.state_slots``); None otherwise.
    ``state_restore``: the state checkpoint row copied into that slot before the step (the
    request's first step after a prefix hit). ``state_saves``: ``(tokens, row)`` pairs: once the
    request holds ``tokens`` tokens (inside this step), its state is copied into checkpoint
    ``row`` (prefix caching for hybrids)."""

    request_id: str
    token_ids: tuple[int, ...]
    start: int
    block_ids: tuple[int, ...]
    num_prompt_tokens: int
    sampling_params: SamplingParams
    samples: bool
    draft_token_ids: tuple[int, ...] = ()
    state_slot: int | None = None
    state_restore: int | None = None
    state_saves: tuple[tuple[int, int], ...] = ()

    @property
    def num_tokens(self) -> int:
        """Tokens computed for the request in this step (draft tokens included)."""
        return len(self.token_ids)

    @property
    def first_block(self) -> int:
        """The first block of its table (with the contiguous layout, its only block)."""
        return self.block_ids[0]

    @property
    def is_prefill(self) -> bool:
        return self.start < self.num_prompt_tokens

    @property
    def context_len(self) -> int:
        """Tokens in the cache once this step has run."""
        return self.start + self.num_tokens


@dataclass(frozen=True)
class SchedulerOutput:
    """One step's plan: what runs (``scheduled``), who joined, left or was preempted to make it,
    who holds KV after it (finished requests still in the batch too), and which requests have
    finished since the last plan (``finished_req_ids``: an executor frees what it keeps for them,
    such as their sampling generators)."""

    step: int
    scheduled: tuple[ScheduledRequest, ...]
    admitted: tuple[str, ...]
    retired: tuple[str, ...]
    holders: dict[str, int]  # every request holding KV after the plan -> its first block
    num_blocks: int
    preempted: tuple[str, ...] = ()
    finished_req_ids: frozenset[str] = frozenset()

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass(frozen=True)
class StepResult:
    """What an executor returns for one step. ``sampled_token_ids``: for every request the step
    completed, the target's tokens: one, or ``1 + k`` when it verified ``k`` draft tokens (the
    target's choice at each verified position). ``errors``: the exception of every request whose
    part failed (the others are unaffected). ``target_probs``: for a *sampled* request that
    verified ``k`` draft tokens, the target's distribution at the ``k + 1`` verified positions
    (``[k + 1, V]``, on the CPU) instead of tokens: the scheduler verifies by rejection sampling.
    ``recompute``: requests the step could not run whose state it may have half-updated (a
    hybrid's step that raised as a whole): the engine preempts them, to compute them again."""

    sampled_token_ids: dict[str, tuple[int, ...]] = field(default_factory=dict)
    errors: dict[str, BaseException] = field(default_factory=dict)
    target_probs: dict[str, Any] = field(default_factory=dict)
    recompute: tuple[str, ...] = ()

    def merged(self, other: "StepResult") -> "StepResult":
        return StepResult({**self.sampled_token_ids, **other.sampled_token_ids},
                          {**self.errors, **other.errors},
                          {**self.target_probs, **other.target_probs},
                          self.recompute + other.recompute)


__all__ = ["ScheduledRequest", "SchedulerOutput", "StepResult"]
