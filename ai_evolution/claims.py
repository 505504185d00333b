"""Conclusions computed from the numbers beside them.

A page may state a conclusion about the reader's machine ("X is faster than Y", "the simulator is
accurate", "growth is linear") only through a :class:`Claim` built here from the measured
numbers. The claim picks the branch that the numbers support, including *inconclusive* when the
interval of a comparison contains no difference or is too short on data to decide (its real
coverage, printed, is under 90 %), and renders the Spanish sentence. The same
object is glued into the page and stored in the contract's ``evidence`` (with the inputs it was
computed from), so :func:`recheck` can rebuild every sentence from its own numbers: a page and its
contract cannot disagree, and a test can prove that no statement contradicts its inputs.

Three kinds, one line each at the call site::

    c = claims.compare(paged_tok_s, contiguous_tok_s, what="bloques / contiguo (tokens/s)",
                       higher="los bloques rinden más", lower="los bloques rinden menos")
    c = claims.threshold(worst_error, 0.15, what="error máximo del simulador",
                         passed="el simulador queda validado aquí", failed="no queda validado")
    c = claims.growth(ns, seconds, what="tiempo total sin caché")
    glue("key", Markdown(c.markdown)); evidence.append(c.evidence("x"))
    glue("key_table", Markdown(claims.table([c, ...])))   # the decision detail, one table

A chapter pastes the sentence with ``{glue:md}`` (one sentence in its voice, the number in
bold) and the section's table with the ``{glue:md}`` directive (``:format: myst``).
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Callable, Sequence

import numpy as np

from .fmt import es

LEVEL = 0.95
N_BOOT = 2000

HIGHER, LOWER, INCONCLUSIVE = "higher", "lower", "inconclusive"
PASSED, FAILED = "passed", "failed"
LINEAR, SUPERLINEAR, BETWEEN = "linear", "superlinear", "between"


# --- intervals ---------------------------------------------------------------------------------
# An interval prints the coverage its method really has for its sample size, and a verdict is
# decisive only when that coverage is at least ``DECISIVE``. Both methods here are
# distribution-free (they assume only independent draws from a continuous distribution):
#
# - ``ORDER``: the order-statistic interval [x(l), x(u)] of a quantile of one sample. The number
#   B of draws below the true quantile is Binomial(n, p), and the interval covers the quantile
#   exactly when l <= B <= u - 1, so its coverage is a sum of binomial terms: exact, not an
#   approximation. For the median of 3 values the widest interval, min-max, covers 75 %; 5
#   values, 93,8 %; 6, 96,9 %. Paired measurements (a[i] beside b[i]) use the ratios a[i]/b[i]:
#   the interval is that of their median, and drift that hits both sides of a pair cancels.
# - ``ORDER2``: a coverage that is a lower bound, printed as "al menos". Two independent samples
#   (or a tail percentile): an order-statistic interval for each side, combined into one for
#   the ratio, covers at least c_a + c_b - 1 (Bonferroni); an exact interval widened to hold
#   the point estimate covers at least as often as before.
#
# The percentile bootstrap the module used before prints 95 % whatever n is; for the median of
# 3 values it is their min-max range, which covers 75 %.
# - ``BOOTSTRAP``: a percentile bootstrap, for a statistic no order statistic covers (a pooled
#   perplexity over text fragments). Its coverage is only approximately its level, and only with
#   enough samples: from ``BOOT_MIN_N`` on it is printed as "aproximado"; below, it is a range
#   with no known coverage, and decides nothing.
DECISIVE = 0.90
BOOT_MIN_N = 20
ORDER, ORDER2, BOOTSTRAP, POINT = "order", "order2", "bootstrap", "point"
METHOD_TEXT = {ORDER: "estadísticos de orden, cobertura exacta",
               ORDER2: "estadísticos de orden, cobertura mínima garantizada",
               BOOTSTRAP: "bootstrap de percentiles, cobertura aproximada",
               POINT: "una sola medición"}


def interval_text(low: float, high: float, decimals: int = 2) -> str:
    """``[1,2; 3,4]``: a semicolon keeps the decimal commas apart."""
    return f"[{es(low, decimals)}; {es(high, decimals)}]"


def binomial_pmf(n: int, p: float) -> np.ndarray:
    """P(B = k) for k = 0..n, B ~ Binomial(n, p) (through logarithms: exact enough for any n)."""
    if n < 0 or not 0 <= p <= 1:
        raise ValueError(f"binomial_pmf necesita n >= 0 y p en [0, 1]; se recibieron {n} y {p}")
    k = np.arange(n + 1)
    if p in (0.0, 1.0):
        return (k == (n if p == 1 else 0)).astype(np.float64)
    log = (np.array([math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in k])
           + k * math.log(p) + (n - k) * math.log1p(-p))
    return np.exp(log)


def order_interval(n: int, p: float = 0.5, level: float = LEVEL) -> tuple[int, int, float]:
    """The shortest order-statistic interval ``[x(l), x(u)]`` (1-based ranks) for the
    ``p``-quantile of ``n`` draws whose coverage reaches ``level``, or, when no interval from
    ``n`` draws does, the widest one, ``[x(1), x(n)]``. Returns ``(l, u, coverage)``, the
    coverage exact for continuous distributions (``n < 2``: ``(1, 1, 0.0)``)."""
    if n < 2:
        return 1, max(n, 1), 0.0
    if not 0 < p < 1:
        raise ValueError(f"p debe estar en (0, 1); se recibió {p}")
    pmf = binomial_pmf(n, p)
    # The interval covers the quantile iff l <= B <= u - 1, with 1 <= l and u <= n: grow the
    # set of B values from the mode, always by the likelier neighbour (both on a tie, which
    # keeps the median's interval symmetric), until its mass reaches the level.
    lo = hi = int(min(max(np.argmax(pmf), 1), n - 1))
    mass = float(pmf[lo])
    while mass < level - 1e-12:
        left = pmf[lo - 1] if lo - 1 >= 1 else -1.0
        right = pmf[hi + 1] if hi + 1 <= n - 1 else -1.0
        if left < 0 and right < 0:
            break
        if left >= 0 and math.isclose(left, right, rel_tol=1e-9):
            lo, hi, mass = lo - 1, hi + 1, mass + left + right
        elif left > right:
            lo, mass = lo - 1, mass + left
        else:
            hi, mass = hi + 1, mass + right
    return lo, hi + 1, float(min(mass, 1.0))


@dataclass(frozen=True)
class Estimate:
    """A median (or another percentile) with an interval over ``n`` samples and the coverage
    that interval really has (``method``: ``ORDER`` exact, ``ORDER2`` a lower bound; n=1: a
    point, coverage 0)."""

    median: float
    low: float
    high: float
    n: int
    coverage: float = 0.0
    method: str = POINT

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high

    @property
    def decisive(self) -> bool:
        """Whether a verdict may rest on this interval: coverage of at least ``DECISIVE``."""
        return self.n >= 2 and self.coverage >= DECISIVE - 1e-12

    def coverage_text(self) -> str:
        """The coverage rounded down, so that it never claims more than the method has:
        "96 %", or "al menos el 95 %" for a lower bound."""
        pct = es(math.floor(100 * self.coverage + 1e-9), 0) + "\u00a0%"
        if self.method == BOOTSTRAP:
            return f"{pct} aproximado" if self.coverage else "una cobertura desconocida"
        return f"al menos el {pct}" if self.method == ORDER2 else pct

    def interval_phrase(self, decimals: int = 2) -> str:
        """``intervalo del 96 %: [1,02; 1,10]`` when a verdict may rest on it; otherwise
        ``rango [1,02; 1,54], que cubre el 75 %``, a range from which no verdict is drawn."""
        span = interval_text(self.low, self.high, decimals)
        cov = self.coverage_text()
        if self.decisive:
            return f"intervalo {'de ' if self.method == ORDER2 else 'del '}{cov}: {span}"
        if self.method == BOOTSTRAP:
            return f"rango {span}, de {cov} (bootstrap con menos de {BOOT_MIN_N} muestras)"
        if self.method == ORDER2 and self.coverage <= 0:  # a bound of 0 says nothing
            return f"rango {span}, sin una cobertura que se pueda garantizar"
        return f"rango {span}, que cubre {'' if self.method == ORDER2 else 'el '}{cov}"


def _samples(values: Sequence[float], name: str) -> np.ndarray:
    arr = np.asarray(list(values), dtype=np.float64).ravel()
    if arr.size == 0:
        raise ValueError(f"{name}: no hay muestras; se necesita al menos una")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: cada muestra debe ser un número finito; se recibió {arr.tolist()}")
    return arr


def _quantile_interval(x: np.ndarray, q: float, level: float) -> tuple[float, float, float, float]:
    """(percentile, low, high, coverage) of one sample's ``q``-th percentile."""
    point = float(np.percentile(x, q))
    if x.size < 2:
        return point, point, point, 0.0
    l, u, cov = order_interval(x.size, q / 100, level)
    s = np.sort(x)
    return point, min(float(s[l - 1]), point), max(float(s[u - 1]), point), cov


def estimate(values: Sequence[float], level: float = LEVEL, n_boot: int = N_BOOT,
             seed: int = 0) -> Estimate:
    """Median of ``values`` and its order-statistic interval, with the exact coverage it has
    for this many values (at least ``level`` when ``n`` allows it). ``n_boot`` and ``seed`` are
    kept for callers of the former bootstrap and have no effect."""
    x = _samples(values, "values")
    med, low, high, cov = _quantile_interval(x, 50.0, level)
    return Estimate(med, low, high, int(x.size), cov, ORDER if x.size > 1 else POINT)


def ratio_estimate(a: Sequence[float], b: Sequence[float], paired: bool = True,
                   level: float = LEVEL, n_boot: int = N_BOOT, seed: int = 0,
                   q: float = 50.0) -> Estimate:
    """How many times ``b`` is ``a``, with an interval and its real coverage.

    ``paired`` (``a[i]`` and ``b[i]`` measured side by side, interleaved) and the median:
    ``median(a) / median(b)`` with the exact order-statistic interval of the median of the
    ratios ``a[i] / b[i]`` (widened to hold the point if needed), so drift that hits both
    members of a pair cancels. Otherwise (independent samples, or ``q``: another
    percentile, e.g. 99 for a tail): ``percentile(a, q) / percentile(b, q)``, with an interval
    built from each side's order-statistic interval (coverage at least ``c_a + c_b - 1``).
    ``n_boot`` and ``seed`` are kept for callers of the former bootstrap and have no effect."""
    xa, xb = _samples(a, "a"), _samples(b, "b")
    if np.any(xb <= 0) or np.any(xa < 0):
        raise ValueError("ratio_estimate necesita muestras a >= 0 y b > 0 (b es el denominador)")
    if paired and xa.size != xb.size:
        raise ValueError(f"las muestras emparejadas deben tener la misma longitud; se recibieron "
                         f"{xa.size} y {xb.size}")
    if not 0 <= q <= 100:
        raise ValueError(f"q debe ser un percentil en [0, 100]; se recibió {q}")
    n = min(xa.size, xb.size)
    ratio = float(np.percentile(xa, q) / np.percentile(xb, q))
    if paired and q == 50.0:
        # The interval is that of the median of the pairs' ratios; the point stays the ratio of
        # the medians (what the labs and their graded measurements call the ratio). When the
        # point falls outside, the interval is widened to hold it: a wider interval covers at
        # least as often, so the coverage becomes a lower bound.
        _, low, high, cov = _quantile_interval(xa / xb, 50.0, level)
        if n < 2:
            return Estimate(ratio, ratio, ratio, 1, 0.0, POINT)
        method = ORDER if low <= ratio <= high else ORDER2
        return Estimate(ratio, min(low, ratio), max(high, ratio), n, cov, method)
    if xa.size == 1 and xb.size == 1:
        return Estimate(ratio, ratio, ratio, 1, 0.0, POINT)
    side = 1 - (1 - level) / 2      # each side's target, so that the pair reaches ``level``
    pa, la, ha, ca = _quantile_interval(xa, q, side)
    pb, lb, hb, cb = _quantile_interval(xb, q, side)
    cov = max(0.0, ca + cb - 1) if min(xa.size, xb.size) > 1 else 0.0
    return Estimate(ratio, min(la / hb, ratio), max(ha / lb, ratio), n, cov, ORDER2)


# --- growth fits -------------------------------------------------------------------------------
def nonneg_lstsq(design: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (exact: tries each active set; for the few
    columns a growth fit has)."""
    design = np.asarray(design, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    k = design.shape[1]
    best, best_res = np.zeros(k), float(np.sum(y**2))
    for size in range(1, k + 1):
        for cols in combinations(range(k), size):
            coef, *_ = np.linalg.lstsq(design[:, cols], y, rcond=None)
            if np.any(coef < 0):
                continue
            full = np.zeros(k)
            full[list(cols)] = coef
            res = float(np.sum((design @ full - y) ** 2))
            if res < best_res - 1e-15 * max(1.0, best_res):
                best, best_res = full, res
    return best


def fit_growth(n: Sequence[float], t: Sequence[float]) -> dict[str, float]:
    """Fit ``t ~ c0 + c1*n + c2*n**2`` with non-negative coefficients (a time cannot shrink as
    work is added). Returns the coefficients and, at the largest ``n``:

    - ``quadratic_share``: the share of the fitted time that the ``n**2`` term accounts for,
      in [0, 1] (0: no quadratic part; 1: all of it);
    - ``exponent``: the local growth exponent ``d ln t / d ln n``, in [0, 2] (1: linear,
      2: quadratic).
    """
    n = np.asarray(n, dtype=np.float64)
    t = np.asarray(t, dtype=np.float64)
    if n.shape != t.shape or n.ndim != 1 or len(n) < 3:
        raise ValueError(f"n y t deben ser vectores de la misma longitud, al menos 3; se recibieron "
                         f"formas {n.shape} y {t.shape}")
    if not (np.all(np.isfinite(n)) and np.all(np.isfinite(t))) or np.any(n < 0):
        raise ValueError("n debe ser finito y >= 0, y t finito")
    c0, c1, c2 = nonneg_lstsq(np.stack([np.ones_like(n), n, n**2], axis=1), t)
    n_max = float(n.max())
    fitted = c0 + c1 * n_max + c2 * n_max**2
    if fitted <= 0:
        share, exponent = 0.0, 0.0
    else:
        share = c2 * n_max**2 / fitted
        exponent = (c1 * n_max + 2 * c2 * n_max**2) / fitted
    return {"c0": float(c0), "c1": float(c1), "c2": float(c2),
            "quadratic_share": float(min(max(share, 0.0), 1.0)),
            "exponent": float(min(max(exponent, 0.0), 2.0))}


# --- claims ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Claim:
    """A conclusion with the branch the numbers support, its sentence and its inputs.

    ``text`` is the whole plain sentence (the contract's statement, with the decision detail in
    parentheses); ``detail`` holds its parts for the book's formatter: ``phrase`` (the
    conclusion in the chapter's voice), ``what`` (the quantity), ``shown`` (the number as
    printed), ``interval``, ``n``, ``method``, ``verdict`` (a short label). See
    :attr:`markdown` and :func:`table`."""

    kind: str
    outcome: str
    text: str
    value: float
    inputs: dict = field(default_factory=dict)
    detail: dict = field(default_factory=dict, compare=False)

    def __str__(self) -> str:
        return self.text

    @property
    def markdown(self) -> str:
        """One sentence with its number in bold and the conclusion in the chapter's voice
        (MyST/Markdown), e.g. "Tokens/s con bloques / con reserva contigua: **1,09 veces**; con
        la misma memoria, los bloques generan más tokens por segundo." The decision detail
        (interval and its real coverage, n, method) goes in :func:`table`."""
        d = self.detail
        if not d:
            return self.text
        return _sentence(f"{d['what']}: **{d['shown']}**", d["phrase"])

    def pasted(self) -> "Pasted":
        """What a page glues: :attr:`markdown` as HTML for the book, :attr:`text` (the
        contract's statement) as its plain text."""
        return Pasted(self.text, f'<span class="verdict">{_html_inline(self.markdown)}</span>')

    def evidence(self, unit: str, source: str = "measured", volatile: bool = True) -> dict:
        """The contract's evidence item for this claim (``claim`` keeps what rebuilds it)."""
        item = {"statement": self.text, "value": self.value, "unit": unit, "source": source,
                "claim": {"kind": self.kind, "outcome": self.outcome, "inputs": self.inputs}}
        if volatile:
            item["volatile"] = True
        return item


def _sentence(*parts: str) -> str:
    text = "; ".join(p.strip().rstrip(".") for p in parts if p and p.strip())
    return text[:1].upper() + text[1:] + "."


def _claim(kind: str, outcome: str, value: float, inputs: dict, *, phrase: str, what: str,
           shown: str, interval: str, n: str, method: str, verdict: str) -> Claim:
    """A claim whose plain sentence and Markdown sentence come from the same parts."""
    how = ", ".join(x for x in (interval, n) if x)
    text = _sentence(f"{what}: {shown}" + (f" ({how})" if how else ""), phrase)
    detail = {"phrase": phrase.strip().rstrip("."), "what": what, "shown": shown,
              "interval": interval, "n": n, "method": method, "verdict": verdict}
    return Claim(kind, outcome, text, value, inputs, detail)


def compare(a: Sequence[float], b: Sequence[float], *, what: str, higher: str, lower: str,
            inconclusive: str = "", paired: bool = True, level: float = LEVEL, seed: int = 0,
            decimals: int = 2, q: float = 50.0, pairs: str = "pares intercalados") -> Claim:
    """Is median(a) / median(b) above or below 1? (``paired``: the median of the pairs'
    ratios; ``q``: compare another percentile, e.g. 99 for the tail; say so in ``what``.)

    ``what`` names the ratio (e.g. "tokens/s de los bloques / contiguo"); ``higher`` and ``lower``
    are the conclusions when the whole interval lies above / below 1 and its real coverage is
    at least ``DECISIVE`` (see :func:`ratio_estimate`); otherwise the claim is inconclusive:
    one sample per side always is, and so are 3 pairs (their range covers the median 75 % of
    the time), whatever they show. ``pairs`` says what a pair is (default: two timings
    interleaved on this machine; e.g. "pares de cargas con la misma semilla" for simulations
    paired by seed).
    """
    a, b = [float(x) for x in a], [float(x) for x in b]
    est = ratio_estimate(a, b, paired=paired, level=level, seed=seed, q=q)
    if est.decisive and est.low > 1:
        outcome, phrase = HIGHER, higher
    elif est.decisive and est.high < 1:
        outcome, phrase = LOWER, lower
    else:
        outcome = INCONCLUSIVE
        phrase = inconclusive if inconclusive and est.decisive else (
            "con una sola medición no se puede separar la diferencia del ruido" if est.n < 2 else
            f"con {f'{est.n} pares' if paired else f'{len(a)} y {len(b)} mediciones'} solo "
            f"hay un rango, no un veredicto" if not est.decisive else
            "el intervalo contiene el 1: con este ruido la diferencia no es concluyente")
    n_text = (f"{est.n} {pairs}" if paired else f"{len(a)} y {len(b)} mediciones")
    interval = "" if est.n < 2 else est.interval_phrase(decimals)
    verdict = {HIGHER: "mayor que 1", LOWER: "menor que 1"}.get(
        outcome, "no concluyente" if est.decisive else "sin veredicto")
    inputs = {"a": a, "b": b, "what": what, "higher": higher, "lower": lower,
              "inconclusive": inconclusive, "paired": paired, "level": level, "seed": seed,
              "decimals": decimals, "q": q}
    if pairs != "pares intercalados":   # older contracts rebuild without the key
        inputs["pairs"] = pairs
    return _claim("compare", outcome, est.median, inputs, phrase=phrase, what=what,
                  shown=f"{es(est.median, decimals)} veces", interval=interval,
                  n=n_text if est.n >= 2 else "1 medición", method=METHOD_TEXT[est.method],
                  verdict=verdict)


def threshold(value: float, limit: float, *, what: str, passed: str, failed: str,
              below: bool = True, scale: float = 100.0, unit: str = "%", decimals: int = 1,
              interval: Sequence[float] | Estimate | None = None, inconclusive: str = "",
              coverage: float | None = None, n: int | None = None,
              method: str | None = None) -> Claim:
    """Does ``value`` meet the criterion (``value <= limit`` when ``below``, else ``>=``)?

    With an ``interval`` (low, high) that straddles the limit the claim is inconclusive. Pass
    an :class:`Estimate` as ``interval`` (or ``coverage`` and ``n`` beside a pair): the sentence
    prints its real coverage, and a coverage under ``DECISIVE`` decides nothing. Numbers are
    printed as ``value * scale`` with ``unit`` (default: a fraction as a percentage);
    ``method`` names how the interval was made (``ORDER`` when not given).
    """
    if isinstance(interval, Estimate):
        coverage = interval.coverage if coverage is None else coverage
        n = interval.n if n is None else n
        method = interval.method if method is None else method
        interval = (interval.low, interval.high)
    method = method or ORDER
    value, limit = float(value), float(limit)
    if not (math.isfinite(value) and math.isfinite(limit)):
        raise ValueError(f"threshold necesita números finitos; se recibieron {value} y {limit}")
    ok = value <= limit if below else value >= limit
    outcome = PASSED if ok else FAILED
    weak = False
    if interval is not None:
        low, high = (float(x) for x in interval)
        weak = coverage is not None and coverage < DECISIVE - 1e-12
        if (low <= limit <= high and low != high) or weak:
            outcome = INCONCLUSIVE
    est = (Estimate(value, low, high, int(n or 0), float(coverage), method)
           if interval is not None and coverage is not None else None)
    phrase = {PASSED: passed, FAILED: failed}.get(outcome) or (
        f"con {n} mediciones solo hay un rango, no un veredicto" if weak else
        inconclusive or "su intervalo contiene el criterio: con este ruido no es concluyente")
    sign = "≤" if below else "≥"
    number = f"{es(value * scale, decimals)} {unit}".rstrip().replace(" %", "\u00a0%")
    crit = f"{sign} {es(limit * scale, decimals)} {unit}".rstrip().replace(" %", "\u00a0%")
    if interval is None:
        shown_interval = ""
    elif est is not None:
        shown_interval = Estimate(value * scale, low * scale, high * scale, est.n, est.coverage,
                                  method).interval_phrase(decimals)
    else:
        shown_interval = f"intervalo {interval_text(low * scale, high * scale, decimals)}"
    verdict = {PASSED: f"cumple ({crit})", FAILED: f"no cumple ({crit})"}.get(
        outcome, "sin veredicto" if weak else "no concluyente")
    inputs = {"value": value, "limit": limit, "what": what, "passed": passed, "failed": failed,
              "below": below, "scale": scale, "unit": unit, "decimals": decimals,
              "interval": None if interval is None else [low, high], "inconclusive": inconclusive}
    if coverage is not None:      # older contracts rebuild without the keys
        inputs.update(coverage=float(coverage), n=None if n is None else int(n))
        if method != ORDER:
            inputs["method"] = method
    return _claim("threshold", outcome, value, inputs, phrase=phrase, what=what, shown=number,
                  interval="; ".join(x for x in (f"criterio: {crit}", shown_interval) if x),
                  n="" if n is None else f"{n} mediciones",
                  method=METHOD_TEXT.get(method, "") if est is not None else "", verdict=verdict)


def growth(n: Sequence[float], t: Sequence[float], *, what: str, linear_below: float = 1.25,
           superlinear_above: float = 1.5, linear: str = "", superlinear: str = "",
           between: str = "", fitted: str = "del tiempo ajustado") -> Claim:
    """How fast ``t`` grows with ``n``: the non-negative fit's exponent at the largest ``n``
    (1: linear, 2: quadratic) and the share of its quadratic term, with the branch they imply.
    ``fitted`` names the fitted quantity in the sentence (e.g. "de la memoria ajustada")."""
    n, t = [float(x) for x in n], [float(x) for x in t]
    fit = fit_growth(n, t)
    e = fit["exponent"]
    if e < linear_below:
        outcome, phrase = LINEAR, linear or "crece de forma casi lineal"
    elif e > superlinear_above:
        outcome, phrase = SUPERLINEAR, superlinear or "crece claramente más rápido que lineal"
    else:
        outcome, phrase = BETWEEN, between or "crece algo más rápido que lineal, sin llegar a cuadrático"
    inputs = {"n": n, "t": t, "what": what, "linear_below": linear_below,
              "superlinear_above": superlinear_above, "linear": linear,
              "superlinear": superlinear, "between": between}
    if fitted != "del tiempo ajustado":   # older contracts rebuild without the key
        inputs["fitted"] = fitted
    return _claim("growth", outcome, e, inputs, phrase=phrase, what=what,
                  shown=f"exponente {es(e, 2)}",
                  interval=(f"1 lineal, 2 cuadrático; el término cuadrático explica el "
                            f"{es(100 * fit['quadratic_share'], 0)}\u00a0% {fitted} en "
                            f"n\u00a0=\u00a0{es(max(n), 0)}"),
                  n=f"{len(n)} puntos", method="ajuste no negativo c₀ + c₁·n + c₂·n²",
                  verdict={LINEAR: "lineal", SUPERLINEAR: "más que lineal"}.get(outcome, "intermedio"))


# --- the book's formatter ------------------------------------------------------------------------
TABLE_HEADER = ("Medición", "Valor", "Intervalo o criterio", "n", "Veredicto")


def _rows(items: Sequence[Claim] | dict[str, Claim]) -> list[tuple[str, ...]]:
    """The detail table's rows, one per claim (medición, valor, intervalo o criterio, n,
    veredicto)."""
    items = list(items.values()) if isinstance(items, dict) else list(items)
    if not items:
        raise ValueError("la tabla de decisiones necesita al menos una afirmación")
    rows = []
    for c in items:
        d = c.detail or {"what": c.text, "shown": es(c.value, 2), "interval": "", "n": "",
                         "verdict": c.outcome}
        what = d["what"][:1].upper() + d["what"][1:]
        rows.append(tuple(str(x).replace("\n", " ").strip() or "—"
                          for x in (what, d["shown"], d["interval"], d["n"], d["verdict"])))
    return rows


def table(items: Sequence[Claim] | dict[str, Claim]) -> str:
    """The decision detail of a section's verdicts as one quiet Markdown table (medición |
    valor | intervalo o criterio | n | veredicto); :func:`paste_table` glues it as HTML."""
    lines = ["| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in _rows(items)]
    return "\n".join(lines) + "\n"


def table_html(items: Sequence[Claim] | dict[str, Claim]) -> str:
    """:func:`table` as a quiet HTML table (class ``verdict-detail``, styled by the book's CSS)
    under the caption "Cómo se decidió"."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in TABLE_HEADER)
    body = "".join("<tr>" + "".join(f'<td data-label="{html.escape(h)}">{html.escape(c)}</td>'
                                    for h, c in zip(TABLE_HEADER, row)) + "</tr>"
                   for row in _rows(items))
    return (f'<div class="verdict-detail"><table><caption>Cómo se decidió</caption>'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>")


@dataclass(frozen=True)
class Pasted:
    """A glued value with two faces: ``html`` for the built book (``{glue}`` picks text/html)
    and ``text`` as its plain text, whose ``repr`` is what myst-nb stores as text/plain (so the
    page's glued verdicts can be compared with its contract's statements)."""

    text: str
    html: str

    def __repr__(self) -> str:
        return repr(self.text)

    def _repr_html_(self) -> str:
        return self.html


def _html_inline(markdown: str) -> str:
    """The book's inline Markdown (``**bold**`` and ```code```) as HTML, everything else
    escaped."""
    text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", html.escape(markdown, quote=False))
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)


def paste(value: Claim | str) -> Pasted:
    """A claim (:meth:`Claim.pasted`) or a sentence of the page's own, ready for ``glue``: the
    ``{glue}`` role pastes its HTML inline in the chapter's prose (a bare string would paste as
    code)."""
    if isinstance(value, Claim):
        return value.pasted()
    return Pasted(str(value), _html_inline(str(value)))


def paste_table(items: Sequence[Claim] | dict[str, Claim]) -> Pasted:
    """:func:`table` ready for ``glue`` (pasted in the chapter with the ``{glue}`` directive)."""
    return Pasted(table(items), table_html(items))


def contract_table(contract: dict) -> Pasted:
    """The detail table of every claim in a lab's contract, rebuilt from the contract's own
    inputs (so the table and the contract cannot disagree), ready for ``glue``."""
    return paste_table([rebuild(item["claim"]) for item in claims_of(contract)])


_PLURAL = re.compile(r"\w\((?:s|es)\)")
_CAPITAL_AFTER_COLON = re.compile(r":\s+(?:\*\*)?[A-ZÁÉÍÓÚÑ][a-záéíóúñ]")
_RAW_SUBSCRIPT = re.compile(r"\b[A-Za-z]+_[A-Za-z0-9]+\b")


def prose_problems(text: str) -> list[str]:
    """What keeps a sentence from reading as the book's prose: a "(s)" plural, literal
    backticks, a capitalised word after a colon, a raw subscript such as ``H_B``, unbalanced
    bold markers. Empty when it reads well."""
    problems = []
    if _PLURAL.search(text):
        problems.append(f"plural con paréntesis: {_PLURAL.search(text).group()!r}")
    if "`" in text:
        problems.append("comillas invertidas literales")
    if _CAPITAL_AFTER_COLON.search(text):
        problems.append(f"mayúscula tras dos puntos: {_CAPITAL_AFTER_COLON.search(text).group()!r}")
    if _RAW_SUBSCRIPT.search(text):
        problems.append(f"subíndice sin formato: {_RAW_SUBSCRIPT.search(text).group()!r}")
    if text.count("**") % 2:
        problems.append("negrita sin cerrar")
    return problems


_BUILDERS: dict[str, Callable[..., Claim]] = {
    "compare": lambda inputs: compare(inputs["a"], inputs["b"],
                                      **{k: v for k, v in inputs.items() if k not in ("a", "b")}),
    "threshold": lambda inputs: threshold(inputs["value"], inputs["limit"],
                                          **{k: v for k, v in inputs.items()
                                             if k not in ("value", "limit")}),
    "growth": lambda inputs: growth(inputs["n"], inputs["t"],
                                    **{k: v for k, v in inputs.items() if k not in ("n", "t")}),
}


def rebuild(claim: dict) -> Claim:
    """The claim an evidence item's ``claim`` field describes, computed again from its inputs."""
    kind = claim.get("kind")
    if kind not in _BUILDERS:
        raise ValueError(f"tipo de afirmación {kind!r} desconocido; aceptados: "
                         f"{', '.join(sorted(_BUILDERS))}")
    return _BUILDERS[kind](claim["inputs"])


def recheck(item: dict) -> list[str]:
    """Problems with one evidence item: its sentence, outcome or value differ from what its own
    inputs give. An item without ``claim`` has nothing to recheck."""
    if "claim" not in item:
        return []
    again = rebuild(item["claim"])
    problems = []
    if again.outcome != item["claim"]["outcome"]:
        problems.append(f"outcome {item['claim']['outcome']!r}, but its inputs give {again.outcome!r}")
    if again.text != item["statement"]:
        problems.append(f"statement {item['statement']!r}, but its inputs give {again.text!r}")
    if not (isinstance(item["value"], (int, float)) and math.isclose(item["value"], again.value,
                                                                      rel_tol=1e-9, abs_tol=1e-12)):
        problems.append(f"value {item['value']!r}, but its inputs give {again.value!r}")
    return problems


def recheck_contract(contract: dict) -> list[str]:
    """Every problem of every claim in a contract's evidence, prefixed with its index."""
    return [f"evidence[{i}]: {p}" for i, item in enumerate(contract.get("evidence", []))
            for p in recheck(item)]


def claims_of(contract: dict) -> list[dict]:
    """The evidence items of a contract that carry a claim."""
    return [item for item in contract.get("evidence", []) if "claim" in item]


def as_inputs(values: Any) -> list[float]:
    """Plain floats (from numpy or torch scalars) for a claim's inputs."""
    return [float(v) for v in values]
