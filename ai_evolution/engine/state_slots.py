"""A hybrid model's fixed state per request, beside the KV blocks, and its prefix-cache checkpoints.

A hybrid decoder's linear-attention layers keep no per-token cache: each running request needs
one **state slot** (its convolution windows and delta-rule matrices, the same size at 10 tokens
as at 10 000). ``HybridKVManager`` wraps the scheduler's KV manager (contiguous or paged) and
hands out those slots with the blocks: a request gets a slot when it is admitted (its first
``allocate_slots``) and gives it back when its KV is freed (finish, abort, preemption). A
preempted request recomputes its state, like its KV: the runner starts a slot from zeros whenever
a request's step starts at position 0. The slot travels to the executor as a value,
``ScheduledRequest.state_slot``; the runner holds the tensors
(``model.linear_attention.LinearAttentionState``, one row per slot).

Prefix caching (paged layout), the way vLLM's hybrid KV cache manager does it in its "align"
mode: a prefix hit skips computing the prefix, so the state *after* that prefix must exist. It
can only be kept at **checkpoints**: when a request's computed length crosses a multiple of
``checkpoint_interval`` tokens (a multiple of the block size), the runner copies its state into a
checkpoint row, keyed by the chain hash of the blocks that end there (the prefix cache's own
hashes). The checkpoints live in a bounded ``StateCheckpointPool`` (least recently used evicted
first, one full state each). A hit is truncated to the longest cached prefix that *also* has a
checkpoint at its end; the runner restores that checkpoint into the request's slot before its
first step (``ScheduledRequest.state_restore``). So a prompt shorter than the interval never hits,
however often it repeats: the cliff of vLLM issue #40696, where Qwen3.5 gets a 528-token block.

Chunks and checkpoints: a step's tokens need not end at a checkpoint (chunked prefill splits
prompts where the token budget runs out; a prompt is computed whole). The scheduler does not split
chunks at checkpoints; it lists, per request, the checkpoints that fall inside its tokens
(``ScheduledRequest.state_saves``), and the runner computes that request's tokens in pieces that
end at each of them (``linear_attention.StateSegments``), copying the state out after each.

A checkpoint becomes findable only after the step that wrote it succeeded (``cache_full_blocks``,
which the scheduler calls then, as it does for the KV blocks); a request that fails or is freed
first gives its reserved rows back. A row being read (restored) or written in a step is never
handed to another save in that step.
"""

from __future__ import annotations

import numbers
from collections import OrderedDict
from typing import Sequence

from .block_pool import KVBlock
from .request import Request


def check_checkpoint_interval(interval, block_size: int) -> None:
    """``interval`` must be a positive multiple of ``block_size`` (a Spanish ``ValueError``
    naming the accepted values otherwise): a checkpoint is keyed by the hash of the blocks it
    ends, so it can only sit at a block boundary."""
    if (isinstance(interval, bool) or not isinstance(interval, numbers.Integral) or interval < 1
            or interval % block_size):
        raise ValueError(
            f"state_checkpoint_interval={interval!r} debe ser un múltiplo positivo de "
            f"block_size={block_size} (aceptados: {block_size}, {2 * block_size}, "
            f"{3 * block_size}, ... o None, que toma block_size): un punto de control del estado "
            "se identifica por el hash de los bloques que termina, así que solo puede caer en un "
            "límite de bloque")


class StateCheckpointPool:
    """``num_checkpoints`` rows, each able to hold one sequence's whole state, keyed by block
    chain hash, least recently used evicted first. Bookkeeping only (the runner holds the
    tensors); ``bytes_per_checkpoint`` makes the byte accounting of ``stats``."""

    def __init__(self, num_checkpoints: int, bytes_per_checkpoint: float = 0.0) -> None:
        if (isinstance(num_checkpoints, bool) or not isinstance(num_checkpoints, numbers.Integral)
                or num_checkpoints < 1):
            raise ValueError(f"num_state_checkpoints debe ser un entero >= 1; se recibió "
                             f"{num_checkpoints!r}")
        self.num_checkpoints = int(num_checkpoints)
        self.bytes_per_checkpoint = float(bytes_per_checkpoint)
        self.cached: OrderedDict[bytes, int] = OrderedDict()  # key -> row; first = least recent
        self._free = list(range(self.num_checkpoints))
        self._reserved: dict[int, bytes] = {}  # row -> key, written but not yet committed
        self._busy: dict[int, int] = {}         # row -> the step that reads or writes it
        self.num_saves = 0
        self.num_restores = 0
        self.num_evictions = 0

    def lookup(self, key: bytes | None) -> int | None:
        """The row holding the checkpoint ``key`` (None if there is none). Changes nothing."""
        return None if key is None else self.cached.get(key)

    def use(self, key: bytes) -> int:
        """A hit on ``key``: it becomes the most recently used; returns its row."""
        self.cached.move_to_end(key)
        self.num_restores += 1
        return self.cached[key]

    def mark_busy(self, row: int, step: int) -> None:
        self._busy[row] = step

    def reserve(self, key: bytes, step: int, pinned: Sequence[int] = ()) -> int | None:
        """A row for a new checkpoint ``key`` written in ``step``: a free one, else the least
        recently used checkpoint that nobody reads or writes in ``step`` and that is not
        ``pinned`` (evicted). None if there is none, or if ``key`` is cached or being written."""
        if key in self.cached or key in self._reserved.values():
            return None
        if self._free:
            row = self._free.pop(0)
        else:
            row = next((r for k, r in self.cached.items()
                        if self._busy.get(r) != step and r not in pinned), None)
            if row is None:
                return None
            del self.cached[next(k for k, r in self.cached.items() if r == row)]
            self.num_evictions += 1
        self._reserved[row] = key
        self._busy[row] = step
        return row

    def commit(self, row: int) -> None:
        """The step that wrote ``row`` succeeded: its checkpoint becomes findable."""
        key = self._reserved.pop(row)
        self.cached[key] = row
        self.num_saves += 1

    def release(self, row: int) -> None:
        """A reserved row whose write did not happen (the request failed or left): free again."""
        if self._reserved.pop(row, None) is not None:
            self._free.append(row)
            self._free.sort()

    @property
    def num_cached(self) -> int:
        return len(self.cached)

    def stats(self) -> dict:
        return {"state_checkpoints": self.num_cached,
                "state_checkpoint_capacity": self.num_checkpoints,
                "state_checkpoint_bytes": self.num_cached * self.bytes_per_checkpoint,
                "state_checkpoint_capacity_bytes": self.num_checkpoints * self.bytes_per_checkpoint,
                "state_checkpoint_saves": self.num_saves,
                "state_checkpoint_restores": self.num_restores,
                "state_checkpoint_evictions": self.num_evictions}

    def check_invariants(self) -> None:
        rows = list(self.cached.values()) + list(self._reserved) + self._free
        assert sorted(rows) == list(range(self.num_checkpoints)), \
            "filas de puntos de control perdidas o duplicadas"


class HybridKVManager:
    """``kv`` (any ``KVManager``) plus ``num_slots`` state slots, one per running request.

    With a paged ``kv`` that caches prefixes, also the state checkpoints: one every
    ``checkpoint_interval`` tokens (default: the block size; a positive multiple of it), kept in
    a pool of ``num_checkpoints`` rows of ``state_bytes`` bytes each (default: one per
    checkpoint boundary the KV pool can hold, ``num_blocks * block_size // interval``, so that
    by default the KV cache, not the checkpoints, bounds the hits, as in vLLM, whose hybrid
    allocator gives every block its own state page)."""

    def __init__(self, kv, num_slots: int, checkpoint_interval: int | None = None,
                 num_checkpoints: int | None = None, state_bytes: float = 0.0) -> None:
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"num_slots (ranuras de estado) debe ser un entero >= 1; se recibió "
                             f"{num_slots!r}")
        self.kv = kv
        self.num_state_slots = num_slots
        self._free = list(range(num_slots))
        self._slot: dict[str, int] = {}
        self.state_bytes = float(state_bytes)
        self.checkpoint_interval: int | None = None
        self.checkpoints: StateCheckpointPool | None = None
        if getattr(kv, "prefix_caching", False):
            interval = kv.block_size if checkpoint_interval is None else checkpoint_interval
            check_checkpoint_interval(interval, kv.block_size)
            self.checkpoint_interval = int(interval)
            if num_checkpoints is None:  # one per checkpoint boundary the KV pool can hold
                num_checkpoints = max(1, kv.num_blocks * kv.block_size // self.checkpoint_interval)
            self.checkpoints = StateCheckpointPool(num_checkpoints, state_bytes)
        self._restore: dict[str, int] = {}  # request id -> checkpoint row to restore (admitted)
        self._saves: dict[str, list[tuple[int, int]]] = {}  # request id -> (tokens, row) written
        self.truncated_tokens = 0  # cached KV tokens not reused: no checkpoint at their end

    def __getattr__(self, name: str):
        # Everything else (num_blocks, block_size, holders...) is the wrapped manager's.
        if name == "kv":
            raise AttributeError(name)
        return getattr(self.kv, name)

    @property
    def num_state_checkpoints(self) -> int:
        """Rows of the checkpoint pool (0 without prefix caching)."""
        return 0 if self.checkpoints is None else self.checkpoints.num_checkpoints

    # --- admission ------------------------------------------------------------------------------
    def _usable(self, hits: Sequence[KVBlock]) -> int:
        """How many of the cached blocks ``hits`` a hybrid can reuse: the longest run that ends
        at a checkpoint boundary holding a checkpoint."""
        per = self.checkpoint_interval // self.kv.block_size
        for k in range(len(hits) - len(hits) % per, 0, -per):
            if self.checkpoints.lookup(hits[k - 1].block_hash) is not None:
                return k
        return 0

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """The wrapped manager's cached blocks, cut to the longest prefix whose state was
        checkpointed (no hit at all without a checkpoint). Changes nothing."""
        hits, _ = self.kv.get_computed_blocks(request)
        if self.checkpoints is None or not hits:
            return [], 0
        hits = hits[:self._usable(hits)]
        return hits, self.kv.tokens_in(hits)

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       computed_blocks: Sequence[KVBlock] = ()) -> list[int] | None:
        """The wrapped manager's blocks; at admission also a state slot, and the checkpoint to
        restore when ``computed_blocks`` is a hit (None, and nothing changes, when the blocks or
        the slots are short)."""
        rid = request.request_id
        if rid in self._slot:
            return self.kv.allocate_slots(request, num_new_tokens, computed_blocks)
        if not self._free:
            return None
        # the KV the cache holds for this prompt, before the hybrid's cut (for the accounting)
        cached = self.kv.get_computed_blocks(request)[1] if self.checkpoints is not None else 0
        blocks = self.kv.allocate_slots(request, num_new_tokens, computed_blocks)
        if blocks is None:
            return None
        self._slot[rid] = self._free.pop(0)
        if computed_blocks:
            self._restore[rid] = self.checkpoints.use(computed_blocks[-1].block_hash)
        if self.checkpoints is not None:
            self.truncated_tokens += max(0, cached - self.kv.tokens_in(computed_blocks))
        return blocks

    # --- one step -------------------------------------------------------------------------------
    def state_step(self, request: Request, start: int, num_tokens: int, step: int) -> dict:
        """The request's state in the step ``step`` that computes its tokens ``start ..
        start + num_tokens - 1``, as ``ScheduledRequest`` fields: ``state_slot``;
        ``state_restore``, the checkpoint row copied into the slot before the step (its first
        step after a hit); ``state_saves``, ``(tokens, row)`` for each checkpoint boundary inside
        the step: the state after the first ``tokens`` tokens goes to ``row``."""
        rid = request.request_id
        out = {"state_slot": self._slot.get(rid), "state_restore": None, "state_saves": ()}
        pool = self.checkpoints
        if pool is None or rid not in self._slot:
            return out
        restore = self._restore.pop(rid, None)
        if restore is not None:
            pool.mark_busy(restore, step)
            out["state_restore"] = restore
        saves = []
        every = self.checkpoint_interval
        pinned = tuple(self._restore.values())  # admitted this step, restored at its start
        for m in range((start // every + 1) * every, start + num_tokens + 1, every):
            row = pool.reserve(self.kv.block_hash(request, m), step, pinned)
            if row is not None:
                saves.append((m, row))
        if saves:
            self._saves.setdefault(rid, []).extend(saves)
        out["state_saves"] = tuple(saves)
        return out

    def state_slot(self, request_id: str) -> int | None:
        """The state slot the request holds (None if it holds none)."""
        return self._slot.get(request_id)

    def cache_full_blocks(self, request: Request) -> None:
        """The wrapped manager's; and the checkpoints the request's last step wrote become
        findable (the step succeeded)."""
        self.kv.cache_full_blocks(request)
        pending = self._saves.get(request.request_id)
        if pending:
            done = [(m, row) for m, row in pending if m <= request.num_computed_tokens]
            for _, row in done:
                self.checkpoints.commit(row)
            pending[:] = [s for s in pending if s not in done]

    def free(self, request: Request) -> None:
        rid = request.request_id
        self.kv.free(request)
        slot = self._slot.pop(rid, None)
        if slot is not None:
            self._free.append(slot)
            self._free.sort()
        self._restore.pop(rid, None)
        for _, row in self._saves.pop(rid, ()):
            self.checkpoints.release(row)

    def trim(self, request: Request, num_tokens: int) -> None:
        raise ValueError("un modelo híbrido no puede descartar tokens ya calculados (su estado "
                         "fijo no guarda versiones anteriores): la decodificación especulativa "
                         "no está disponible para él")

    def block_table(self, request_id: str) -> list[int]:
        return self.kv.block_table(request_id)

    def usage(self, requests: dict) -> dict:
        """The wrapped manager's accounting (its ``prefix_hit_tokens`` are the hybrid's real
        hits, after truncation), plus the state: slots, bytes per state, and the checkpoint
        pool's rows, bytes, saves, restores and evictions; ``prefix_truncated_tokens``: cached
        KV tokens a hit could not reuse for lack of a checkpoint at their end."""
        out = self.kv.usage(requests)
        out.update({"state_slots": self.num_state_slots,
                    "state_slots_used": len(self._slot),
                    "state_bytes_per_sequence": self.state_bytes,
                    "state_checkpoint_interval": self.checkpoint_interval,
                    "prefix_truncated_tokens": self.truncated_tokens})
        if self.checkpoints is not None:
            out.update(self.checkpoints.stats())
        return out

    def check_invariants(self) -> None:
        """Every slot is free or owned by exactly one request; the checkpoint rows are each
        free, reserved or cached exactly once; the wrapped manager's own."""
        owned = sorted(self._slot.values())
        assert len(owned) == len(set(owned)), "una ranura de estado tiene dos dueños"
        assert sorted(owned + self._free) == list(range(self.num_state_slots)), \
            "ranuras de estado perdidas o duplicadas"
        if self.checkpoints is not None:
            self.checkpoints.check_invariants()
        if hasattr(self.kv, "check_invariants"):
            self.kv.check_invariants()
