"""Hidden checks of lab 6 (``observability``). Loaded by path by the autograder; never imported by
a notebook. Each function is named after a criterion of ``rubric.json`` and yields its stages:
the notebook's public self-check first, then checks the student never saw."""

from __future__ import annotations

import math
import numbers

import numpy as np

from ai_evolution.checks import call_student, failed, passed
from ai_evolution.checks import observability as checks
from ai_evolution.fmt import es, es_sig, es_value
from ai_evolution.grading import hidden, public
from ai_evolution.labs.observability import datacenter_target, measure_capacity, poisson_run
from ai_evolution.metrics import percentile as reference_percentile
from ai_evolution.reference.observability import reference_bootstrap

_REL = 1e-9


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_REL, abs_tol=1e-12)


def _number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


# --- exercise 1: Poisson arrivals -------------------------------------------------------------
def arrivals(fn, ctx):
    yield public(checks.check_arrivals, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_arrivals, fn, seed=s)
    yield hidden(_arrivals_edges, fn, seed=ctx.hidden_seeds[0])


def _times(name: str, fn, n, rate, seed):
    """The student's times as a float array, or None and the problem."""
    got, crash = call_student(name, fn, n, rate, seed)
    if crash:
        return None, crash
    try:
        t = np.asarray(got, dtype=float).reshape(-1)
    except (TypeError, ValueError):
        return None, f"devolvió {type(got).__name__}; se espera una lista de {n} instantes (s)."
    if t.size != n:
        return None, f"devolvió {t.size} instantes y se pidieron n = {n}."
    if not np.all(np.isfinite(t)):
        return None, "devolvió instantes no finitos (NaN o inf)."
    if t[0] != 0.0:
        return None, f"la primera llegada es {es_sig(t[0], 4)} s y debe ser 0."
    if np.any(np.diff(t) < 0):
        return None, "los instantes no crecen."
    return t, ""


def _arrivals_edges(fn, seed: int = 0, raise_on_fail: bool = False):
    """One arrival at extreme rates; an integer rate; very small and very large rates (mean and
    exponential shape of 2 000 gaps); the same times whatever the global numpy state."""
    name = "llegadas de Poisson (casos límite)"
    rng = np.random.default_rng(seed + 6)
    k = 0
    # 1. n = 1: one arrival, at 0, whatever the rate
    for rate in (1e-3, 1e4):
        s = int(rng.integers(0, 10_000))
        label = f"n = 1, rate = {es_sig(rate)}, seed = {s}"
        t, problem = _times(name, fn, 1, rate, s)
        if t is None:
            return failed(name, k, label, problem, "con n = 1 no hay huecos: la única llegada es "
                          "la primera, en t = 0.")
        k += 1
    # 2. rates that are integers, very small or very large: 2 000 gaps of mean 1/rate, exponential
    n = 2001
    crit = checks._KS_C / math.sqrt(n - 1)
    for rate in (3, 1e-3, 1e4, 2.5e6):
        s = int(rng.integers(0, 10_000))
        label = f"n = {n}, rate = {es_sig(rate)} ({type(rate).__name__}), seed = {s}"
        t, problem = _times(name, fn, n, rate, s)
        if t is None:
            hint = ("una tasa entera (rate = 3) es un número válido: no exija float; lo que "
                    "se rechaza es una tasa que no sea un número finito mayor que 0."
                    if isinstance(rate, int) else "")
            return failed(name, k, label, problem, hint)
        gaps = np.diff(t)
        mean = float(gaps.mean())
        if abs(mean * rate - 1) > 6 / math.sqrt(n - 1):  # six standard errors of the mean
            return failed(name, k, label, f"la media de los huecos es {es_sig(mean, 4)} s y "
                          f"debería ser 1/rate = {es_sig(1 / rate, 4)} s.", "la escala de la "
                          "exponencial es la media del hueco, 1/rate, a cualquier tasa.")
        d = checks._ks_exponential(gaps, float(rate))
        if d > crit:
            return failed(name, k, label, f"los huecos no siguen una exponencial de media 1/rate: "
                          f"D = {es(d, 4)} y el máximo admisible es {es(crit, 4)}.",
                          "¿redondea los instantes? A tasas altas los huecos son de microsegundos.")
        k += 1
    # 3. the seed alone decides: the global numpy state must not matter
    s = int(rng.integers(0, 10_000))
    label = f"n = 50, rate = 2, seed = {s}, con np.random.seed(1) y luego np.random.seed(2)"
    saved = np.random.get_state()
    runs = []
    try:
        for g in (1, 2):
            np.random.seed(g)
            t, problem = _times(name, fn, 50, 2.0, s)
            if t is None:
                return failed(name, k, label, problem)
            runs.append(t)
    finally:
        np.random.set_state(saved)
    if not np.array_equal(runs[0], runs[1]):
        return failed(name, k, label, "con la misma semilla devolvió instantes distintos al "
                      "cambiar el estado global de np.random.", "cree su propio generador a partir "
                      "de seed; el estado global de np.random no depende de ella.")
    return passed(name, k + 1)


# --- exercise 2: the percentile ---------------------------------------------------------------
def percentile(fn, ctx):
    yield public(checks.check_percentile, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_percentile, fn, seed=s)
    yield hidden(_percentile_edges, fn)


def _percentile_edges(fn, raise_on_fail: bool = False):
    """A single value at q = 0, 50 and 100; the minimum and maximum of unsorted input; integers;
    negatives; repeated values; small percentiles (q = 1 and 0,5, not fractions); a reversed
    list of 10 001 values."""
    ten = [0.2, 0.9, 0.1, 0.7, 0.3, 0.8, 0.4, 0.6, 0.5, 1.0]
    cases = [([7.5], 0.0), ([7.5], 50.0), ([7.5], 100.0),
             ([0.4, 0.1, 0.3, 0.2], 0.0), ([0.4, 0.1, 0.3, 0.2], 100.0),
             ([5, 3, 9, 1], 50), ([-3.0, 2.0, -1.0, 0.0], 25.0),
             ([2.0, 2.0, 2.0, 2.0, 2.0, 1.0], 99.9), (ten, 1.0), (ten, 0.5),
             ([float(v) for v in range(10_000, -1, -1)], 99.95)]
    return checks.percentile_result("percentil (casos límite)", fn, cases)


# --- exercise 3: the bootstrap interval ----------------------------------------------------
def bootstrap(fn, ctx):
    yield public(checks.check_bootstrap, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_bootstrap, fn, seed=s)
    yield hidden(_bootstrap_edges, fn, seed=ctx.hidden_seeds[0])


def _pair(got):
    if (not isinstance(got, (tuple, list, np.ndarray)) or len(got) != 2
            or not all(_number(v) or isinstance(v, np.number) for v in got)):
        return None
    return float(got[0]), float(got[1])


def _bootstrap_edges(fn, seed: int = 0, raise_on_fail: bool = False):
    """A single value; all values equal; q = 0 and q = 100; one resample; alpha = 0,5; the
    median of a symmetric sample (the interval holds the point estimate); the same interval for
    the same seed and another for another seed."""
    name = "intervalo bootstrap (casos límite)"
    rng = np.random.default_rng(seed + 11)
    expo = rng.exponential(0.1, 30).round(6).tolist()
    sym = (0.5 + rng.normal(0, 0.1, 101)).round(6).tolist()
    cases = [
        ([0.25], 99.0, dict(n_boot=200, alpha=0.05, seed=3)),
        ([0.1] * 12, 50.0, dict(n_boot=300, alpha=0.05, seed=4)),
        (expo, 0.0, dict(n_boot=500, alpha=0.05, seed=5)),
        (expo, 100.0, dict(n_boot=500, alpha=0.05, seed=6)),
        (expo, 90.0, dict(n_boot=1, alpha=0.05, seed=7)),
        (expo, 99.0, dict(n_boot=400, alpha=0.5, seed=8)),
        (sym, 50.0, dict(n_boot=1000, alpha=0.05, seed=int(rng.integers(0, 10_000)))),
    ]
    for i, (values, q, kw) in enumerate(cases):
        label = (f"{len(values)} valores, q = {es(q, 0)}, n_boot = {kw['n_boot']}, "
                 f"alpha = {es(kw['alpha'], 2)}, seed = {kw['seed']}")
        given = list(values)
        got, crash = call_student(name, fn, given, q, **kw)
        if crash:
            return failed(name, i, label, crash)
        pair = _pair(got)
        if pair is None:
            return failed(name, i, label, f"devolvió {es_value(got)}; se espera una pareja (low, high).")
        expected = reference_bootstrap(values, q, **kw)
        point = reference_percentile(values, q)
        if expected[0] <= point <= expected[1] and not pair[0] <= point <= pair[1]:
            return failed(name, i, label, f"su intervalo {es_value(pair)} no contiene el "
                          f"percentil de la muestra, {es_sig(point)}, y el de referencia "
                          f"{es_value(expected)} sí.")
        if not (_close(pair[0], expected[0]) and _close(pair[1], expected[1])):
            return failed(name, i, label, f"se esperaba el intervalo {es_value(expected)} y su "
                          f"función devolvió {es_value(pair)}.",
                          "remuestree con reemplazo, con el protocolo del enunciado (el generador "
                          "de la semilla y todos los índices en una sola llamada); con un solo "
                          "valor o con todos iguales el intervalo tiene anchura 0.")
        if given != values:
            return failed(name, i, label, "su función modificó la lista que recibió.")
    # the seed decides: the same seed twice gives the same interval, other seeds other intervals
    i = len(cases)
    label = f"{len(sym)} valores, q = 37,5, n_boot = 300, seed = 21 dos veces y seeds 22 a 25"
    calls = []
    for s in (21, 21, 22, 23, 24, 25):
        got, crash = call_student(name, fn, list(sym), 37.5, n_boot=300, alpha=0.05, seed=s)
        if crash:
            return failed(name, i, label, crash)
        pair = _pair(got)
        if pair is None:
            return failed(name, i, label, f"devolvió {es_value(got)}; se espera una pareja (low, high).")
        calls.append(pair)
    if calls[0] != calls[1]:
        return failed(name, i, label, f"la misma semilla dio {es_value(calls[0])} y "
                      f"{es_value(calls[1])}.", "cree el generador a partir de seed dentro de la "
                      "función, no use el estado global de np.random.")
    if all(c == calls[0] for c in calls[2:]):
        return failed(name, i, label, "cinco semillas distintas dieron el mismo intervalo: su "
                      "función no usa seed.", "el generador debe crearse a partir de seed.")
    return passed(name, i + 1)


# --- the challenge ----------------------------------------------------------------------------
WORST_PREFIX = "worst_ttft_p99_s_at_"
CHALLENGE_REQUESTS = 240


def extension(ext, contract, ctx):
    yield hidden(_rate_to_announce, ext, ctx.params, ctx.seed)


def _rate_to_announce(ext, params, seed, raise_on_fail: bool = False):
    """The simulated capacity of the lab (recomputed: the simulator is deterministic) and, for
    at least two fractions of it, a worst TTFT p99 in seconds between the TTFT of a request alone
    on the simulated GPU and the time to serve the run's 240 requests twice at capacity."""
    name = "reto: la tasa que anunciar"
    m = ext["measurement"]
    dc, shape, setup = datacenter_target(params)
    width = params["dc_max_num_seqs"]
    cap = measure_capacity(dc, width, 8 * width, *shape, seed)[0]["capacity_req_s"]
    got = m["capacity_req_s"]
    if not math.isclose(got, cap, rel_tol=1e-6):
        return failed(name, 0, "capacity_req_s", f"la capacidad simulada de {setup['device']} es "
                      f"{es(cap, 4)} peticiones/s (scap['capacity_req_s'] de la sección 7) y "
                      f"measurement dice {es_value(got)}.", "el reto se mide en el simulador, no en esta "
                      "máquina: use la capacidad simulada.")
    worst = {k: v for k, v in m.items() if isinstance(k, str) and k.startswith(WORST_PREFIX)}
    if len(worst) < 2:
        return failed(name, 1, "fracciones", f"measurement tiene {len(worst)} claves "
                      f"{WORST_PREFIX}<fracción>; buscar la mayor fracción que cumple el SLO "
                      "pide medir al menos dos.")
    solo = poisson_run(dc, 1, 1.0, *shape, seed).requests[0].ttft
    ceiling = 2 * CHALLENGE_REQUESTS / cap
    for i, (key, value) in enumerate(sorted(worst.items()), start=2):
        try:
            fraction = float(key[len(WORST_PREFIX):])
        except ValueError:
            return failed(name, i, key, f"{key!r} no termina en una fracción de la capacidad "
                          f"(por ejemplo {WORST_PREFIX}0.6).")
        if not (math.isfinite(fraction) and fraction > 0):
            return failed(name, i, key, f"la fracción {es_value(fraction)} no es un número positivo.")
        if not _number(value) or not math.isfinite(value):
            return failed(name, i, key, f"measurement[{key!r}] debe ser un número finito y es "
                          f"{es_value(value)}.")
        if value < solo * (1 - 1e-9):
            return failed(name, i, key, f"un TTFT p99 de {es_sig(value, 4)} s es menor que el TTFT "
                          f"de una petición sola en el simulador, {es_sig(solo, 4)} s.",
                          "la clave termina en _s: el p99 va en segundos.")
        if value > ceiling:
            return failed(name, i, key, f"un TTFT p99 de {es_sig(value, 4)} s es mayor que el "
                          f"tiempo de servir dos veces las {CHALLENGE_REQUESTS} peticiones a la "
                          f"capacidad ({es_sig(ceiling, 3)} s).",
                          "¿está en milisegundos? La clave termina en _s: segundos.")
    return passed(name, len(worst) + 2)
