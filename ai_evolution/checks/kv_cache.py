"""Self-checks of the KV-cache lab (chapter 2)."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from ..model import ModelConfig, get_preset, kv_bytes_per_token, memory_budget
from . import CheckResult, call_student, check_student_extension, failed, finish, passed  # noqa: F401

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


def check_kv_bytes_per_token(fn: Callable[[ModelConfig, str], float], seed: int = 0,
                             raise_on_fail: bool = True) -> CheckResult:
    """``fn(config, dtype) -> bytes`` must equal 2 x layers x kv_heads x head_dim x bytes(dtype)."""
    name = "bytes de caché KV por token"
    cases = kv_bytes_cases(seed)
    for i, (config, dtype) in enumerate(cases):
        expected = kv_bytes_per_token(config, dtype)
        got, crash = call_student(name, fn, config, dtype)
        label = f"{_config_label(config)}; dtype {dtype}"
        if crash:
            return finish(failed(name, i, label, crash), raise_on_fail)
        if not isinstance(got, (int, float, np.number)) or isinstance(got, bool):
            return finish(failed(name, i, label, f"devolvió {got!r} ({type(got).__name__}); "
                                 "se espera un número de bytes."), raise_on_fail)
        if not math.isclose(float(got), expected, rel_tol=1e-9):
            return finish(failed(name, i, label, f"se esperaban {expected:.0f} bytes y su "
                                 f"función devolvió {float(got):.0f}.",
                                 _kv_hint(config, float(got), expected)), raise_on_fail)
    return finish(passed(name, len(cases)), raise_on_fail)


def _kv_hint(config: ModelConfig, got: float, expected: float) -> str:
    ratio = got / expected if expected else float("nan")
    if math.isclose(ratio, 0.5):
        return "la caché guarda dos tensores por token y capa: K y V."
    if config.q_per_kv > 1 and math.isclose(ratio, config.q_per_kv):
        return ("con atención de consultas agrupadas (GQA) la caché guarda solo las cabezas KV "
                "(num_kv_heads), no las de consulta.")
    if math.isclose(ratio, 8):
        return "el resultado parece estar en bits; se piden bytes."
    if math.isclose(ratio, 1 / config.num_layers):
        return "cada capa tiene su propia caché: multiplique por num_layers."
    return "revise cada factor: 2 (K y V) × capas × cabezas KV × head_dim × bytes por elemento."


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


def check_cached_attention(fn: Callable, seed: int = 0, model=None, prompts=None,
                           max_new_tokens: int = 12, raise_on_fail: bool = True) -> CheckResult:
    """The student's attention step, alone on random tensors and then inside the real model."""
    from ..generation import generate
    from ..model.attention import cached_attention

    name = "atención con caché KV"
    cases = list(_attention_cases(seed))
    for i, (label, q, k_new, v_new, k_cache, v_cache, positions) in enumerate(cases):
        ref_k, ref_v = k_cache.clone(), v_cache.clone()
        expected = cached_attention(q, k_new, v_new, ref_k, ref_v, positions)
        got, crash = call_student(name, fn, q, k_new.clone(), v_new.clone(), k_cache, v_cache,
                                  positions)
        if crash:
            return finish(failed(name, i, label, crash), raise_on_fail)
        if not torch.is_tensor(got) or got.shape != expected.shape:
            shape = tuple(got.shape) if torch.is_tensor(got) else type(got).__name__
            return finish(failed(name, i, label, f"se esperaba un tensor de forma "
                                 f"{tuple(expected.shape)} y se obtuvo {shape}."), raise_on_fail)
        if not torch.equal(k_cache, ref_k) or not torch.equal(v_cache, ref_v):
            bad = (k_cache != ref_k).any(-1) | (v_cache != ref_v).any(-1)
            b, hk, pos = [int(x) for x in bad.nonzero()[0]]
            return finish(failed(
                name, i, label, f"la caché quedó mal escrita: la fila {b}, cabeza KV {hk}, "
                f"posición {pos} no contiene lo esperado.",
                "escriba k_new y v_new en k_cache y v_cache en las posiciones dadas "
                "(una por token nuevo), sin tocar el resto."), raise_on_fail)
        err = (got - expected).abs().max().item()
        if not torch.allclose(got, expected, atol=1e-4, rtol=1e-4):
            return finish(failed(
                name, i, label, f"la salida difiere de la referencia (diferencia máxima "
                f"{err:.3g}).", "cada consulta en la posición p atiende a las claves 0..p de "
                "su propia fila; escale por 1/sqrt(head_dim) y reparta cada cabeza KV entre "
                "num_heads/num_kv_heads cabezas de consulta."), raise_on_fail)
    # Inside the real model: identical greedy tokens.
    if model is None:
        from ..model.checkpoint import load_pretrained

        model = load_pretrained("tiny-es")
    if prompts is None:
        g = torch.Generator().manual_seed(seed)
        prompts = [torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist()
                   for n in (5, 11, 8)]
    expected_tokens = generate(model, prompts, max_new_tokens, cache="contiguous")
    got_tokens, crash = call_student(name, generate, model, prompts, max_new_tokens,
                                     cache="contiguous", attn_fn=fn)
    label = f"generación voraz de {max_new_tokens} tokens con el modelo {model.config.name}"
    if crash:
        return finish(failed(name, len(cases), label, crash), raise_on_fail)
    for row, (e, g_) in enumerate(zip(expected_tokens, got_tokens)):
        if e != g_:
            j = next(k for k in range(len(e)) if k >= len(g_) or e[k] != g_[k])
            got_j = g_[j] if j < len(g_) else "nada"
            return finish(failed(name, len(cases), label, f"en el prompt {row + 1}, el token "
                                 f"generado {j + 1} debía ser {e[j]} y fue {got_j}."),
                          raise_on_fail)
    return finish(passed(name, len(cases) + 1, "Dentro del modelo real genera exactamente los "
                         "mismos tokens que la referencia."), raise_on_fail)


# --- (c) fitting growth ------------------------------------------------------------------------

FIT_KEYS = ("c0", "c1", "c2", "quadratic_share", "exponent")

NEGATIVE_HINT = ("un coeficiente negativo no tiene sentido físico: un tiempo no baja al añadir "
                 "tokens. Si el ajuste libre da alguno, quite ese término y ajuste de nuevo los "
                 "demás; entre todos los ajustes sin coeficientes negativos, quédese con el de "
                 "menor error cuadrático.")
BEST_FIT_HINT = ("el ajuste pedido es el de menor error cuadrático entre los que no tienen "
                 "coeficientes negativos: compare el error de todos los ajustes posibles sin "
                 "coeficientes negativos (con los tres términos, con dos, con uno), no se quede "
                 "con el primero que lo cumpla.")
SHARE_HINT = ("quadratic_share es la fracción del tiempo ajustado que aporta el término en n², "
              "leída en el n más grande (max(n), que no tiene por qué ser el último).")
EXPONENT_HINT = ("exponent es la pendiente del tiempo ajustado en escala logarítmica, "
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
        coef = "; ".join(f"{k} = {v:g}".replace(".", ",") for k, v in
                         (("c0", c0), ("c1", c1), ("c2", c2), ("ruido", noise)))
        cases.append((n, t, f"{what}; {coef}"))
    return cases


def compare_fit(got, expected: dict) -> tuple[str, str] | None:
    """``(message, hint)`` for the first key of ``got`` that differs from the reference fit."""
    if not isinstance(got, dict) or set(expected) - set(got):
        return (f"se espera un dict con las claves {sorted(expected)}, se obtuvo {got!r}.", "")
    try:
        values = {key: float(got[key]) for key in FIT_KEYS}
    except (TypeError, ValueError):
        return (f"las claves {list(FIT_KEYS)} deben ser números; se obtuvo {got!r}.", "")
    for key in ("c2", "c1", "c0", "quadratic_share", "exponent"):
        e, g = expected[key], values[key]
        if math.isclose(g, e, rel_tol=1e-6, abs_tol=1e-9):
            continue
        message = f"{key}: se esperaba {e:.6g} y se obtuvo {g:.6g}."
        if key in ("c0", "c1", "c2"):
            swapped = (math.isclose(g, expected["c0"], rel_tol=1e-6, abs_tol=1e-12)
                       and math.isclose(values["c0"], e, rel_tol=1e-6, abs_tol=1e-12))
            if key == "c2" and swapped:
                return message, "c2 es el coeficiente de n²; compruebe el orden de los coeficientes."
            if min(values["c0"], values["c1"], values["c2"]) < -1e-12:
                return message, NEGATIVE_HINT
            return message, BEST_FIT_HINT
        return message, SHARE_HINT if key == "quadratic_share" else EXPONENT_HINT
    return None


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
            return finish(failed(name, i, label, crash), raise_on_fail)
        wrong = compare_fit(got, expected)
        if wrong:
            return finish(failed(name, i, label, *wrong), raise_on_fail)
    return finish(passed(name, len(cases)), raise_on_fail)


# --- (d) the memory budget ---------------------------------------------------------------------

def reference_sequences_that_fit(config: ModelConfig, gpu_memory_bytes: float, context_len: int,
                                 utilization: float, dtype: str) -> int:
    try:
        return memory_budget(config, gpu_memory_bytes, max_len=context_len,
                             utilization=utilization, dtype=dtype).static_slots
    except ValueError:
        return 0  # the weights alone do not fit


def budget_cases() -> list[tuple[ModelConfig, float, int, float, str]]:
    return [
        (get_preset("llama-2-7b"), 24e9, 4096, 1.0, "fp16"),
        (get_preset("llama-3.1-8b"), 85.5e9, 4096, 0.92, "bf16"),
        (get_preset("llama-3.1-8b"), 16e9, 2048, 0.9, "fp16"),
        (get_preset("qwen3-0.6b"), 16e9, 8192, 0.9, "fp16"),
        (get_preset("smollm2-135m"), 8e9, 8192, 0.8, "fp32"),
        (get_preset("llama-3.1-70b"), 24e9, 4096, 0.9, "bf16"),  # the weights alone do not fit
        (get_preset("llama-3.1-70b"), 4 * 80e9, 32768, 0.9, "bf16"),
    ]


def check_sequences_that_fit(fn: Callable, raise_on_fail: bool = True) -> CheckResult:
    """``fn(config, gpu_memory_bytes, context_len, utilization, dtype) -> int`` sequences that
    each reserve ``context_len`` tokens of KV cache, after the weights; 0 if the weights do not fit."""
    name = "presupuesto de memoria"
    cases = budget_cases()
    for i, (config, mem, ctx, util, dtype) in enumerate(cases):
        expected = reference_sequences_that_fit(config, mem, ctx, util, dtype)
        label = f"{config.name} en {mem / 1e9:g} GB × {util}, contexto {ctx}, {dtype}"
        got, crash = call_student(name, fn, config, mem, ctx, util, dtype)
        if crash:
            return finish(failed(name, i, label, crash, "si los pesos no caben, devuelva 0."),
                          raise_on_fail)
        if got != expected:
            hint = ("redondee hacia abajo: media secuencia no se puede servir." if
                    isinstance(got, (int, float)) and math.isclose(got, expected + 1, abs_tol=0.5)
                    else "memoria útil = memoria × utilización − bytes de los pesos; divídala "
                    "entre los bytes de KV de una secuencia de context_len tokens.")
            return finish(failed(name, i, label, f"se esperaban {expected} secuencias y su "
                                 f"función devolvió {got!r}.", hint), raise_on_fail)
    return finish(passed(name, len(cases)), raise_on_fail)


# --- the challenge -----------------------------------------------------------------------------
