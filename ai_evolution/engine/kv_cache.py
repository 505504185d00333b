"""Where each running request keeps its K/V: the bookkeeping half of the KV cache.

The scheduler owns this object (it decides who gets memory); the model runner owns the tensors
and only reads the placement the scheduler hands it: a **block table** per request, the list of
physical blocks that hold its tokens in order (token ``p`` lives in block ``table[p // B]`` at
offset ``p % B``, with ``B`` the block size).

Two layouts share that interface:

- ``ContiguousKVManager`` (chapter 3): one block of ``max_model_len`` tokens per request (its
  *row*), reserved whole at admission whatever the request's length.
- ``KVCacheManager`` (chapter 4): blocks of ``block_size`` tokens from a ``BlockPool``, allocated
  as the request grows, with prefix caching: full blocks are identified by a hash chain and
  shared, by reference count, between requests whose prompts start the same way.

Both follow the ``KVManager`` protocol below. Words: a *slot* is the place of one token's K/V
(block, offset); a *row* is a whole contiguous block of one request; a *block* is the unit of
allocation. Admission is two explicit calls, as in vLLM v1: ``get_computed_blocks(request)``
returns the cached blocks that already hold a prefix of the prompt and how many tokens they
cover; the scheduler passes them to ``allocate_slots(request, num_new_tokens, computed_blocks)``,
which holds them and adds blocks for the new tokens, or returns ``None`` when memory is short
(nothing changes then; the scheduler decides what to do).
"""

from __future__ import annotations

import hashlib
from typing import Iterator, Protocol, Sequence

import numpy as np

from .block_pool import BlockPool, KVBlock
from .request import Request


def hash_block(parent: bytes | None, token_ids: Sequence[int]) -> bytes:
    """Chain hash of one full block: its tokens *and* everything before it (via ``parent``)."""
    h = hashlib.sha256(parent or b"root")
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return h.digest()


def block_hashes(token_ids: Sequence[int], block_size: int, done: Sequence[bytes] = ()) -> Iterator[bytes]:
    """The chain hashes of the full blocks of ``token_ids``, one at a time, after the ``done``
    ones already known (the hash of block ``i`` covers blocks ``0..i``)."""
    parent = done[-1] if done else None
    for i in range(len(done), len(token_ids) // block_size):
        parent = hash_block(parent, token_ids[i * block_size:(i + 1) * block_size])
        yield parent


def find_cached_prefix(token_ids: Sequence[int], block_size: int, pool: BlockPool) -> list[KVBlock]:
    """The cached blocks that hold a prefix of ``token_ids``: walk the full blocks of all tokens
    but the last (whose logits must be computed) along the hash chain, and stop at the first
    block that is not cached."""
    hits = []
    for h in block_hashes(token_ids[:len(token_ids) - 1], block_size):
        block = pool.lookup(h)
        if block is None:
            break
        hits.append(block)
    return hits


class KVManager(Protocol):
    """What the scheduler needs from a KV layout (the bookkeeping; the runner holds the tensors).

    ``num_blocks`` blocks of ``block_size`` token slots each; ``capacity_tokens``: the most one
    request can ever hold; ``num_free``: blocks free now.
    """

    num_blocks: int
    block_size: int
    capacity_tokens: int
    num_free: int

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """Cached blocks holding a prefix of a waiting request's prompt, and the tokens they
        cover (never the whole prompt: its last token's logits must be computed). Changes nothing."""

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       computed_blocks: Sequence[KVBlock] = ()) -> list[int] | None:
        """Make room for ``num_new_tokens`` after what the request has computed (at admission:
        after ``computed_blocks``, which it then holds). The new block ids, or ``None`` when
        memory is short, and then nothing changes."""

    def free(self, request: Request) -> None:
        """Give back every block of the request (no-op for one that holds none)."""

    def trim(self, request: Request, num_tokens: int) -> None:
        """Give back the blocks past the first ``num_tokens`` tokens (rejected draft tokens)."""

    def cache_full_blocks(self, request: Request) -> None:
        """Make the request's full, computed blocks findable by later prompts (prefix caching)."""

    def block_table(self, request_id: str) -> list[int]:
        """The blocks of a request, in token order."""

    @property
    def holders(self) -> dict[str, int]:
        """Every request that holds KV -> its first block."""

    def usage(self, requests: dict[str, Request]) -> dict:
        """Memory accounting now (see ``_usage``), prefix-cache counters included."""


class ContiguousKVManager:
    """``num_rows`` rows of ``max_model_len`` tokens; one row per running request."""

    prefix_caching = False

    def __init__(self, num_rows: int, max_model_len: int) -> None:
        if num_rows < 1 or max_model_len < 2:
            raise ValueError(f"num_rows debe ser >= 1 y max_model_len >= 2; se recibió {num_rows}, {max_model_len}")
        self.num_rows = num_rows
        self.max_model_len = max_model_len
        self._free = list(range(num_rows))  # kept sorted: the lowest free row is taken first
        self._owner: dict[str, int] = {}

    # --- the layout, as the runner needs it ----------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.num_rows

    @property
    def block_size(self) -> int:
        return self.max_model_len

    @property
    def capacity_tokens(self) -> int:
        """The most tokens one request can ever hold here."""
        return self.max_model_len

    # --- the common interface ------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """Nothing of the prompt is cached: no prefix caching here."""
        return [], 0

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       computed_blocks: Sequence[KVBlock] = ()) -> list[int] | None:
        if request.request_id in self._owner:
            return []  # the row already holds max_model_len tokens
        if not self._free:
            return None
        row = self._free.pop(0)
        self._owner[request.request_id] = row
        return [row]

    def free(self, request: Request) -> None:
        """Give the request's row back (no-op for a request that holds none)."""
        row = self._owner.pop(request.request_id, None)
        if row is not None:
            self._free.append(row)
            self._free.sort()

    def trim(self, request: Request, num_tokens: int) -> None:
        pass  # the row is the request's whole reservation

    def cache_full_blocks(self, request: Request) -> None:
        pass

    def block_table(self, request_id: str) -> list[int]:
        return [self._owner[request_id]]

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def holders(self) -> dict[str, int]:
        """request_id -> its row, for every holder."""
        return dict(self._owner)

    def usage(self, requests: dict[str, Request]) -> dict:
        held = {rid: requests[rid].num_computed_tokens for rid in self._owner if rid in requests}
        return _usage(self.num_rows, len(self._owner), 0, self.max_model_len,
                      {rid: 1 for rid in self._owner}, held)


class KVCacheManager:
    """Paged KV: block tables over a ``BlockPool``, with optional prefix caching.

    ``get_computed_blocks(request)`` looks the prompt up block by block along the hash chain
    (``prefix_fn``, by default ``find_cached_prefix``) and stops at the first miss; it never
    covers the whole prompt (the last prompt token is always computed, so that its logits exist).
    ``allocate_slots(request, n, computed_blocks)`` then holds those blocks (a hit on a free block
    takes it out of the free queue) and adds fresh ones for the new tokens. ``cache_full_blocks``
    registers the hashes of the request's blocks that became full (each request's hash chain is
    computed once, block by block, as it fills).
    """

    def __init__(self, num_blocks: int, block_size: int = 16, max_model_len: int | None = None,
                 enable_prefix_caching: bool = True, pool: BlockPool | None = None,
                 prefix_fn=find_cached_prefix) -> None:
        self.pool = pool if pool is not None else BlockPool(num_blocks, block_size)
        if (self.pool.num_blocks, self.pool.block_size) != (num_blocks, block_size):
            raise ValueError(f"el pool tiene {self.pool.num_blocks} bloques de {self.pool.block_size} "
                             f"tokens y el gestor espera {num_blocks} de {block_size}: deben coincidir")
        self.prefix_fn = prefix_fn
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.prefix_caching = enable_prefix_caching
        self.tables: dict[str, list[KVBlock]] = {}
        self._hashes: dict[str, list[bytes]] = {}  # chain hashes of each request's full blocks
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
        """Chain hashes of the request's full blocks within its first ``upto_tokens`` tokens,
        extending the ones already computed for it."""
        hashes = self._hashes.setdefault(request.request_id, [])
        hashes.extend(block_hashes(request.all_token_ids[:upto_tokens], self.block_size, hashes))
        return hashes[: upto_tokens // self.block_size]

    def block_hash(self, request: Request, num_tokens: int) -> bytes:
        """The chain hash of the request's block that ends at token ``num_tokens`` (a multiple of
        the block size, within its known tokens): the key of everything cached for that prefix."""
        if num_tokens < self.block_size or num_tokens % self.block_size:
            raise ValueError(f"num_tokens={num_tokens} debe ser un múltiplo positivo de "
                             f"block_size={self.block_size}")
        return self._chain(request, num_tokens)[num_tokens // self.block_size - 1]

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """The cached blocks that hold a prefix of ``request`` (a waiting request) and the tokens
        they cover: a multiple of the block size, less than ``num_tokens``."""
        if not self.prefix_caching or request.request_id in self.tables:
            return [], 0
        hits = list(self.prefix_fn(request.all_token_ids, self.block_size, self.pool))
        return hits, self.tokens_in(hits)

    def tokens_in(self, computed_blocks: Sequence[KVBlock]) -> int:
        """The prompt tokens that cached blocks hold: the one place that count is decided
        (``get_computed_blocks`` reports it, ``allocate_slots`` starts after it)."""
        return len(computed_blocks) * self.block_size

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       computed_blocks: Sequence[KVBlock] = ()) -> list[int] | None:
        """Blocks for ``num_new_tokens`` more tokens after what the request has computed; at
        admission (no table yet) after ``computed_blocks``, which the request then holds. The
        new block ids (hits included), or None if the pool is short (and then nothing changes)."""
        rid = request.request_id
        table = self.tables.get(rid, [])
        hits = list(computed_blocks) if not table else []
        computed = request.num_computed_tokens if table else self.tokens_in(hits)
        need = -(-(computed + num_new_tokens) // self.block_size) - len(table) - len(hits)
        # a hit on a free block takes it from the free queue: count it against what is free
        free_hits = sum(1 for b in hits if b.ref_cnt == 0)
        if need + free_hits > self.pool.num_free:
            return None
        self.pool.touch(hits)
        new = self.pool.allocate(max(0, need)) or []
        if table == [] and hits:
            self.hit_tokens += self.tokens_in(hits)
        if not table:
            self.queried_tokens += request.num_prompt_tokens
        self.tables[rid] = table + hits + new
        return [b.block_id for b in hits + new]

    def free(self, request: Request) -> None:
        """Return every block of the request (its last blocks become the first to evict)."""
        self._hashes.pop(request.request_id, None)
        table = self.tables.pop(request.request_id, None)
        if table:
            self.pool.free(list(reversed(table)))

    def trim(self, request: Request, num_tokens: int) -> None:
        """Free the blocks past the first ``num_tokens`` tokens (speculative decoding: the slots
        of rejected drafts). Their content was never registered: only computed, full blocks are."""
        table = self.tables.get(request.request_id)
        keep = -(-num_tokens // self.block_size)
        if table and len(table) > keep:
            self.pool.free(list(reversed(table[keep:])))
            del table[keep:]

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
    def holders(self) -> dict[str, int]:
        """request_id -> its first block, for every holder."""
        return {rid: t[0].block_id for rid, t in self.tables.items() if t}

    def tables_per_block(self) -> dict[int, int]:
        """block id -> number of block tables holding it (what ref_cnt must equal)."""
        out: dict[int, int] = {}
        for table in self.tables.values():
            for b in table:
                out[b.block_id] = out.get(b.block_id, 0) + 1
        return out

    def check_invariants(self) -> None:
        self.pool.check_invariants(self.tables_per_block())

    def usage(self, requests: dict[str, Request]) -> dict:
        held = {rid: requests[rid].num_computed_tokens for rid in self.tables if rid in requests}
        return _usage(self.pool.num_blocks, self.pool.num_used, self.pool.num_cached_free,
                      self.block_size, {rid: len(t) for rid, t in self.tables.items()}, held,
                      self.hit_tokens, self.queried_tokens, self.pool.evictions)


def _usage(total: int, used: int, cached_free: int, block_size: int, blocks: dict[str, int],
           tokens: dict[str, int], hit_tokens: int = 0, queried_tokens: int = 0,
           evictions: int = 0) -> dict:
    """Memory accounting: blocks total/used/cached-but-free, per request the tokens it holds
    against the token slots it reserves (shared blocks count for each holder), and the prefix
    cache's counters (prompt tokens looked up, served from the cache, cached blocks evicted)."""
    reserved = sum(blocks.values()) * block_size
    real = sum(tokens.values())
    return {"blocks_total": total, "blocks_used": used, "blocks_cached_free": cached_free,
            "block_size": block_size, "reserved_token_slots": reserved, "tokens": real,
            "utilization": real / reserved if reserved else 1.0,
            "prefix_hit_tokens": hit_tokens, "prefix_queried_tokens": queried_tokens,
            "evictions": evictions,
            "per_request": {rid: {"tokens": tokens.get(rid, 0), "reserved": n * block_size}
                            for rid, n in blocks.items()}}
