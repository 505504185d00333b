"""Hidden checks of lab 4 (``paged_attention``). Loaded by path by the autograder; never
imported by a notebook. Each function is named after a criterion of ``rubric.json`` and yields
its stages: the notebook's public self-check first, then checks the student never saw."""

from __future__ import annotations

from ai_evolution.checks import call_student, failed, passed
from ai_evolution.checks import paged_attention as checks
from ai_evolution.engine import BlockPool, KVCacheManager, Request, SamplingParams, hash_block
from ai_evolution.fmt import es_value
from ai_evolution.grading import hidden, public


def block_pool(cls, ctx):
    yield public(checks.check_block_pool, cls, seed=ctx.seed, model=ctx.model())
    for s in ctx.hidden_seeds:  # other operation sequences, without the engine run
        yield hidden(checks.check_block_pool, cls, seed=s)
    yield hidden(_pool_edges, cls)


def _pool_state(pool) -> tuple:
    return (list(pool._free), [b.ref_cnt for b in pool.blocks], dict(pool.cached), pool.evictions)


def _pool_edges(cls, raise_on_fail=False):
    """The whole pool at once, one too many, a block shared by three holders freed one at a
    time, and a cached block reused (evicted) when the queue reaches it."""
    name = "pool de bloques (casos límite)"
    ref = BlockPool(4, 2)
    mine, crash = call_student(name, cls, 4, 2)
    if crash:
        return failed(name, 0, "crear un pool de 4 bloques", crash)

    def script(pool):
        out = []
        blocks = pool.allocate(4)
        out.append([b.block_id for b in blocks])
        out.append(pool.allocate(1))                      # none left: None
        pool.cache(blocks[0], hash_block(None, [1, 2]))
        pool.touch([blocks[0]])
        pool.touch([blocks[0]])                           # three holders
        pool.free([blocks[0]])
        out.append(_pool_state(pool))                     # still held twice
        pool.free([blocks[0]])
        pool.free([blocks[0]])                            # now free, keeps its hash
        out.append(_pool_state(pool))
        pool.free(list(reversed(blocks[1:])))
        out.append(_pool_state(pool))
        again = pool.allocate(2)                          # reuses the cached block first
        out.append([b.block_id for b in again])
        out.append(_pool_state(pool))
        return out

    expected = script(ref)
    got, crash = call_student(name, script, mine)
    steps = ["allocate(4)", "allocate(1) con el pool lleno", "free de un bloque con tres dueños",
             "free del último dueño", "free del resto", "allocate(2) tras liberar",
             "estado tras reutilizar el bloque con hash"]
    if crash:
        return failed(name, 0, "secuencia de operaciones límite", crash)
    for i, (e, g) in enumerate(zip(expected, got)):
        if e != g:
            return failed(name, i, steps[i], f"se esperaba {e} y su pool dio {g}.",
                          "ref_cnt cuenta los dueños; solo al llegar a 0 vuelve el bloque a la "
                          "cola libre, con su hash, que se pierde al reutilizarlo.")
    return passed(name, len(expected))


def prefix_lookup(fn, ctx):
    yield public(checks.check_prefix_lookup, fn, seed=ctx.seed, model=ctx.model())
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_prefix_lookup, fn, seed=s)
    yield hidden(_prefix_edges, fn)


def _prefix_edges(fn, raise_on_fail=False):
    """A one-token prompt, a prompt that is exactly the cached blocks, blocks of one token."""
    cases = []
    for bs, cached, query in [(4, list(range(10, 22)), [10]),
                              (4, list(range(10, 22)), list(range(10, 22))),
                              (1, [5, 6, 7, 8], [5, 6, 7, 8, 9]),
                              (1, [5, 6, 7, 8], [5, 6, 7, 8]),
                              (3, [4] * 9, [4] * 10)]:
        kv = KVCacheManager(32, bs, 64)
        r = Request("w", cached + [1], SamplingParams())
        kv.allocate_slots(r, r.num_tokens)
        r.num_computed_tokens = r.num_tokens
        kv.cache_full_blocks(r)
        kv.free(r)
        cases.append((bs, kv.pool, query))
    return checks.prefix_lookup_result("búsqueda de prefijo en caché (casos límite)", fn, cases)


def extension(ext, contract, ctx):
    yield hidden(_block_sizes, ext)


def _block_sizes(ext, raise_on_fail=False):
    """Utilization is a fraction and throughput positive, for the three block sizes."""
    name = "reto: tamaño de bloque"
    m = ext["measurement"]
    for i, b in enumerate((4, 16, 64)):
        u, t = m[f"utilization_bs{b}"], m[f"tokens_per_s_bs{b}"]
        if not 0 < u <= 1:
            return failed(name, i, f"utilization_bs{b}", f"la utilización es una fracción de la "
                          f"memoria reservada (0 a 1), y measurement dice {es_value(u)}.")
        if not t > 0:
            return failed(name, i, f"tokens_per_s_bs{b}", f"se esperan tokens/s positivos y "
                          f"measurement dice {es_value(t)}.")
    return passed(name, 3)
