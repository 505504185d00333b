"""Where each running request keeps its K/V: the bookkeeping half of the KV cache.

The scheduler owns this object (it decides who gets memory); the model runner owns the tensors
and only reads the placement the scheduler hands it. ``ContiguousSlots`` is the layout of chapter
3: the cache has ``num_slots`` rows of ``max_model_len`` token slots each, and a request takes a
whole row when admitted, whatever its length, until it is retired. Chapter 4 swaps in paged
blocks behind the same three calls.
"""

from __future__ import annotations

from .request import Request


class ContiguousSlots:
    """``num_slots`` rows of ``max_model_len`` tokens; one row per running request."""

    def __init__(self, num_slots: int, max_model_len: int) -> None:
        if num_slots < 1 or max_model_len < 2:
            raise ValueError(f"need num_slots >= 1 and max_model_len >= 2, got {num_slots}, {max_model_len}")
        self.num_slots = num_slots
        self.max_model_len = max_model_len
        self._free = list(range(num_slots))  # kept sorted: the lowest free row is taken first
        self._owner: dict[str, int] = {}

    def can_allocate(self, request: Request) -> bool:
        return bool(self._free) and request.request_id not in self._owner

    def allocate(self, request: Request) -> int:
        """Reserve a row for ``request`` and return it (the lowest free one)."""
        if request.request_id in self._owner:
            raise ValueError(f"request {request.request_id!r} already holds slot "
                             f"{self._owner[request.request_id]}")
        if not self._free:
            raise ValueError(f"no free slot for request {request.request_id!r}: all {self.num_slots} are taken")
        slot = self._free.pop(0)
        self._owner[request.request_id] = slot
        return slot

    def free(self, request: Request) -> None:
        """Give the request's row back (no-op for a request that holds none)."""
        slot = self._owner.pop(request.request_id, None)
        if slot is not None:
            self._free.append(slot)
            self._free.sort()

    def slot_of(self, request_id: str) -> int:
        return self._owner[request_id]

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def owners(self) -> dict[str, int]:
        """request_id -> slot, for every held slot."""
        return dict(self._owner)

    def reserved_tokens(self) -> int:
        """Token slots reserved right now (whole rows)."""
        return len(self._owner) * self.max_model_len
