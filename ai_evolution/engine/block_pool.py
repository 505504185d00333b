"""The paged KV cache's physical memory: a pool of fixed-size blocks with reference counts.

::

    physical blocks      0    1    2    3    4    5    6    7
                       +----+----+----+----+----+----+----+----+
    ref_cnt            | 2  | 1  | 0  | 1  | 0  | 0  | 1  | 0  |
    hash (full blocks) | h0 | h1 | h2 | -- | -- | h5 | -- | -- |
                       +----+----+----+----+----+----+----+----+
    free queue (least recently freed first):  2 -> 5 -> 4 -> 7
    cached (hash -> block):  h0 -> 0, h1 -> 1, h2 -> 2, h5 -> 5

    request A's block table:  [0, 1, 3]      (block 0 shared with B: ref_cnt 2)
    request B's block table:  [0, 6]

Invariants (checked by ``check_invariants`` and the property tests):

- a block is either in the free queue (``ref_cnt == 0``) or held (``ref_cnt >= 1``), never both;
  free + held = total;
- ``ref_cnt`` equals the number of block tables that hold the block;
- a block in ``cached`` carries that hash, and no two blocks carry the same hash in ``cached``;
- a free block may keep its hash (it can still be hit) until it is handed out again, at which
  point the hash is evicted.

Allocation takes from the head of the free queue, so the block freed longest ago is reused (and
its cached content evicted) first; a cache hit on a free block takes it out of the queue wherever
it sits, in O(1) (the queue is an ordered dict).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None


class BlockPool:
    """``num_blocks`` physical blocks of ``block_size`` tokens each."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks y block_size deben ser >= 1; se recibió {num_blocks}, {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[bytes, int] = {}  # block hash -> block id
        self.evictions = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached_free(self) -> int:
        """Free blocks that still hold a cached prefix (reusable by a hit until evicted)."""
        return sum(1 for b in self._free if self.blocks[b].block_hash is not None)

    def allocate(self, n: int) -> list[KVBlock] | None:
        """``n`` fresh blocks (ref_cnt 1), least recently freed first; None if fewer are free
        (and then nothing changes)."""
        if n > len(self._free):
            return None
        out = []
        for _ in range(n):
            bid, _ = self._free.popitem(last=False)
            block = self.blocks[bid]
            if block.block_hash is not None:  # reusing it evicts its cached content
                if self.cached.get(block.block_hash) == bid:
                    del self.cached[block.block_hash]
                block.block_hash = None
                self.evictions += 1
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: list[KVBlock]) -> None:
        """One more holder for each block (a prefix-cache hit); a free one leaves the queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def free(self, blocks: list[KVBlock]) -> None:
        """One holder fewer for each block; blocks that reach 0 join the tail of the free queue
        in the order given (pass a table reversed so that its last blocks are evicted first)."""
        for block in blocks:
            if block.ref_cnt < 1:
                raise ValueError(f"el bloque {block.block_id} ya está libre: no se puede liberar dos veces")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = None

    def lookup(self, block_hash: bytes) -> KVBlock | None:
        bid = self.cached.get(block_hash)
        return None if bid is None else self.blocks[bid]

    def cache(self, block: KVBlock, block_hash: bytes) -> None:
        """Record that ``block`` holds the full block whose chain hash is ``block_hash``."""
        if block.block_hash is not None:
            return
        if block_hash in self.cached:  # the same content already cached elsewhere: keep that one
            return
        block.block_hash = block_hash
        self.cached[block_hash] = block.block_id

    def check_invariants(self, holders: dict[int, int] | None = None) -> None:
        """Raise AssertionError if the pool is inconsistent; ``holders`` (block id -> number of
        block tables holding it) also checks the reference counts."""
        free = set(self._free)
        assert len(free) == len(self._free)
        for b in self.blocks:
            assert (b.ref_cnt == 0) == (b.block_id in free), f"block {b.block_id}: ref {b.ref_cnt}"
            assert b.ref_cnt >= 0
            if holders is not None:
                assert b.ref_cnt == holders.get(b.block_id, 0), \
                    f"block {b.block_id}: ref_cnt {b.ref_cnt} but {holders.get(b.block_id, 0)} holders"
        for h, bid in self.cached.items():
            assert self.blocks[bid].block_hash == h
