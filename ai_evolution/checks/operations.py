"""Self-checks of the operations lab (chapter 12).

Failure messages carry the second tier of each exercise's hint ("Pista: ..."): which quantity is
off and why, in words, never the code line. Numbers are written with a decimal comma."""

from __future__ import annotations

import functools
import math
import random
from typing import Callable

from ..fmt import es, es_sig, es_value
from ..reference.operations import (reference_bucket_waits, reference_goodput_rate,
                                    reference_pick_tenant)
from ..sim.capacity import SLO, capacity_study, slo_percentiles
from . import CheckResult, call_student, check_student_extension, failed, passed, self_check  # noqa: F401

CHALLENGE_KEYS = ("target_rate", "h100_goodput_rate", "device_goodput_rate", "h100_replicas",
                  "device_replicas")


# --- exercise 1: VTC's admission rule ---------------------------------------------------------------

def pick_cases(seed: int = 0) -> list[tuple[str, dict, list]]:
    """(label, counters, backlogged): counters of every tenant the policy knows, the backlogged
    ones in queue order."""
    cases = [
        ("dos inquilinos, el educado ha recibido menos", {"educado": 120.0, "inundador": 900.0},
         ["inundador", "educado"]),
        ("un solo inquilino en cola", {"a": 50.0}, ["a"]),
        ("el de menor contador no tiene peticiones en cola", {"a": 0.0, "b": 300.0, "c": 200.0},
         ["b", "c"]),
        ("empate: gana el primero de la cola", {"x": 10.0, "y": 10.0, "z": 40.0}, ["y", "x", "z"]),
        ("el inquilino anónimo (None)", {None: 5.0, "b": 7.0}, ["b", None]),
        ("contadores enteros y grandes", {"p": 10**9, "q": 10**9 - 1}, ["p", "q"]),
    ]
    rng = random.Random(seed)
    for i in range(10):
        names = [f"t{j}" for j in range(rng.randint(2, 6))]
        counters = {t: float(rng.choice([0, 1, 2, 3]) * 100 + rng.randint(0, 1) * 0.5) for t in names}
        backlogged = rng.sample(names, rng.randint(1, len(names)))
        cases.append((f"aleatorio {i + 1} ({len(names)} inquilinos)", counters, backlogged))
    return cases


@self_check
def check_pick_tenant(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(counters, backlogged) -> tenant`` as VTC's rule: the backlogged tenant with the
    smallest counter, the first in queue order on a tie."""
    name = "regla de admisión de VTC"
    cases = pick_cases(seed)
    for i, (label, counters, backlogged) in enumerate(cases):
        want = reference_pick_tenant(counters, backlogged)
        shown = f"{label}: contadores {es_value(counters)}, en cola {es_value(backlogged)}"
        got, crash = call_student(name, fn, dict(counters), list(backlogged))
        if crash:
            return failed(name, i, shown, crash)
        if got == want and (got is not None or want is None):
            continue
        problem = f"se esperaba {want!r} y su función devolvió {es_value(got)}."
        if got not in backlogged:
            hint = ("solo puede admitirse un inquilino con peticiones en cola: el que menos "
                    "servicio ha recibido pero no espera nada no tiene nada que admitir.")
        elif counters[got] > counters[want]:
            hint = ("VTC admite al inquilino en cola que MENOS servicio ha recibido (el menor "
                    "contador): así el que se quedó atrás recupera su parte.")
        else:
            hint = ("en un empate gana el primero de la lista de inquilinos en cola (la lista va "
                    "en el orden de la cola): así el desempate no depende de los nombres.")
        return failed(name, i, shown, problem, hint)
    return passed(name, len(cases))


# --- exercise 2: a token bucket at the door ----------------------------------------------------------

def bucket_cases(seed: int = 0) -> list[tuple[str, list, list, float, float]]:
    """(label, arrival times, costs, rate per second, capacity)."""
    cases = [
        ("tres seguidas con capacidad 2: la tercera espera", [0.0, 0.0, 0.0], [1, 1, 1], 1.0, 2.0),
        ("espaciadas: siempre hay fichas", [0.0, 1.0, 2.0, 3.0], [1, 1, 1, 1], 1.0, 1.0),
        ("un rechazo no gasta fichas", [0.0, 0.1, 0.2, 1.0], [1, 1, 1, 1], 1.0, 1.0),
        ("el cubo no se llena por encima de su capacidad", [0.0, 100.0, 100.0, 100.0, 100.0],
         [1, 1, 1, 1, 1], 1.0, 3.0),
        ("coste mayor que la capacidad: nunca cabe", [0.0, 0.5], [5, 1], 2.0, 4.0),
        ("costes en tokens", [0.0, 0.0, 0.5, 0.6], [300, 500, 200, 400], 1000.0, 1000.0),
        ("la primera llega en t = 7", [7.0, 7.0, 7.25], [1, 1, 1], 4.0, 1.0),
    ]
    rng = random.Random(seed)
    for i in range(8):
        n, t = rng.randint(3, 25), 0.0
        times = []
        for _ in range(n):
            t += rng.expovariate(rng.choice([1.0, 4.0, 20.0]))
            times.append(round(t, 4))
        costs = [rng.randint(1, 4) for _ in range(n)]
        cases.append((f"aleatorio {i + 1} ({n} llegadas)", times, costs,
                      rng.choice([0.5, 2.0, 8.0]), float(rng.randint(4, 10))))
    return cases


def _bucket_variant(times, costs, rate, capacity, *, start=None, refused_take=False,
                    cap=True, retry_full=False) -> list[float]:
    """The usual slips, to name them: the bucket starts empty, a refused request still takes,
    no cap, the Retry-After as the whole cost's refill time."""
    level, last, out = (capacity if start is None else start), (times[0] if times else 0.0), []
    for t, n in zip(times, costs):
        level = level + (t - last) * rate
        level = min(capacity, level) if cap else level
        last = t
        if n > capacity:
            out.append(math.inf)
            continue
        wait = max(0.0, (n - level) / rate)
        if wait == 0 or refused_take:
            level -= n
        out.append(n / rate if (wait > 0 and retry_full) else wait)
    return out


def _close(a, b) -> bool:
    return len(a) == len(b) and all((x == y) if math.isinf(y) or math.isinf(x) else
                                    math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9)
                                    for x, y in zip(a, b))


@self_check
def check_bucket_waits(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(times, costs, rate, capacity) -> waits`` as ``reference_bucket_waits``: 0 for an
    admitted request, the seconds until its cost is available for a refused one (its
    Retry-After), ``inf`` when it can never fit."""
    name = "cubo de fichas"
    cases = bucket_cases(seed)
    for i, (label, times, costs, rate, capacity) in enumerate(cases):
        want = reference_bucket_waits(times, costs, rate, capacity)
        shown = (f"{label}: llegadas {es_value(times)}, costes {es_value(costs)}, "
                 f"{es_sig(rate, 4)} fichas/s, capacidad {es_sig(capacity, 4)}")
        got, crash = call_student(name, fn, list(times), list(costs), rate, capacity)
        if crash:
            return failed(name, i, shown, crash)
        try:
            waits = [float(x) for x in got]
        except (TypeError, ValueError):
            return failed(name, i, shown, f"se esperaba una lista de {len(times)} esperas en "
                          f"segundos y se obtuvo {es_value(got)}.")
        if _close(waits, want):
            continue
        problem = (f"se esperaba {es_value([round(w, 6) for w in want])} y su función devolvió "
                   f"{es_value([round(w, 6) for w in waits])}.")
        variants = {
            "start": ("el cubo empieza lleno: un cliente nuevo puede gastar su ráfaga entera de "
                      "golpe; solo después lo limita el ritmo de relleno."),
            "refused_take": ("una petición rechazada (429) no gasta fichas: no se sirvió, y "
                             "cobrársela castigaría al cliente por reintentar."),
            "cap": ("el cubo no guarda más fichas que su capacidad: tras un rato inactivo, la "
                    "ráfaga admitida es como mucho la capacidad, no todo lo acumulado."),
            "retry_full": ("el Retry-After es lo que falta para reunir el coste contando las "
                           "fichas que ya hay en el cubo, no el tiempo de rellenar el coste entero."),
        }
        settings = {"start": {"start": 0.0}, "refused_take": {"refused_take": True},
                    "cap": {"cap": False}, "retry_full": {"retry_full": True}}
        hint = next((text for key, text in variants.items()
                     if _close(waits, _bucket_variant(times, costs, rate, capacity, **settings[key]))),
                    None)
        if hint is None and any(c > capacity for c in costs):
            hint = ("una petición que cuesta más que la capacidad no cabrá nunca: su espera es "
                    "infinita (math.inf), y el servidor debe rechazarla sin Retry-After.")
        if hint is None:
            hint = ("antes de decidir, sume las fichas que entraron desde la última llegada (el "
                    "tiempo transcurrido por el ritmo, sin pasar de la capacidad); si alcanzan el "
                    "coste se admite y se descuentan, si no, la espera es lo que falta entre el "
                    "ritmo.")
        return failed(name, i, shown, problem, hint)
    return passed(name, len(cases))


# --- exercise 3: goodput from the probes' records ---------------------------------------------------

def goodput_cases(seed: int = 0) -> list[tuple[str, dict, float, float]]:
    """(label, {rate: [(ttft, tpot), ...]}, SLO TTFT, SLO TPOT)."""
    ok = [(0.1, 0.02)] * 200
    slow_tail = [(0.1, 0.02)] * 196 + [(3.0, 0.02)] * 4      # p99 TTFT above 1 s, mean below
    slow_tpot = [(0.1, 0.02)] * 190 + [(0.1, 0.2)] * 10
    cases = [
        ("todas las sondas cumplen", {1.0: ok, 2.0: ok, 4.0: ok}, 1.0, 0.05),
        ("una sonda que cumple por encima de una que falla no cuenta",
         {1.0: ok, 2.0: [(3.0, 0.02)] * 200, 3.0: ok}, 1.0, 0.05),
        ("ya la primera falla", {1.0: slow_tail, 2.0: ok}, 1.0, 0.05),
        ("la cola del TTFT falla aunque la media cumple", {1.0: ok, 2.0: slow_tail, 4.0: slow_tail},
         1.0, 0.05),
        ("solo falla el TPOT", {1.0: ok, 3.0: ok, 9.0: slow_tpot}, 1.0, 0.05),
        ("la cola falla entre dos sondas que cumplen", {1.0: ok, 2.0: slow_tail, 3.0: ok}, 1.0, 0.05),
        ("peticiones sin terminar (ttft None) cuentan como tardías",
         {1.0: ok, 2.0: [(0.1, 0.02)] * 190 + [(None, None)] * 10}, 1.0, 0.05),
        ("peticiones de un token (tpot None)", {1.0: [(0.2, None)] * 50, 2.0: [(0.2, None)] * 50},
         1.0, 0.05),
        ("sondas desordenadas en el dict", {8.0: slow_tail, 2.0: ok, 4.0: ok}, 1.0, 0.05),
    ]
    rng = random.Random(seed)
    for i in range(6):
        rates = sorted(rng.sample([0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0], rng.randint(2, 5)))
        probes = {}
        for r in rates:
            load = r / 10
            probes[r] = [(rng.expovariate(1 / (0.05 + load * 0.1)), 0.01 + load * rng.random() * 0.02)
                         for _ in range(rng.randint(20, 120))]
        cases.append((f"aleatorio {i + 1} ({len(rates)} sondas)", probes, 0.5, 0.05))
    return cases


def _meets_on_mean(records, slo_ttft: float, slo_tpot: float) -> bool:
    """The slip of judging the SLO on means: finished requests' mean TTFT and mean TPOT."""
    ttft = [t for t, _ in records if t is not None]
    tpot = [p for _, p in records if p is not None]
    return bool(ttft) and sum(ttft) / len(ttft) <= slo_ttft and (
        not tpot or sum(tpot) / len(tpot) <= slo_tpot)


@self_check
def check_goodput_rate(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(probes, slo_ttft_s, slo_tpot_s) -> rate or None`` as ``reference_goodput_rate``."""
    name = "goodput desde las sondas"
    cases = goodput_cases(seed)
    for i, (label, probes, slo_ttft, slo_tpot) in enumerate(cases):
        want = reference_goodput_rate(probes, slo_ttft, slo_tpot)
        shown = (f"{label}: sondas a {es_value(sorted(probes))} peticiones/s, SLO p99 del TTFT ≤ "
                 f"{es(slo_ttft, 2)} s y p99 del TPOT ≤ {es(1000 * slo_tpot, 0)} ms")
        got, crash = call_student(name, fn, {r: list(v) for r, v in probes.items()}, slo_ttft, slo_tpot)
        if crash:
            return failed(name, i, shown, crash)
        if (got is None) == (want is None) and (want is None or (
                isinstance(got, (int, float)) and not isinstance(got, bool)
                and math.isclose(float(got), want, rel_tol=1e-12))):
            continue
        problem = f"se esperaba {es_value(want)} y su función devolvió {es_value(got)}."
        meets = {r: slo_percentiles(v, SLO(slo_ttft, slo_tpot))["meets"] for r, v in probes.items()}
        p99_hint = ("el SLO se juzga con el percentil 99 (interpolación lineal, como "
                    "numpy.percentile), no con la media ni la mediana, y exige a la vez el del "
                    "TTFT y el del TPOT.")
        on_mean = None
        for r in sorted(probes):
            if not _meets_on_mean(probes[r], slo_ttft, slo_tpot):
                break
            on_mean = r
        if got is not None and got == on_mean:
            hint = p99_hint
        elif got in meets and meets[got] and (want is None or got > want):
            hint = ("la carga solo crece: un ritmo que cumple por encima de uno que ya falla es "
                    "suerte de la muestra, no capacidad. El goodput es el último ritmo que cumple "
                    "antes del primero que falla; si ya falla el más bajo, no hay goodput (None).")
        elif any(t is None for v in probes.values() for t, _ in v):
            hint = ("una petición sin primer token (ttft None) no cumplió: cuéntela como "
                    "infinitamente tardía, no la descarte (descartarla maquilla la cola).")
        elif any(p is None for v in probes.values() for _, p in v):
            hint = ("una petición de un solo token no tiene TPOT: déjela fuera del TPOT, pero "
                    "su TTFT cuenta.")
        elif got is None and want is not None:
            hint = ("el ritmo más bajo sí cumple: el SLO se juzga con el percentil 99 de cada "
                    "métrica, y hay goodput.")
        else:
            hint = p99_hint
        return failed(name, i, shown, problem, hint)
    return passed(name, len(cases))


# --- the challenge -----------------------------------------------------------------------------------

# the lab's parameters that decide its capacity study
CAPACITY_KEYS = ("dc_model", "slo_ttft_s", "slo_tpot_s", "trace", "trace_scale",
                 "dc_max_model_len", "capacity_max_num_seqs", "capacity_requests",
                 "capacity_max_requests", "capacity_seconds", "rate_low", "rate_high", "rate_steps",
                 "rate_bisections")


def challenge_capacity(params: dict, seed: int, device: str, target_rate: float) -> dict:
    """The lab's capacity study (its SLO, trace, probes and seed) on ``device`` for
    ``target_rate`` (simulated once per set of inputs: the grader checks many contracts with the
    same ones)."""
    return dict(_capacity(tuple(params[k] for k in CAPACITY_KEYS), seed, device, target_rate))


@functools.lru_cache(maxsize=16)
def _capacity(values: tuple, seed: int, device: str, target_rate: float) -> dict:
    return capacity_study(dict(zip(CAPACITY_KEYS, values), target_rate=target_rate), seed, device)


@self_check
def check_challenge(ext: dict, params: dict, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """The challenge's ``student_extension``: the goodput of one simulated replica on an H100 and
    on ``params["challenge_device"]`` (the lab's SLO, trace and probes, workload seed
    ``seed``), and the replicas each needs for ``params["challenge_target_rate"]``."""
    name = "reto: ¿cuántas réplicas ahorra otra GPU?"
    m = ext.get("measurement") if isinstance(ext, dict) else None
    if not isinstance(m, dict) or any(k not in m for k in CHALLENGE_KEYS):
        missing = [k for k in CHALLENGE_KEYS if not isinstance(m, dict) or k not in m]
        return failed(name, 0, "measurement", f"faltan las claves {', '.join(missing)}.")
    device, target = params["challenge_device"], params["challenge_target_rate"]
    if m["target_rate"] != target:
        return failed(name, 1, "target_rate", f"el reto pide {es(target, 0)} peticiones/s; "
                      f"measurement dice {es_value(m['target_rate'])}.")
    want = {"h100": challenge_capacity(params, seed, "h100-sxm", target),
            "device": challenge_capacity(params, seed, device, target)}
    for j, (who, res) in enumerate(want.items()):
        rate_key, rep_key = f"{who}_goodput_rate", f"{who}_replicas"
        try:
            ok = (res["goodput_rate"] is None and m[rate_key] is None) or math.isclose(
                float(m[rate_key]), res["goodput_rate"], rel_tol=1e-9)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            return failed(name, 2 + 2 * j, rate_key, f"el simulador da {es_value(res['goodput_rate'])} "
                          f"peticiones/s y measurement dice {es_value(m[rate_key])}.",
                          "Use el mismo estudio de capacidad del laboratorio (mismo SLO, traza, "
                          "sondas y semilla) cambiando solo la GPU.")
        if m[rep_key] != res["replicas"]:
            return failed(name, 3 + 2 * j, rep_key, f"con {es_sig(res['goodput_rate'], 6)} "
                          f"peticiones/s por réplica hacen falta {res['replicas']} para "
                          f"{es(target, 0)}; measurement dice {es_value(m[rep_key])}.",
                          "Las réplicas se redondean hacia arriba: una fracción de réplica no "
                          "existe, y con menos no se cumple el SLO.")
    return passed(name, 6)
