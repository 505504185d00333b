"""Self-checks of the memory-roofline lab (chapter 1).

Three exercises, each checked against the library's cost model (``ai_evolution.sim``):

(a) ``check_decode_roofline``: the bytes, FLOPs, intensity and bandwidth floor of one decode step;
(b) ``check_predict_step``: the time a step takes, ``max(bytes / BW, flops / peak) + overhead``,
    which of the two floors binds, and the intensity at which they cross (the ridge point);
(c) ``check_departure_batch``: the roofline prediction calibrated on the smallest batch, and the
    first batch size where the measured curve leaves it.

Failure messages carry the second tier of each exercise's hint ("Pista: ..."): which quantity is
off and why, in words, never the code line (the first tier is the notebook's NotImplementedError).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..fmt import es, es_sig, es_value
from ..hardware import DEVICE_PRESETS
from ..model import ModelConfig, dtype_bytes, get_preset, kv_bytes_per_token
from ..reference.roofline import (calibrated_prediction, reference_decode_roofline,  # noqa: F401
                                  reference_departure_batch, reference_predict_step)
from ..sim import decode_step_cost, matmul_params, step_cost
from ..sim import departure_batch as departure_from_prediction
from . import CheckResult, call_student, failed, passed, self_check

DTYPES = ("bf16", "fp16", "fp32", "int8")
PRESETS = ("llama-2-7b", "llama-3.1-8b", "llama-3.1-70b", "mistral-7b-v0.3", "qwen3-0.6b",
           "smollm2-135m", "qwen2.5-0.5b", "cpu-200m")
REL_TOL = 1e-6
_HINT_TOL = 1e-8  # a wrong formula reproduced exactly: only float rounding separates it


def _num(x: float, digits: int = 7) -> str:
    """``x`` with about ``digits`` significant digits, decimal comma; powers of ten when extreme."""
    return es_sig(x, digits)


def _is_number(x) -> bool:
    return isinstance(x, (int, float, np.number)) and not isinstance(x, (bool, np.bool_))


def _close(a: float, b: float, rel_tol: float = _HINT_TOL) -> bool:
    return math.isclose(a, b, rel_tol=rel_tol, abs_tol=0.0)


# --- (a) bytes, FLOPs and the floor of one decode step -----------------------------------------

def decode_roofline_cases(seed: int = 0) -> list[tuple[ModelConfig, str, int, int, str]]:
    """(config, dtype, batch_size, context_len, device preset). The first cases are chosen so that
    each common mistake shows a distinct signature; the rest are seeded, one per preset."""
    fixed = [("llama-2-7b", "bf16", 8, 1024, "h100-sxm"),   # untied, batch > 1, long context
             ("qwen3-0.6b", "fp16", 8, 512, "l4"),           # tied embeddings
             ("smollm2-135m", "fp32", 64, 100, "t4"),
             ("llama-3.1-8b", "int8", 64, 8192, "h200"),
             ("cpu-200m", "bf16", 1, 0, "apple-m5-pro-laptop")]
    rng = np.random.default_rng(seed)
    devices = sorted(DEVICE_PRESETS)
    seeded = [(name, str(rng.choice(DTYPES)), int(rng.choice([1, 8, 64])),
               int(rng.integers(0, 8193)), str(rng.choice(devices))) for name in PRESETS]
    return [(get_preset(n), d, b, c, dev) for n, d, b, c, dev in fixed + seeded]


@self_check
def check_decode_roofline(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(config, dtype, batch_size, context_len, bandwidth_bytes_per_s) -> dict`` with keys
    ``bytes``, ``flops``, ``intensity`` and ``floor_s``, as ``reference_decode_roofline``."""
    name = "bytes, FLOP y suelo de un paso de decodificación"
    cases = decode_roofline_cases(seed)
    keys = ("bytes", "flops", "intensity", "floor_s")
    for i, (config, dtype, batch, ctx, device) in enumerate(cases):
        bw = DEVICE_PRESETS[device].bandwidth_bytes_per_s
        expected = reference_decode_roofline(config, dtype, batch, ctx, bw)
        label = (f"{config.name}, {dtype}, lote {batch}, contexto {ctx}, ancho de banda "
                 f"{es(bw / 1e9, 0)} GB/s ({device})")
        got, crash = call_student(name, fn, config, dtype, batch, ctx, bw)
        if crash:
            return failed(name, i, label, crash)
        if not isinstance(got, dict) or any(k not in got for k in keys):
            return failed(name, i, label, f"se espera un dict con las claves "
                          f"{', '.join(keys)}; se obtuvo {es_value(got)}.")
        for key in keys:
            value = got[key]
            if not _is_number(value):
                return failed(name, i, label, f"{key}: devolvió {es_value(value)} "
                              f"({type(value).__name__}); se espera un número.")
            g, e = float(value), expected[key]
            # intensity and floor derive from bytes and flops, each already within REL_TOL
            tol = REL_TOL if key in ("bytes", "flops") else 3 * REL_TOL
            if not math.isclose(g, e, rel_tol=tol):
                hint = _roofline_hint(key, g, config, dtype, batch, ctx, bw, expected)
                return failed(name, i, label, f"{key}: se esperaba {_num(e)}"
                              f"{_UNITS[key]} y su función devolvió {_num(g)}"
                              f"{_UNITS[key]}.", hint)
    return passed(name, len(cases))


_UNITS = {"bytes": " bytes", "flops": " FLOP", "intensity": " FLOP/byte", "floor_s": " s"}


def _roofline_hint(key: str, got: float, config: ModelConfig, dtype: str, batch: int, ctx: int,
                   bw: float, expected: dict) -> str:
    b = dtype_bytes(dtype)
    h, vocab = config.hidden_size, config.vocab_size
    cost = decode_step_cost(config, batch, ctx, dtype)
    kv_token = kv_bytes_per_token(config, dtype)
    table = vocab * h * b
    if key == "bytes":
        e = expected["bytes"]
        if not config.tie_word_embeddings and _close(got, e + (vocab - batch) * h * b):
            return ("La tabla de embeddings no se multiplica: cada token del lote lee solo su "
                    "fila, no la tabla entera. Solo un modelo con embeddings atados la lee "
                    "entera, porque es también su lm_head.")
        if config.tie_word_embeddings and _close(got, e - table):
            return ("Este modelo ata los embeddings (tie_word_embeddings): la misma tabla es su "
                    "lm_head, y el último matmul la lee entera en cada paso.")
        if not config.tie_word_embeddings and _close(got, e - table):
            return ("Falta el lm_head: una matriz de vocabulario por dimensión oculta que el "
                    "último matmul lee entera en cada paso.")
        if _close(got, e - cost.kv_bytes):
            return ("Sus bytes son solo los de los pesos: un paso de decodificación lee también "
                    "la caché KV entera de cada secuencia del lote.")
        if batch > 1 and _close(got, e - cost.kv_bytes * (batch - 1) / batch):
            return ("Contó la caché KV de una sola secuencia: cada secuencia del lote tiene la "
                    "suya (los pesos, en cambio, se leen una sola vez por paso para todo el lote).")
        if _close(got, e - batch * kv_token):
            return ("Le falta una posición de caché por secuencia: el token nuevo también se "
                    "atiende a sí mismo, así que se leen las posiciones anteriores y la suya.")
        if _close(got, e - batch * h * b):
            return "Falta la fila de la tabla de embeddings que lee cada token del lote."
        if batch > 1 and _close(got, e + (batch - 1) * cost.weight_bytes):
            return ("Contó los pesos una vez por secuencia: se leen una sola vez por paso, "
                    "compartidos por todo el lote; lo que crece con el lote es la caché KV.")
        if _close(got, 8 * e):
            return "Sus bytes son 8 veces los esperados: el resultado parece estar en bits."
        return ("Los bytes de un paso son los pesos que lee (cada uno una vez, una fila de "
                "embeddings por token) más la caché KV de todas las secuencias; revise también "
                f"los bytes por elemento de {dtype} ({es(b, 0)}).")
    if key == "flops":
        e = expected["flops"]
        matmul = 2 * matmul_params(config) * batch
        attn = e - matmul
        if _close(got, e / 2) or _close(got, matmul / 2 + attn):
            return ("Sus FLOP de matmul son la mitad: cada peso hace dos operaciones por token, "
                    "una multiplicación y una suma.")
        if _close(got, matmul):
            return ("Faltan los FLOP de la atención: cada token nuevo compara su consulta con "
                    "todas las claves que atiende y mezcla otros tantos valores, en cada capa y "
                    "cada cabeza.")
        if _close(got, e + 2 * vocab * h * batch):
            return ("La tabla de embeddings no entra en un matmul: leer una fila no hace FLOP. "
                    "Cuente solo los pesos de atención, MLP y lm_head.")
        if _close(got, e - 4 * config.num_layers * config.num_heads * config.head_dim * batch):
            return ("Le falta una posición atendida por secuencia: cada token nuevo atiende a las "
                    "anteriores y a la suya.")
        return ("Los FLOP de un paso son los de los matmul (dos por peso y por token del lote) "
                "más los de la atención sobre todas las posiciones atendidas.")
    if key == "intensity":
        if _close(got, 1 / expected["intensity"], 1e-5):
            return ("La intensidad aritmética son FLOP por byte leído: su resultado es el "
                    "inverso.")
        return "La intensidad es el cociente entre los FLOP y los bytes del mismo paso."
    # floor_s
    e = expected["floor_s"]
    ratio = got / e if e else float("nan")
    if math.isclose(ratio, 8, rel_tol=1e-5):
        return ("Su suelo es 8 veces el esperado: parece calculado en bits, y el ancho de banda "
                "está en bytes por segundo.")
    if math.isclose(ratio, 1e-9, rel_tol=1e-5) or math.isclose(ratio, 1e9, rel_tol=1e-5):
        return ("Mezcla de unidades: los bytes y el ancho de banda deben ir en las mismas "
                "unidades (bytes y bytes por segundo, no GB ni GB/s solo en uno de los dos).")
    if math.isclose(ratio, 1e3, rel_tol=1e-5):
        return "El suelo va en segundos, no en milisegundos."
    if _close(got, cost.weight_bytes / bw, 1e-5):
        return "El suelo usa todos los bytes del paso: pesos y caché KV."
    return ("El suelo es lo que tarda en leerse todo lo que el paso lee al ancho de banda dado, "
            "en segundos.")


# --- (b) the time of a step ---------------------------------------------------------------------

PREDICT_KEYS = ("time_s", "bound", "ridge_intensity")
BOUNDS = ("memory", "compute")
_BOUND_ES = {"memory": "la memoria", "compute": "el cálculo"}


def predict_step_cases(seed: int = 0) -> list[tuple[str, float, float, float, float, float]]:
    """(label, bytes, flops, bandwidth, peak, overhead): decodes (bandwidth-bound), long
    prefills (compute-bound), then seeded ones."""
    rows = [("llama-3.1-8b", "bf16", "decode", 1, 1024, "h100-sxm", 3e-5),
            ("llama-3.1-8b", "bf16", "prefill", 1, 4096, "h100-sxm", 0.0),
            ("qwen3-0.6b", "fp16", "decode", 64, 2048, "l4", 1.2e-3),
            ("llama-2-7b", "fp16", "prefill", 1, 4096, "a100-80gb", 5e-4),
            ("smollm2-135m", "fp32", "decode", 8, 0, "t4", 0.0),
            ("mistral-7b-v0.3", "int8", "decode", 64, 8192, "h200", 2e-5)]
    cases = []
    for preset, dtype, kind, batch, ctx, device, overhead in rows:
        config, spec = get_preset(preset), DEVICE_PRESETS[device]
        if kind == "decode":
            cost = decode_step_cost(config, batch, ctx, dtype)
            what = f"decodificación de {preset} ({dtype}), lote {batch}, contexto {ctx}"
        else:
            cost = step_cost(config, [ctx], [ctx], dtype)
            what = f"prefill de {ctx} tokens de {preset} ({dtype})"
        cases.append((f"{what} en {device}, sobrecarga {es(overhead * 1e3, 3)} ms", cost.bytes,
                      cost.flops, spec.bandwidth_bytes_per_s, spec.peak_flops[dtype], overhead))
    rng = np.random.default_rng(seed)
    for j in range(4):
        n_bytes = float(round(10 ** rng.uniform(6, 11)))
        intensity = float(10 ** rng.uniform(-1, 4))
        bw = float(10 ** rng.uniform(11, 13))
        peak = bw * float(10 ** rng.uniform(1, 3))
        overhead = float(rng.choice([0.0, 1e-5, 4e-4, 2e-3]))
        cases.append((f"caso aleatorio {j + 1}: {_num(n_bytes, 4)} bytes, intensidad "
                      f"{_num(intensity, 4)} FLOP/byte, punto de cresta {_num(peak / bw, 4)} "
                      f"FLOP/byte, sobrecarga {es(overhead * 1e3, 3)} ms",
                      n_bytes, n_bytes * intensity, bw, peak, overhead))
    return cases


def compare_predict(got, n_bytes: float, flops: float, bw: float, peak: float,
                    overhead: float) -> tuple[str, str] | None:
    """``(problem, hint)`` for the first thing ``got`` gets wrong against the reference, or None."""
    expected = reference_predict_step(n_bytes, flops, bw, peak, overhead)
    if not isinstance(got, dict) or any(k not in got for k in PREDICT_KEYS):
        return (f"se espera un dict con las claves {', '.join(PREDICT_KEYS)}; se obtuvo "
                f"{es_value(got)}.", "")
    t = got["time_s"]
    if not _is_number(t):
        return (f"time_s: devolvió {es_value(t)} ({type(t).__name__}); se espera un número de "
                "segundos.", "")
    if not math.isclose(float(t), expected["time_s"], rel_tol=REL_TOL):
        return (f"time_s: se esperaban {_num(expected['time_s'])} s y su función devolvió "
                f"{_num(float(t))} s.", _time_hint(float(t), n_bytes, flops, bw, peak, overhead))
    if got["bound"] not in BOUNDS:
        return (f"bound: devolvió {es_value(got['bound'])}; se espera «memory» o «compute».",
                "Diga con una de esas dos palabras cuál de los dos límites manda en el paso.")
    if got["bound"] != expected["bound"]:
        t_mem, t_comp = n_bytes / bw, flops / peak
        hint = ("A igualdad de los dos tiempos el paso todavía no está limitado por el cálculo: "
                "diga «memory»." if t_mem == t_comp else
                f"Manda el límite que más tarda: aquí leer los bytes tarda {_num(t_mem, 4)} s y "
                f"hacer los FLOP, {_num(t_comp, 4)} s.")
        return (f"bound: se esperaba «{expected['bound']}» ({_BOUND_ES[expected['bound']]}) y su "
                f"función devolvió «{got['bound']}».", hint)
    r = got["ridge_intensity"]
    if not _is_number(r):
        return (f"ridge_intensity: devolvió {es_value(r)} ({type(r).__name__}); se espera un "
                "número de FLOP por byte.", "")
    e = expected["ridge_intensity"]
    if not math.isclose(float(r), e, rel_tol=REL_TOL):
        if _close(float(r), 1 / e, 1e-6):
            hint = ("Su resultado es el inverso: el punto de cresta se mide en FLOP por byte, "
                    "los FLOP que hay que hacer por cada byte leído para que el cálculo tarde "
                    "lo mismo que la lectura.")
        elif n_bytes and _close(float(r), flops / n_bytes, 1e-6):
            hint = ("Esa es la intensidad del paso. El punto de cresta es de la máquina: no "
                    "depende de los bytes ni de los FLOP del paso, solo de su pico y su ancho "
                    "de banda.")
        else:
            hint = ("El punto de cresta es la intensidad (FLOP por byte) a la que leer y "
                    "calcular tardan lo mismo en esta máquina.")
        return (f"ridge_intensity: se esperaban {_num(e)} FLOP/byte y su función devolvió "
                f"{_num(float(r))} FLOP/byte.", hint)
    return None


@self_check
def check_predict_step(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(step_bytes, step_flops, bandwidth_bytes_per_s, peak_flops, overhead_s) -> dict``
    with ``time_s``, ``bound`` and ``ridge_intensity``, as ``reference_predict_step``."""
    name = "tiempo de un paso según el roofline"
    cases = predict_step_cases(seed)
    for i, (label, n_bytes, flops, bw, peak, overhead) in enumerate(cases):
        got, crash = call_student(name, fn, n_bytes, flops, bw, peak, overhead)
        if crash:
            return failed(name, i, label, crash)
        wrong = compare_predict(got, n_bytes, flops, bw, peak, overhead)
        if wrong:
            return failed(name, i, label, *wrong)
    return passed(name, len(cases))


def _time_hint(got: float, n_bytes: float, flops: float, bw: float, peak: float,
               overhead: float) -> str:
    t_mem, t_comp = n_bytes / bw, flops / peak
    slow = "la memoria" if t_mem >= t_comp else "el cómputo"
    if _close(got, t_mem + t_comp + overhead) or _close(got, t_mem + t_comp):
        return ("Los dos límites no se suman: leer y calcular se solapan, y el paso tarda lo que "
                "el más lento de los dos, más la sobrecarga.")
    if _close(got, min(t_mem, t_comp) + overhead) or _close(got, min(t_mem, t_comp)):
        return (f"Su resultado es el límite más rápido de los dos; en este caso manda {slow}: "
                "el paso no termina antes de que acabe lo más lento.")
    if overhead > 0 and _close(got, max(t_mem, t_comp)):
        return ("Falta sumar overhead_s, la sobrecarga: el tiempo fijo que el motor añade a "
                "cada paso.")
    if t_comp > t_mem and (_close(got, t_mem + overhead) or _close(got, t_mem)):
        return ("Solo cuenta la memoria: en este paso hacer los FLOP tarda más que leer los "
                "bytes, y manda el cómputo.")
    return ("El tiempo es el del límite más lento (leer los bytes al ancho de banda o hacer los "
            "FLOP al pico), más la sobrecarga, en segundos.")


# --- (c) the prediction calibrated on the smallest batch, and where the measurement leaves it ---

def _costs(config: ModelConfig, dtype: str, batches: list[int], ctx: int) -> list[dict]:
    return [{"bytes": c.bytes, "flops": c.flops}
            for c in (decode_step_cost(config, b, ctx, dtype) for b in batches)]


def departure_cases(seed: int = 0) -> list[tuple[str, list[int], list[float], list[dict], float,
                                                 float, float]]:
    """(label, batch_sizes, measured_s, step_costs, bandwidth, peak, tolerance): seeded curves
    built on the calibrated prediction, each meant to expose one mistake."""
    rng = np.random.default_rng(seed)
    cases = []
    cpu = get_preset("cpu-200m")
    bw, peak = float(rng.uniform(15e9, 40e9)), float(rng.uniform(2e11, 8e11))

    def measured(batches, costs, factors, overhead):
        pred = calibrated_prediction([0.0], costs, bw, peak, "none")
        return [(p + overhead) * f for p, f in zip(pred, factors)]

    # 1. On the calibrated prediction (within the tolerance) up to a knee, then rising.
    batches = [1, 2, 4, 8, 16, 32, 64, 128]
    costs = _costs(cpu, "fp32", batches, 64)
    overhead = float(rng.uniform(2e-3, 8e-3))
    knee = int(rng.integers(3, 6))
    factors = [1.0] + [1 + float(rng.uniform(0, 0.05)) if k < knee else 1.3 + 0.5 * (k - knee)
                       for k in range(1, len(batches))]
    cases.append(("medida sobre la predicción calibrada hasta un lote, después más lenta",
                  batches, measured(batches, costs, factors, overhead), costs, bw, peak, 0.1))
    # 2. Never departs: the measurement follows the prediction, compute-bound batches included.
    factors = [1.0] + [1 + float(rng.uniform(-0.05, 0.08)) for _ in batches[1:]]
    cases.append(("la medida nunca se aparta", batches,
                  measured(batches, costs, factors, overhead), costs, bw, peak, 0.1))
    # 3. The batch-1 step measured below its roofline: the calibrated overhead is zero.
    batches3 = [1, 2, 4, 8]
    costs3 = _costs(cpu, "fp32", batches3, 32)
    roof = calibrated_prediction([0.0], costs3, bw, peak, "none")
    meas = [0.8 * roof[0]] + [r * (1 + float(rng.uniform(0.0, 0.04))) for r in roof[1:]]
    cases.append(("el lote 1 mide menos que su roofline (un ancho de banda subestimado)",
                  batches3, meas, costs3, bw, peak, 0.1))
    # 4. Departs, dips back within the tolerance, departs again: the first departure counts.
    first = int(rng.integers(2, 5))
    factors = [1.0] + [1.25 + 0.3 * max(0, k - first - 2) if k == first or k >= first + 2
                       else 1 + float(rng.uniform(0, 0.05)) for k in range(1, len(batches))]
    cases.append(("se aparta, vuelve a quedar dentro de la tolerancia y se aparta de nuevo",
                  batches, measured(batches, costs, factors, overhead), costs, bw, peak, 0.1))
    # 5. Exactly at the boundary (dyadic numbers, exact in binary): equal is not beyond.
    #    Reading takes 2**-7 s at every batch; computing takes 2**-6 s at 8 and 2**-5 s at 16.
    b5 = [1, 2, 4, 8, 16]
    costs5 = [{"bytes": 2.0**23, "flops": f} for f in (2.0**30, 2.0**31, 2.0**32, 2.0**34,
                                                       2.0**35)]
    u = 2.0**-8  # measured batch 1: 3u, so the overhead is u and the predictions 3u, 3u, 3u, 5u, 9u
    meas5 = [3 * u, 3.75 * u, 3.5 * u, 6.25 * u, 12 * u]
    cases.append(("medida exactamente en el límite de la tolerancia en los lotes 2 y 8", b5,
                  meas5, costs5, 2.0**30, 2.0**40, 0.25))
    # 6. Irregular batch sizes, a long context, a tolerance of zero.
    b6 = [1, 3, 5, 12, 24, 48, 96]
    costs6 = _costs(get_preset("qwen2.5-0.5b"), "bf16", b6, 512)
    cut = int(rng.integers(2, 6))
    factors = [1.0] + [1 - float(rng.uniform(0.001, 0.02)) if k < cut else 1.01
                       for k in range(1, len(b6))]
    cases.append(("lotes irregulares, contexto largo, tolerancia 0", b6,
                  measured(b6, costs6, factors, overhead), costs6, bw, peak, 0.0))
    return cases


@self_check
def check_departure_batch(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(batch_sizes, measured_s, step_costs, bandwidth_bytes_per_s, peak_flops, tolerance)
    -> int | None``, as ``reference_departure_batch``."""
    name = "lote en que la medida se aparta del roofline"
    for i, (what, batches, meas, costs, bw, peak, tol) in enumerate(departure_cases(seed)):
        expected = reference_departure_batch(batches, meas, costs, bw, peak, tol)
        label = (f"{what}; lotes {batches}, ancho de banda {_num(bw / 1e9, 4)} GB/s, pico "
                 f"{_num(peak / 1e9, 4)} GFLOP/s, tolerancia {es(tol, 2)}")
        got, crash = call_student(name, fn, list(batches), list(meas), [dict(c) for c in costs],
                                  bw, peak, tol)
        if crash:
            return failed(name, i, label, crash)
        ok_type = got is None or (_is_number(got) and float(got).is_integer())
        if not ok_type:
            return failed(name, i, label, f"devolvió {es_value(got)} "
                          f"({type(got).__name__}); se espera un tamaño de lote (int) o "
                          "None.")
        if got != expected:
            shown = "None" if expected is None else str(expected)
            hint = _departure_hint(got, expected, batches, meas, costs, bw, peak, tol)
            return failed(name, i, label, f"se esperaba {shown} y su función devolvió "
                          f"{es_value(got)}.", hint)
    return passed(name, len(departure_cases(seed)))


def _first(batches, flags):
    return next((b for b, f in zip(batches, flags) if f), None)


def _departure_hint(got, expected, batches, meas, costs, bw, peak, tol) -> str:
    pred = calibrated_prediction(meas, costs, bw, peak)
    beyond = [m > p * (1 + tol) for m, p in zip(meas, pred)]
    if expected is not None and got == batches.index(expected) and got != expected:
        return "Devolvió la posición en la lista; se pide el tamaño de lote."
    if got == departure_from_prediction(batches, meas, calibrated_prediction(
            meas, costs, bw, peak, "none"), tol):
        return ("Su predicción no lleva sobrecarga. Calíbrela con el primer lote: lo que su paso "
                "medido tarda de más sobre su roofline es un tiempo fijo por paso, y se suma a "
                "la predicción de todos los lotes.")
    if got == departure_from_prediction(batches, meas, calibrated_prediction(
            meas, costs, bw, peak, "signed"), tol):
        return ("El primer lote mide menos que su roofline: la sobrecarga calibrada es cero, no "
                "negativa, porque un tiempo fijo por paso no puede restar.")
    if got == departure_from_prediction(batches, meas, calibrated_prediction(
            meas, costs, bw, peak, memory_only=True), tol):
        return ("Su predicción solo cuenta la memoria: en los lotes grandes hacer los FLOP "
                "puede tardar más que leer los bytes, y entonces manda el cálculo.")
    if got is not None and expected is None and not any(beyond):
        return "Si ninguna medida supera la tolerancia, devuelva None (no 0 ni −1)."
    if got == _first(batches, [m >= p * (1 + tol) for m, p in zip(meas, pred)]):
        return ("Una medida exactamente igual al límite de la tolerancia todavía está dentro: "
                "se pide superarlo.")
    if got == _first(batches, [m - p > tol for m, p in zip(meas, pred)]):
        return ("La tolerancia es relativa, una fracción de la predicción, no una cantidad de "
                "segundos.")
    last = _first(batches[::-1], beyond[::-1])
    stays = next((b for k, b in enumerate(batches) if all(beyond[k:])), None)
    if got is not None and got in (last, stays):
        return ("Se pide el PRIMER lote que se aparta, aunque después la medida vuelva a quedar "
                "dentro de la tolerancia.")
    if got is not None and got == _first(batches, [p > m * (1 + tol)
                                                   for m, p in zip(meas, pred)]):
        return "Se busca una medida MÁS LENTA que la predicción, no más rápida."
    return ("Calibre la sobrecarga con el primer lote, prediga cada lote con ella y busque, en "
            "orden, el primer lote cuya medida supera su predicción en más de la tolerancia "
            "relativa.")
