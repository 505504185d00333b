"""Conclusions computed from the numbers beside them.

A page may state a conclusion about the reader's machine ("X is faster than Y", "the simulator is
accurate", "growth is linear") only through a :class:`Claim` built here from the measured
numbers. The claim picks the branch that the numbers support, including *inconclusive* when the
interval of a comparison contains no difference, and renders the Spanish sentence. The same
object is glued into the page and stored in the contract's ``evidence`` (with the inputs it was
computed from), so :func:`recheck` can rebuild every sentence from its own numbers: a page and its
contract cannot disagree, and a test can prove that no statement contradicts its inputs.

Three kinds, one line each at the call site::

    c = claims.compare(paged_tok_s, contiguous_tok_s, what="bloques / contiguo (tokens/s)",
                       higher="los bloques rinden más", lower="los bloques rinden menos")
    c = claims.threshold(worst_error, 0.15, what="error máximo del simulador",
                         passed="el simulador queda validado aquí", failed="no queda validado")
    c = claims.growth(ns, seconds, what="tiempo total sin caché")
    glue("key", c.text); evidence.append(c.evidence("x"))
"""

from __future__ import annotations

import math
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


def interval_text(low: float, high: float, decimals: int = 2) -> str:
    """``[1,2; 3,4]``: a semicolon keeps the decimal commas apart."""
    return f"[{es(low, decimals)}; {es(high, decimals)}]"


# --- intervals ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Estimate:
    """A median with a bootstrap percentile interval over ``n`` samples (n=1: a point)."""

    median: float
    low: float
    high: float
    n: int

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high


def _samples(values: Sequence[float], name: str) -> np.ndarray:
    arr = np.asarray(list(values), dtype=np.float64).ravel()
    if arr.size == 0:
        raise ValueError(f"{name}: no hay muestras; se necesita al menos una")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: cada muestra debe ser un número finito; se recibió {arr.tolist()}")
    return arr


def estimate(values: Sequence[float], level: float = LEVEL, n_boot: int = N_BOOT,
             seed: int = 0) -> Estimate:
    """Median of ``values`` and the bootstrap percentile interval of that median."""
    x = _samples(values, "values")
    med = float(np.median(x))
    if x.size == 1:
        return Estimate(med, med, med, 1)
    rng = np.random.default_rng(seed)
    boot = np.median(x[rng.integers(0, x.size, size=(n_boot, x.size))], axis=1)
    tail = 100 * (1 - level) / 2
    return Estimate(med, float(np.percentile(boot, tail)), float(np.percentile(boot, 100 - tail)),
                    int(x.size))


def ratio_estimate(a: Sequence[float], b: Sequence[float], paired: bool = True,
                   level: float = LEVEL, n_boot: int = N_BOOT, seed: int = 0,
                   q: float = 50.0) -> Estimate:
    """median(a) / median(b) with a bootstrap interval (``q``: another percentile instead of
    the median, e.g. 99 for a tail). ``paired``: ``a[i]`` and ``b[i]`` were measured side by side
    (interleaved), so pairs are resampled together and drift that hits both cancels."""
    xa, xb = _samples(a, "a"), _samples(b, "b")
    if np.any(xb <= 0) or np.any(xa < 0):
        raise ValueError("ratio_estimate necesita muestras a >= 0 y b > 0 (b es el denominador)")
    if paired and xa.size != xb.size:
        raise ValueError(f"las muestras emparejadas deben tener la misma longitud; se recibieron "
                         f"{xa.size} y {xb.size}")
    if not 0 <= q <= 100:
        raise ValueError(f"q debe ser un percentil en [0, 100]; se recibió {q}")

    def stat(x: np.ndarray, axis=None):
        return np.percentile(x, q, axis=axis)

    ratio = float(stat(xa) / stat(xb))
    n = min(xa.size, xb.size)
    if xa.size == 1 and xb.size == 1:
        return Estimate(ratio, ratio, ratio, 1)
    rng = np.random.default_rng(seed)
    if paired:
        idx = rng.integers(0, xa.size, size=(n_boot, xa.size))
        boot = stat(xa[idx], axis=1) / stat(xb[idx], axis=1)
    else:
        boot = (stat(xa[rng.integers(0, xa.size, size=(n_boot, xa.size))], axis=1)
                / stat(xb[rng.integers(0, xb.size, size=(n_boot, xb.size))], axis=1))
    tail = 100 * (1 - level) / 2
    return Estimate(ratio, float(np.percentile(boot, tail)), float(np.percentile(boot, 100 - tail)), n)


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
    """A conclusion with the branch the numbers support, its sentence and its inputs."""

    kind: str
    outcome: str
    text: str
    value: float
    inputs: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return self.text

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


def compare(a: Sequence[float], b: Sequence[float], *, what: str, higher: str, lower: str,
            inconclusive: str = "", paired: bool = True, level: float = LEVEL, seed: int = 0,
            decimals: int = 2, q: float = 50.0) -> Claim:
    """Is median(a) / median(b) above or below 1, given the bootstrap interval of the ratio?
    (``q``: compare another percentile, e.g. 99 for the tail; say so in ``what``.)

    ``what`` names the ratio (e.g. "tokens/s de los bloques / contiguo"); ``higher`` and ``lower``
    are the conclusions when the whole interval lies above / below 1; otherwise the claim is
    inconclusive (one sample per side always is: one measurement cannot tell a difference from
    noise).
    """
    a, b = [float(x) for x in a], [float(x) for x in b]
    est = ratio_estimate(a, b, paired=paired, level=level, seed=seed, q=q)
    if est.n >= 2 and est.low > 1:
        outcome, phrase = HIGHER, higher
    elif est.n >= 2 and est.high < 1:
        outcome, phrase = LOWER, lower
    else:
        outcome = INCONCLUSIVE
        phrase = inconclusive or (
            "con una sola medición no se puede separar la diferencia del ruido" if est.n < 2 else
            "el intervalo contiene el 1: con este ruido la diferencia no es concluyente")
    how = (f"{est.n} pares intercalados" if paired else f"{len(a)} y {len(b)} mediciones")
    numbers = (f"{what}: {es(est.median, decimals)} veces" if est.n < 2 else
               f"{what}: {es(est.median, decimals)} veces (intervalo del {es(100 * level, 0)} %: "
               f"{interval_text(est.low, est.high, decimals)}, {how})")
    inputs = {"a": a, "b": b, "what": what, "higher": higher, "lower": lower,
              "inconclusive": inconclusive, "paired": paired, "level": level, "seed": seed,
              "decimals": decimals, "q": q}
    return Claim("compare", outcome, _sentence(numbers, phrase), est.median, inputs)


def threshold(value: float, limit: float, *, what: str, passed: str, failed: str,
              below: bool = True, scale: float = 100.0, unit: str = "%", decimals: int = 1,
              interval: Sequence[float] | None = None, inconclusive: str = "") -> Claim:
    """Does ``value`` meet the criterion (``value <= limit`` when ``below``, else ``>=``)?

    With an ``interval`` (low, high) that straddles the limit the claim is inconclusive. Numbers
    are printed as ``value * scale`` with ``unit`` (default: a fraction as a percentage).
    """
    value, limit = float(value), float(limit)
    if not (math.isfinite(value) and math.isfinite(limit)):
        raise ValueError(f"threshold necesita números finitos; se recibieron {value} y {limit}")
    ok = value <= limit if below else value >= limit
    outcome = PASSED if ok else FAILED
    if interval is not None:
        low, high = (float(x) for x in interval)
        if low <= limit <= high and low != high:
            outcome = INCONCLUSIVE
    phrase = {PASSED: passed, FAILED: failed}.get(outcome) or inconclusive or (
        "su intervalo contiene el criterio: con este ruido no es concluyente")
    sign = "≤" if below else "≥"
    number = f"{es(value * scale, decimals)} {unit}".rstrip().replace(" %", "\u00a0%")
    crit = f"{sign} {es(limit * scale, decimals)} {unit}".rstrip().replace(" %", "\u00a0%")
    shown = f"{what}: {number} (criterio: {crit}"
    if interval is not None:
        shown += f"; intervalo {interval_text(low * scale, high * scale, decimals)}"
    shown += ")"
    inputs = {"value": value, "limit": limit, "what": what, "passed": passed, "failed": failed,
              "below": below, "scale": scale, "unit": unit, "decimals": decimals,
              "interval": None if interval is None else [low, high], "inconclusive": inconclusive}
    return Claim("threshold", outcome, _sentence(shown, phrase), value, inputs)


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
    numbers = (f"{what}: exponente de crecimiento {es(e, 2)} en n = {es(max(n), 0)} "
               f"(1 lineal, 2 cuadrático); el término cuadrático explica el "
               f"{es(100 * fit['quadratic_share'], 0)}\u00a0% {fitted}")
    inputs = {"n": n, "t": t, "what": what, "linear_below": linear_below,
              "superlinear_above": superlinear_above, "linear": linear,
              "superlinear": superlinear, "between": between}
    if fitted != "del tiempo ajustado":   # older contracts rebuild without the key
        inputs["fitted"] = fitted
    return Claim("growth", outcome, _sentence(numbers, phrase), e, inputs)


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
