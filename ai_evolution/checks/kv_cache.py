"""Self-checks of the KV-cache lab (chapter 2).

Failure messages carry the second tier of each exercise's hint ("Pista: ..."): which quantity is
off and why, in words, never the code line (the first tier is the notebook's NotImplementedError).
Numbers are written with a decimal comma (``ai_evolution.fmt``)."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from ..fmt import es, es_sig, es_value
from ..model import ModelConfig, get_preset, kv_bytes_per_token, weight_bytes
from ..reference.kv_cache import reference_sequences_that_fit
from . import CheckResult, call_student, check_student_extension, failed, passed, self_check  # noqa: F401
from ._attention import attention_step_result

DTYPES = ("fp32", "fp16", "bf16", "int8")


def _random_configs(seed: int, n: int) -> list[ModelConfig]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        kv = int(rng.choice([1, 2, 4, 8]))
        heads = kv * int(rng.choice([1, 2, 4, 8]))
        head_dim = int(rng.choice([32, 64, 128]))
        out.append(ModelConfig(
            name=f"aleatoria-{i}", num_layers=int(rng.integers(1, 81)), hidden_size=heads * head_dim,
            num_heads=heads, num_kv_heads=kv, intermediate_size=4 * heads * head_dim,
            vocab_size=int(rng.integers(1000, 200_000)),
        ))
    return out


def _config_label(c: ModelConfig) -> str:
    return (f"{c.name}: {c.num_layers} capas, {c.num_heads} cabezas de consulta, "
            f"{c.num_kv_heads} cabezas KV, head_dim {c.head_dim}")


def kv_bytes_cases(seed: int = 0) -> list[tuple[ModelConfig, str]]:
    presets = [get_preset(n) for n in ("llama-2-7b", "llama-3.1-8b", "qwen3-0.6b", "smollm2-135m")]
    return [(c, d) for c in presets for d in ("fp16", "bf16")] + \
        [(c, d) for c, d in zip(_random_configs(seed, 8), DTYPES * 2)]


@self_check
def check_kv_bytes_per_token(fn: Callable[[ModelConfig, str], float], seed: int = 0,
                             raise_on_fail: bool = True) -> CheckResult:
    """``fn(config, dtype) -> bytes`` must equal 2 x layers x kv_heads x head_dim x bytes(dtype)."""
    return kv_bytes_result("bytes de caché KV por token", fn, kv_bytes_cases(seed))


def kv_bytes_result(name: str, fn: Callable, cases: list[tuple[ModelConfig, str]]) -> CheckResult:
    """``fn(config, dtype)`` against ``kv_bytes_per_token`` on each ``(config, dtype)`` of
    ``cases``, stopping at the first difference (the public check's cases, or the autograder's)."""
    for i, (config, dtype) in enumerate(cases):
        expected = kv_bytes_per_token(config, dtype)
        got, crash = call_student(name, fn, config, dtype)
        label = f"{_config_label(config)}; dtype {dtype}"
        if crash:
            return failed(name, i, label, crash)
        if not isinstance(got, (int, float, np.number)) or isinstance(got, bool):
            return failed(name, i, label, f"devolvió {es_value(got)} "
                          f"({type(got).__name__}); se espera un número de bytes.")
        if not math.isclose(float(got), expected, rel_tol=1e-9):
            return failed(name, i, label, f"se esperaban {es(expected, 0)} bytes y su "
                          f"función devolvió {es_sig(float(got), 9)}.",
                          _kv_hint(config, float(got), expected))
    return passed(name, len(cases))


def _kv_hint(config: ModelConfig, got: float, expected: float) -> str:
    ratio = got / expected if expected else float("nan")
    if math.isclose(ratio, 0.5):
        return ("Sus bytes son la mitad de los esperados: la caché guarda dos tensores por token "
                "y capa, las claves y los valores (K y V).")
    if math.isclose(ratio, 2):
        return "Sus bytes son el doble de los esperados: ¿contó K y V dos veces?"
    if config.q_per_kv > 1 and math.isclose(ratio, config.q_per_kv):
        return ("Con atención de consultas agrupadas (GQA) la caché guarda solo las cabezas KV "
                "(num_kv_heads), no las de consulta.")
    if math.isclose(ratio, 8):
        return "Sus bytes son 8 veces los esperados: el resultado parece estar en bits."
    if math.isclose(ratio, 1 / config.num_layers):
        return "Cada capa tiene su propia caché: cuente todas las capas."
    return ("Revise cada factor: ¿cuenta K y V, todas las capas, solo las cabezas KV, head_dim "
            "elementos por cabeza y los bytes de cada elemento en ese dtype?")


# --- (b) the attention step with a cache -------------------------------------------------------

def _attention_cases(seed: int):
    g = torch.Generator().manual_seed(seed)
    # (batch, query heads, kv heads, new tokens, cache length, head_dim, start positions)
    shapes = [(1, 4, 4, 1, 16, 8, [5]), (2, 4, 2, 1, 16, 8, [3, 9]), (2, 8, 2, 6, 32, 16, [0, 0]),
              (3, 4, 1, 3, 24, 8, [0, 7, 12]), (2, 6, 3, 5, 20, 4, [2, 10])]
    for b, h, hkv, t, s, d, starts in shapes:
        positions = torch.tensor([[p + j for j in range(t)] for p in starts])
        q = torch.randn(b, h, t, d, generator=g)
        k_new = torch.randn(b, hkv, t, d, generator=g)
        v_new = torch.randn(b, hkv, t, d, generator=g)
        k_cache = torch.randn(b, hkv, s, d, generator=g)
        v_cache = torch.randn(b, hkv, s, d, generator=g)
        label = (f"batch {b}, {h} cabezas de consulta, {hkv} KV, {t} tokens nuevos en las "
                 f"posiciones {positions.tolist()}, caché de {s}")
        yield label, q, k_new, v_new, k_cache, v_cache, positions


@self_check
def check_cached_attention(fn: Callable, seed: int = 0, model=None, prompts=None,
                           max_new_tokens: int = 12, raise_on_fail: bool = True) -> CheckResult:
    """The student's attention step, alone on random tensors and then inside the real model."""
    return attention_step_result(
        "atención con caché KV", fn, list(_attention_cases(seed)), model=model, prompts=prompts,
        seed=seed, max_new_tokens=max_new_tokens,
        write_hint="Escriba las claves y los valores nuevos en la caché, cada uno en la posición "
                   "de su token, sin tocar el resto.",
        output_hint="Cada consulta atiende a las claves de su propia fila hasta su posición, "
                    "incluida, y a ninguna posterior; las puntuaciones se escalan por la inversa "
                    "de la raíz de head_dim, y cada cabeza KV sirve a un grupo de cabezas de "
                    "consulta consecutivas.")


# --- (c) fitting growth ------------------------------------------------------------------------

FIT_KEYS = ("c0", "c1", "c2", "quadratic_share", "exponent")

NEGATIVE_HINT = ("Un coeficiente negativo no tiene sentido físico: un tiempo no baja al añadir "
                 "tokens. Si el ajuste libre da alguno, quite ese término y ajuste de nuevo los "
                 "demás; entre todos los ajustes sin coeficientes negativos, quédese con el de "
                 "menor error cuadrático.")
BEST_FIT_HINT = ("El ajuste pedido es el de menor error cuadrático entre los que no tienen "
                 "coeficientes negativos: compare el error de todos los ajustes posibles sin "
                 "coeficientes negativos (con los tres términos, con dos, con uno), no se quede "
                 "con el primero que lo cumpla.")
SHARE_HINT = ("quadratic_share es la fracción del tiempo ajustado que aporta el término en n², "
              "leída en el n más grande, que no tiene por qué ser el último de la lista.")
EXPONENT_HINT = ("El exponente es la pendiente del tiempo ajustado en escala logarítmica, "
                 "d ln t / d ln n, en el n más grande: 1 si el tiempo es proporcional a n, 2 si es "
                 "proporcional a n².")


def fit_cases(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray, str]]:
    """Total times against tokens: some with a feasible free fit, and two whose free
    least-squares fit has a negative coefficient (a curve that bends down, a negative offset)."""
    rng = np.random.default_rng(seed)
    cases = []
    for c0, c1, c2, noise, what in [
            (0.01, 0.002, 0.0, 0.0, "lineal"),
            (0.0, 0.001, 2e-5, 0.0, "cuadrático sin término constante"),
            (0.05, 0.003, -2e-6, 1e-4, "curva que se dobla hacia abajo: el ajuste libre da c2 < 0"),
            (-0.02, 0.002, 1e-5, 1e-4, "desplazamiento negativo: el ajuste libre da c0 < 0"),
            (0.02, 0.0, 4e-5, 1e-4, "cuadrático con ruido")]:
        n = np.sort(rng.choice(np.arange(4, 400), size=12, replace=False)).astype(float)
        t = c0 + c1 * n + c2 * n**2 + noise * rng.standard_normal(n.shape)
        coef = "; ".join(f"{k} = {es_sig(v)}" for k, v in
                         (("c0", c0), ("c1", c1), ("c2", c2), ("ruido", noise)))
        cases.append((n, t, f"{what}; {coef}"))
    return cases


def compare_fit(got, expected: dict) -> tuple[str, str] | None:
    """``(message, hint)`` for the first key of ``got`` that differs from the reference fit."""
    if not isinstance(got, dict) or set(expected) - set(got):
        return (f"se espera un dict con las claves {', '.join(FIT_KEYS)}; se obtuvo "
                f"{es_value(got)}.", "")
    try:
        values = {key: float(got[key]) for key in FIT_KEYS}
    except (TypeError, ValueError):
        return (f"las claves {', '.join(FIT_KEYS)} deben ser números; se obtuvo "
                f"{es_value(got)}.", "")
    for key in ("c2", "c1", "c0", "quadratic_share", "exponent"):
        e, g = expected[key], values[key]
        if math.isclose(g, e, rel_tol=1e-6, abs_tol=1e-9):
            continue
        message = f"{key}: se esperaba {es_sig(e)} y se obtuvo {es_sig(g)}."
        if key in ("c0", "c1", "c2"):
            swapped = (math.isclose(g, expected["c0"], rel_tol=1e-6, abs_tol=1e-12)
                       and math.isclose(values["c0"], e, rel_tol=1e-6, abs_tol=1e-12))
            if key == "c2" and swapped:
                return message, ("El valor de c2 es el de c0: c2 es el coeficiente de n²; "
                                 "compruebe el orden de los coeficientes.")
            if min(values["c0"], values["c1"], values["c2"]) < -1e-12:
                return message, NEGATIVE_HINT
            return message, BEST_FIT_HINT
        return message, SHARE_HINT if key == "quadratic_share" else EXPONENT_HINT
    return None


@self_check
def check_fit_growth(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(n, t) -> {"c0", "c1", "c2", "quadratic_share", "exponent"}``: the least-squares fit
    with non-negative coefficients of ``ai_evolution.timing.fit_growth``."""
    from ..timing import fit_growth

    name = "ajuste del crecimiento con coeficientes no negativos"
    cases = fit_cases(seed)
    for i, (n, t, label) in enumerate(cases):
        expected = fit_growth(n, t)
        got, crash = call_student(name, fn, n.copy(), t.copy())
        if crash:
            return failed(name, i, label, crash)
        wrong = compare_fit(got, expected)
        if wrong:
            return failed(name, i, label, *wrong)
    return passed(name, len(cases))


# --- (d) the memory budget ---------------------------------------------------------------------

BUDGET_KEYS = ("kv_budget_bytes", "num_blocks", "max_tokens", "sequences")


def budget_cases() -> list[tuple[ModelConfig, float, float, float, str, str, int, int]]:
    """(config, memory, utilization, activation reserve, weight dtype, KV dtype, block size,
    context): each plausible mistake changes the answer of at least one case."""
    return [
        (get_preset("llama-2-7b"), 24e9, 1.0, 0.0, "fp16", "fp16", 16, 4096),
        (get_preset("llama-3.1-8b"), 85.5e9, 0.92, 2e9, "bf16", "bf16", 16, 4096),
        (get_preset("llama-3.1-8b"), 24e9, 0.9, 1e9, "fp16", "fp8", 16, 100),  # fp8, 7 blocks
        (get_preset("qwen3-0.6b"), 16e9, 0.9, 5e8, "fp16", "fp16", 16, 8192),
        (get_preset("smollm2-135m"), 8e9, 0.8, 0.0, "fp32", "fp32", 1, 8192),
        (get_preset("llama-3.1-70b"), 24e9, 0.9, 0.0, "bf16", "bf16", 16, 4096),  # no room
        (get_preset("qwen3-0.6b"), 2e9, 0.9, 7e8, "bf16", "bf16", 16, 2048),  # the reserve: none
        (get_preset("llama-3.1-70b"), 4 * 80e9, 0.9, 8e9, "bf16", "fp8", 32, 32768),
    ]


def budget_label(config: ModelConfig, mem: float, util: float, act: float, wdt: str, kdt: str,
                 block: int, ctx: int) -> str:
    return (f"{config.name} ({wdt}, caché en {kdt}) en {es_sig(mem / 1e9)} GB × {es_sig(util)}, "
            f"reserva de activaciones {es_sig(act / 1e9)} GB, bloques de {block} tokens, "
            f"secuencias de {ctx} tokens")


def compare_budget(got, args) -> tuple[str, str] | None:
    """``(problem, hint)`` for the first answer of ``got`` that differs from the reference."""
    expected = reference_sequences_that_fit(*args)
    if not isinstance(got, dict) or any(k not in got for k in BUDGET_KEYS):
        return (f"se espera un dict con las claves {', '.join(BUDGET_KEYS)}; se obtuvo "
                f"{es_value(got)}.", "")
    for key in BUDGET_KEYS:
        g, e = got[key], expected[key]
        if not isinstance(g, (int, float, np.number)) or isinstance(g, bool):
            return f"{key}: devolvió {es_value(g)}; se espera un número.", ""
        if key != "kv_budget_bytes" and float(g) != int(float(g)):
            return (f"{key}: devolvió {es_value(g)}; se espera un número entero.",
                    "Se cuentan bloques, tokens y secuencias enteros: redondee hacia abajo.")
        if not math.isclose(float(g), e, rel_tol=1e-9, abs_tol=1e-6):
            return (f"{key}: se esperaba {es_value(e)} y su función devolvió {es_value(g)}.",
                    _budget_hint(key, float(g), args, expected))
    return None


def _budget_hint(key: str, got: float, args, expected: dict) -> str:
    config, mem, util, act, wdt, kdt, block, ctx = args
    if key == "kv_budget_bytes":
        usable = mem * util
        if expected["kv_budget_bytes"] == 0 and got < 0:
            return ("Si los pesos y la reserva no caben, no queda nada para la caché: el "
                    "presupuesto es 0, no negativo.")
        if math.isclose(got, usable - weight_bytes(config, wdt), rel_tol=1e-9):
            return ("Falta restar la reserva de activaciones: el motor la aparta antes de "
                    "repartir el resto entre bloques de caché.")
        if math.isclose(got, mem - weight_bytes(config, wdt) - act, rel_tol=1e-9):
            return "El motor solo usa la fracción utilization de la memoria, no toda."
        return ("El presupuesto es la memoria que el motor se permite usar menos los pesos (en "
                "su dtype) y la reserva de activaciones.")
    per_token = kv_bytes_per_token(config, kdt)
    budget = expected["kv_budget_bytes"]
    if key == "num_blocks":
        if kdt != wdt and math.isclose(got, math.floor(
                budget / (kv_bytes_per_token(config, wdt) * block))):
            return (f"La caché va en {kdt}, no en el dtype de los pesos ({wdt}): cada token de "
                    "caché ocupa otros bytes.")
        if got == math.ceil(budget / (per_token * block)):
            return "Redondee hacia abajo: un bloque a medias no guarda block_size tokens."
        return "Cuente cuántos bloques enteros de block_size tokens de caché caben en el presupuesto."
    if key == "max_tokens":
        if got == math.floor(budget / per_token):
            return ("La caché se reparte en bloques enteros: los tokens que caben son los de los "
                    "bloques, no el presupuesto entre los bytes de un token.")
        return "Los tokens que caben son los que guardan los bloques enteros."
    if got == math.floor(budget / (per_token * ctx)) or             got == expected["num_blocks"] * block // ctx:
        return ("Cada secuencia ocupa bloques enteros: si context_len no es múltiplo de "
                "block_size, su último bloque está a medias y cuenta entero.")
    if got == math.ceil(expected["num_blocks"] / math.ceil(ctx / block)):
        return "Redondee hacia abajo: media secuencia no se puede servir."
    return ("Divida los bloques entre los que necesita una secuencia de context_len tokens, "
            "contando entero el último, que puede quedar a medias.")


@self_check
def check_sequences_that_fit(fn: Callable, raise_on_fail: bool = True) -> CheckResult:
    """``fn(config, gpu_memory_bytes, utilization, activation_bytes, weight_dtype, kv_dtype,
    block_size, context_len) -> dict`` with ``kv_budget_bytes``, ``num_blocks``, ``max_tokens``
    and ``sequences``, as ``reference_sequences_that_fit``."""
    name = "presupuesto de memoria"
    cases = budget_cases()
    for i, args in enumerate(cases):
        label = budget_label(*args)
        got, crash = call_student(name, fn, *args)
        if crash:
            return failed(name, i, label, crash, "Si los pesos y la reserva no caben, "
                          "todo vale 0.")
        wrong = compare_budget(got, args)
        if wrong:
            return failed(name, i, label, *wrong)
    return passed(name, len(cases))


# --- the challenge -----------------------------------------------------------------------------
