"""Self-checks of the speculative decoding lab (chapter 9).

Failure messages carry the second tier of each exercise's hint ("Pista: ..."): which quantity is
off and why, in words, never the code line. Numbers are written with a decimal comma."""

from __future__ import annotations

import math
from typing import Callable

import torch

from ..fmt import es, es_sig, es_value
from ..reference.speculative import reference_acceptance_and_residual, reference_speedup_table
from ..sim.cost_model import best_k, predict_speculation_h100
from ..speculative import greedy_accept
from . import CheckResult, call_student, check_student_extension, failed, passed, self_check  # noqa: F401

CHALLENGE_KEYS = ("alpha", "k", "context_len", "break_even_batch", "speedup_batch1",
                  "speedup_before", "speedup_at_break_even")


# --- exercise 1: greedy acceptance -----------------------------------------------------------------

def greedy_cases(seed: int = 0) -> list[tuple[str, list[int], list[int]]]:
    """(label, draft tokens, target argmax at the k + 1 verified places)."""
    cases = [
        ("los k = 3 aceptados: el siguiente es el bonus", [5, 9, 2], [5, 9, 2, 7]),
        ("ninguno aceptado", [4, 4, 4], [1, 4, 4, 4]),
        ("desacuerdo en la segunda propuesta", [3, 8, 1, 6], [3, 2, 1, 6, 0]),
        ("k = 1, aceptado", [11], [11, 12]),
        ("k = 1, rechazado", [11], [10, 11]),
        ("el bonus repite el último token", [7, 7], [7, 7, 7]),
        ("tras el desacuerdo vuelven a coincidir", [1, 2, 3, 4, 5], [1, 2, 9, 4, 5, 6]),
    ]
    g = torch.Generator().manual_seed(seed)
    for i in range(12):
        k = int(torch.randint(1, 8, (1,), generator=g))
        target = torch.randint(0, 4, (k + 1,), generator=g).tolist()
        flip = torch.rand(k, generator=g) < 0.3
        draft = [(t + 1) % 4 if f else t for t, f in zip(target[:k], flip.tolist())]
        cases.append((f"aleatorio {i + 1} (k = {k})", draft, target))
    return cases


@self_check
def check_greedy_accept(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(draft_tokens, target_argmax) -> (num_accepted, next_token)``, as
    ``speculative.greedy_accept``; the off-by-one errors are named."""
    name = "aceptación voraz"
    cases = greedy_cases(seed)
    for i, (label, draft, target) in enumerate(cases):
        want_n, want_next = greedy_accept(draft, target)
        shown = f"{label}: borrador {draft}, argmax del objetivo {target}"
        got, crash = call_student(name, fn, list(draft), list(target))
        if crash:
            return failed(name, i, shown, crash)
        try:
            n, nxt = (int(x) for x in got)
        except (TypeError, ValueError):
            return failed(name, i, shown, f"se esperaba una tupla (aceptados, siguiente) y se "
                          f"obtuvo {es_value(got)}.")
        if n == want_n and nxt == want_next:
            continue
        problem = (f"se esperaba ({want_n}, {want_next}) y su función devolvió ({n}, {nxt}).")
        if n == want_n + 1:
            hint = ("cuenta como aceptada la primera propuesta que no coincide: el prefijo "
                    "aceptado termina justo antes del primer desacuerdo.")
        elif n != want_n:
            hint = ("el número aceptado es la longitud del prefijo más largo en el que cada "
                    "propuesta coincide con el argmax del objetivo en su misma posición.")
        elif want_n < len(target) - 1 and nxt == target[min(want_n + 1, len(target) - 1)] != want_next:
            hint = ("error por uno en el token siguiente: toma el del objetivo una posición más "
                    "allá. La predicción del objetivo en la posición del primer desacuerdo (la que "
                    "tiene como índice el número aceptado) es la corrección.")
        elif want_n == len(draft) and nxt == target[want_n - 1]:
            hint = ("error por uno en el bonus: con las k propuestas aceptadas, el token siguiente "
                    "es la última predicción del objetivo (la que sigue a la última propuesta, "
                    "índice k), no la que confirmó la última propuesta.")
        else:
            hint = ("el token siguiente es siempre del objetivo: su predicción en la posición que "
                    "sigue al prefijo aceptado.")
        return failed(name, i, shown, problem, hint)
    return passed(name, len(cases))


# --- exercise 2: the expected speedup and the best k -------------------------------------------------

def speedup_cases(seed: int = 0) -> list[tuple[str, float, float, int]]:
    """(label, alpha, cost ratio, k_max)."""
    cases = [("α = 0: solo el token del objetivo", 0.0, 0.2, 4),
             ("α = 1: todas aceptadas", 1.0, 0.1, 5),
             ("α casi 1", 0.999999, 0.05, 6),
             ("borrador gratis (c = 0)", 0.6, 0.0, 8),
             ("el α y el c de este portátil (no paga)", 0.28, 0.31, 4),
             ("α alto y borrador barato", 0.8, 0.05, 12)]
    g = torch.Generator().manual_seed(seed)
    for i in range(6):
        alpha = round(float(torch.rand(1, generator=g)) * 0.95, 3)
        c = round(float(torch.rand(1, generator=g)) * 0.4, 3)
        cases.append((f"aleatorio {i + 1}", alpha, c, int(torch.randint(1, 10, (1,), generator=g))))
    return cases


def _speedup_hint(alpha: float, c: float, k_max: int, got: list[float], want: list[float]) -> str:
    def near(values):
        return len(values) == len(got) and all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
                                               for a, b in zip(got, values))
    ks = range(1, k_max + 1)
    tokens = [sum(alpha**i for i in range(k + 1)) for k in ks]
    if near([sum(alpha**i for i in range(k)) / (1 + k * c) for k in ks]):
        return ("le falta el token del propio objetivo: cada paso da, además de las propuestas "
                "aceptadas, la predicción del objetivo que sigue a ellas (con α = 0 se obtiene 1 "
                "token por paso, no 0).")
    if near(tokens):
        return ("no divide por el coste del paso: un paso especulativo cuesta la verificación más "
                "k pasos del borrador, cada uno una fracción c de uno del objetivo.")
    if near([t / (1 + c) for t in tokens]):
        return "el borrador da k pasos, no uno: su coste crece con k."
    if any(isinstance(x, float) and math.isnan(x) for x in got):
        return ("con α = 1 la forma cerrada divide entre cero: los tokens esperados son la suma "
                "de las potencias de α, que con α = 1 vale k + 1.")
    return ("los tokens esperados por paso son 1 + α + α² + … + α^k, y la aceleración los divide "
            "entre el coste del paso en pasos del objetivo, 1 + k·c.")


@self_check
def check_speedup_table(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(alpha, cost_ratio, k_max) -> {"speedup": [...], "best_k": k}`` as
    ``reference_speedup_table``; the usual slips (no target token, no draft cost, best k by
    tokens) are named."""
    name = "aceleración esperada y mejor k"
    cases = speedup_cases(seed)
    for i, (label, alpha, c, k_max) in enumerate(cases):
        want = reference_speedup_table(alpha, c, k_max)
        shown = f"{label}: α = {es_sig(alpha, 6)}, c = {es_sig(c, 3)}, k_max = {k_max}"
        got, crash = call_student(name, fn, alpha, c, k_max)
        if crash:
            return failed(name, i, shown, crash)
        try:
            speedup = [float(x) for x in got["speedup"]]
            k = int(got["best_k"])
        except (TypeError, KeyError, ValueError, IndexError):
            return failed(name, i, shown, f"se esperaba un dict con 'speedup' (una lista de "
                          f"{k_max} números, k = 1..{k_max}) y 'best_k'; se obtuvo {es_value(got)}.")
        if len(speedup) != k_max or not all(
                math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) for a, b in zip(speedup, want["speedup"])):
            return failed(name, i, shown, f"speedup debería ser {es_value(want['speedup'])} y es "
                          f"{es_value(speedup)}.", _speedup_hint(alpha, c, k_max, speedup,
                                                                   want["speedup"]))
        if k != want["best_k"]:
            hint = ("el mejor k es el de mayor aceleración, no el de más tokens por paso: cada "
                    "propuesta más cuesta un paso del borrador.")
            if math.isclose(want["speedup"][k - 1], max(want["speedup"]), rel_tol=1e-12):
                hint = "en un empate gana el k más pequeño: da lo mismo con menos trabajo."
            return failed(name, i, shown, f"best_k debería ser {want['best_k']} y es {k}.", hint)
    return passed(name, len(cases))


# --- exercise 3: the rejection-sampling step ---------------------------------------------------------

def distribution_cases(seed: int = 0) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    t = lambda *x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    cases = [
        ("dos tokens", t(0.7, 0.3), t(0.4, 0.6)),
        ("p y q iguales: nunca se rechaza", t(0.2, 0.5, 0.3), t(0.2, 0.5, 0.3)),
        ("el borrador nunca propone el token 2", t(0.3, 0.3, 0.4), t(0.5, 0.5, 0.0)),
        ("el objetivo nunca elige el token 0", t(0.0, 0.6, 0.4), t(0.5, 0.25, 0.25)),
        ("objetivo determinista (p one-hot)", t(0.0, 1.0, 0.0, 0.0), t(0.25, 0.25, 0.25, 0.25)),
        ("borrador determinista (q one-hot)", t(0.1, 0.2, 0.3, 0.4), t(0.0, 0.0, 1.0, 0.0)),
    ]
    g = torch.Generator().manual_seed(seed)
    for i in range(8):
        v = int(torch.randint(2, 7, (1,), generator=g))
        p = torch.softmax(2 * torch.randn(v, generator=g, dtype=torch.float64), -1)
        q = torch.softmax(2 * torch.randn(v, generator=g, dtype=torch.float64), -1)
        cases.append((f"aleatorio {i + 1} (vocabulario de {v})", p, q))
    return cases


def _fmt(x: torch.Tensor) -> str:
    return "[" + "; ".join(es(float(v), 4) for v in x) + "]"


@self_check
def check_acceptance_and_residual(fn: Callable, seed: int = 0,
                                  raise_on_fail: bool = True) -> CheckResult:
    """``fn(p, q) -> (accept, residual)`` on small vocabularies: ``accept`` equals
    ``min(1, p/q)`` wherever the draft can propose, ``residual`` equals ``norm(max(0, p - q))``
    wherever a rejection can happen, and the exact distribution of the emitted token,
    ``q * accept + (1 - sum(q * accept)) * residual``, is ``p``."""
    name = "paso de muestreo por rechazo"
    cases = distribution_cases(seed)
    for i, (label, p, q) in enumerate(cases):
        shown = f"{label}: p = {_fmt(p)}, q = {_fmt(q)}"
        got, crash = call_student(name, fn, p.clone(), q.clone())
        if crash:
            return failed(name, i, shown, crash)
        try:
            accept, residual = (torch.as_tensor(x, dtype=torch.float64) for x in got)
        except (TypeError, ValueError, RuntimeError):
            return failed(name, i, shown, f"se esperaba una tupla (accept, residual) de dos "
                          f"tensores y se obtuvo {es_value(got)}.")
        if accept.shape != p.shape or residual.shape != p.shape:
            return failed(name, i, shown, f"accept y residual deben tener la forma de p "
                          f"({tuple(p.shape)}); tienen {tuple(accept.shape)} y {tuple(residual.shape)}.")
        want_a, want_r = reference_acceptance_and_residual(p, q)
        proposed = q > 0
        if not torch.allclose(accept[proposed], want_a[proposed], atol=1e-9):
            return failed(name, i, shown, f"accept debería ser {_fmt(want_a)} donde q > 0 y es "
                          f"{_fmt(accept)}.", "la probabilidad de quedarse con un token propuesto "
                          "es el cociente entre lo que le da el objetivo y lo que le da el "
                          "borrador, sin pasar de 1: si el objetivo lo quiere más que el borrador, "
                          "se acepta siempre.")
        kept = q * torch.where(proposed, accept, torch.zeros_like(accept))
        rejected = float(1 - kept.sum())
        if rejected > 1e-12 and not torch.allclose(residual, want_r, atol=1e-9):
            return failed(name, i, shown, f"residual debería ser {_fmt(want_r)} y es "
                          f"{_fmt(residual)}.", "tras un rechazo hay que dar a cada token la "
                          "probabilidad que le falta: lo que el objetivo le da por encima de lo "
                          "que ya le dio el borrador (nunca negativo), normalizado para que sume 1.")
        emitted = kept + rejected * residual
        if not torch.allclose(emitted, p, atol=1e-9):
            return failed(name, i, shown, f"la distribución exacta del token emitido es "
                          f"{_fmt(emitted)} y debería ser p.", "sume la probabilidad de "
                          "proponer y aceptar cada token y la de rechazar y remuestrearlo.")
    return passed(name, len(cases), "La distribución exacta del token emitido es p en todos.")


# --- the challenge -----------------------------------------------------------------------------------

@self_check
def check_challenge(ext: dict, raise_on_fail: bool = True) -> CheckResult:
    """The challenge's ``student_extension``: the first batch size (from 1 up) at which the
    simulated H100 speedup of Llama 3.1 8B + Llama 3.2 1B drops below 1, and the speedups around
    it, as ``sim.cost_model.predict_speculation_h100`` gives them."""
    name = "reto: el lote en el que la especulación deja de pagar"
    m = ext.get("measurement") if isinstance(ext, dict) else None
    if not isinstance(m, dict) or any(k not in m for k in CHALLENGE_KEYS):
        missing = [k for k in CHALLENGE_KEYS if not isinstance(m, dict) or k not in m]
        return failed(name, 0, "measurement", f"faltan las claves {', '.join(missing)}.")
    try:
        alpha, k, ctx = float(m["alpha"]), int(m["k"]), int(m["context_len"])
        b = int(m["break_even_batch"])
    except (TypeError, ValueError):
        return failed(name, 0, "measurement", "alpha, k, context_len y break_even_batch deben "
                      "ser números.")
    if not (0 < alpha < 1 and 1 <= k <= 16 and ctx >= 64 and 2 <= b <= 4096):
        return failed(name, 1, "alpha, k, context_len, break_even_batch", f"el reto pide "
                      f"0 < α < 1, 1 ≤ k ≤ 16, un contexto de al menos 64 tokens y un lote entre 2 "
                      f"y 4096; measurement dice α = {es_value(m['alpha'])}, k = {k}, contexto "
                      f"{ctx}, lote {b}.")
    steps = predict_speculation_h100(alpha, k, list(range(1, b + 1)), ctx)
    below = [s.batch_size for s in steps if s.speedup < 1]
    if not below or below[0] != b:
        return failed(name, 2, "break_even_batch", f"con α = {es(alpha, 3)}, k = {k} y {ctx} "
                      f"tokens de contexto, el simulador da una aceleración de "
                      f"{es_sig(steps[-1].speedup, 5)} en el lote {b}"
                      + (f" y ya baja de 1 en el lote {below[0]}." if below and below[0] < b else
                         ", que no es menor que 1."),
                      "Calcule la aceleración en cada lote desde 1 y quédese con el primero en que "
                      "baja de 1; no basta con las potencias de dos.")
    want = {"speedup_batch1": steps[0].speedup, "speedup_before": steps[b - 2].speedup,
            "speedup_at_break_even": steps[b - 1].speedup}
    for j, (key, value) in enumerate(want.items()):
        try:
            ok = math.isclose(float(m[key]), value, rel_tol=1e-6)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            return failed(name, 3 + j, key, f"el simulador da {es_sig(value, 7)} y measurement "
                          f"dice {es_value(m[key])}.")
    return passed(name, 3 + len(want))
