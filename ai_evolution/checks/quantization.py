"""Self-checks of the quantization lab (chapter 7).

(a) ``check_quantize_int8`` / ``check_dequantize_int8``: symmetric int8, one scale per output
    channel, on seeded tensors (an all-zero row and an outlier column among them) and, with a
    model, inside it: the student's integers serve ``tiny-es`` and must generate the library's
    greedy tokens;
(b) ``check_quantize_int4_groups``: symmetric int4 per group, two per byte, on seeded tensors,
    with a clear error (ValueError) when the group does not divide the row, and inside the model;
(c) ``check_predict_step_s``: the step time a weight format allows, from the bytes it reads.

Failure messages carry the second tier of each exercise's hint ("Pista: ..."): which quantity is
off and why, in words, never the code line (the first tier is the notebook's NotImplementedError).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from ..fmt import es, es_sig, es_value
from ..model import ModelConfig, dtype_bytes, get_preset, kv_bytes_per_token
from ..model.memory import linear_shapes, parse_weight_format, unquantized_params
from ..model.quant import (dequantize_int8, quantize_int4, quantize_int8, quantize_model,
                           quantized_layers, unpack_int4)
from ..reference.quantization import reference_predict_step_s, reference_quantize_int4_groups
from . import (CheckResult, call_student, check_student_extension, failed, passed,  # noqa: F401
               self_check)


def _seeded(seed: int, shape: tuple[int, int], scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * scale


def _label(w: torch.Tensor, what: str) -> str:
    return f"matriz {w.shape[0]} × {w.shape[1]} float32, {what}"


# --- (a) int8 per output channel ---------------------------------------------------------------

def int8_cases(seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    """Seeded weights; each plausible mistake changes the answer of at least one case."""
    cases = []
    for i, (shape, scale) in enumerate([((4, 16), 1.0), ((7, 33), 0.02), ((16, 64), 3.0),
                                        ((1, 5), 1.0)]):
        w = _seeded(seed + i, shape, scale)
        cases.append((_label(w, f"valores normales × {es_sig(scale)}"), w))
    w = _seeded(seed + 10, (5, 24))
    w[2] = 0.0
    cases.append((_label(w, "la fila 3 toda a cero"), w))
    w = _seeded(seed + 11, (6, 32), 0.05)
    w[:, 7] *= 400.0
    cases.append((_label(w, "la columna 8 con valores atípicos (400 veces mayores)"), w))
    w = -_seeded(seed + 12, (3, 20)).abs()
    cases.append((_label(w, "todos los valores negativos"), w))
    return cases


def _tensor_problem(got, shape: tuple, dtype: torch.dtype, what: str) -> str | None:
    if not torch.is_tensor(got):
        return f"{what}: se esperaba un tensor y se obtuvo {type(got).__name__}."
    if tuple(got.shape) != shape:
        return f"{what}: se esperaba forma {shape} y se obtuvo {tuple(got.shape)}."
    if got.dtype != dtype:
        return f"{what}: se esperaba dtype {str(dtype).removeprefix('torch.')} y se obtuvo " \
               f"{str(got.dtype).removeprefix('torch.')}."
    return None


def _pair(got, name: str) -> str | None:
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return f"se esperaba una pareja (enteros, escalas) y {name} devolvió {es_value(got)}."
    return None


def compare_int8(got, w: torch.Tensor) -> tuple[str, str] | None:
    """``(problem, hint)`` for the first thing ``got = fn(w)`` gets wrong, or None."""
    q_ref, s_ref = quantize_int8(w)
    N, K = w.shape
    if (bad := _pair(got, "su función")):
        return bad, "Devuelva los enteros y las escalas, en ese orden."
    q, s = got
    if torch.is_tensor(s) and tuple(s.shape) in ((N, 1), (1, N)) and s.numel() == N:
        return (f"escalas: se esperaba forma ({N},) y se obtuvo {tuple(s.shape)}.",
                "Una escala por canal de salida: un vector con una por fila.")
    if torch.is_tensor(s) and tuple(s.shape) == (K,) and K != N:
        return (f"escalas: se esperaba forma ({N},) y se obtuvo ({K},).",
                "La escala va por canal de salida, es decir, por fila del peso [out, in], no por "
                "columna.")
    for what, t, ref in (("escalas", s, s_ref), ("enteros", q, q_ref)):
        if (bad := _tensor_problem(t, tuple(ref.shape), ref.dtype, what)):
            hint = ("Guarde los enteros en int8: un byte cada uno, que es lo que se ahorra."
                    if what == "enteros" else "Las escalas van en el dtype del peso.")
            return bad, hint
    s_f, q_i = s.float(), q.to(torch.int32)
    if not torch.allclose(s_f, s_ref.float(), rtol=1e-6, atol=0.0):
        row = int((~torch.isclose(s_f, s_ref.float(), rtol=1e-6, atol=0.0)).nonzero()[0])
        amax = float(w[row].abs().max())
        e, g = float(s_ref[row]), float(s_f[row])
        problem = f"escala de la fila {row + 1}: se esperaba {es_sig(e)} y se obtuvo {es_sig(g)}."
        if math.isclose(g, amax, rel_tol=1e-6):
            return problem, ("La escala es lo que vale un paso del entero: el máximo absoluto de "
                             "la fila repartido entre los 127 pasos del lado positivo.")
        if math.isclose(g, amax / 128, rel_tol=1e-6) or math.isclose(g, amax / 255, rel_tol=1e-6):
            return problem, ("El rango simétrico es [−127, 127]: el máximo absoluto de la fila "
                             "corresponde a 127, no a 128 ni a 255.")
        if math.isclose(g, float(w.abs().max()) / 127, rel_tol=1e-6):
            return problem, ("Hay una escala por fila (canal de salida), calculada con los "
                             "valores de esa fila, no una para toda la matriz.")
        return problem, "Cada fila tiene su escala: su máximo absoluto entre 127."
    if not torch.equal(q_i, q_ref.to(torch.int32)):
        r, c = [int(x) for x in (q_i != q_ref.to(torch.int32)).nonzero()[0]]
        e, g = int(q_ref[r, c]), int(q_i[r, c])
        problem = (f"entero de la fila {r + 1}, columna {c + 1}: se esperaba {e} y se obtuvo "
                   f"{g} (peso {es_sig(float(w[r, c]))}, escala {es_sig(float(s_ref[r]))}).")
        if float(s_ref[r]) == 0:
            return problem, ("Una fila toda a cero tiene escala 0: sus enteros son 0, sin "
                             "dividir entre cero.")
        if abs(e - g) == 1:
            return problem, ("Redondee al entero más cercano (w / escala), no trunque ni redondee "
                             "siempre hacia abajo.")
        return problem, "Cada entero es el peso dividido entre la escala de su fila, redondeado."
    return None


def _student_model(model, fmt: str, fn: Callable, group_size: int | None = None):
    """``model`` with every linear layer quantized to ``fmt`` by the student's ``fn`` (the
    library's QuantizedLinear, the student's integers and scales in its buffers), or a Spanish
    problem."""
    quantized = quantize_model(model, fmt)
    originals = dict(model.named_modules())
    for name, layer in quantized_layers(quantized).items():
        w = originals[name].weight.detach()
        got = fn(w) if group_size is None else fn(w, group_size)
        if (bad := _pair(got, f"su función con la capa {name}")):
            return None, bad
        for buffer, t in (("qweight", got[0]), ("scales", got[1])):
            ref = getattr(layer, buffer)
            if not torch.is_tensor(t) or tuple(t.shape) != tuple(ref.shape):
                return None, (f"con la capa {name} ({w.shape[0]} × {w.shape[1]}) devolvió "
                              f"{es_value(t) if not torch.is_tensor(t) else tuple(t.shape)} donde "
                              f"se esperaba forma {tuple(ref.shape)}.")
            with torch.no_grad():
                ref.copy_(t.to(ref.dtype))
    return quantized, None


def _in_model(name: str, fn: Callable, model, fmt: str, cases: int,
              group_size: int | None = None, seed: int = 0) -> CheckResult:
    from ..generation import generate

    label = f"el modelo {model.config.name} cuantizado en {fmt} con su función"
    built, problem = _student_model(model, fmt, fn, group_size)
    if problem:
        return failed(name, cases, label, problem)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist()
               for n in (6, 11, 9)]
    expected = generate(quantize_model(model, fmt), prompts, 12)
    got, crash = call_student(name, generate, built, prompts, 12)
    if crash:
        return failed(name, cases, label, crash)
    for row, (e, o) in enumerate(zip(expected, got)):
        if e != o:
            j = next(k for k in range(len(e)) if e[k] != o[k])
            return failed(name, cases, label, f"en el prompt {row + 1}, el token generado "
                          f"{j + 1} debía ser {e[j]} y fue {o[j]}.")
    return passed(name, cases + 1, f"Dentro de {model.config.name} genera los mismos "
                  f"tokens que la cuantización {fmt} de la biblioteca.")


@self_check
def check_quantize_int8(fn: Callable, seed: int = 0, model=None,
                        raise_on_fail: bool = True) -> CheckResult:
    """``fn(w) -> (q int8 [N, K], scale [N])`` as ``model.quant.quantize_int8`` (float32 ``w``);
    with ``model``, also inside it."""
    name = "int8 por canal de salida"
    cases = int8_cases(seed)
    worst = 0.0
    for i, (label, w) in enumerate(cases):
        got, crash = call_student(name, fn, w.clone())
        if crash:
            return failed(name, i, label, crash, "Una fila toda a cero tiene escala 0: "
                          "sus enteros son 0, sin dividir entre cero.")
        wrong = compare_int8(got, w)
        if wrong:
            return failed(name, i, label, *wrong)
        q, s = got
        err = (w - dequantize_int8(q, s)).abs() / torch.where(s == 0, 1, s)[:, None]
        worst = max(worst, float(err.max()))
    if model is not None:
        return _in_model(name, fn, model, "int8", len(cases), seed=seed)
    return passed(name, len(cases), f"El mayor error fue {es(worst, 3)} escalas (≤ 0,5).")


@self_check
def check_dequantize_int8(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(q, scale) -> float32 [N, K]``, ``q x scale`` row by row (``dequantize_int8``)."""
    return dequantize_result("descuantizar int8", fn, int8_cases(seed))


def dequantize_result(name: str, fn: Callable, cases: list[tuple[str, torch.Tensor]]
                      ) -> CheckResult:
    """``fn(q, scale)`` against ``dequantize_int8`` on the int8 form of each ``(label, w)`` of
    ``cases``, stopping at the first difference (the public check's cases, or the autograder's)."""
    for i, (label, w) in enumerate(cases):
        q, s = quantize_int8(w)
        expected = dequantize_int8(q, s)
        got, crash = call_student(name, fn, q.clone(), s.clone())
        if crash:
            return failed(name, i, label, crash)
        if (bad := _tensor_problem(got, tuple(expected.shape), torch.float32, "resultado")):
            return failed(name, i, label, bad, "Devuelva la matriz [out, in] en float32.")
        if not torch.allclose(got, expected, rtol=1e-6, atol=0.0):
            off = ~torch.isclose(got, expected, rtol=1e-6, atol=0.0)
            r, c = [int(x) for x in off.nonzero()[0]]
            hint = "Cada entero vale su valor por la escala de su fila."
            n_rows, n_cols = q.shape
            if n_rows == n_cols and torch.allclose(got, q.float() * s.float()[None, :]):
                hint = ("La escala de la fila r multiplica todos los enteros de la fila r: "
                        "colóquela como columna, no como fila.")
            return failed(name, i, label, f"fila {r + 1}, columna {c + 1}: se esperaba "
                          f"{es_sig(float(expected[r, c]))} y se obtuvo "
                          f"{es_sig(float(got[r, c]))}.", hint)
    return passed(name, len(cases))


# --- (b) int4 per group, packed ----------------------------------------------------------------

def int4_cases(seed: int = 0) -> list[tuple[str, torch.Tensor, int]]:
    cases = []
    for i, (shape, g, scale) in enumerate([((4, 64), 32, 1.0), ((8, 128), 64, 0.02),
                                           ((6, 256), 128, 2.0), ((3, 96), 32, 1.0)]):
        w = _seeded(seed + 20 + i, shape, scale)
        cases.append((_label(w, f"grupos de {g}"), w, g))
    w = _seeded(seed + 30, (4, 128), 0.1)
    w[1, 32:64] = 0.0
    w[2, :] = 0.0
    cases.append((_label(w, "grupos de 32; un grupo de la fila 2 y la fila 3 enteros a cero"),
                  w, 32))
    w = _seeded(seed + 31, (5, 128), 0.05)
    w[:, 70] *= 300.0
    cases.append((_label(w, "grupos de 64; la columna 71 con valores atípicos"), w, 64))
    return cases


BAD_GROUPS = (((4, 96), 64), ((3, 100), 32), ((2, 48), 32))


def _unpacked(packed: torch.Tensor) -> torch.Tensor:
    return unpack_int4(packed).to(torch.int32)


def compare_int4(got, w: torch.Tensor, g: int) -> tuple[str, str] | None:
    packed_ref, s_ref = reference_quantize_int4_groups(w, g)
    N, K = w.shape
    if (bad := _pair(got, "su función")):
        return bad, "Devuelva los enteros empaquetados y las escalas, en ese orden."
    packed, s = got
    if torch.is_tensor(packed) and tuple(packed.shape) == (N, K):
        return (f"enteros: se esperaba forma ({N}, {K // 2}) y se obtuvo ({N}, {K}).",
                "Dos enteros de 4 bits comparten cada byte: la matriz empaquetada tiene la mitad "
                "de columnas.")
    if torch.is_tensor(s) and tuple(s.shape) == (N,):
        return (f"escalas: se esperaba forma ({N}, {K // g}) y se obtuvo ({N},).",
                "Hay una escala por grupo de group_size entradas consecutivas de cada fila, no "
                "una por fila.")
    for what, t, ref in (("escalas", s, s_ref), ("enteros", packed, packed_ref)):
        if (bad := _tensor_problem(t, tuple(ref.shape), ref.dtype, what)):
            hint = ("Guarde los bytes empaquetados como uint8 (0..255)." if what == "enteros"
                    else "Las escalas van en el dtype del peso, una por grupo.")
            return bad, hint
    if not torch.allclose(s.float(), s_ref.float(), rtol=1e-6, atol=0.0):
        r, c = [int(x) for x in (~torch.isclose(s.float(), s_ref.float(), rtol=1e-6,
                                                atol=0.0)).nonzero()[0]]
        amax = float(w[r, c * g:(c + 1) * g].abs().max())
        e, got_s = float(s_ref[r, c]), float(s[r, c])
        problem = (f"escala del grupo {c + 1} de la fila {r + 1}: se esperaba {es_sig(e)} y se "
                   f"obtuvo {es_sig(got_s)}.")
        if math.isclose(got_s, amax / 8, rel_tol=1e-6) or math.isclose(got_s, amax / 15,
                                                                        rel_tol=1e-6):
            return problem, ("Con 4 bits simétricos el lado positivo llega a 7: el máximo "
                             "absoluto del grupo corresponde a 7 (el −8 solo lo alcanza el "
                             "redondeo).")
        return problem, "La escala de un grupo es su máximo absoluto entre 7."
    u, u_ref = _unpacked(packed), _unpacked(packed_ref)
    if torch.equal(u, u_ref):
        return None
    swapped = torch.stack((packed & 15, packed >> 4), dim=-1).reshape(N, -1).to(torch.int32)
    r, c = [int(x) for x in (u != u_ref).nonzero()[0]]
    problem = (f"el entero de la fila {r + 1}, columna {c + 1} guardado en el byte {c // 2 + 1} "
               f"es {int(u[r, c])} y se esperaba {int(u_ref[r, c])} (peso "
               f"{es_sig(float(w[r, c]))}).")
    if torch.equal(swapped, u_ref):
        return problem, ("Los nibbles están intercambiados: la columna par va en los 4 bits altos "
                         "del byte y la impar en los bajos.")
    if torch.equal((u + 8) % 16, u_ref):
        return problem, ("Guarde cada entero q (de −8 a 7) desplazado en 8, como q + 8 (de 0 a "
                         "15): un nibble no tiene signo.")
    if int((u - u_ref).abs().max()) == 1:
        return problem, "Redondee al entero más cercano y recorte a [−8, 7] antes de desplazar."
    return problem, ("Cada entero es el peso entre la escala de su grupo, redondeado, recortado a "
                     "[−8, 7] y desplazado en 8; dos por byte, la columna par en los bits altos.")


@self_check
def check_quantize_int4_groups(fn: Callable, seed: int = 0, model=None,
                               raise_on_fail: bool = True) -> CheckResult:
    """``fn(w, group_size) -> (packed uint8 [N, K / 2], scale [N, K / group_size])`` as
    ``reference_quantize_int4_groups``; a ``group_size`` that does not divide ``K`` raises
    ValueError; with ``model``, also inside it (groups of 64)."""
    name = "int4 por grupos, dos por byte"
    cases = int4_cases(seed)
    for i, (label, w, g) in enumerate(cases):
        got, crash = call_student(name, fn, w.clone(), g)
        if crash:
            return failed(name, i, label, crash)
        wrong = compare_int4(got, w, g)
        if wrong:
            return failed(name, i, label, *wrong)
    for j, (shape, g) in enumerate(BAD_GROUPS):
        i = len(cases) + j
        label = f"matriz {shape[0]} × {shape[1]} con grupos de {g}: {g} no divide {shape[1]}"
        try:
            got = fn(_seeded(seed + 40 + j, shape), g)
        except NotImplementedError:
            raise
        except ValueError:
            continue
        except Exception as err:  # noqa: BLE001 - the wrong kind of error is a finding
            return failed(name, i, label, f"su función lanzó {type(err).__name__}: {err}",
                          "Ante un tamaño de grupo que no divide la fila, lance "
                          "ValueError con un mensaje que lo diga.")
        return failed(name, i, label, f"se esperaba ValueError y su función devolvió "
                      f"{es_value(type(got).__name__)}.",
                      "Compruebe antes de cuantizar que group_size divide el número de "
                      "columnas; si no, lance ValueError con un mensaje que lo diga.")
    n = len(cases) + len(BAD_GROUPS)
    if model is not None:
        return _in_model(name, fn, model, "int4-g64", n, group_size=64, seed=seed)
    return passed(name, n)


# --- (c) the step a weight format allows ------------------------------------------------------

def predict_cases(seed: int = 0) -> list[tuple]:
    """(config, weight_format, dtype, context_len, bandwidth, overhead)."""
    rng = np.random.default_rng(seed)
    combos = [("llama-3.1-8b", None, "bf16"), ("llama-3.1-8b", "int8", "bf16"),
              ("llama-3.1-8b", "int4-g128", "bf16"), ("llama-3.1-8b", "int4-asym-g64", "fp16"),
              ("qwen3-0.6b", "int4-g32", "bf16"), ("cpu-200m", "int8", "fp32"),
              ("cpu-200m", "int4-g128", "bf16"), ("tiny-es", "int4-asym-g32", "bf16"),
              ("tiny-es", None, "fp32"), ("smollm2-135m", "int4-g64", "fp16"),
              ("llama-2-7b", "int4-asym-g128", "fp16")]
    cases = []
    for name, fmt, dtype in combos:
        ctx = int(rng.integers(0, 4000))
        bw = float(rng.choice([20e9, 300e9, 3.35e12]))
        overhead = float(rng.choice([0.0, 2e-4, 5e-3]))
        cases.append((get_preset(name), fmt, dtype, ctx, bw, overhead))
    return cases


def _bytes_variants(config: ModelConfig, fmt: str | None, dtype: str, ctx: int) -> dict[str, float]:
    """The bytes a step reads, right and with each plausible mistake (for the hints)."""
    b = dtype_bytes(dtype)
    shapes = linear_shapes(config)
    n_linear = sum(o * k for _, o, k in shapes)
    kv = kv_bytes_per_token(config, dtype)
    rest = unquantized_params(config) * b
    row = config.hidden_size * b
    table = config.vocab_size * config.hidden_size * b
    if fmt is None:
        ints, scales = n_linear * b, 0.0
        per_weight_int = b
    else:
        f = parse_weight_format(fmt)
        ints = n_linear * f.bytes_per_weight
        scales = sum(f.linear_bytes(o, k, dtype) for _, o, k in shapes) - ints
        per_weight_int = f.bytes_per_weight
    right = ints + scales + rest + row + kv * (ctx + 1)
    out = {"right": right, "no_scales": right - scales,
           "no_kv": right - kv * (ctx + 1), "kv_ctx": right - kv,
           "table": right - row + table}
    if fmt is not None and per_weight_int == 0.5:
        out["int4_one_byte"] = right + ints
    if fmt is not None and not parse_weight_format(fmt).symmetric:
        out["no_zeros"] = right - scales / 2
    return out


def _predict_hint(got: float, config, fmt, dtype, ctx, bw, overhead) -> str:
    v = _bytes_variants(config, fmt, dtype, ctx)

    def t(key: str) -> float:
        return v[key] / bw + overhead

    def close(a: float, b: float) -> bool:
        return math.isclose(a, b, rel_tol=1e-8)

    if close(got, 1e3 * t("right")):
        return "Su resultado está en milisegundos: devuelva segundos."
    if overhead > 0 and close(got, v["right"] / bw):
        return "Falta sumar overhead_s, el tiempo fijo de cada paso."
    messages = {
        "no_scales": ("Faltan las escalas: cada grupo (o fila, en int8) guarda una escala en el "
                      "dtype de las activaciones, y se lee con sus enteros."),
        "no_zeros": ("En el formato asimétrico cada grupo guarda, además de su escala, un cero; "
                     "los dos se leen."),
        "int4_one_byte": "Un entero de 4 bits ocupa medio byte: dos comparten cada byte.",
        "no_kv": ("Falta la caché KV: el paso lee las claves y los valores de todo el contexto, "
                  "en el dtype indicado."),
        "kv_ctx": ("La caché que lee el paso incluye el token nuevo: context_len + 1 posiciones."),
        "table": ("De la tabla de embeddings el paso lee una sola fila (la del token); la matriz "
                  "de salida (lm_head) es una capa lineal más y va en el formato."),
    }
    for key, text in messages.items():
        if key in v and close(got, t(key)):
            return text
    return ("Sume los bytes de cada capa lineal en el formato (enteros y, por grupo, escala y, "
            "si es asimétrico, cero), los demás parámetros y una fila de embeddings en el "
            "dtype, y la caché de context_len + 1 tokens; divida entre el ancho de banda y sume el "
            "overhead.")


@self_check
def check_predict_step_s(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(config, weight_format, dtype, context_len, bandwidth_bytes_per_s, overhead_s) ->
    seconds``, as ``reference.quantization.reference_predict_step_s``."""
    name = "tiempo de un paso según los bytes del formato"
    cases = predict_cases(seed)
    for i, (config, fmt, dtype, ctx, bw, overhead) in enumerate(cases):
        label = (f"{config.name}, formato {fmt or 'sin cuantizar'}, {dtype}, contexto {ctx}, "
                 f"{es_sig(bw / 1e9)} GB/s, overhead {es_sig(1e3 * overhead)} ms")
        expected = reference_predict_step_s(config, fmt, dtype, ctx, bw, overhead)
        got, crash = call_student(name, fn, config, fmt, dtype, ctx, bw, overhead)
        if crash:
            return failed(name, i, label, crash)
        if not isinstance(got, (int, float, np.number)) or isinstance(got, (bool, np.bool_)):
            return failed(name, i, label, f"devolvió {es_value(got)}; se espera un número "
                          "de segundos.")
        if not math.isclose(float(got), expected, rel_tol=1e-6):
            return failed(name, i, label, f"se esperaban {es_sig(1e3 * expected)} ms y "
                          f"su función dio {es_sig(1e3 * float(got))} ms.",
                          _predict_hint(float(got), config, fmt, dtype, ctx, bw, overhead))
    return passed(name, len(cases))
