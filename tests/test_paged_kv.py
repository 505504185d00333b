"""The paged KV cache of chapter 4: block pool, block tables, prefix caching and preemption.

Paging is a memory trick, never a change of output: every request must get exactly the tokens it
would get alone, whatever the block size, however small the pool (preemption by recompute) and
whether or not its prompt was served from the prefix cache. Underneath, the pool must stay
consistent after every operation (a block is free or held, its reference count is its number of
holders, a cached hash points at the block that carries it), a refused allocation must change
nothing, and a request must never write into a block that someone else can read.

No test asserts a duration: the machine is shared.
"""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest
import torch
from hypothesis import given, settings, strategies as st

from ai_evolution.engine import (LLM, BlockPool, FinishReason, KVCacheManager, LLMEngine, Request,
                                 RequestRejected, RequestStatus, build_engine, hash_block)
from ai_evolution.generation import generate
from ai_evolution.sim import sim_engine, step_cost
from engine_helpers import PROPS, COST, SMALL, cdiv, check_done, greedy, schedule, solo

pytestmark = pytest.mark.usefixtures("one_thread")

POLICIES = ("static", "continuous")
BLOCK_SIZES = (1, 4, 16)
MAX_LEN = 96
WIDTH = 4
SMALL_LEN = 40


# --- fixtures and helpers -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def workload(tiny):
    """12 requests: half share a 40-token prefix (two and a half 16-token blocks), the other half
    are unrelated; 1..24 new tokens; two (one of each kind) are seeded samples. With each
    one's solo, uncached continuation."""
    rng = random.Random(0)
    vocab = tiny.config.vocab_size
    prefix = [rng.randrange(vocab) for _ in range(40)]
    items = []
    for i in range(12):
        if i % 2 == 0:
            prompt = prefix + [rng.randrange(vocab) for _ in range(rng.randint(0 if i == 4 else 1, 10))]
        else:
            prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 50))]
        n = 24 if i == 1 else rng.randint(1, 20)
        params = greedy(n)
        if i in (2, 5):
            params = greedy(n, temperature=1.0, top_k=50, top_p=0.9, seed=40 + i)
        items.append((prompt, params))
    refs = [solo(tiny, p, sp) for p, sp in items]
    for (p, sp), ref in zip(items, refs):
        if sp.temperature > 0:  # the samples really differ from the greedy continuation
            assert ref != generate(tiny, p, sp.max_tokens, cache=None)[0]
    return items, refs


def longest(items) -> int:
    return max(min(len(p) + sp.max_tokens, MAX_LEN) for p, sp in items)


def watch_preemptions(engine: LLMEngine) -> None:
    """Check every planning round (``schedule()`` may plan several): the victims of a preemption are the newest unfinished running
    requests (newest first), they go back to the head of the queue in their old order, and a step
    that preempts admits nobody."""
    sched = engine.scheduler
    if getattr(sched, "_watched", False):
        return
    inner = sched._plan_once

    def schedule():
        before = [r.request_id for r in sched.running if not r.is_finished]
        out = inner()
        if out.preempted:
            k = len(out.preempted)
            assert not out.admitted
            assert list(out.preempted) == before[::-1][:k]
            assert [r.request_id for r in sched.waiting][:k] == list(out.preempted[::-1])
        return out

    sched._plan_once, sched._watched = schedule, True


def drain_checked(engine: LLMEngine) -> None:
    """Step to the end checking the KV manager after every step, then retire the last requests."""
    kv = engine.scheduler.kv
    watch_preemptions(engine)
    while engine.has_unfinished_requests():
        engine.step()
        kv.check_invariants()
        for r in engine.scheduler.running:
            table = kv.tables[r.request_id]
            assert len(table) == cdiv(r.num_computed_tokens, kv.block_size)
            assert len({b.block_id for b in table}) == len(table)
        if engine.scheduler.running:
            check_usage(engine)
    engine.retire_finished()
    kv.check_invariants()


def check_history(engine: LLMEngine) -> None:
    """Per request, the steps either continue where the last one stopped (start == previous
    context) or restart after a preemption from a cached prefix (a whole number of blocks). A
    restart needs a preemption; a preemption may look like no restart when the whole context was
    still cached (the request then recomputes only its last token)."""
    B = engine.scheduler.kv.block_size
    last: dict[str, int] = {}
    restarts: dict[str, int] = {}
    for h in engine.history:
        for e in h.scheduled:
            r = engine.requests[e.request_id]
            start = e.context_len - e.num_tokens
            assert e.context_len <= engine.max_model_len
            if e.request_id not in last:
                assert start % B == 0 and start < r.num_prompt_tokens  # the prompt's cached blocks
            elif start != last[e.request_id]:
                assert start < last[e.request_id] and start % B == 0
                restarts[e.request_id] = restarts.get(e.request_id, 0) + 1
            else:
                assert e.num_tokens == 1  # a decode step
            last[e.request_id] = e.context_len
    # first come, first served: nobody starts before a request added earlier
    first = {}
    for h in engine.history:
        for e in h.scheduled:
            first.setdefault(e.request_id, h.step)
    starts = [first[rid] for rid in engine.requests if rid in first]
    assert starts == sorted(starts)
    for rid, r in engine.requests.items():
        assert restarts.get(rid, 0) <= r.num_preemptions, rid
        if not engine.scheduler.kv.prefix_caching:
            assert restarts.get(rid, 0) == r.num_preemptions, rid
    assert sum(r.num_preemptions for r in engine.requests.values()) == engine.scheduler.num_preemptions


# --- 1. the block pool ------------------------------------------------------------------------------
def free_order(pool: BlockPool) -> list[int]:
    return list(pool._free)


def test_blocks_freed_first_are_reused_first():
    pool = BlockPool(6, 4)
    blocks = pool.allocate(6)
    assert [b.block_id for b in blocks] == list(range(6)) and pool.num_free == 0
    assert pool.allocate(1) is None and pool.num_free == 0
    for i in (4, 1, 5):
        pool.free([blocks[i]])
    assert free_order(pool) == [4, 1, 5]
    assert [b.block_id for b in pool.allocate(2)] == [4, 1]
    pool.free([blocks[0], blocks[3]])
    assert free_order(pool) == [5, 0, 3]
    pool.check_invariants()


def test_a_table_is_freed_tail_first_so_its_tail_is_evicted_first():
    kv = KVCacheManager(num_blocks=6, block_size=2)
    r = Request("a", [1, 2, 3, 4, 5, 6, 7], greedy(4))
    table = kv.allocate_slots(r, r.num_tokens)
    assert table == [0, 1, 2, 3]
    kv.free(r)
    assert free_order(kv.pool) == [4, 5, 3, 2, 1, 0]
    s = Request("b", [9] * 9, greedy(1))
    assert kv.allocate_slots(s, s.num_tokens) == [4, 5, 3, 2, 1]  # a's first block survives longest
    kv.check_invariants()


def test_a_hit_on_a_free_cached_block_takes_it_out_of_the_queue_wherever_it_sits():
    pool = BlockPool(5, 2)
    assert isinstance(pool._free, OrderedDict)  # removal by key: O(1), no scan of the queue
    blocks = pool.allocate(5)
    pool.cache(blocks[2], b"h2")
    pool.free(blocks)
    assert free_order(pool) == [0, 1, 2, 3, 4]
    hit = pool.lookup(b"h2")
    assert hit is blocks[2] and hit.ref_cnt == 0
    pool.touch([hit])
    assert free_order(pool) == [0, 1, 3, 4] and hit.ref_cnt == 1
    assert hit.block_hash == b"h2" and pool.cached[b"h2"] == 2  # still cached, now held
    pool.touch([hit])  # a second holder
    assert hit.ref_cnt == 2
    pool.check_invariants({2: 2})
    pool.free([hit])
    assert 2 not in pool._free
    pool.free([hit])
    assert free_order(pool) == [0, 1, 3, 4, 2]  # back at the tail: freed most recently
    with pytest.raises(ValueError):
        pool.free([hit])


def test_evicting_a_cached_block_forgets_its_hash():
    pool = BlockPool(2, 2)
    a, b = pool.allocate(2)
    pool.cache(a, b"ha")
    pool.cache(b, b"hb")
    pool.free([a, b])
    assert pool.num_cached_free == 2 and pool.evictions == 0
    got, = pool.allocate(1)
    assert got is a and a.block_hash is None and pool.lookup(b"ha") is None
    assert pool.lookup(b"hb") is b and pool.cached == {b"hb": 1}
    assert pool.evictions == 1 and pool.num_cached_free == 1
    pool.check_invariants({0: 1})


def test_the_same_content_is_cached_once():
    pool = BlockPool(3, 2)
    a, b, _ = pool.allocate(3)
    pool.cache(a, b"h")
    pool.cache(b, b"h")  # same content elsewhere: the first copy stays the cached one
    assert pool.cached == {b"h": a.block_id} and b.block_hash is None
    pool.cache(a, b"other")  # a block keeps its first hash
    assert a.block_hash == b"h" and b"other" not in pool.cached


def test_hash_chain_depends_on_everything_before_the_block():
    toks = [5, 6, 7, 8]
    assert hash_block(None, toks) == hash_block(None, list(toks))
    p1, p2 = hash_block(None, [1, 2, 3, 4]), hash_block(None, [1, 2, 3, 9])
    assert p1 != p2
    assert hash_block(p1, toks) != hash_block(p2, toks)
    assert hash_block(p1, toks) != hash_block(None, toks)
    assert hash_block(None, [1, 2]) != hash_block(None, [2, 1])
    # the same second block after different first blocks: no hit on it
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = Request("a", [1, 2, 3, 4] + toks + [0], greedy(1))
    compute_prompt(kv, a)
    b = Request("b", [1, 2, 3, 9] + toks + [0], greedy(1))
    assert kv.get_computed_blocks(b) == ([], 0)
    c = Request("c", [1, 2, 3, 4] + toks + [0], greedy(1))
    assert kv.get_computed_blocks(c)[1] == 8


def compute_prompt(kv: KVCacheManager, r: Request) -> list[int]:
    """Admit ``r`` as the scheduler does and pretend its prompt ran; its new block ids."""
    hits, hit = kv.get_computed_blocks(r)
    ids = kv.allocate_slots(r, r.num_tokens - hit, hits)
    assert ids is not None
    r.num_computed_tokens = r.num_tokens
    kv.cache_full_blocks(r)
    return ids


def test_lookup_stops_at_the_first_miss():
    B = 4
    kv = KVCacheManager(num_blocks=3, block_size=B)
    a = Request("a", list(range(12)), greedy(1))
    assert compute_prompt(kv, a) == [0, 1, 2]
    assert len(kv.pool.cached) == 3
    kv.free(a)
    assert free_order(kv.pool) == [2, 1, 0]
    # evict the middle block only: hold the tail, take one block, give the tail back
    tail = kv.pool.blocks[2]
    kv.pool.touch([tail])
    kv.pool.allocate(1)
    kv.pool.free([tail])
    assert kv.pool.blocks[1].block_hash is None and tail.block_hash is not None
    b = Request("b", list(range(12)) + [99], greedy(1))
    # block 2 is still cached, but after a miss
    assert kv.get_computed_blocks(b) == ([kv.pool.blocks[0]], B)


def test_a_whole_prompt_match_still_computes_the_last_token():
    for B in (1, 2, 4):
        kv = KVCacheManager(num_blocks=32, block_size=B)
        a = Request("a", list(range(8)), greedy(1))
        compute_prompt(kv, a)
        same = Request("same", list(range(8)), greedy(1))
        hits, hit = kv.get_computed_blocks(same)
        assert hit % B == 0 and hit < same.num_tokens and hit == 8 - B == len(hits) * B
        ids = kv.allocate_slots(same, same.num_tokens - hit, hits)
        assert ids[:hit // B] == [b.block_id for b in kv.tables["a"][:hit // B]]
        assert len(ids) == 8 // B and ids[-1] not in kv.block_table("a")  # the last block is its own
        longer = Request("longer", list(range(9)), greedy(1))
        assert kv.get_computed_blocks(longer)[1] == 8
        one = Request("one", [0], greedy(1))
        assert kv.get_computed_blocks(one) == ([], 0)
        kv.check_invariants()


def test_a_refused_allocation_counts_the_free_hits_against_the_pool():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    a = Request("a", [1, 2, 3, 4, 5], greedy(1))
    compute_prompt(kv, a)  # 3 blocks, 2 full and cached
    kv.free(a)
    other = Request("o", [7], greedy(1))
    compute_prompt(kv, other)  # takes the never-used block 3
    b = Request("b", [1, 2, 3, 4, 6, 6, 6, 6], greedy(1))
    hits, n = kv.get_computed_blocks(b)
    assert n == 4 and len(hits) == 2  # two free cached blocks
    before = snapshot(kv)
    # b needs its 2 hits and 2 new blocks; 3 are free (2 of them the hits)
    assert kv.allocate_slots(b, b.num_tokens - 4, hits) is None
    assert snapshot(kv) == before
    kv.free(other)
    hits, n = kv.get_computed_blocks(b)
    assert n == 4
    assert kv.allocate_slots(b, b.num_tokens - 4, hits) is not None
    kv.check_invariants()


def test_without_prefix_caching_nothing_is_hashed_or_hit():
    kv = KVCacheManager(num_blocks=8, block_size=2, enable_prefix_caching=False)
    a = Request("a", [1, 2, 3, 4, 5], greedy(1))
    compute_prompt(kv, a)
    assert not kv.pool.cached and all(b.block_hash is None for b in kv.pool.blocks)
    assert kv.get_computed_blocks(Request("b", [1, 2, 3, 4, 5], greedy(1))) == ([], 0)


# --- 1b. property test: random operations on a small pool ----------------------------------------
def snapshot(kv: KVCacheManager):
    p = kv.pool
    return ([(b.ref_cnt, b.block_hash) for b in p.blocks], list(p._free), dict(p.cached), p.evictions,
            {rid: [b.block_id for b in t] for rid, t in kv.tables.items()}, kv.hit_tokens,
            kv.queried_tokens)


class Shadow:
    """The manager plus an independent model of what every physical block holds, filled as the
    (pretend) runner writes each computed token at ``table[p // B]``, offset ``p % B``."""

    def __init__(self, kv: KVCacheManager) -> None:
        self.kv, self.B = kv, kv.block_size
        self.content: dict[int, list] = {}
        self.live: dict[str, Request] = {}
        self.hash_tokens: dict[bytes, tuple] = {}
        self.seen: list[list[int]] = []

    def chain(self, tokens: list[int], upto: int) -> list[bytes]:
        out, parent = [], None
        for i in range(upto // self.B):
            block = tokens[i * self.B:(i + 1) * self.B]
            parent = hash_block(parent, block)
            self.hash_tokens[parent] = tuple(block)
            out.append(parent)
        return out

    def write(self, r: Request, start: int, end: int) -> None:
        table = self.kv.tables[r.request_id]
        tokens = r.all_token_ids
        for p in range(start, end):
            block = table[p // self.B]
            # never write where another request can read, nor into a block the cache vouches for
            assert block.ref_cnt == 1 and block.block_hash is None, (r.request_id, p, block)
            self.content.setdefault(block.block_id, [None] * self.B)[p % self.B] = tokens[p]
        self.chain(tokens, end)

    def expected_hit(self, r: Request) -> int:
        if not self.kv.prefix_caching:
            return 0
        n = 0
        for h in self.chain(r.all_token_ids, r.num_tokens - 1):
            if h not in self.kv.pool.cached:
                break
            n += 1
        return n * self.B

    def admit(self, r: Request) -> bool:
        kv = self.kv
        hits, hit = kv.get_computed_blocks(r)
        assert hit == self.expected_hit(r) and hit % self.B == 0 and hit < r.num_tokens
        assert hit == len(hits) * self.B
        for i, b in enumerate(hits):  # a hit serves exactly the prompt's tokens
            assert self.content[b.block_id] == r.all_token_ids[i * self.B:(i + 1) * self.B]
        before = snapshot(kv)
        free_hits = sum(1 for b in hits if b.ref_cnt == 0)
        short = cdiv(r.num_tokens, self.B) - len(hits) + free_hits > kv.num_free
        ids = kv.allocate_slots(r, r.num_tokens - hit, hits)
        if ids is None:
            assert short and snapshot(kv) == before
            return False
        assert not short
        assert ids == kv.block_table(r.request_id) and len(ids) == cdiv(r.num_tokens, self.B)
        assert ids[:len(hits)] == [b.block_id for b in hits]
        for bid in ids[len(hits):]:
            self.content.pop(bid, None)  # fresh block: whatever it held is gone
        self.live[r.request_id] = r
        self.seen.append(r.prompt_token_ids)
        r.num_computed_tokens = hit
        self.write(r, hit, r.num_tokens)
        r.num_computed_tokens = r.num_tokens
        kv.cache_full_blocks(r)
        r.output_token_ids.append(len(r.output_token_ids) % 3)  # the sampled token, not yet computed
        return True

    def grow(self, r: Request, k: int, on_refusal: str) -> None:
        kv = self.kv
        extra = [7 + (len(r.output_token_ids) + j) % 2 for j in range(k - 1)]
        r.output_token_ids += extra
        before = snapshot(kv)
        short = cdiv(r.num_tokens, self.B) - len(kv.tables[r.request_id]) > kv.num_free
        ids = kv.allocate_slots(r, r.num_tokens - r.num_computed_tokens)
        if ids is None:
            assert short and snapshot(kv) == before
            if on_refusal == "preempt":
                self.free(r)
            else:
                del r.output_token_ids[len(r.output_token_ids) - len(extra):]
            return
        assert not short and len(kv.tables[r.request_id]) == cdiv(r.num_tokens, self.B)
        for bid in ids:
            self.content.pop(bid, None)
        self.write(r, r.num_computed_tokens, r.num_tokens)
        r.num_computed_tokens = r.num_tokens
        kv.cache_full_blocks(r)
        r.output_token_ids.append(1)
        self.seen.append(r.all_token_ids)

    def free(self, r: Request) -> None:
        self.kv.free(r)
        del self.live[r.request_id]

    def check(self) -> None:
        kv, pool = self.kv, self.kv.pool
        kv.check_invariants()
        holders = kv.tables_per_block()
        assert pool.num_free + pool.num_used == pool.num_blocks
        assert pool.num_used == len(holders) and set(kv.tables) == set(self.live)
        for rid, r in self.live.items():
            table = kv.tables[rid]
            assert len(table) == cdiv(r.num_computed_tokens, self.B)
            assert len({b.block_id for b in table}) == len(table)
            # reading the request's blocks gives back its tokens
            read = [t for b in table for t in self.content[b.block_id]][:r.num_computed_tokens]
            assert read == r.all_token_ids[:r.num_computed_tokens], rid
        for b in pool.blocks:
            if b.ref_cnt > 1:
                assert b.block_hash is not None  # only full, cached blocks are shared
            if b.block_hash is not None:
                assert kv.prefix_caching and pool.cached[b.block_hash] == b.block_id
                assert tuple(self.content[b.block_id]) == self.hash_tokens[b.block_hash]
        assert pool.num_cached_free == sum(1 for b in pool.blocks if b.ref_cnt == 0 and b.block_hash)


@st.composite
def kv_programs(draw):
    B = draw(st.sampled_from([1, 2, 3, 4]))
    num_blocks = draw(st.integers(2, 12))
    caching = draw(st.booleans()) if draw(st.integers(0, 3)) == 0 else True
    tok = st.integers(0, 4)  # a tiny vocabulary: equal blocks happen often
    prefixes = draw(st.lists(st.lists(tok, min_size=2, max_size=10), min_size=1, max_size=3))
    op = st.sampled_from(["new", "new", "turn", "turn", "grow", "grow", "grow", "free", "free"])
    ops = draw(st.lists(st.tuples(op, st.integers(0, 10 ** 6), st.lists(tok, max_size=6),
                                  st.integers(1, 3), st.sampled_from(["preempt", "wait"])),
                        min_size=5, max_size=40))
    return B, num_blocks, caching, prefixes, ops


@settings(max_examples=250, **PROPS)
@given(program=kv_programs())
def test_property_random_operations_keep_the_pool_consistent(program):
    B, num_blocks, caching, prefixes, ops = program
    kv = KVCacheManager(num_blocks, B, enable_prefix_caching=caching)
    sh = Shadow(kv)
    for n, (op, pick, suffix, k, on_refusal) in enumerate(ops):
        live = sorted(sh.live)
        if op in ("new", "turn") or not live:
            if op == "turn" and sh.seen:
                base = sh.seen[pick % len(sh.seen)]  # a later turn of an earlier conversation
            else:
                base = prefixes[pick % len(prefixes)]
            prompt = (base + suffix) or [pick % 5]
            sh.admit(Request(f"r{n}", prompt, greedy(1000)))
        elif op == "grow":
            sh.grow(sh.live[live[pick % len(live)]], k, on_refusal)
        else:
            sh.free(sh.live[live[pick % len(live)]])
        sh.check()
    for rid in list(sh.live):
        sh.free(sh.live[rid])
        sh.check()
    assert kv.num_free == num_blocks and not kv.tables and kv.tables_per_block() == {}
    assert pool_is_all_free(kv.pool)


def pool_is_all_free(pool: BlockPool) -> bool:
    pool.check_invariants({})
    return all(b.ref_cnt == 0 for b in pool.blocks) and sorted(pool._free) == list(range(pool.num_blocks))


# --- 2. exactness on the real model -----------------------------------------------------------------
def pool_blocks(items, block_size: int, size: str) -> int:
    """'roomy': every request of the batch fits at its longest; 'tight': one request at its
    longest fits, barely (preemption happens)."""
    if size == "roomy":
        return WIDTH * cdiv(MAX_LEN, block_size)
    return cdiv(longest(items) + 8, block_size)


@pytest.fixture(scope="module")
def served(tiny, workload):
    """(policy, block_size, pool size, prefix caching) -> the engine after serving the workload."""
    items, _ = workload
    out = {}
    for policy in POLICIES:
        for bs in BLOCK_SIZES:
            for size in ("roomy", "tight"):
                for caching in (True, False):
                    engine = build_engine(tiny, max_num_seqs=WIDTH, max_model_len=MAX_LEN, policy=policy,
                                          kv_layout="paged", block_size=bs,
                                          num_blocks=pool_blocks(items, bs, size),
                                          enable_prefix_caching=caching)
                    for i, (p, sp) in enumerate(items):
                        engine.add_request(p, sp, request_id=f"r{i}")
                    drain_checked(engine)
                    out[policy, bs, size, caching] = engine
    return out


@pytest.mark.parametrize("caching", (True, False), ids=("cache", "nocache"))
@pytest.mark.parametrize("size", ("roomy", "tight"))
@pytest.mark.parametrize("bs", BLOCK_SIZES)
@pytest.mark.parametrize("policy", POLICIES)
def test_paged_requests_get_their_solo_tokens(served, workload, policy, bs, size, caching):
    items, refs = workload
    engine = served[policy, bs, size, caching]
    for i, ((p, sp), ref) in enumerate(zip(items, refs)):
        r = engine.requests[f"r{i}"]
        assert r.output_token_ids == ref, f"request {i} (prompt {len(p)}, {sp})"
        assert r.finish_reason is FinishReason.LENGTH and r.status is RequestStatus.FINISHED
    check_done(engine)
    check_history(engine)
    usage = engine.kv_usage()
    if size == "tight":
        assert usage["num_preemptions"] > 0 and usage["preempted_tokens"] > 0
    else:
        assert usage["num_preemptions"] == 0
    if caching:
        assert usage["prefix_hit_tokens"] > 0 and usage["prefix_hit_tokens"] % bs == 0
        assert usage["blocks_cached_free"] > 0
    else:
        assert usage["prefix_hit_tokens"] == 0 and usage["blocks_cached_free"] == 0
        assert usage["evictions"] == 0
    # a shared-prefix request admitted into a warm cache skips at least its prefix's full blocks
    if caching and size == "roomy":
        first = {}
        for h in engine.history:
            for e in h.scheduled:
                first.setdefault(e.request_id, e)
        skipped = [e.context_len - e.num_tokens for rid, e in first.items() if int(rid[1:]) % 2 == 0]
        assert max(skipped) >= (40 // bs) * bs


def test_preemption_hits_sampled_and_greedy_requests_alike(served, workload):
    """The tight pools preempt seeded samples too: their generator must carry on after a recompute."""
    items, _ = workload
    seeded = [f"r{i}" for i, (_, sp) in enumerate(items) if sp.temperature > 0]
    preempted = {rid for (_, _, size, _), e in served.items() if size == "tight"
                 for rid, r in e.requests.items() if r.num_preemptions}
    assert set(seeded) & preempted and preempted - set(seeded)


def test_paged_and_contiguous_take_the_same_steps_when_memory_is_roomy(served, tiny, workload):
    items, _ = workload
    contiguous = build_engine(tiny, max_num_seqs=WIDTH, max_model_len=MAX_LEN, policy="continuous")
    for i, (p, sp) in enumerate(items):
        contiguous.add_request(p, sp, request_id=f"r{i}")
    while contiguous.has_unfinished_requests():
        contiguous.step()
    paged = served["continuous", 16, "roomy", False]
    steps = lambda e: [[(s.request_id, s.num_tokens, s.context_len) for s in h.scheduled]  # noqa: E731
                       for h in e.history]
    assert steps(paged) == steps(contiguous)
    for rid, r in contiguous.requests.items():
        assert r.output_token_ids == paged.requests[rid].output_token_ids


@st.composite
def paged_workloads(draw):
    tok = st.integers(0, SMALL.vocab_size - 1)
    prefix = draw(st.lists(tok, min_size=4, max_size=16))
    items = []
    for _ in range(draw(st.integers(2, 7))):
        shared = draw(st.booleans())
        suffix = draw(st.lists(tok, min_size=0 if shared else 1, max_size=10))
        items.append(((prefix if shared else []) + suffix, draw(st.integers(1, 12))))
    bs = draw(st.sampled_from([1, 2, 4, 8]))
    need = cdiv(max(min(len(p) + n, SMALL_LEN) for p, n in items), bs)
    num_blocks = need + draw(st.integers(0, 1) if draw(st.booleans()) else st.integers(0, 2 * need))
    return items, bs, num_blocks


@settings(max_examples=50, **PROPS)
@given(work=paged_workloads(), policy=st.sampled_from(POLICIES), width=st.integers(1, 4),
       caching=st.booleans())
def test_property_paged_engine_matches_solo_generate(small, work, policy, width, caching):
    items, bs, num_blocks = work
    engine = build_engine(small, max_num_seqs=width, max_model_len=SMALL_LEN, policy=policy,
                          kv_layout="paged", block_size=bs, num_blocks=num_blocks,
                          enable_prefix_caching=caching)
    reqs = [engine.add_request(p, greedy(n)) for p, n in items]
    drain_checked(engine)
    for r, (p, n) in zip(reqs, items):
        assert r.output_token_ids == generate(small, p, n, cache=None)[0]
    check_done(engine)
    check_history(engine)


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_a_later_turn_reuses_the_earlier_conversation(tiny, bs):
    rng = random.Random(bs)
    vocab = tiny.config.vocab_size
    engine = build_engine(tiny, max_num_seqs=2, max_model_len=MAX_LEN, kv_layout="paged", block_size=bs)
    p1 = [rng.randrange(vocab) for _ in range(37)]
    r1 = engine.add_request(p1, greedy(10))
    other = engine.add_request([rng.randrange(vocab) for _ in range(20)], greedy(6))
    drain_checked(engine)
    p2 = p1 + r1.output_token_ids + [rng.randrange(vocab) for _ in range(5)]
    before = engine.kv_usage()["prefix_hit_tokens"]
    r2 = engine.add_request(p2, greedy(8))
    drain_checked(engine)
    first = next(e for h in engine.history for e in h.scheduled if e.request_id == r2.request_id)
    hit = first.context_len - first.num_tokens
    # r1 left len(p1) + 10 - 1 computed tokens (its last token was sampled, never run)
    assert hit == (len(p1) + 9) // bs * bs >= len(p1) // bs * bs
    assert first.num_tokens == len(p2) - hit
    assert engine.kv_usage()["prefix_hit_tokens"] - before == hit
    assert r1.output_token_ids == generate(tiny, p1, 10, cache=None)[0]
    assert other.output_token_ids == generate(tiny, other.prompt_token_ids, 6, cache=None)[0]
    assert r2.output_token_ids == generate(tiny, p2, 8, cache=None)[0]
    check_done(engine)


def test_aborting_a_running_or_a_waiting_request_frees_its_blocks(tiny, workload):
    items, refs = workload
    engine = build_engine(tiny, max_num_seqs=3, max_model_len=MAX_LEN, kv_layout="paged", block_size=4)
    for i in (0, 1, 3, 4):
        engine.add_request(items[i][0], items[i][1], request_id=f"r{i}")
    engine.step()
    assert set(engine.scheduler.kv.tables) == {"r0", "r1", "r3"}
    engine.abort_request("r1")
    engine.abort_request("r4")  # still waiting
    engine.step()  # the aborted running request leaves and gives its blocks back
    assert set(engine.scheduler.kv.tables) == {"r0", "r3"}
    engine.scheduler.kv.check_invariants()
    drain_checked(engine)
    assert engine.requests["r1"].finish_reason is engine.requests["r4"].finish_reason is FinishReason.ABORT
    assert engine.requests["r0"].output_token_ids == refs[0]
    assert engine.requests["r3"].output_token_ids == refs[3]
    check_done(engine)


# --- 3. rejections and accounting ------------------------------------------------------------------
def rand_prompt(n: int, seed: int, vocab: int = 4054) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def test_a_request_larger_than_the_whole_pool_is_rejected_and_the_others_served(tiny):
    engine = build_engine(tiny, max_num_seqs=3, max_model_len=128, kv_layout="paged",
                          block_size=16, num_blocks=4)  # 64 tokens in all
    pa, pb, pe = rand_prompt(20, 1), rand_prompt(12, 2), rand_prompt(34, 3)
    engine.add_request(pa, greedy(10), request_id="a")
    engine.step()
    before = (list(engine.requests), [r.request_id for r in engine.scheduler.waiting],
              snapshot(engine.scheduler.kv))
    with pytest.raises(RequestRejected) as info:
        engine.add_request([3] * 50, greedy(30))
    msg = str(info.value)
    for w in ("80 tokens", "prompt de 50", "max_tokens 30", "caché KV", "64", "no cabría ni sola"):
        assert w in msg, msg
    assert (list(engine.requests), [r.request_id for r in engine.scheduler.waiting],
            snapshot(engine.scheduler.kv)) == before
    exact = engine.add_request(pe, greedy(30), request_id="exact")  # 64 tokens: fits, alone
    engine.add_request(pb, greedy(5), request_id="b")
    drain_checked(engine)
    assert engine.requests["a"].output_token_ids == generate(tiny, pa, 10, cache=None)[0]
    assert engine.requests["b"].output_token_ids == generate(tiny, pb, 5, cache=None)[0]
    assert exact.output_token_ids == generate(tiny, pe, 30, cache=None)[0]
    assert exact.finish_reason is FinishReason.LENGTH
    check_done(engine)
    # with run(), the bad arrival is named and nothing is added
    with pytest.raises(RequestRejected, match="llegada 1: .*no cabría ni sola"):
        engine.run([(0.0, [5, 6], greedy(2)), (0.0, [3] * 60, greedy(10))])
    assert len(engine.requests) == 3


def test_max_model_len_caps_what_a_request_can_need(tiny):
    # prompt + max_tokens exceed the pool, but max_model_len stops the request before it does
    engine = build_engine(tiny, max_num_seqs=2, max_model_len=64, kv_layout="paged",
                          block_size=16, num_blocks=4)
    r = engine.add_request(list(range(5, 55)), greedy(100))
    drain_checked(engine)
    assert r.finish_reason is FinishReason.LENGTH and r.num_tokens == 64
    assert r.output_token_ids == generate(tiny, list(range(5, 55)), 14, cache=None)[0]
    check_done(engine)


def test_llm_answers_a_request_that_cannot_fit_with_a_rejection(tiny):
    llm = LLM(tiny, max_num_seqs=2, max_model_len=128, kv_layout="paged", block_size=8, num_blocks=8)
    ok = rand_prompt(30, 4)
    outs = llm.generate([[3] * 60, ok], [greedy(10), greedy(12)])
    assert outs[0].finish_reason is FinishReason.REJECTED and "no cabría ni sola" in outs[0].error
    assert outs[1].error is None and outs[1].token_ids == generate(tiny, ok, 12, cache=None)[0]
    check_done(llm.engine)


def test_unknown_kv_layout_is_refused(tiny):
    with pytest.raises(ValueError, match="kv_layout 'pagged' desconocido.*contiguous, paged"):
        build_engine(tiny, max_num_seqs=2, max_model_len=32, kv_layout="pagged")


def check_usage(engine: LLMEngine) -> dict:
    """kv_usage agrees with the scheduler's state; returns it."""
    u = engine.kv_usage()
    kv = engine.scheduler.kv
    holders = {rid for rid in u["per_request"]}
    assert holders == {r.request_id for r in engine.scheduler.running}
    assert 0 <= u["blocks_used"] <= u["blocks_total"] == kv.num_blocks
    assert u["tokens"] == sum(engine.requests[rid].num_computed_tokens for rid in holders)
    assert u["reserved_token_slots"] == sum(v["reserved"] for v in u["per_request"].values())
    assert 0 < u["utilization"] <= 1 and u["utilization"] == u["tokens"] / u["reserved_token_slots"]
    for rid, v in u["per_request"].items():
        assert 0 <= v["reserved"] - v["tokens"]
        if isinstance(kv, KVCacheManager):
            assert v["reserved"] - v["tokens"] < kv.block_size  # at most one partial block
            assert v["reserved"] == len(kv.tables[rid]) * kv.block_size
        else:
            assert v["reserved"] == engine.max_model_len
    if isinstance(kv, KVCacheManager):
        assert u["blocks_used"] == len(kv.tables_per_block())
    return u


@pytest.mark.parametrize("policy", POLICIES)
def test_paged_kv_wastes_less_than_contiguous_rows(tiny, workload, policy):
    items, _ = workload
    engines = {layout: build_engine(tiny, max_num_seqs=WIDTH, max_model_len=MAX_LEN, policy=policy,
                                    kv_layout=layout, block_size=16, enable_prefix_caching=False)
               for layout in ("contiguous", "paged")}
    usage = {}
    for layout, engine in engines.items():
        for i, (p, sp) in enumerate(items):
            engine.add_request(p, sp, request_id=f"r{i}")
        for _ in range(5):
            engine.step()
        usage[layout] = check_usage(engine)
    c, p = usage["contiguous"], usage["paged"]
    assert c["blocks_total"] == WIDTH and p["blocks_total"] == WIDTH * MAX_LEN // 16  # same memory
    assert c["tokens"] == p["tokens"] > 0  # the same requests have run the same tokens
    assert c["reserved_token_slots"] == WIDTH * MAX_LEN
    assert p["reserved_token_slots"] < c["reserved_token_slots"]
    assert p["utilization"] > c["utilization"]
    for engine in engines.values():
        while engine.has_unfinished_requests():
            engine.step()
            if engine.scheduler.running:
                check_usage(engine)
        engine.retire_finished()
        end = engine.kv_usage()
        assert end["blocks_used"] == 0 and end["utilization"] == 1.0 and end["tokens"] == 0


# --- 4. the simulator with paged KV ---------------------------------------------------------------
SIM_CASES = [(4, "tight"), (16, "tight"), (16, "roomy")]


@pytest.fixture(scope="module")
def sim_pairs(tiny, workload):
    """(policy, block_size, size, caching) -> (real engine, simulated engine) on the greedy
    requests of the workload (the simulator samples nothing)."""
    items = [(p, greedy(sp.max_tokens)) for p, sp in workload[0]]
    out = {}
    for policy in POLICIES:
        for bs, size in SIM_CASES:
            for caching in (True, False):
                nb = pool_blocks(items, bs, size)
                real = build_engine(tiny, max_num_seqs=3, max_model_len=MAX_LEN, policy=policy,
                                    kv_layout="paged", block_size=bs, num_blocks=nb,
                                    enable_prefix_caching=caching)
                sim = sim_engine(tiny.config, COST, 3, MAX_LEN, policy,
                                 kv=KVCacheManager(nb, bs, MAX_LEN, caching))
                for engine in (real, sim):
                    for i, (p, sp) in enumerate(items):
                        engine.add_request(p, sp, request_id=f"r{i}")
                    drain_checked(engine)
                out[policy, bs, size, caching] = real, sim
    return out


@pytest.mark.parametrize("caching", (True, False), ids=("cache", "nocache"))
@pytest.mark.parametrize("bs, size", SIM_CASES)
@pytest.mark.parametrize("policy", POLICIES)
def test_simulator_makes_the_paged_engines_decisions(sim_pairs, tiny, policy, bs, size, caching):
    real, sim = sim_pairs[policy, bs, size, caching]
    assert len(sim.history) > 1
    assert schedule(sim) == schedule(real)
    assert [h.holders for h in sim.history] == [h.holders for h in real.history]
    ru, su = real.kv_usage(), sim.kv_usage()
    for key in ("num_preemptions", "preempted_tokens", "prefix_hit_tokens", "prefix_queried_tokens",
                "evictions"):
        assert ru[key] == su[key], key
    for rid, r in real.requests.items():
        s = sim.requests[rid]
        assert s.num_preemptions == r.num_preemptions
        assert len(s.output_token_ids) == len(r.output_token_ids) == r.sampling_params.max_tokens
    if size == "tight":
        assert su["num_preemptions"] > 0
    # the simulated clock charges exactly the tokens that ran: cached prefixes are not charged
    expected = [COST.step_time_s(step_cost(tiny.config, h.query_lens, h.context_lens)) for h in sim.history]
    assert sim.executor.step_times == pytest.approx(expected, rel=1e-12)
    check_done(sim)
    check_done(real)


def prefill_tokens(engine: LLMEngine) -> int:
    """Tokens computed by multi-token steps (prompts and recomputes), over the whole run."""
    return sum(e.num_tokens for h in engine.history for e in h.scheduled if e.num_tokens > 1)


@pytest.mark.parametrize("bs, size", SIM_CASES)
@pytest.mark.parametrize("policy", POLICIES)
def test_prefix_hits_shorten_the_simulated_prefills(sim_pairs, policy, bs, size):
    sim_on, sim_off = sim_pairs[policy, bs, size, True][1], sim_pairs[policy, bs, size, False][1]
    assert sim_on.kv_usage()["prefix_hit_tokens"] > 0
    # some prompt started after a cached prefix, and only its uncached tail was charged
    after_hit = [e for h in sim_on.history for e in h.scheduled
                 if e.num_tokens > 1 and 0 < e.context_len - e.num_tokens
                 < sim_on.requests[e.request_id].num_prompt_tokens]
    assert after_hit, "no prefill started after a cached prefix"
    assert prefill_tokens(sim_on) < prefill_tokens(sim_off)
    if size == "roomy":  # same schedule otherwise: the saved prefill is saved time
        assert sim_on.executor.clock < sim_off.executor.clock
