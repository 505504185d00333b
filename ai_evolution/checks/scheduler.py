"""Self-checks of the scheduler lab (chapter 5): the token split and the preemption victim.

The victim exercise asks for three rules (``VICTIM_RULES``), each checked against
``reference_victim`` step by step; ``compare_victim_rules`` then serves seeded workloads under
memory pressure with each rule of the student's function (on the simulator: every count is
deterministic) and measures what each costs: preemptions, recomputed tokens, the most times one
request was preempted, and preemptions out of arrival order.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..engine import KVCacheManager, LLMEngine, Request, SamplingParams, build_engine, tokens_for
from ..engine.request import RequestStatus
from ..reference.scheduler import VICTIM_RULES, reference_victim
from ..sim import SimExecutor
from . import CheckResult, call_student, failed, passed, self_check
from ._engine import TOY_CONFIG, TOY_COST, trace

def _workloads(seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    cases = []
    for k in range(8):
        n = int(rng.integers(3, 12))
        prompts, outputs = rng.integers(1, 40, n).tolist(), rng.integers(1, 16, n).tolist()
        longest = max(-(-(p + o) // 4) for p, o in zip(prompts, outputs))  # blocks of 4
        chunked = k % 2 == 0  # without chunks the budget must hold a whole max_model_len (64)
        cases.append({"width": int(rng.integers(2, 6)), "chunked": chunked,
                      "budget": int(rng.integers(1, 40)) if chunked else int(rng.integers(64, 90)),
                      "blocks": longest + int(rng.integers(0, 8)), "prompts": prompts,
                      "outputs": outputs})
    return cases


def _engine(case: dict, model=None, **kw) -> tuple[LLMEngine, list]:
    cfg = model.config if model is not None else TOY_CONFIG
    kv = KVCacheManager(case["blocks"], 4, 64, enable_prefix_caching=False)
    executor = None if model is not None else SimExecutor(cfg, TOY_COST, "fp32")
    engine = build_engine(model if model is not None else cfg, max_num_seqs=case["width"],
                          max_model_len=64, max_num_batched_tokens=case["budget"],
                          enable_chunked_prefill=case.get("chunked", True), decode_graphs=None,
                          kv=kv, executor=executor, **kw)
    rng = np.random.default_rng(case["budget"])
    items = [(0.0, rng.integers(3, cfg.vocab_size, p).tolist(), SamplingParams(max_tokens=o, ignore_eos=True))
             for p, o in zip(case["prompts"], case["outputs"])]
    return engine, items


def _label(case: dict) -> str:
    chunks = "con" if case.get("chunked", True) else "sin"
    return (f"presupuesto {case['budget']} tokens {chunks} prefill troceado, max_num_seqs "
            f"{case['width']}, {case['blocks']} bloques de 4, prompts {case['prompts']}")


def _compare(name: str, kw_student: dict, kw_ref: dict, seed: int, model, raise_on_fail: bool,
             hint: Callable[[tuple, tuple], str]) -> CheckResult:
    return _compare_result(name, kw_student, kw_ref, seed, model, hint)


def _compare_result(name: str, kw_student: dict, kw_ref: dict, seed: int, model,
                    hint: Callable[[tuple, tuple], str]) -> CheckResult:
    cases = _workloads(seed)
    for i, case in enumerate(cases):
        expected = trace(*_engine(case, **kw_ref))  # on the simulator: only the schedule matters
        engine, items = _engine(case, **kw_student)
        got, crash = call_student(name, trace, engine, items)
        if crash:
            return failed(name, i, _label(case), crash)
        for step, (e, g) in enumerate(zip(expected, got)):
            if e != g:
                return failed(name, i, _label(case),
                              f"en el paso {step} la referencia ejecuta {e[2]} (id, tokens) y "
                              f"expulsa {e[3]}; con su función se ejecuta {g[2]} y se expulsa {g[3]}.",
                              hint(e, g))
        if len(expected) != len(got):
            return failed(name, i, _label(case), f"la referencia termina en {len(expected)} "
                          f"pasos y con su función en {len(got)}.")
    detail = ""
    if model is not None:
        case = {"width": 4, "budget": 12, "blocks": 10, "prompts": [9, 30, 5, 17, 22],
                "outputs": [6, 3, 9, 4, 5]}
        ref_engine, items = _engine(case, model=model, **kw_ref)
        ref = [r.output_token_ids for r in ref_engine.run(items)]
        engine, items = _engine(case, model=model, **kw_student)
        mine, crash = call_student(name, engine.run, items)
        if crash:
            return failed(name, len(cases), "motor real", crash)
        for j, (e, g) in enumerate(zip(ref, [r.output_token_ids for r in mine])):
            if e != g:
                return failed(name, len(cases), "motor real", f"la petición {j} genera {g} y con "
                              f"la referencia {e}.")
        detail = "En el motor real produce los mismos tokens que la referencia."
    return passed(name, len(cases) + (model is not None), detail)


@self_check
def check_token_split(fn: Callable, seed: int = 0, model=None, raise_on_fail: bool = True) -> CheckResult:
    """``fn(want, budget, chunked) -> tokens`` must schedule like ``tokens_for``."""
    def hint(e, g):
        return ("compare lo que la petición necesita con lo que queda del presupuesto del paso. Si "
                "cabe, lo recibe todo (también cuando necesita exactamente lo que queda); si no "
                "cabe, con prefill troceado recibe la parte entera de lo que queda, y sin prefill "
                "troceado, o si no queda ni un token entero, no recibe nada y espera al paso "
                "siguiente.")
    return _compare("reparto del presupuesto de tokens", {"token_fn": fn}, {"token_fn": tokens_for},
                    seed, model, raise_on_fail, hint)


def _with_rule(fn: Callable, rule: str) -> Callable:
    """``fn(running, rule)`` as the scheduler's ``victim_fn(running)``."""
    def victim_fn(running):
        return fn(running, rule)
    return victim_fn


def _batch(spec: list[tuple[bool, int, int]]) -> list[Request]:
    """Running requests from (finished?, computed tokens, total tokens), in admission order."""
    out = []
    for j, (done, computed, total) in enumerate(spec):
        r = Request(f"p{j}", list(range(1, total + 1)), SamplingParams(max_tokens=4))
        r.status = RequestStatus.FINISHED if done else RequestStatus.RUNNING
        r.num_computed_tokens = computed
        out.append(r)
    return out


def _victim_hint(fn: Callable, rule: str) -> str:
    """What the student's rule does wrong, found by asking it about small known batches of
    (finished?, computed tokens, total tokens)."""
    def wrong(spec):
        running = _batch(spec)
        try:
            got = fn(list(running), rule)
        except NotImplementedError:
            raise
        except Exception:  # noqa: BLE001 - the step-by-step comparison already named the case
            return None
        return got if got is not reference_victim(running, rule) else None

    for spec in ([(False, 5, 12), (False, 9, 12), (True, 3, 12)], [(True, 1, 12), (False, 4, 12)]):
        if getattr(wrong(spec), "is_finished", False):
            return ("eligió una petición que ya terminó: sigue en running hasta que se retira, pero "
                    "no se puede expulsar; la víctima sale de las que no han terminado.")
    if rule == "newest":
        return ("con la regla 'newest' la víctima es la admitida más tarde de las que no han "
                "terminado: running llega en orden de entrada.")
    if wrong([(False, 2, 10), (False, 8, 30)]) or wrong([(False, 8, 30), (False, 2, 10)]):
        fewest = rule == "fewest_computed"
        return (f"con la regla {rule!r} la víctima es la que {'menos' if fewest else 'más'} tokens "
                f"calculados tiene, no la que {'más' if fewest else 'menos'}.")
    if wrong([(False, 2, 30), (False, 8, 10)]) or wrong([(False, 8, 10), (False, 2, 30)]):
        return ("se compara lo que la expulsión tiraría, los tokens ya calculados "
                "(num_computed_tokens), no los tokens totales de la petición.")
    if wrong([(False, 4, 12), (False, 4, 12), (False, 4, 12)]):
        return "en un empate de tokens calculados, la víctima es la admitida más tarde."
    return f"vuelva a leer la regla {rule!r}: {VICTIM_RULES[rule]}."


@self_check
def check_victim(fn: Callable, seed: int = 0, model=None, raise_on_fail: bool = True) -> CheckResult:
    """``fn(running, rule) -> Request`` must choose, for every rule of ``VICTIM_RULES``, the same
    preemption victims as ``reference_victim``, step by step on seeded workloads (and give the
    same tokens on the real engine with ``model``)."""
    name = "elección de la víctima"
    cases = 0
    for rule in VICTIM_RULES:
        result = _compare_result(f"{name} con la regla {rule!r}", {"victim_fn": _with_rule(fn, rule)},
                                 {"victim_fn": _with_rule(reference_victim, rule)}, seed, model,
                                 lambda e, g, rule=rule: _victim_hint(fn, rule))
        if not result.passed:
            return result
        cases += result.cases
    detail = (f"Las {len(VICTIM_RULES)} reglas eligen las mismas víctimas que la referencia"
              + (" y dan los mismos tokens en el motor real." if model is not None else "."))
    return passed(name, cases, detail)


# --- what each rule costs ------------------------------------------------------------------------
def _pressure_workloads(seed: int) -> list[dict]:
    """Seeded workloads that preempt often: twelve requests in a pool of 24 blocks of 4 tokens,
    one of them a long prompt (44 tokens) admitted in the second half of the queue."""
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(4):
        n = 12
        prompts, outputs = rng.integers(4, 32, n).tolist(), rng.integers(4, 24, n).tolist()
        late = int(rng.integers(n // 2, n))
        prompts[late], outputs[late] = 44, int(rng.integers(8, 20))
        cases.append({"width": 6, "chunked": True, "budget": 24, "blocks": 24, "prompts": prompts,
                      "outputs": outputs})
    return cases


def compare_victim_rules(fn: Callable, seed: int = 0) -> list[dict]:
    """Serve ``_pressure_workloads(seed)`` with each rule of ``fn(running, rule)`` on the simulator
    and add up, per rule: ``preemptions``, ``recomputed_tokens`` (the work preemption threw away),
    ``max_preemptions`` (the most times one request was preempted), ``out_of_order`` (preemptions
    of a request that arrived before another one that stayed in the batch) and ``steps``. Every
    request arrives at t = 0 in queue order, so arrival order is the order they were added."""
    rows = []
    for rule in VICTIM_RULES:
        row = {"rule": rule, "preemptions": 0, "recomputed_tokens": 0, "max_preemptions": 0,
               "out_of_order": 0, "steps": 0}
        for case in _pressure_workloads(seed):
            order: dict[str, int] = {}  # request id -> arrival order, read once all have arrived
            served: dict = {}

            def victim_fn(running, rule=rule, order=order, served=served):
                victim = fn(running, rule)
                if not order:
                    order.update({rid: k for k, rid in enumerate(served["engine"].requests)})
                if any(order[r.request_id] > order[victim.request_id] for r in running
                       if r is not victim and not r.is_finished):
                    row["out_of_order"] += 1
                return victim

            engine, items = _engine(case, victim_fn=victim_fn)
            served["engine"] = engine
            requests = engine.run(items)
            row["preemptions"] += engine.scheduler.num_preemptions
            row["recomputed_tokens"] += engine.scheduler.preempted_tokens
            row["max_preemptions"] = max(row["max_preemptions"],
                                         max(r.num_preemptions for r in requests))
            row["steps"] += len(engine.history)
        rows.append(row)
    return rows
