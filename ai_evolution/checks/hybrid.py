"""Self-checks of the hybrid-models lab (chapter 11).

Failure messages carry the second tier of each exercise's hint ("Pista: ..."): which quantity is
off and why, in words, never the code line. Numbers are written with a decimal comma."""

from __future__ import annotations

import math
import random
from typing import Callable

import torch

from ..fmt import es_bytes, es_count, es_sig, es_value
from ..model import ModelConfig, get_preset
from ..model.linear_attention import gated_delta_chunked, l2_normalize
from ..reference.hybrid import (reference_reusable_tokens, reference_sequences_that_fit,
                                reference_state_bytes)
from . import CheckResult, call_student, check_student_extension, failed, passed, self_check  # noqa: F401

CHALLENGE_GPU_GB, CHALLENGE_UTILIZATION = 80.0, 0.9
CHALLENGE_CONTEXTS = (512, 2048, 8192, 32768)
CHALLENGE_KEYS = ("gpu_gb", "utilization", "contexts", "qwen_f32", "qwen_bf16", "llama",
                  "first_context_hybrid_wins", "contexts_state_dtype_matters")


# --- exercise 1: the state of one sequence ------------------------------------------------------
def random_hybrid(rng: random.Random, name: str = "aleatorio") -> ModelConfig:
    """A seeded random hybrid configuration (the shapes only matter)."""
    every = rng.choice((2, 3, 4))
    n = every * rng.randint(1, 4)
    kh = rng.choice((1, 2, 4))
    return ModelConfig(
        name=name, model_type="qwen3_5_text", num_layers=n, hidden_size=128, num_heads=2,
        num_kv_heads=1, head_dim=64, intermediate_size=256, vocab_size=64,
        partial_rotary_factor=0.25, attn_output_gate=True, zero_centered_norm=True, qk_norm=True,
        layer_types=tuple("full_attention" if (i + 1) % every == 0 else "linear_attention"
                          for i in range(n)),
        linear_num_key_heads=kh, linear_num_value_heads=kh * rng.choice((1, 2, 3)),
        linear_key_head_dim=rng.choice((16, 32, 64, 128)),
        linear_value_head_dim=rng.choice((16, 48, 64, 128)),
        linear_conv_kernel_dim=rng.choice((2, 3, 4)))


def state_cases(seed: int = 0) -> list[tuple[str, ModelConfig, float]]:
    """(label, config, bytes per element)."""
    rng = random.Random(seed)
    qwen = get_preset("qwen3.5-9b")
    cases = [("Qwen3.5-9B, estado en float32", qwen, 4.0),
             ("Qwen3.5-9B, estado en bf16", qwen, 2.0),
             ("Llama-3.1-8B (sin capas lineales)", get_preset("llama-3.1-8b"), 4.0)]
    for i in range(5):
        c = random_hybrid(rng, f"aleatorio {i + 1}")
        cases.append((f"aleatorio {i + 1} ({c.num_linear_layers} de {c.num_layers} capas "
                      f"lineales, {c.linear_num_key_heads} cabezas de clave y "
                      f"{c.linear_num_value_heads} de valor, Dk = {c.linear_key_head_dim}, Dv = "
                      f"{c.linear_value_head_dim}, núcleo {c.linear_conv_kernel_dim})", c,
                      rng.choice((4.0, 2.0))))
    return cases


def _state_hint(config: ModelConfig, b: float, got: float) -> str:
    if not config.is_hybrid:
        return ("un modelo sin capas lineales no guarda estado fijo: toda su memoria por "
                "secuencia es la caché KV.")
    L = config.num_linear_layers
    rec = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim
    conv = config.linear_conv_dim * (config.linear_conv_kernel_dim - 1)
    if math.isclose(got, L * rec * b):
        return ("falta la segunda pieza del estado: la convolución corta guarda, por canal, las "
                "últimas entradas que necesita su ventana.")
    if math.isclose(got, config.num_layers * (rec + conv) * b):
        return "solo las capas lineales guardan estado; las de atención completa guardan KV."
    return ("cada capa lineal guarda una matriz Dk × Dv por cabeza de valor (no de clave) y, "
            "para la convolución, núcleo − 1 entradas de cada canal: consultas, claves y valores.")


def state_bytes_failure(name: str, fn: Callable, cases) -> CheckResult:
    """The first of ``cases`` ((label, config, bytes per element)) where ``fn`` is not the
    reference, as a failed result with its hint; or the passed result."""
    for i, (label, config, b) in enumerate(cases):
        want = reference_state_bytes(config, b)
        got, crash = call_student(name, fn, config, b)
        if crash:
            return failed(name, i, label, crash)
        try:
            ok = math.isclose(float(got), want, rel_tol=1e-9, abs_tol=0.5)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            return failed(name, i, label, f"se esperaban {es_bytes(want)} ({es_value(want)} B) y su "
                          f"función devolvió {es_value(got)}.",
                          _state_hint(config, b, float(got) if isinstance(got, (int, float))
                                      else -1.0))
    return passed(name, len(cases))


@self_check
def check_state_bytes(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(config, dtype_bytes) -> bytes``: the fixed state of one sequence."""
    return state_bytes_failure("bytes de estado por secuencia", fn, state_cases(seed))


# --- exercise 2: one recurrent step against the chunked form -----------------------------------
def delta_cases(seed: int = 0) -> list[tuple[str, dict]]:
    """(label, sizes): batch, heads, key and value dims, tokens, chunk size, initial state."""
    rng = random.Random(seed)
    cases = [("un token, estado cero", dict(B=1, H=1, Dk=4, Dv=3, T=1, C=4, init=False)),
             ("5 tokens, estado inicial", dict(B=2, H=3, Dk=8, Dv=5, T=5, C=4, init=True))]
    for i in range(4):
        cases.append((f"aleatorio {i + 1}", dict(
            B=rng.randint(1, 3), H=rng.randint(1, 4), Dk=rng.choice((4, 8, 16)),
            Dv=rng.choice((3, 8, 12)), T=rng.randint(2, 20), C=rng.choice((2, 4, 8, 16)),
            init=bool(i % 2))))
    return cases


def delta_inputs(seed: int, B: int, H: int, Dk: int, Dv: int, T: int, init: bool, **_):
    g = torch.Generator().manual_seed(seed)
    q = l2_normalize(torch.randn(B, T, H, Dk, generator=g)) * Dk ** -0.5
    k = l2_normalize(torch.randn(B, T, H, Dk, generator=g))
    v = torch.randn(B, T, H, Dv, generator=g)
    decay = -torch.rand(B, T, H, generator=g) * 0.5
    beta = torch.rand(B, T, H, generator=g)
    s0 = torch.randn(B, H, Dk, Dv, generator=g) * 0.3 if init else None
    return q, k, v, decay, beta, s0


@self_check
def check_delta_step(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(state, q, k, v, g, beta) -> (output, new_state)``, one token of the gated delta rule;
    applied token after token it must give the outputs and final state of the chunked form."""
    name = "un paso de la regla delta con compuerta"
    for i, (label, sizes) in enumerate(delta_cases(seed)):
        q, k, v, decay, beta, s0 = delta_inputs(seed * 100 + i, **sizes)
        want_out, want_state = gated_delta_chunked(q, k, v, decay, beta, s0, chunk_size=sizes["C"])
        B, T, H, Dk = k.shape
        S = torch.zeros(B, H, Dk, v.shape[-1]) if s0 is None else s0.clone()
        shown = (f"{label}: B = {B}, H = {H}, Dk = {Dk}, Dv = {v.shape[-1]}, "
                 f"{es_count(T, 'token')}")
        for t in range(T):
            got, crash = call_student(name, fn, S.clone(), q[:, t].clone(), k[:, t].clone(),
                                      v[:, t].clone(), decay[:, t].clone(), beta[:, t].clone())
            if crash:
                return failed(name, i, shown, crash)
            try:
                out, S = got
                out, S = out.float(), S.float()
                shape_ok = (tuple(out.shape) == (B, H, v.shape[-1])
                            and tuple(S.shape) == (B, H, Dk, v.shape[-1]))
            except (TypeError, ValueError, AttributeError):
                shape_ok = False
            if not shape_ok:
                return failed(name, i, shown, f"en el token {t}, se esperaba (salida [{B}, {H}, "
                              f"{v.shape[-1]}], estado [{B}, {H}, {Dk}, {v.shape[-1]}]) y se obtuvo "
                              f"{es_value(got)}.")
            err = float((out - want_out[:, t]).abs().max())
            scale = max(1.0, float(want_out[:, t].abs().max()))
            if not err <= 1e-4 * scale:
                return failed(name, i, shown, f"la salida del token {t} se aleja de la forma por "
                              f"bloques: máx |dif| = {es_sig(err, 3)}.",
                              "en cada token el estado primero se desvanece (exp(g)), después "
                              "predice el valor de la clave con lo que ya guarda, escribe a lo "
                              "largo de la clave solo la diferencia entre el valor y esa "
                              "predicción, multiplicada por beta, y al final la consulta lee el "
                              "estado ya actualizado.")
        err = float((S - want_state).abs().max())
        if not err <= 1e-4 * max(1.0, float(want_state.abs().max())):
            return failed(name, i, shown, f"el estado final se aleja del de la forma por bloques: "
                          f"máx |dif| = {es_sig(err, 3)}.",
                          "devuelva el estado después de escribir el token: es lo que lee el "
                          "token siguiente.")
    return passed(name, len(delta_cases(seed)), "Token a token da lo mismo que la forma por "
                  "bloques del prefill.")


# --- exercise 3: sequences that fit ------------------------------------------------------------
def fit_cases(seed: int = 0) -> list[tuple[str, str, float, int, float]]:
    """(label, preset, GPU GB, context, utilization)."""
    rng = random.Random(seed)
    cases = [("Qwen3.5-9B, 24 GB, 4096 tokens", "qwen3.5-9b", 24.0, 4096, 0.9),
             ("Llama-3.1-8B, 24 GB, 4096 tokens", "llama-3.1-8b", 24.0, 4096, 0.9),
             ("Qwen3.5-9B, 80 GB, 16 tokens", "qwen3.5-9b", 80.0, 16, 0.9),
             ("Qwen3.5-9B en 16 GB: los pesos no caben", "qwen3.5-9b", 16.0, 1024, 0.9)]
    for i in range(4):
        preset = rng.choice(("qwen3.5-9b", "llama-3.1-8b", "qwen3-0.6b"))
        gb = rng.choice((24.0, 40.0, 48.0, 80.0, 141.0))
        ctx = rng.choice((100, 1000, 2048, 8192, 32768, 131072))
        util = rng.choice((0.8, 0.9, 0.95))
        cases.append((f"aleatorio {i + 1} ({preset}, {gb:g} GB, {ctx} tokens, utilización "
                      f"{util:g})".replace(".", ","), preset, gb, ctx, util))
    return cases


@self_check
def check_sequences_that_fit(fn: Callable, seed: int = 0,
                             raise_on_fail: bool = True) -> CheckResult:
    """``fn(config, gpu_bytes, context_len, utilization) -> int``: sequences of that context
    that fit after the weights (bf16 weights and KV, float32 state)."""
    name = "secuencias que caben"
    cases = fit_cases(seed)
    for i, (label, preset, gb, ctx, util) in enumerate(cases):
        config = get_preset(preset)
        want = reference_sequences_that_fit(config, gb * 1e9, ctx, util)
        got, crash = call_student(name, fn, config, gb * 1e9, ctx, util)
        if crash:
            return failed(name, i, label, crash)
        if isinstance(got, bool) or not isinstance(got, int) or got != want:
            hint = ("a la memoria útil (utilización × memoria de la GPU) réstele los pesos; cada "
                    "secuencia ocupa su KV (por token, solo las capas de atención) más, en un "
                    "híbrido, su estado fijo; y una secuencia que no cabe entera no cuenta.")
            if want == 0:
                hint = "si los pesos no caben, no cabe ninguna secuencia: la respuesta es 0."
            return failed(name, i, label, f"se esperaban {es_value(want)} secuencias (un entero) y "
                          f"su función devolvió {es_value(got)}.", hint)
    return passed(name, len(cases))


# --- exercise 4: tokens a prefix hit can reuse -----------------------------------------------------
def reuse_cases(seed: int = 0) -> list[tuple[str, int, int, int]]:
    """(label, shared tokens, prompt tokens, interval)."""
    rng = random.Random(seed)
    cases = [("transformer, bloques de 16, prefijo de 40 tokens con 8 propios", 40, 48, 16),
             ("híbrido, intervalo 256, prefijo de 200 tokens: más corto que el intervalo", 200,
              210, 256),
             ("híbrido, intervalo 64, prefijo de 128 tokens: justo en un punto de control", 128,
              140, 64),
             ("el mismo prompt de 128 tokens repetido entero, intervalo 64", 128, 128, 64),
             ("intervalo 528 (el bloque de vLLM para Qwen3.5), prefijo de 1000 tokens", 1000,
              1100, 528)]
    for i in range(5):
        interval = rng.choice((4, 16, 64, 256, 528))
        shared = rng.randint(1, 4 * interval)
        prompt = shared + rng.choice((0, 0, 1, rng.randint(2, 100)))
        cases.append((f"aleatorio {i + 1} (prefijo de {shared} tokens, prompt de {prompt}, "
                      f"intervalo {interval})", shared, prompt, interval))
    return cases


def _reuse_hint(shared: int, prompt: int, interval: int, got) -> str:
    usable = min(shared, prompt - 1)
    if isinstance(got, bool) or not isinstance(got, int):
        return f"devuelva un número entero de tokens (int), no {type(got).__name__}."
    if got == min(shared, prompt) // interval * interval:
        return ("si el prompt entero está en la caché, algún token tiene que calcularse igual: "
                "de él salen los logits del primer token nuevo.")
    if got == -(-usable // interval) * interval:
        return ("redondee hacia abajo, nunca hacia arriba: un punto de control que cae después del "
                "prefijo compartido ya contiene tokens que esta petición no tiene.")
    if got in (shared, usable):
        return ("el motor solo puede reanudar donde guardó algo: en un límite de bloque (la KV) "
                "y, en un híbrido, en un punto de control del estado; lo compartido se recorta "
                "al último de ellos.")
    return ("cuente solo lo que comparten los dos prompts, recortado al último punto donde el "
            "motor puede reanudar (un múltiplo del intervalo), y deje un token por calcular.")


def reuse_failure(name: str, fn: Callable, cases) -> CheckResult:
    """The first of ``cases`` ((label, shared, prompt, interval)) where ``fn`` is not the
    reference, as a failed result with its hint; or the passed result."""
    for i, (label, shared, prompt, interval) in enumerate(cases):
        want = reference_reusable_tokens(shared, prompt, interval)
        got, crash = call_student(name, fn, shared, prompt, interval)
        if crash:
            return failed(name, i, label, crash)
        if isinstance(got, bool) or not isinstance(got, int) or got != want:
            return failed(name, i, label, f"se esperaban {es_value(want)} tokens (un entero) y su "
                          f"función devolvió {es_value(got)}.",
                          _reuse_hint(shared, prompt, interval, got))
    return passed(name, len(cases))


@self_check
def check_reusable_tokens(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(shared_len, prompt_len, interval) -> int``: prompt tokens a request takes from the
    prefix cache."""
    return reuse_failure("tokens reutilizables de la caché de prefijos", fn, reuse_cases(seed))


# --- the challenge -------------------------------------------------------------------------------
def challenge_answer() -> dict:
    """What the challenge's measurement must hold (computed with the library)."""
    qwen, llama = get_preset("qwen3.5-9b"), get_preset("llama-3.1-8b")
    gpu = CHALLENGE_GPU_GB * 1e9
    f32 = [reference_sequences_that_fit(qwen, gpu, c, CHALLENGE_UTILIZATION, "bf16", "float32")
           for c in CHALLENGE_CONTEXTS]
    bf16 = [reference_sequences_that_fit(qwen, gpu, c, CHALLENGE_UTILIZATION, "bf16", "bf16")
            for c in CHALLENGE_CONTEXTS]
    ll = [reference_sequences_that_fit(llama, gpu, c, CHALLENGE_UTILIZATION)
          for c in CHALLENGE_CONTEXTS]
    wins = [c for c, a, b in zip(CHALLENGE_CONTEXTS, f32, ll) if a > b]
    matters = [c for c, a, b in zip(CHALLENGE_CONTEXTS, f32, bf16) if b > 1.1 * a]
    return {"gpu_gb": CHALLENGE_GPU_GB, "utilization": CHALLENGE_UTILIZATION,
            "contexts": list(CHALLENGE_CONTEXTS), "qwen_f32": f32, "qwen_bf16": bf16, "llama": ll,
            "first_context_hybrid_wins": wins[0] if wins else None,
            "contexts_state_dtype_matters": matters}


@self_check
def check_challenge(ext: dict, raise_on_fail: bool = True) -> CheckResult:
    """The challenge's ``student_extension``: sequences that fit on an 80 GB GPU for Qwen3.5-9B
    (state in float32 and in bf16) and Llama-3.1-8B at four contexts, the first context at
    which the hybrid fits more, and the contexts at which the state's dtype changes the count by
    more than 10 %."""
    name = "reto: el estado, la caché y la GPU"
    m = ext.get("measurement") if isinstance(ext, dict) else None
    if not isinstance(m, dict) or any(k not in m for k in CHALLENGE_KEYS):
        missing = [k for k in CHALLENGE_KEYS if not isinstance(m, dict) or k not in m]
        return failed(name, 0, "measurement", f"faltan las claves {', '.join(missing)}.")
    want = challenge_answer()
    for j, key in enumerate(CHALLENGE_KEYS):
        got, value = m[key], want[key]
        try:
            if isinstance(value, list):
                ok = [float(x) for x in got] == [float(x) for x in value]
            elif value is None:
                ok = got is None
            else:
                ok = float(got) == float(value)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            hint = {"qwen_f32": "el estado de cada secuencia de Qwen3.5-9B cuenta en float32, "
                                "además de su KV en bf16.",
                    "qwen_bf16": "con el estado en bf16, cada elemento del estado ocupa 2 bytes.",
                    "first_context_hybrid_wins": "el primer contexto de la lista en que caben "
                                                 "más secuencias del híbrido (estado float32) que "
                                                 "de Llama; None si no hay ninguno.",
                    "contexts_state_dtype_matters": "los contextos en que con el estado en bf16 "
                                                    "caben más de un 10 % más secuencias que en "
                                                    "float32."}.get(key, "")
            return failed(name, j, key, f"debería ser {es_value(value)} y measurement dice "
                          f"{es_value(got)}.", hint)
    return passed(name, len(CHALLENGE_KEYS))
