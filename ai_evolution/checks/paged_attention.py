"""Self-checks of the PagedAttention lab (chapter 4)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..engine import (BlockPool, KVCacheManager, Request, SamplingParams, build_engine,
                      find_cached_prefix, hash_block)
from . import CheckResult, call_student, failed, passed, self_check


def _state(pool: BlockPool) -> tuple:
    return (list(pool._free), [b.ref_cnt for b in pool.blocks], dict(pool.cached))


def _describe(state: tuple) -> str:
    free, refs, cached = state
    held = {i: r for i, r in enumerate(refs) if r}
    return (f"cola libre {free}, ref_cnt de los ocupados {held}, {len(cached)} "
            f"{'bloque' if len(cached) == 1 else 'bloques'} en caché")


def _pool_ops(seed: int, num_blocks: int) -> list[tuple]:
    """A seeded sequence of allocate / free / cache / touch operations."""
    rng = np.random.default_rng(seed)
    ops, hashes = [], 0
    for k in range(40):
        r = rng.random()
        if r < 0.4 or k == 0:
            ops.append(("allocate", int(rng.integers(1, max(2, num_blocks // 2)))))
        elif r < 0.7:
            ops.append(("free", int(rng.integers(0, 1 << 30))))
        elif r < 0.85:
            hashes += 1
            ops.append(("cache", int(rng.integers(0, 1 << 30)), hashes))
        else:
            ops.append(("touch", int(rng.integers(0, 1 << 30))))
    return ops


def _apply(pool: BlockPool, op: tuple, tables: list[list[int]]):
    """Run ``op`` on ``pool``; ``tables`` are the holders' block-id lists (shared by both runs)."""
    kind = op[0]
    if kind == "allocate":
        got = pool.allocate(op[1])
        if got is not None:
            tables.append([b.block_id for b in got])
        return None if got is None else [b.block_id for b in got]
    if not tables:
        return None
    table = tables.pop(op[1] % len(tables)) if kind == "free" else tables[op[1] % len(tables)]
    blocks = [pool.blocks[i] for i in table]
    if kind == "free":
        pool.free(list(reversed(blocks)))
    elif kind == "cache":
        pool.cache(blocks[0], hash_block(None, [op[2]]))
    elif kind == "touch":
        pool.touch(blocks)
        tables.append(list(table))
    return None


@self_check
def check_block_pool(cls: type, seed: int = 0, model=None, raise_on_fail: bool = True) -> CheckResult:
    """``cls(num_blocks, block_size)`` (a ``BlockPool`` with the student's ``allocate`` and
    ``free``) must leave exactly the reference's state after every operation of seeded
    sequences, and serve the same tokens inside the engine with ``model``."""
    name = "pool de bloques"
    cases = [(seed + k, n) for k, n in enumerate((4, 6, 8, 12, 16))]
    for i, (case_seed, n) in enumerate(cases):
        ref, tables_ref = BlockPool(n, 4), []
        mine, crash = call_student(name, cls, n, 4)
        if crash:
            return failed(name, i, f"{n} bloques", crash)
        tables_mine: list[list[int]] = []
        for step, op in enumerate(_pool_ops(case_seed, n)):
            expected = _apply(ref, op, tables_ref)
            got, crash = call_student(name, _apply, mine, op, tables_mine)
            label = f"{n} bloques, operación {step} = {op[0]}" + (f"({op[1]})" if op[0] == "allocate" else "")
            if crash:
                return failed(name, i, label, crash)
            if got != expected:
                return failed(name, i, label, f"allocate debía devolver {_blocks(expected)} "
                              f"y devolvió {_blocks(got)}.", _allocate_hint(expected, got))
            if _state(mine) != _state(ref):
                return failed(name, i, label, f"tras la operación se esperaba "
                              f"{_describe(_state(ref))} y su pool tiene "
                              f"{_describe(_state(mine))}.",
                              _pool_hint(op[0], _state(ref), _state(mine)))
    return _in_the_engine(name, len(cases), model, seed, "motor real con su pool",
                          "En el motor real sirve los mismos tokens que la referencia.",
                          pool_cls=cls)


def _blocks(ids) -> str:
    return "None" if ids is None else f"los bloques {ids}"


def _allocate_hint(expected, got) -> str:
    if expected is None:
        return ("no había tantos bloques libres como se pedían: en ese caso allocate no asigna "
                "ninguno (devuelve None) y el pool queda como estaba.")
    if got is None:
        return "había bloques libres suficientes: allocate debía asignarlos."
    return ("los bloques se toman de la cabeza de la cola libre, en su orden: primero los liberados "
            "hace más tiempo.")


def _pool_hint(kind: str, expected: tuple, got: tuple) -> str:
    """What differs between the reference's state and the student's after operation ``kind``."""
    (free_e, refs_e, cached_e), (free_g, refs_g, cached_g) = expected, got
    if kind == "allocate":
        if refs_e != refs_g:
            return "un bloque recién asignado tiene un solo dueño: su contador de referencias empieza en 1."
        if cached_e != cached_g:
            return ("un bloque que se reutiliza pierde el prefijo que guardaba: deja de figurar en "
                    "pool.cached, su hash queda vacío y el desalojo se cuenta.")
        return ("allocate saca de la cola libre exactamente los bloques que asigna, por la cabeza, "
                "y deja el resto en su orden.")
    if kind == "free":
        if refs_e != refs_g:
            return ("free quita un solo dueño a cada bloque que recibe; un bloque compartido sigue "
                    "ocupado mientras le quede alguno.")
        if set(free_g) - set(free_e):
            return "un bloque vuelve a la cola libre solo cuando se queda sin dueños."
        if set(free_e) - set(free_g):
            return "un bloque que se queda sin dueños debe volver a la cola libre."
        if free_e != free_g:
            return ("los bloques liberados se añaden al final de la cola libre, en el orden en que "
                    "free los recibe.")
        return ("liberar no borra el prefijo: el bloque conserva su hash y sigue en pool.cached "
                "hasta que alguien lo reutiliza.")
    return ("el estado ya difería antes de esta operación de la biblioteca: revise qué dejan su "
            "allocate y su free en la cola libre, en los contadores y en pool.cached.")


def _prefix_pools(seed: int):
    """A pool with some cached chains, and the queries to look up in it."""
    rng = np.random.default_rng(seed)
    bs = int(rng.choice([2, 4, 8]))
    kv = KVCacheManager(64, bs, 256)
    prefixes = [rng.integers(3, 50, bs * int(rng.integers(1, 5))).tolist() for _ in range(3)]
    for p in prefixes:  # register each prefix's full blocks as computed and cached
        r = Request(f"w{len(kv.tables)}", p + [1], SamplingParams())
        kv.allocate_slots(r, r.num_tokens)
        r.num_computed_tokens = r.num_tokens
        kv.cache_full_blocks(r)
        kv.free(r)
    queries = [prefixes[0] + [7, 8, 9], prefixes[1], prefixes[2][:bs] + [99] * bs + [1],
               [98] + prefixes[0], prefixes[0][:-1], prefixes[1] + prefixes[2] + [4],
               rng.integers(3, 50, 3 * bs + 1).tolist()]
    return bs, kv.pool, queries


@self_check
def check_prefix_lookup(fn: Callable, seed: int = 0, model=None, raise_on_fail: bool = True) -> CheckResult:
    """``fn(token_ids, block_size, pool) -> list[KVBlock]`` must return the same cached blocks as
    ``find_cached_prefix`` on seeded pools, and give the same tokens and hits in the engine."""
    name = "búsqueda de prefijo en caché"
    cases = []
    for k in range(4):
        bs, pool, queries = _prefix_pools(seed + k)
        cases += [(bs, pool, q) for q in queries]
    result = prefix_lookup_result(name, fn, cases)
    if not result.passed:
        return result
    return _in_the_engine(name, len(cases), model, seed, "motor real con su búsqueda",
                          "En el motor real da los mismos tokens y los mismos aciertos que la "
                          "referencia.", prefix_fn=fn)


def prefix_lookup_result(name: str, fn: Callable, cases: list[tuple[int, BlockPool, list[int]]]
                         ) -> CheckResult:
    """``fn(token_ids, block_size, pool)`` against ``find_cached_prefix`` on each ``(block_size,
    pool, query)`` of ``cases``, stopping at the first difference (the public check's cases, or
    the autograder's)."""
    for i, (bs, pool, query) in enumerate(cases):
        expected = [b.block_id for b in find_cached_prefix(query, bs, pool)]
        got, crash = call_student(name, fn, query, bs, pool)
        label = f"bloques de {bs} tokens, consulta de {len(query)} tokens"
        if crash:
            return failed(name, i, label, crash)
        try:
            got_ids = [b.block_id for b in got]
        except (TypeError, AttributeError):
            return failed(name, i, label, f"devolvió {got!r}; se espera una lista de KVBlock.")
        if got_ids != expected:
            return failed(name, i, label, f"se esperaban los bloques {expected} y su función "
                          f"devolvió {got_ids}.", _prefix_hint(len(query), bs, expected, got_ids))
    return passed(name, len(cases))


def _prefix_hint(n: int, bs: int, expected: list, got: list) -> str:
    if len(got) > len(expected) and len(got) * bs >= n:
        return ("el último token del prompt nunca sale de la caché (hay que calcularlo para tener "
                "sus logits): solo cuentan los bloques llenos que quedan sin él.")
    if len(got) > len(expected):
        return "pare en el primer bloque que no está en caché, aunque los siguientes sí estén."
    return ("el hash de un bloque encadena el del bloque anterior (el primero no tiene anterior), "
            "así que un bloque solo coincide si todo lo que va antes coincide: un hash calculado con "
            "los tokens del bloque solos, o con otro encadenamiento, no está en la caché.")


def _in_the_engine(name: str, num_cases: int, model, seed: int, label: str, detail: str,
                   **piece) -> CheckResult:
    """After ``num_cases`` passed cases: with a ``model``, the student's ``piece`` (``pool_cls``
    or ``prefix_fn``) serves the engine's workload too (one more case, ``label``)."""
    if model is None:
        return passed(name, num_cases, "")
    problem = _engine_run(model, seed, **piece)
    if problem:
        return failed(name, num_cases, label, problem)
    return passed(name, num_cases + 1, detail)


def _engine_run(model, seed: int, pool_cls=None, prefix_fn=None) -> str | None:
    """The same shared-prefix workload under memory pressure, reference vs the student's piece."""
    cfg = model.config
    rng = np.random.default_rng(seed)
    system = rng.integers(3, cfg.vocab_size, 24).tolist()
    items = [(0.0, system + rng.integers(3, cfg.vocab_size, int(rng.integers(1, 9))).tolist(),
              SamplingParams(max_tokens=int(rng.integers(1, 12)), ignore_eos=True)) for _ in range(8)]
    runs = []
    for student in (False, True):
        kw = {}
        if student and pool_cls is not None:
            kw["pool"] = pool_cls(14, 4)
        if student and prefix_fn is not None:
            kw["prefix_fn"] = prefix_fn
        kv = KVCacheManager(14, 4, 48, **kw)
        engine = build_engine(model, max_num_seqs=4, max_model_len=48, kv=kv, decode_graphs=None)
        try:
            engine.run(items[:1])
            reqs = engine.run(items[1:])
            kv.check_invariants()
        except Exception as err:  # noqa: BLE001 - a crash of student code is a finding
            return f"el motor falló: {type(err).__name__}: {err}"
        runs.append(([r.output_token_ids for r in reqs], kv.hit_tokens, kv.pool.num_free))
    (ref_tokens, ref_hits, _), (tokens, hits, free) = runs
    for j, (e, g) in enumerate(zip(ref_tokens, tokens)):
        if e != g:
            return f"la petición {j + 1} genera {g} y con la referencia {e}."
    if hits != ref_hits:
        return f"la caché acertó {hits} tokens y con la referencia {ref_hits}."
    if free != 14:
        return f"al terminar quedan {14 - free} bloques ocupados; deberían estar todos libres."
    return None
