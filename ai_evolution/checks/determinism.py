"""Self-checks of the determinism lab (chapter 10).

Failure messages carry the second tier of each exercise's hint ("Pista: ..."): which quantity is
off and why, in words, never the code line. Numbers are written with a decimal comma."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from ..fmt import es_sig, es_value
from ..reference.determinism import reference_compare_runs, reference_split_sum
from . import CheckResult, call_student, check_student_extension, failed, passed, self_check  # noqa: F401

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 5e-3}
CHALLENGE_N, CHALLENGE_SEED = 4096, 10
CHALLENGE_KEYS = ("n", "seed", "split_sizes", "results", "distinct_results", "exact_sum",
                  "worst_split", "worst_abs_error")


# --- exercise 1: a batch-invariant matmul ------------------------------------------------------------

def linear_cases(seed: int = 0) -> list[tuple[str, str, int, int, int, bool]]:
    """(label, dtype, rows M, K, N, with bias)."""
    cases = [("fp32, 9 filas", "fp32", 9, 256, 96, False),
             ("fp32 con sesgo, 17 filas", "fp32", 17, 128, 64, True),
             ("bf16, 32 filas", "bf16", 32, 256, 128, False),
             ("fp16, 12 filas", "fp16", 12, 192, 80, False)]
    g = torch.Generator().manual_seed(seed)
    for i in range(4):
        dtype = ("fp32", "bf16", "fp16", "fp32")[i]
        m = int(torch.randint(2, 34, (1,), generator=g))
        k = 32 * int(torch.randint(2, 9, (1,), generator=g))
        n = 16 * int(torch.randint(2, 9, (1,), generator=g))
        cases.append((f"aleatorio {i + 1} ({dtype}, {m} filas, K = {k}, N = {n})", dtype, m, k, n,
                      bool(i % 2)))
    return cases


def _linear_inputs(seed: int, index: int, dtype: str, m: int, k: int, n: int, bias: bool):
    g = torch.Generator().manual_seed(seed * 1000 + index)
    dt = DTYPES[dtype]
    x = torch.randn(m, k, generator=g).to(dt)
    w = (torch.randn(n, k, generator=g) / math.sqrt(k)).to(dt)
    b = torch.randn(n, generator=g).to(dt) if bias else None
    return x, w, b


def _subsets(m: int, seed: int) -> list[tuple[str, list[int]]]:
    """Row subsets of a batch of ``m``: prefixes of several sizes, each row alone, a reversed
    order: (label, row indices)."""
    g = torch.Generator().manual_seed(seed)
    out = [("la primera fila" if s == 1 else f"las {s} primeras filas", list(range(s)))
           for s in (1, 2, 3, 8, 9, 16, m - 1) if 0 < s < m]
    out += [(f"la fila {r} sola", [r]) for r in (m - 1, m // 2)]
    out.append(("las filas en orden inverso", list(range(m - 1, -1, -1))))
    out.append(("las filas en otro orden", torch.randperm(m, generator=g).tolist()))
    return out


@self_check
def check_invariant_linear(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(x [M, K], weight [N, K], bias [N] | None) -> [M, N]``: ``F.linear``'s result (within
    the dtype's rounding) whose rows are the same bits whatever the other rows: computed for a
    whole batch, for a part of it, for one row alone or in another order."""
    name = "matmul invariante al lote"
    cases = linear_cases(seed)
    for i, (label, dtype, m, k, n, with_bias) in enumerate(cases):
        x, w, b = _linear_inputs(seed, i, dtype, m, k, n, with_bias)
        shown = f"{label}: x [{m}, {k}], weight [{n}, {k}]" + (", con sesgo" if with_bias else "")
        got, crash = call_student(name, fn, x.clone(), w.clone(), None if b is None else b.clone())
        if crash:
            return failed(name, i, shown, crash)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (m, n) or got.dtype != x.dtype:
            what = (f"un tensor {tuple(got.shape)} {got.dtype}" if isinstance(got, torch.Tensor)
                    else es_value(got))
            return failed(name, i, shown, f"se esperaba un tensor [{m}, {n}] en {x.dtype} (el dtype "
                          f"de x) y se obtuvo {what}.")
        want = x.double() @ w.double().T + (0 if b is None else b.double())
        scale = float(want.abs().max()) or 1.0
        err = float((got.double() - want).abs().max())
        if not err <= TOLERANCE[dtype] * scale:
            return failed(name, i, shown, f"el resultado se aleja del producto x·Wᵀ"
                          f"{' + b' if with_bias else ''} calculado en float64: máx |dif| = "
                          f"{es_sig(err, 3)}, y el redondeo de {dtype} admite "
                          f"{es_sig(TOLERANCE[dtype] * scale, 3)}.",
                          "la función tiene que calcular lo mismo que F.linear (cada fila de x por "
                          "cada fila de weight, más el sesgo si lo hay); solo cambia cómo se reparten "
                          "las filas entre llamadas al kernel.")
        for part, rows in _subsets(m, seed + i):
            sub, crash = call_student(name, fn, x[rows].clone(), w.clone(),
                                      None if b is None else b.clone())
            if crash:
                return failed(name, i, f"{shown}; {part}", crash)
            expected = got[rows]
            if not isinstance(sub, torch.Tensor) or sub.shape != expected.shape:
                return failed(name, i, f"{shown}; {part}", f"se esperaba un tensor "
                              f"{list(expected.shape)} y se obtuvo {es_value(sub)}.")
            if torch.equal(sub, expected):
                continue
            bad = next(j for j in range(len(rows)) if not torch.equal(sub[j], expected[j]))
            diff = float((sub[bad].double() - expected[bad].double()).abs().max())
            return failed(name, i, f"{shown}; {part}",
                          f"la fila {rows[bad]} no da los mismos bits que en el lote de {m} filas: "
                          f"máx |dif| = {es_sig(diff, 3)} (se exige 0: torch.equal).",
                          "el resultado de una fila depende de cuántas filas llegan con ella: el "
                          "kernel elige otro camino (y con él otro orden de la suma) según la forma "
                          "que recibe. Cada fila tiene que pasar por el kernel con una forma que no "
                          "dependa del tamaño del lote ni de su lugar en él.")
    return passed(name, len(cases), "Cada fila da los mismos bits sola, en parte del lote y en "
                  "otro orden.")


# --- exercise 2: one request alone and in a batch ----------------------------------------------------

def _logits(g: torch.Generator, steps: int, vocab: int) -> torch.Tensor:
    return (4 * torch.randn(steps, vocab, generator=g)).to(torch.bfloat16).float()


def compare_cases(seed: int = 0) -> list[tuple[str, list[int], torch.Tensor, list[int], torch.Tensor]]:
    """(label, solo tokens, solo logits, batch tokens, batch logits)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    base = _logits(g, 8, 16)
    tokens = base.argmax(-1).tolist()
    out.append(("las dos ejecuciones iguales bit a bit", tokens, base, list(tokens), base.clone()))
    ulp = base.clone()
    ulp[2, 5] = torch.nextafter(ulp[2, 5], torch.tensor(float("inf")))
    out.append(("un solo bit distinto en el paso 2; los tokens no cambian", tokens, base,
                list(tokens), ulp))
    # logits differ from step 1; the tokens from step 4; after it, another prefix: other logits
    late = base.clone()
    late[1:] += 0.0625
    late[5:] = _logits(g, 3, 16)
    t2 = list(tokens)
    t2[4] = (t2[4] + 1) % 16
    t2[5:] = late[5:].argmax(-1).tolist()
    out.append(("logits distintos desde el paso 1, tokens desde el paso 4", tokens, base, t2, late))
    first = base.clone()
    first[0] += 0.5
    t3 = [(tokens[0] + 3) % 16] + _logits(g, 7, 16).argmax(-1).tolist()
    first[1:] = _logits(g, 7, 16)
    out.append(("el primer token ya es otro", tokens, base, t3, first))
    out.append(("la ejecución en el lote termina antes (un prefijo de la sola)", tokens, base,
                tokens[:5], base[:5].clone()))
    same_tok = base.clone()
    same_tok[6:] -= 1.0
    out.append(("logits distintos solo en los últimos pasos", tokens, base, list(tokens), same_tok))
    for i in range(6):
        steps, vocab = int(torch.randint(3, 12, (1,), generator=g)), int(torch.randint(4, 40, (1,), generator=g))
        a = _logits(g, steps, vocab)
        b = a.clone()
        split = int(torch.randint(0, steps, (1,), generator=g))
        b[split:] += torch.randint(0, 3, (steps - split, vocab), generator=g).float() * 0.03125
        ta, tb = a.argmax(-1).tolist(), b.argmax(-1).tolist()
        stop = next((j for j, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
        if stop is not None:  # after the tokens part, the batch run sees another prefix
            b[stop + 1:] = _logits(g, steps - stop - 1, vocab)
            tb = tb[:stop + 1] + b[stop + 1:].argmax(-1).tolist()
        out.append((f"aleatorio {i + 1} ({steps} pasos, vocabulario de {vocab})", ta, a, tb, b))
    return out


@self_check
def check_compare_runs(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(solo_tokens, solo_logits, batch_tokens, batch_logits) -> {"first_token_step",
    "first_logit_step", "max_abs_diff"}`` as ``reference_compare_runs``: the step where the tokens
    part, the first step (among the comparable ones) whose logits are not the same bits, and the
    largest difference over the comparable steps."""
    name = "comparar una petición sola y en un lote"
    for i, (label, ta, la, tb, lb) in enumerate(compare_cases(seed)):
        want = reference_compare_runs(ta, la, tb, lb)
        shown = f"{label}: {len(ta)} y {len(tb)} tokens"
        got, crash = call_student(name, fn, list(ta), la.clone(), list(tb), lb.clone())
        if crash:
            return failed(name, i, shown, crash)
        try:
            ft = None if got["first_token_step"] is None else int(got["first_token_step"])
            fl = None if got["first_logit_step"] is None else int(got["first_logit_step"])
            diff = float(got["max_abs_diff"])
        except (TypeError, KeyError, ValueError):
            return failed(name, i, shown, "se esperaba un dict con 'first_token_step', "
                          "'first_logit_step' (un paso o None) y 'max_abs_diff' (un número); se "
                          f"obtuvo {es_value(got)}.")
        if ft != want["first_token_step"]:
            hint = ("el primer paso distinto es el primer índice en que los dos tokens no "
                    "coinciden; si una ejecución es un prefijo de la otra, se separan donde "
                    "termina la más corta; si son iguales, None.")
            return failed(name, i, shown, f"first_token_step debería ser "
                          f"{want['first_token_step']} y es {ft}.", hint)
        if fl != want["first_logit_step"]:
            if fl is None or (want["first_logit_step"] is not None and fl > want["first_logit_step"]):
                hint = ("compare los logits bit a bit (torch.equal), no con una tolerancia: una "
                        "diferencia en el último bit es justo lo que se busca.")
            else:
                hint = ("solo se comparan los pasos en que las dos ejecuciones tienen el mismo "
                        "prefijo: hasta el paso en que cambia el token, incluido.")
            return failed(name, i, shown, f"first_logit_step debería ser "
                          f"{want['first_logit_step']} y es {fl}.", hint)
        if not math.isclose(diff, want["max_abs_diff"], rel_tol=1e-6, abs_tol=1e-12):
            if diff > want["max_abs_diff"]:
                hint = ("después del paso en que cambia el token las dos ejecuciones siguen "
                        "prefijos distintos: sus logits ya no son comparables y no cuentan.")
            else:
                hint = ("el paso en que cambia el token se calculó con el mismo prefijo en las dos "
                        "ejecuciones: sus logits sí cuentan.")
            return failed(name, i, shown, f"max_abs_diff debería ser "
                          f"{es_sig(want['max_abs_diff'], 6)} y es {es_sig(diff, 6)}.", hint)
    return passed(name, len(compare_cases(seed)))


# --- the challenge -----------------------------------------------------------------------------------

def challenge_values(n: int = CHALLENGE_N, seed: int = CHALLENGE_SEED) -> np.ndarray:
    """The challenge's vector: ``numpy.random.default_rng(seed).standard_normal(n)`` in float32."""
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


@self_check
def check_challenge(ext: dict, raise_on_fail: bool = True) -> CheckResult:
    """The challenge's ``student_extension``: the float32 split-K sums of the challenge's vector
    for every power-of-two split size, how many distinct results they give, the exact sum and the
    split farthest from it, as ``reference_split_sum`` gives them."""
    name = "reto: el mismo vector, otra división, otra suma"
    m = ext.get("measurement") if isinstance(ext, dict) else None
    if not isinstance(m, dict) or any(k not in m for k in CHALLENGE_KEYS):
        missing = [k for k in CHALLENGE_KEYS if not isinstance(m, dict) or k not in m]
        return failed(name, 0, "measurement", f"faltan las claves {', '.join(missing)}.")
    try:
        n, seed = int(m["n"]), int(m["seed"])
        splits = [int(s) for s in m["split_sizes"]]
        results = [float(r) for r in m["results"]]
    except (TypeError, ValueError):
        return failed(name, 0, "measurement", "n y seed deben ser enteros, split_sizes una lista "
                      "de enteros y results una lista de números.")
    want_splits = [2 ** j for j in range(CHALLENGE_N.bit_length())]
    if (n, seed) != (CHALLENGE_N, CHALLENGE_SEED) or sorted(splits) != want_splits:
        return failed(name, 1, "n, seed, split_sizes", f"el reto pide n = {CHALLENGE_N}, seed = "
                      f"{CHALLENGE_SEED} y las divisiones {want_splits}; measurement dice n = {n}, "
                      f"seed = {seed}, divisiones {splits}.")
    if len(results) != len(splits):
        return failed(name, 2, "results", f"results debe tener un número por división "
                      f"({len(splits)}); tiene {len(results)}.")
    values = challenge_values(n, seed)
    want = {s: reference_split_sum(values, s) for s in splits}
    for j, (s, r) in enumerate(zip(splits, results)):
        if r != want[s]:
            return failed(name, 3, f"results, división {s}", f"la suma en float32 con bloques de "
                          f"{s} da {es_sig(want[s], 9)} y measurement dice {es_sig(r, 9)}.",
                          "cada bloque se suma de izquierda a derecha en float32 y las sumas de los "
                          "bloques se acumulan también en float32, en orden: cada suma intermedia "
                          "se redondea a float32.")
    exact = math.fsum(float(v) for v in values)
    errors = {s: abs(want[s] - exact) for s in sorted(splits)}
    worst = max(errors, key=lambda s: (errors[s], -s))
    checks = (("distinct_results", len(set(want.values())), lambda a, b: int(a) == b),
              ("exact_sum", exact, lambda a, b: math.isclose(float(a), b, rel_tol=1e-12)),
              ("worst_split", worst, lambda a, b: int(a) == b),
              ("worst_abs_error", errors[worst],
               lambda a, b: math.isclose(float(a), b, rel_tol=1e-6, abs_tol=1e-12)))
    for j, (key, value, same) in enumerate(checks):
        try:
            ok = same(m[key], value)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            return failed(name, 4 + j, key, f"debería ser {es_value(value)} y measurement dice "
                          f"{es_value(m[key])}.")
    return passed(name, 4 + len(checks))
