"""Self-checks of the observability lab (chapter 6): percentile, bootstrap interval, Poisson arrivals.

The percentile and the bootstrap are compared with the library's (``metrics.percentile``,
``metrics.bootstrap_ci``) on seeded samples. A Poisson generator has no single right answer
(any correct use of a random generator will do), so it is checked by its properties: shape,
reproducibility with the seed, statistics of the gaps that only exponential gaps of mean
``1 / rate`` pass, and rejection of a bad rate.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..fmt import es, es_sig, es_value
from ..metrics import bootstrap_ci, percentile
from . import CheckResult, call_student, failed, passed, self_check

_REL = 1e-9


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_REL, abs_tol=1e-12)


def _number(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def _short(values: list[float], k: int = 6) -> str:
    shown = "; ".join(es_sig(v, 4) for v in values[:k])
    return f"[{shown}{'; …' if len(values) > k else ''}]"


# --- percentile ---------------------------------------------------------------------------------
def _linear(values, q: float, rank: Callable[[int, float], float]) -> float:
    """Linear interpolation at position ``rank(n, q)`` (0-based, clipped) of ``values`` as given."""
    x = list(values)
    h = min(max(rank(len(x), q), 0.0), len(x) - 1)
    lo = math.floor(h)
    hi = min(lo + 1, len(x) - 1)
    return x[lo] + (h - lo) * (x[hi] - x[lo])


def _percentile_cases(seed: int) -> list[tuple[list[float], float]]:
    rng = np.random.default_rng(seed)
    cases = [([3.0, 1.0, 2.0], 50.0),                         # unsorted, the middle one
             ([0.5, 0.1, 0.4, 0.2], 50.0),                    # even n: between two values
             ([0.2, 0.9, 0.1, 0.7, 0.3, 0.8, 0.4, 0.6, 0.5, 1.0], 90.0),
             (rng.exponential(0.05, 60).round(6).tolist(), 99.0),  # the p99 of a 60-request run
             ([4.2], 99.0), ([2.0, 2.0, 5.0, 2.0], 75.0),
             ([0.3, 0.1, 0.2], 0.0), ([0.3, 0.1, 0.2], 100.0)]
    for _ in range(8):
        n = int(rng.integers(2, 200))
        q = float(rng.choice([50.0, 90.0, 99.0, 99.9, round(float(rng.uniform(1, 99)), 1)]))
        cases.append((rng.lognormal(-3, 1, n).round(6).tolist(), q))
    return cases


def _percentile_hint(values: list[float], q: float, got: float) -> str:
    n = len(values)
    s = sorted(values)
    variants = [
        (lambda: percentile(values, 100 * q) if q <= 1 else math.nan,
         "q llega siempre en la escala 0..100: q = 1 es el p1, no el p100; no lo interprete "
         "como fracción."),
        (lambda: _linear(values, q, lambda n, q: (n - 1) * q / 100),
         "su resultado coincide con interpolar sobre los valores sin ordenar: ordénelos primero "
         "(sorted(values))."),
        (lambda: s[max(0, math.ceil(q / 100 * n) - 1)],
         "usó el rango más cercano (sin interpolar); la convención de numpy y de vLLM interpola "
         "linealmente entre los dos valores vecinos."),
        (lambda: _linear(s, q, lambda n, q: n * q / 100),
         "la posición está desplazada en uno: con n valores ordenados x[0..n−1], la posición es "
         "h = (n − 1)·q/100, no n·q/100."),
        (lambda: _linear(s, q, lambda n, q: (n + 1) * q / 100 - 1),
         "usó la posición (n + 1)·q/100 − 1 (otra convención); use h = (n − 1)·q/100."),
        (lambda: s[math.floor((n - 1) * q / 100)],
         "tomó x[floor(h)] sin interpolar: sume (h − floor(h))·(x[floor(h)+1] − x[floor(h)])."),
        (lambda: _linear(s, q / 100, lambda n, q: (n - 1) * q / 100),
         "q llega en la escala 0..100 (99 = p99), no como fracción."),
    ]
    for value, hint in variants:
        if _close(got, value()):
            return hint
    return ("ordene los valores, calcule h = (n − 1)·q/100 e interpole entre x[floor(h)] y el "
            "siguiente.")


@self_check
def check_percentile(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(values, q) -> float``: the ``q``-th percentile (0..100) of a non-empty list, linear
    interpolation between closest ranks (numpy's default), without modifying ``values``."""
    return percentile_result("percentil", fn, _percentile_cases(seed))


def percentile_result(name: str, fn: Callable, cases: list[tuple[list[float], float]]
                      ) -> CheckResult:
    """``fn(values, q)`` against ``metrics.percentile`` on each ``(values, q)`` of ``cases``,
    stopping at the first difference (the public check's cases, or the autograder's)."""
    for i, (values, q) in enumerate(cases):
        label = f"{len(values)} valores {_short(values)}, q = {es_sig(q, 4)}"
        given = list(values)
        got, crash = call_student(name, fn, given, q)
        if crash:
            return failed(name, i, label, crash)
        expected = percentile(values, q)
        if not _number(got):
            return failed(name, i, label, f"devolvió {type(got).__name__} ({es_value(got)}); se "
                          "espera un número.")
        if not _close(float(got), expected):
            return failed(name, i, label, f"se esperaba {es_sig(expected)} y su función "
                          f"devolvió {es_sig(float(got))}.", _percentile_hint(values, q, float(got)))
        if given != values:
            return failed(name, i, label, "el resultado es correcto, pero su función "
                          "reordenó la lista que recibió (values.sort() cambia los datos "
                          "de quien la llama).", "use sorted(values), que devuelve una "
                          "copia.")
    return passed(name, len(cases))


# --- bootstrap ----------------------------------------------------------------------------------
def _bootstrap_cases(seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    cases = []
    for n, q, n_boot, alpha in ((60, 99.0, 1000, 0.05), (20, 50.0, 500, 0.05),
                                (150, 90.0, 1000, 0.1), (60, 50.0, 2000, 0.05),
                                (8, 99.0, 300, 0.2), (100, 99.0, 1000, 0.05)):
        values = rng.exponential(0.1, n).round(6).tolist()
        cases.append({"values": values, "q": q, "n_boot": n_boot, "alpha": alpha,
                      "seed": int(rng.integers(0, 10_000))})
    return cases


def _boot_stats(values: list[float], q: float, n_boot: int, seed: int) -> np.ndarray:
    """The reference's resampled statistics (``bootstrap_ci`` draws them in one call when
    ``n * n_boot`` is small, as in every case here)."""
    x = np.asarray(values, dtype=float)
    assert x.size * n_boot <= 4_000_000
    idx = np.random.default_rng(seed).integers(0, x.size, (n_boot, x.size))
    return np.percentile(x[idx], q, axis=1)


def _bootstrap_hint(case: dict, got: tuple[float, float]) -> str:
    values, q, alpha = case["values"], case["q"], case["alpha"]
    if got[0] == got[1] and min(values) != max(values):
        return ("su intervalo tiene anchura 0: ¿remuestreó sin reemplazo (una permutación tiene "
                "siempre el mismo percentil)? Cada remuestra toma n valores con reemplazo.")
    stats = _boot_stats(values, q, case["n_boot"], case["seed"])
    x = np.asarray(values)
    idx = np.random.default_rng(case["seed"]).integers(0, x.size, (case["n_boot"], x.size))
    variants = [
        (np.quantile(stats, [alpha, 1 - alpha]),
         "usó alpha en cada cola; un intervalo al 1 − alpha deja alpha/2 a cada lado."),
        (np.quantile(np.mean(x[idx], axis=1), [alpha / 2, 1 - alpha / 2]),
         "calculó la media de cada remuestra; la estadística es el percentil q."),
        (np.quantile(stats, [alpha / 200, 1 - alpha / 200]),
         "alpha viene como fracción (0,05 = intervalo del 95 %): los extremos son los percentiles "
         "100·alpha/2 y 100·(1 − alpha/2) de las estadísticas."),
    ]
    for (lo, hi), hint in variants:
        if _close(got[0], lo) and _close(got[1], hi):
            return hint
    return ("siga el protocolo de remuestreo del enunciado (un generador creado con la semilla y "
            "todos los índices en una sola llamada, una fila por remuestra), calcule el percentil q "
            "de cada remuestra y, de esas n_boot estadísticas, tome los percentiles 100·alpha/2 y "
            "100·(1 − alpha/2).")


@self_check
def check_bootstrap(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(values, q, n_boot=1000, alpha=0.05, seed=0) -> (low, high)``: the percentile-bootstrap
    interval of the ``q``-th percentile, equal to ``metrics.bootstrap_ci(values, q=q, ...)``
    (same resampling protocol, relative 1e-9), reproducible with its seed."""
    name = "intervalo bootstrap"
    cases = _bootstrap_cases(seed)
    sample = np.random.default_rng(seed).lognormal(-2, 0.5, 150).round(6).tolist()
    label = "150 valores, q = 90, n_boot = 200, seed = 7, tres llamadas"
    calls = []
    for _ in range(3):
        got, crash = call_student(name, fn, list(sample), 90.0, n_boot=200, alpha=0.05, seed=7)
        if crash:
            return failed(name, 0, label, crash)
        try:
            calls.append(tuple(float(v) for v in got))
        except (TypeError, ValueError):
            return failed(name, 0, label, f"devolvió {es_value(got)}; se espera una pareja "
                          "(low, high) de números.")
    if len(set(calls)) > 1:
        return failed(name, 0, label, f"tres llamadas con la misma semilla dan "
                      f"intervalos distintos: {es_value(calls)}.", "cree el generador con "
                      "np.random.default_rng(seed) dentro de la función; no use el estado "
                      "global de np.random.")
    for i, case in enumerate(cases):
        i += 1  # case 0 was the reproducibility one
        kw = {k: case[k] for k in ("n_boot", "alpha", "seed")}
        label = (f"{len(case['values'])} valores, q = {es(case['q'], 0)}, n_boot = {case['n_boot']}, "
                 f"alpha = {es(case['alpha'], 2)}, seed = {case['seed']}")
        got, crash = call_student(name, fn, list(case["values"]), case["q"], **kw)
        if crash:
            return failed(name, i, label, crash)
        if (not isinstance(got, (tuple, list, np.ndarray)) or len(got) != 2
                or not all(_number(v) for v in got)):
            return failed(name, i, label, f"devolvió {es_value(got)}; se espera una pareja "
                          "(low, high) de números.")
        got = (float(got[0]), float(got[1]))
        if got[0] > got[1]:
            return failed(name, i, label, f"low = {es_sig(got[0])} es mayor que high = "
                          f"{es_sig(got[1])}.")
        expected = bootstrap_ci(case["values"], q=case["q"], **kw)
        if not (_close(got[0], expected[0]) and _close(got[1], expected[1])):
            return failed(name, i, label, f"se esperaba el intervalo {es_value(expected)} y "
                          f"su función devolvió {es_value(got)}.", _bootstrap_hint(case, got))
    return passed(name, len(cases) + 1)


# --- Poisson arrivals ---------------------------------------------------------------------------
STAT_N = 20_001   # arrivals per statistical case: 20 000 gaps
# Two-sided Kolmogorov-Smirnov critical value at alpha = 1e-4: a correct generator fails a case
# once in ten thousand seeds; gaps that are fixed or uniform fail it by a factor of ten or more.
_KS_C = math.sqrt(-0.5 * math.log(1e-4 / 2))


def _ks_exponential(gaps: np.ndarray, rate: float) -> float:
    g = np.sort(gaps)
    m = g.size
    cdf = 1.0 - np.exp(-rate * g)
    return float(max(np.max(np.arange(1, m + 1) / m - cdf), np.max(cdf - np.arange(m) / m)))


def _as_times(got, n: int) -> tuple[np.ndarray | None, str]:
    try:
        t = np.asarray(got, dtype=float).reshape(-1)
    except (TypeError, ValueError):
        return None, f"devolvió {type(got).__name__}; se espera una lista de {n} instantes (s)."
    if t.size != n:
        return None, (f"devolvió {t.size} instantes y se pidieron n = {n}" +
                      (": n llegadas tienen n − 1 huecos (la primera en 0, sin hueco delante)."
                       if t.size in (n - 1, n + 1) else "."))
    if not np.all(np.isfinite(t)):
        return None, "devolvió instantes no finitos (NaN o inf)."
    return t, ""


def _call_times(name: str, fn: Callable, n: int, rate: float, seed: int) -> tuple[np.ndarray | None, str]:
    """The student's arrival times as an array, or None and what went wrong."""
    got, crash = call_student(name, fn, n, rate, seed)
    return (None, crash) if crash else _as_times(got, n)


@self_check
def check_arrivals(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(n, rate, seed) -> list[float]``: ``n`` arrival times (s) of a Poisson process of
    ``rate`` requests/s, the first at 0, gaps independent ``Exponential`` of mean ``1 / rate``,
    the same times for the same seed (and other times for another), ``ValueError`` for a rate
    that is not a finite number > 0."""
    name = "llegadas de Poisson"
    rng = np.random.default_rng(seed)
    k = 0

    def fail(label: str, problem: str, hint: str = "") -> CheckResult:
        return failed(name, k, label, problem, hint)

    # 1. shape: n times, the first at 0, non-decreasing
    for n, rate in ((1, 2.0), (5, 2.0), (40, 0.7)):
        s = int(rng.integers(0, 10_000))
        label = f"n = {n}, rate = {es(rate, 1)}, seed = {s}"
        t, problem = _call_times(name, fn, n, rate, s)
        if t is None:
            return fail(label, problem)
        if t[0] != 0.0:
            return fail(label, f"la primera llegada es {es_sig(t[0], 4)} s.", "por convención (la de "
                        "benchmark_serving de vLLM) la primera petición se envía en t = 0: "
                        "instantes = 0 seguido de la suma acumulada de n − 1 huecos.")
        if np.any(np.diff(t) < 0):
            return fail(label, f"los instantes no crecen: {_short(t.tolist())}.",
                        "devuelva instantes acumulados (cada uno, el anterior más su hueco), no los "
                        "huecos.")
        k += 1
    # 2. statistics of the gaps: mean 1 / rate, exponential shape, no correlation
    for rate in (0.5, 4.0, 37.5):
        s = int(rng.integers(0, 10_000))
        label = f"n = {STAT_N}, rate = {es(rate, 1)}, seed = {s}"
        t, problem = _call_times(name, fn, STAT_N, rate, s)
        if t is None:
            return fail(label, problem)
        gaps = np.diff(t)
        m = gaps.size
        mean = float(gaps.mean())
        if abs(mean * rate - 1) > 0.03:  # ~4 standard errors of the mean of 20 000 gaps
            hint = ("np.random.Generator.exponential recibe la escala (la media, 1/rate), no la "
                    "tasa." if abs(mean - rate) < 0.03 * rate else
                    "los huecos deben tener media 1/rate segundos.")
            return fail(label, f"la media de los huecos es {es(mean, 4)} s y debería ser "
                        f"1/rate = {es(1 / rate, 4)} s.", hint)
        d = _ks_exponential(gaps, rate)
        crit = _KS_C / math.sqrt(m)
        if d > crit:
            cv = float(gaps.std() / mean) if mean > 0 else 0.0
            shape = ("todos los huecos son iguales: eso es una carga determinista, no un proceso "
                     "de Poisson." if cv < 0.05 else
                     "¿huecos uniformes? Una exponencial tiene la desviación típica igual a la "
                     f"media (la suya es {es(cv, 2)} veces la media)." if cv < 0.9 else
                     "use n − 1 huecos exponenciales independientes, de media 1/rate.")
            return fail(label, f"los huecos no siguen una exponencial de media 1/rate: el "
                        f"estadístico de Kolmogorov-Smirnov es D = {es(d, 4)} y el máximo "
                        f"admisible {es(crit, 4)}.", shape)
        r1 = float(np.corrcoef(gaps[:-1], gaps[1:])[0, 1])
        if abs(r1) > 4.5 / math.sqrt(m):
            return fail(label, f"cada hueco está correlacionado con el siguiente (r = {es(r1, 3)}).",
                        "los huecos de un proceso de Poisson son independientes: no los ordene "
                        "ni los derive unos de otros.")
        k += 1
    # 3. the seed: same seed, same times; another seed, other times
    s = int(rng.integers(0, 10_000))
    label = f"n = 50, rate = 3, seed = {s} dos veces y seed = {s + 1}"
    runs = []
    for seed_k in (s, s, s + 1):
        t, problem = _call_times(name, fn, 50, 3.0, seed_k)
        if t is None:
            return fail(label, problem)
        runs.append(t)
    if not np.array_equal(runs[0], runs[1]):
        return fail(label, "con la misma semilla devolvió instantes distintos.",
                    "cree el generador con np.random.default_rng(seed) dentro de la función; "
                    "np.random.exponential usa un estado global que no depende de seed.")
    if np.array_equal(runs[0], runs[2]):
        return fail(label, "con semillas distintas devolvió los mismos instantes.",
                    "pase seed a np.random.default_rng(seed): la semilla debe cambiar la muestra.")
    k += 1
    # 4. a rate that is not a finite number > 0 is rejected
    for bad in (0.0, -2.0, float("nan"), float("inf")):
        label = f"rate = {es_value(bad)}"
        try:
            got = fn(5, bad, 0)
        except NotImplementedError:
            raise
        except ValueError:
            k += 1
            continue
        except Exception as err:  # noqa: BLE001 - a crash of student code is a finding
            return fail(label, f"lanzó {type(err).__name__}: {err}; se espera ValueError.",
                        "compruebe rate al principio y lance ValueError con un mensaje que "
                        "nombre el valor recibido.")
        return fail(label, f"devolvió un resultado ({type(got).__name__}) sin lanzar "
                    "ValueError.", "una tasa debe ser un número finito mayor que 0 (ni 0, ni "
                    "negativa, ni NaN, ni infinita): compruébelo al principio y, si no, lance "
                    "ValueError.")
    return passed(name, k, "Los huecos pasan las pruebas de media, forma exponencial "
                  "e independencia.")
