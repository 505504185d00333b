"""Self-checks of the scheduler lab (chapter 5): the token split and the preemption victim."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..engine import (KVCacheManager, LLMEngine, ModelRunner, SamplingParams, Scheduler,
                      newest_unfinished, tokens_for)
from ..sim import SimExecutor
from . import CheckResult, call_student, failed, finish, passed
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
    executor = ModelRunner.for_kv(model, kv) if model is not None else SimExecutor(cfg, TOY_COST, "fp32")
    engine = LLMEngine(Scheduler(case["width"], 64, "continuous", kv=kv,
                                 max_num_batched_tokens=case["budget"],
                                 enable_chunked_prefill=case.get("chunked", True), **kw),
                       executor, cfg.vocab_size)
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
    cases = _workloads(seed)
    for i, case in enumerate(cases):
        expected = trace(*_engine(case, **kw_ref))  # on the simulator: only the schedule matters
        engine, items = _engine(case, **kw_student)
        got, crash = call_student(name, trace, engine, items)
        if crash:
            return finish(failed(name, i, _label(case), crash), raise_on_fail)
        for step, (e, g) in enumerate(zip(expected, got)):
            if e != g:
                return finish(failed(name, i, _label(case),
                                     f"en el paso {step} la referencia ejecuta {e[2]} (id, tokens) y "
                                     f"expulsa {e[3]}; con su función se ejecuta {g[2]} y se expulsa {g[3]}.",
                                     hint(e, g)), raise_on_fail)
        if len(expected) != len(got):
            return finish(failed(name, i, _label(case), f"la referencia termina en {len(expected)} "
                                 f"pasos y con su función en {len(got)}."), raise_on_fail)
    detail = ""
    if model is not None:
        case = {"width": 4, "budget": 12, "blocks": 10, "prompts": [9, 30, 5, 17, 22],
                "outputs": [6, 3, 9, 4, 5]}
        ref_engine, items = _engine(case, model=model, **kw_ref)
        ref = [r.output_token_ids for r in ref_engine.run(items)]
        engine, items = _engine(case, model=model, **kw_student)
        mine, crash = call_student(name, engine.run, items)
        if crash:
            return finish(failed(name, len(cases), "motor real", crash), raise_on_fail)
        for j, (e, g) in enumerate(zip(ref, [r.output_token_ids for r in mine])):
            if e != g:
                return finish(failed(name, len(cases), "motor real", f"la petición {j} genera {g} y con "
                                     f"la referencia {e}."), raise_on_fail)
        detail = "En el motor real produce los mismos tokens que la referencia."
    return finish(passed(name, len(cases) + (model is not None), detail), raise_on_fail)


def check_token_split(fn: Callable, seed: int = 0, model=None, raise_on_fail: bool = True) -> CheckResult:
    """``fn(want, budget, chunked) -> tokens`` must schedule like ``tokens_for``."""
    def hint(e, g):
        return ("si lo que la petición necesita cabe en lo que queda, déselo entero; si no, con "
                "prefill troceado dele lo que queda (un entero) y sin él, 0.")
    return _compare("reparto del presupuesto de tokens", {"token_fn": fn}, {"token_fn": tokens_for},
                    seed, model, raise_on_fail, hint)


def check_victim(fn: Callable, seed: int = 0, model=None, raise_on_fail: bool = True) -> CheckResult:
    """``fn(running) -> Request`` must choose the same preemption victims as ``newest_unfinished``."""
    def hint(e, g):
        return ("expulse la petición admitida más recientemente que no haya terminado: recorra "
                "running desde el final y salte las que tienen is_finished.")
    return _compare("elección de la víctima", {"victim_fn": fn}, {"victim_fn": newest_unfinished},
                    seed, model, raise_on_fail, hint)
