"""Self-checks of the continuous-batching lab (chapter 3).

Failure messages carry the second tier of each exercise's hint ("Pista: ..."): which quantity is
off and why, in words, never the code line (the first tier is the notebook's NotImplementedError).
Numbers are written with a decimal comma (``ai_evolution.fmt``)."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..engine import PolicyError, Request, build_engine, continuous_batching
from ..engine.request import SamplingParams
from ..fmt import es_sig, es_value
from ..loadgen import fixed_prompt_workload
from ..metrics import summarize
from ..sim import SimExecutor
from . import CheckResult, call_student, failed, passed, self_check
from ._engine import TOY_CONFIG, TOY_COST, trace


def _policy_cases(seed: int) -> list[tuple[int, list[int], list[int], list[float]]]:
    """(max_num_seqs, prompt lengths, output lengths, arrival times) per case."""
    rng = np.random.default_rng(seed)
    cases = [(2, [4, 4, 4], [3, 1, 2], [0.0] * 3),          # a short one frees a row early
             (3, [5] * 6, [1, 6, 2, 2, 5, 1], [0.0] * 6)]
    for _ in range(8):
        n = int(rng.integers(2, 16))
        arrivals = [0.0] * n if rng.random() < 0.5 else sorted(rng.uniform(0, 0.05, n).tolist())
        cases.append((int(rng.integers(1, 6)), rng.integers(1, 12, n).tolist(),
                      rng.integers(1, 20, n).tolist(), arrivals))
    return cases


def _schedule(policy, width: int, prompts: list[int], outputs: list[int], arrivals: list[float]):
    """Run a workload on the simulator with ``policy``: per step, (admitted, retired, running)."""
    engine = build_engine(TOY_CONFIG, max_num_seqs=width, max_model_len=64, policy=policy,
                          executor=SimExecutor(TOY_CONFIG, TOY_COST, "fp32"))
    items = [(t, [1] * p, SamplingParams(max_tokens=o, ignore_eos=True))
             for t, p, o in zip(arrivals, prompts, outputs)]
    return [(a, r, [rid for rid, _ in s]) for a, r, s, _ in trace(engine, items)]


def _case_label(width, prompts, outputs, arrivals) -> str:
    when = "todas en el instante 0" if not any(arrivals) else "llegadas escalonadas"
    return (f"max_num_seqs={width}, {len(prompts)} peticiones con max_tokens={outputs}, {when}")


@self_check
def check_policy(fn: Callable, seed: int = 0, model=None, raise_on_fail: bool = True) -> CheckResult:
    """``fn(running, waiting, max_num_seqs) -> BatchPlan`` must schedule exactly like
    ``continuous_batching`` on seeded workloads (simulated), and, with ``model``, produce the
    same tokens as the reference on the real engine."""
    name = "política de batching continuo"
    cases = _policy_cases(seed)
    for i, (width, prompts, outputs, arrivals) in enumerate(cases):
        label = _case_label(width, prompts, outputs, arrivals)
        expected = _schedule(continuous_batching, width, prompts, outputs, arrivals)
        got, crash = call_student(name, _schedule, fn, width, prompts, outputs, arrivals)
        if crash and crash.startswith(f"su función lanzó {PolicyError.__name__}"):
            # raised by the scheduler, which checks every plan before applying it
            crash = "el planificador rechazó su plan: " + crash.split(": ", 1)[1]
        if crash:
            return failed(name, i, label, crash)
        for step, (e, g) in enumerate(zip(expected, got)):
            if e != g:
                return failed(name, i, label, _step_diff(step, e, g),
                              _policy_hint(e, g))
        if len(expected) != len(got):
            return failed(name, i, label, f"la referencia termina en {len(expected)} pasos "
                          f"y su política en {len(got)}.")
    detail = ""
    if model is not None:
        result = _same_tokens(fn, model, seed)
        if result is not None:
            return failed(name, len(cases), "motor real con el modelo", result)
        detail = "En el motor real produce los mismos tokens que la referencia."
    return passed(name, len(cases) + (model is not None), detail)


def _step_diff(step: int, expected, got) -> str:
    (ea, er, es_), (ga, gr, gs) = expected, got
    return (f"En el paso {step} la referencia retira {er}, admite {ea} y ejecuta {es_}; su "
            f"política retira {gr}, admite {ga} y ejecuta {gs}.")


def _policy_hint(expected, got) -> str:
    (ea, er, _), (ga, gr, _) = expected, got
    if set(er) - set(gr):
        return ("Su política deja en el lote peticiones que ya terminaron: retírelas en cada "
                "paso, no solo cuando termina el lote entero.")
    if len(ga) < len(ea):
        return ("Admite menos peticiones de las que caben: cada fila que queda libre tras retirar "
                "las terminadas puede recibir una petición de la cola en ese mismo paso.")
    if len(ga) > len(ea):
        return "Admite más peticiones que filas libres: el lote no puede pasar de max_num_seqs."
    return "Admita en orden de llegada: las primeras de la cola, no otras."


def _same_tokens(fn, model, seed: int) -> str | None:
    cfg = model.config
    outputs = np.random.default_rng(seed).integers(1, 12, 6).tolist()
    items = fixed_prompt_workload(6, 8, outputs, cfg.vocab_size, seed)
    runs = []
    for policy in (continuous_batching, fn):
        engine = build_engine(model, max_num_seqs=3, max_model_len=32, policy=policy, decode_graphs=None)
        try:
            runs.append([r.output_token_ids for r in engine.run(items)])
        except Exception as err:  # noqa: BLE001 - a crash of student code is a finding
            return f"el motor falló con su política: {type(err).__name__}: {err}"
    for j, (e, g) in enumerate(zip(*runs)):
        if e != g:
            return f"la petición {j} genera {g} con su política y {e} con la referencia."
    return None


# --- metrics ------------------------------------------------------------------------------------

METRIC_KEYS = ("throughput_tok_s", "ttft_p50_s", "e2e_p50_s", "e2e_p99_s")


def _metric_cases(seed: int) -> list[list[Request]]:
    rng = np.random.default_rng(seed)
    cases = []
    for c in range(8):
        n = int(rng.integers(1, 30))
        reqs = []
        for k in range(n):
            arrival = 0.0 if c % 2 == 0 else float(rng.uniform(0, 2))
            n_tok = int(rng.integers(1, 12))
            first = arrival + float(rng.uniform(0.01, 0.5))
            times = (first + np.cumsum(np.r_[0, rng.uniform(0.005, 0.05, n_tok - 1)])).tolist()
            r = Request(str(k), [1, 2, 3], SamplingParams(max_tokens=n_tok), arrival_time=arrival)
            r.output_token_ids = [7] * n_tok
            r.first_token_time, r.token_times, r.finish_time = times[0], times, times[-1]
            reqs.append(r)
        cases.append(reqs)
    return cases


@self_check
def check_summarize(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(requests) -> dict`` with ``throughput_tok_s``, ``ttft_p50_s``, ``e2e_p50_s`` and
    ``e2e_p99_s`` equal to ``ai_evolution.metrics.summarize`` (relative 1e-9)."""
    return summarize_result("métricas de servicio", fn, _metric_cases(seed))


def summarize_result(name: str, fn: Callable, cases: list[list[Request]]) -> CheckResult:
    """``fn(requests)`` against ``metrics.summarize`` on each list of finished requests of
    ``cases``, stopping at the first difference (the public check's cases, or the autograder's)."""
    for i, reqs in enumerate(cases):
        expected = summarize(reqs)
        got, crash = call_student(name, fn, reqs)
        label = f"{len(reqs)} peticiones, {sum(len(r.output_token_ids) for r in reqs)} tokens"
        if crash:
            return failed(name, i, label, crash)
        if not isinstance(got, dict):
            return failed(name, i, label, f"devolvió {type(got).__name__}; se espera un dict "
                          f"con las claves {', '.join(METRIC_KEYS)}.")
        for key in METRIC_KEYS:
            if key not in got:
                return failed(name, i, label, f"falta la clave {key!r}.")
            g, e = got[key], expected[key]
            if not isinstance(g, (int, float, np.number)) or isinstance(g, bool) or \
                    not math.isclose(float(g), e, rel_tol=1e-9):
                return failed(name, i, label, f"{key}: se esperaba {es_sig(e)} y su "
                              f"función devolvió {es_value(g)}.",
                              _metric_hint(key, g, reqs))
    return passed(name, len(cases))


def _metric_hint(key: str, got, reqs: list[Request]) -> str:
    """The second tier of the hint: which quantity is off and, when it is recognisable, why."""
    g = float(got) if isinstance(got, (int, float, np.number)) else None
    tokens = sum(len(r.output_token_ids) for r in reqs)
    ttft = [r.first_token_time - r.arrival_time for r in reqs]
    e2e = [r.finish_time - r.arrival_time for r in reqs]
    if key == "throughput_tok_s":
        if g is not None and math.isclose(g, tokens / max(r.finish_time for r in reqs),
                                          rel_tol=1e-9):
            return ("Su duración empieza en el instante 0; se cuenta desde la primera llegada, "
                    "que no tiene por qué ser 0.")
        if g is not None and math.isclose(g, tokens / sum(e2e), rel_tol=1e-9):
            return ("Sumó las latencias de todas las peticiones; la duración es una sola, de la "
                    "primera llegada al último final, porque las peticiones se sirven a la vez.")
        return ("Tokens generados por todas las peticiones entre la duración del servicio, de la "
                "primera llegada al último final.")
    values = ttft if key.startswith("ttft") else e2e
    q = 50 if key.endswith("p50_s") else 99
    if g is not None and q == 99 and math.isclose(g, max(values), rel_tol=1e-9):
        return ("Tomó el máximo: el percentil 99 interpola entre los dos valores ordenados más "
                "cercanos a esa posición, y con pocas peticiones no es el máximo.")
    if g is not None and math.isclose(g, float(np.mean(values)), rel_tol=1e-9):
        return "Calculó la media; se pide un percentil (el 50 es la mediana)."
    if key.startswith("ttft"):
        return "El TTFT de cada petición va de su llegada a su primer token."
    return ("La latencia de extremo a extremo de cada petición va de su llegada a su final; "
            "resúmala con el percentil pedido, interpolado.")
