"""Where each running request keeps its K/V: the bookkeeping half of the KV cache.

The scheduler owns this object (it decides who gets memory); the model runner owns the tensors
and only reads the placement the scheduler hands it: a **block table** per request, the list of
physical blocks that hold its tokens in order (token ``p`` lives in block ``table[p // B]`` at
offset ``p % B``, with ``B`` the block size).

Two layouts share that interface:

- ``ContiguousSlots`` (chapter 3): one block of ``max_model_len`` tokens per request, reserved
  whole at admission whatever the request's length: a "slot".
- ``KVCacheManager`` (chapter 4): blocks of ``block_size`` tokens from a ``BlockPool``, allocated
  as the request grows, with prefix caching: full blocks are identified by a hash chain and
  shared, by reference count, between requests whose prompts start the same way.

Both answer ``allocate_slots(request, num_new_tokens)`` with the new block ids, or ``None`` when
memory is short (nothing changes then; the scheduler decides what to do).
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from .block_pool import BlockPool, KVBlock
from .request import Request


def hash_block(parent: bytes | None, token_ids: Sequence[int]) -> bytes:
    """Chain hash of one full block: its tokens *and* everything before it (via ``parent``)."""
    h = hashlib.sha256(parent or b"root")
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return h.digest()


def find_cached_prefix(token_ids: Sequence[int], block_size: int, pool: BlockPool) -> list[KVBlock]:
    """The cached blocks that hold a prefix of ``token_ids``: walk the full blocks of all tokens
    but the last (whose logits must be computed), chaining each block's hash to its parent's, and
    stop at the first block that is not cached."""
    hits, parent = [], None
    usable = len(token_ids) - 1
    for i in range(usable // block_size):
        parent = hash_block(parent, token_ids[i * block_size:(i + 1) * block_size])
        block = pool.lookup(parent)
        if block is None:
            break
        hits.append(block)
    return hits


class ContiguousSlots:
    """``num_slots`` rows of ``max_model_len`` tokens; one row per running request."""

    prefix_caching = False

    def __init__(self, num_slots: int, max_model_len: int) -> None:
        if num_slots < 1 or max_model_len < 2:
            raise ValueError(f"need num_slots >= 1 and max_model_len >= 2, got {num_slots}, {max_model_len}")
        self.num_slots = num_slots
        self.max_model_len = max_model_len
        self._free = list(range(num_slots))  # kept sorted: the lowest free row is taken first
        self._owner: dict[str, int] = {}

    # --- the layout, as the runner needs it ----------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.num_slots

    @property
    def block_size(self) -> int:
        return self.max_model_len

    @property
    def capacity_tokens(self) -> int:
        """The most tokens one request can ever hold here."""
        return self.max_model_len

    # --- the common interface ------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> int:
        """Tokens of the prompt already in the cache: none, without prefix caching."""
        return 0

    def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
        if request.request_id in self._owner:
            return []  # the row already holds max_model_len tokens
        if not self._free:
            return None
        slot = self._free.pop(0)
        self._owner[request.request_id] = slot
        return [slot]

    def free(self, request: Request) -> None:
        """Give the request's row back (no-op for a request that holds none)."""
        slot = self._owner.pop(request.request_id, None)
        if slot is not None:
            self._free.append(slot)
            self._free.sort()

    def cache_full_blocks(self, request: Request) -> None:
        pass

    def block_table(self, request_id: str) -> list[int]:
        return [self._owner[request_id]]

    def slot_of(self, request_id: str) -> int:
        return self._owner[request_id]

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def owners(self) -> dict[str, int]:
        """request_id -> first block (the row), for every holder."""
        return dict(self._owner)

    def usage(self, requests: dict[str, Request]) -> dict:
        held = {rid: requests[rid].num_computed_tokens for rid in self._owner if rid in requests}
        return _usage(self.num_slots, len(self._owner), 0, self.max_model_len,
                      {rid: 1 for rid in self._owner}, held)


class KVCacheManager:
    """Paged KV: block tables over a ``BlockPool``, with optional prefix caching.

    ``get_computed_blocks(request)`` looks the prompt up block by block along the hash chain
    (``prefix_fn``, by default ``find_cached_prefix``) and stops at the first miss; it never covers the whole prompt (the last prompt token is always
    computed, so that its logits exist). ``allocate_slots`` then holds those blocks (a hit on a
    free block takes it out of the free queue) and adds fresh ones for the new tokens.
    ``cache_full_blocks`` registers the hashes of the request's blocks that became full.
    """

    def __init__(self, num_blocks: int, block_size: int = 16, max_model_len: int | None = None,
                 enable_prefix_caching: bool = True, pool: BlockPool | None = None,
                 prefix_fn=find_cached_prefix) -> None:
        self.pool = pool if pool is not None else BlockPool(num_blocks, block_size)
        if (self.pool.num_blocks, self.pool.block_size) != (num_blocks, block_size):
            raise ValueError(f"the pool has {self.pool.num_blocks} blocks of {self.pool.block_size} "
                             f"tokens; expected {num_blocks} of {block_size}")
        self.prefix_fn = prefix_fn
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.prefix_caching = enable_prefix_caching
        self.tables: dict[str, list[KVBlock]] = {}
        self._hashes: dict[str, list[bytes]] = {}  # chain hashes of each request's full blocks
        self._pending_hits: dict[str, list[KVBlock]] = {}
        self.hit_tokens = 0     # prompt tokens served from the cache (never recomputed)
        self.queried_tokens = 0  # prompt tokens looked up

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free(self) -> int:
        return self.pool.num_free

    @property
    def capacity_tokens(self) -> int:
        """The most tokens one request can ever hold: the whole pool."""
        return self.pool.num_blocks * self.block_size

    def _chain(self, request: Request, upto_tokens: int) -> list[bytes]:
        """Chain hashes of the request's full blocks within its first ``upto_tokens`` tokens."""
        hashes = self._hashes.setdefault(request.request_id, [])
        tokens = request.all_token_ids
        B = self.block_size
        while (len(hashes) + 1) * B <= upto_tokens:
            i = len(hashes)
            hashes.append(hash_block(hashes[-1] if hashes else None, tokens[i * B:(i + 1) * B]))
        return hashes[: upto_tokens // B]

    def get_computed_blocks(self, request: Request) -> int:
        """Tokens of ``request`` whose K/V are already cached (a multiple of the block size, less
        than ``num_tokens``); the hit blocks are remembered for the next ``allocate_slots``."""
        self._pending_hits.pop(request.request_id, None)
        if not self.prefix_caching or request.request_id in self.tables:
            return 0
        hits = list(self.prefix_fn(request.all_token_ids, self.block_size, self.pool))
        self._pending_hits[request.request_id] = hits
        return len(hits) * self.block_size

    def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
        """Blocks for ``num_new_tokens`` more tokens after ``request.num_computed_tokens`` (after
        the hits of a preceding ``get_computed_blocks``); the new block ids, or None if the pool
        is short (and then nothing changes)."""
        rid = request.request_id
        table = self.tables.get(rid, [])
        hits = self._pending_hits.get(rid, []) if not table else []
        computed = max(request.num_computed_tokens, len(hits) * self.block_size)
        need = -(-(computed + num_new_tokens) // self.block_size) - len(table) - len(hits)
        # a hit on a free block takes it from the free queue: count it against what is free
        free_hits = sum(1 for b in hits if b.ref_cnt == 0)
        if need + free_hits > self.pool.num_free:
            return None
        self.pool.touch(hits)
        new = self.pool.allocate(max(0, need)) or []
        if table == [] and hits:
            self.hit_tokens += len(hits) * self.block_size
        if not table:
            self.queried_tokens += request.num_prompt_tokens
        self._pending_hits.pop(rid, None)
        self.tables[rid] = table + hits + new
        return [b.block_id for b in hits + new]

    def free(self, request: Request) -> None:
        """Return every block of the request (its last blocks become the first to evict)."""
        self._pending_hits.pop(request.request_id, None)
        self._hashes.pop(request.request_id, None)
        table = self.tables.pop(request.request_id, None)
        if table:
            self.pool.free(list(reversed(table)))

    def cache_full_blocks(self, request: Request) -> None:
        """Register the hash of every block of ``request`` that is full of computed tokens."""
        if not self.prefix_caching:
            return
        table = self.tables.get(request.request_id)
        if not table:
            return
        for block, h in zip(table, self._chain(request, request.num_computed_tokens)):
            self.pool.cache(block, h)

    def block_table(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.tables[request_id]]

    @property
    def owners(self) -> dict[str, int]:
        return {rid: t[0].block_id for rid, t in self.tables.items() if t}

    def holders(self) -> dict[int, int]:
        """block id -> number of block tables holding it (what ref_cnt must equal)."""
        out: dict[int, int] = {}
        for table in self.tables.values():
            for b in table:
                out[b.block_id] = out.get(b.block_id, 0) + 1
        return out

    def check_invariants(self) -> None:
        self.pool.check_invariants(self.holders())

    def usage(self, requests: dict[str, Request]) -> dict:
        held = {rid: requests[rid].num_computed_tokens for rid in self.tables if rid in requests}
        return _usage(self.pool.num_blocks, self.pool.num_used, self.pool.num_cached_free,
                      self.block_size, {rid: len(t) for rid, t in self.tables.items()}, held)


def _usage(total: int, used: int, cached_free: int, block_size: int, blocks: dict[str, int],
           tokens: dict[str, int]) -> dict:
    """Memory accounting: blocks total/used/cached-but-free, and per request the tokens it
    holds against the token slots it reserves (shared blocks count for each holder)."""
    reserved = sum(blocks.values()) * block_size
    real = sum(tokens.values())
    return {"blocks_total": total, "blocks_used": used, "blocks_cached_free": cached_free,
            "block_size": block_size, "reserved_token_slots": reserved, "tokens": real,
            "utilization": real / reserved if reserved else 1.0,
            "per_request": {rid: {"tokens": tokens.get(rid, 0), "reserved": n * block_size}
                            for rid, n in blocks.items()}}
