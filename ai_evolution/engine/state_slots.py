"""A hybrid model's fixed state per request, beside the KV blocks.

A hybrid decoder's linear-attention layers keep no per-token cache: each running request needs
one **state slot** (its convolution windows and delta-rule matrices, the same size at 10 tokens
as at 10 000). ``HybridKVManager`` wraps the scheduler's KV manager (contiguous or paged) and
hands out those slots with the blocks: a request gets a slot when it is admitted (its first
``allocate_slots``) and gives it back when its KV is freed (finish, abort, preemption). A
preempted request recomputes its state from scratch, like its KV: the runner starts a slot from
zeros whenever a request's step starts at position 0. The slot travels to the executor as a
value, ``ScheduledRequest.state_slot``; the runner holds the tensors
(``model.linear_attention.LinearAttentionState``, one row per slot).

Prefix caching is not supported here: a cache hit skips computing the prefix, but the state after
that prefix was never stored (real engines keep state checkpoints at block boundaries for that).
"""

from __future__ import annotations

from typing import Sequence

from .block_pool import KVBlock
from .request import Request


class HybridKVManager:
    """``kv`` (any ``KVManager``) plus ``num_slots`` state slots, one per running request."""

    def __init__(self, kv, num_slots: int) -> None:
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"num_slots (ranuras de estado) debe ser un entero >= 1; se recibió "
                             f"{num_slots!r}")
        if getattr(kv, "prefix_caching", False):
            raise ValueError(
                "la caché de prefijos no está disponible para un modelo híbrido: un acierto "
                "evitaría calcular el prefijo, pero el estado fijo de las capas lineales tras ese "
                "prefijo no se guarda; use enable_prefix_caching=False")
        self.kv = kv
        self.num_state_slots = num_slots
        self._free = list(range(num_slots))
        self._slot: dict[str, int] = {}

    def __getattr__(self, name: str):
        # Everything else (num_blocks, block_table, holders, usage...) is the wrapped manager's.
        return getattr(self.kv, name)

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        return self.kv.get_computed_blocks(request)

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       computed_blocks: Sequence[KVBlock] = ()) -> list[int] | None:
        """The wrapped manager's blocks; at admission also a state slot (None, and nothing
        changes, when either is short)."""
        rid = request.request_id
        if rid in self._slot:
            return self.kv.allocate_slots(request, num_new_tokens, computed_blocks)
        if not self._free:
            return None
        blocks = self.kv.allocate_slots(request, num_new_tokens, computed_blocks)
        if blocks is not None:
            self._slot[rid] = self._free.pop(0)
        return blocks

    def free(self, request: Request) -> None:
        self.kv.free(request)
        slot = self._slot.pop(request.request_id, None)
        if slot is not None:
            self._free.append(slot)
            self._free.sort()

    def trim(self, request: Request, num_tokens: int) -> None:
        raise ValueError("un modelo híbrido no puede descartar tokens ya calculados (su estado "
                         "fijo no guarda versiones anteriores): la decodificación especulativa "
                         "no está disponible para él")

    def cache_full_blocks(self, request: Request) -> None:
        self.kv.cache_full_blocks(request)

    def block_table(self, request_id: str) -> list[int]:
        return self.kv.block_table(request_id)

    def state_slot(self, request_id: str) -> int | None:
        """The state slot the request holds (None if it holds none)."""
        return self._slot.get(request_id)

    def check_invariants(self) -> None:
        """Every slot is free or owned by exactly one request; the wrapped manager's own."""
        owned = sorted(self._slot.values())
        assert len(owned) == len(set(owned)), "una ranura de estado tiene dos dueños"
        assert sorted(owned + self._free) == list(range(self.num_state_slots)), \
            "ranuras de estado perdidas o duplicadas"
        if hasattr(self.kv, "check_invariants"):
            self.kv.check_invariants()
