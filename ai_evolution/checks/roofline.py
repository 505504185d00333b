"""Self-checks of the memory-roofline lab (chapter 1).

Three exercises, each checked against the library's cost model (``ai_evolution.sim``):

(a) ``check_decode_roofline``: the bytes, FLOPs, intensity and bandwidth floor of one decode step;
(b) ``check_predict_step``: the time a step takes, ``max(bytes / BW, flops / peak) + overhead``;
(c) ``check_departure_batch``: the first batch size where a measured curve leaves the prediction.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..fmt import es
from ..hardware import DEVICE_PRESETS
from ..model import ModelConfig, dtype_bytes, get_preset, kv_bytes_per_token
from ..sim import (RooflineCostModel, StepCost, decode_step_cost, matmul_params, step_cost,
                   time_floor_s)
from ..sim import departure_batch as reference_departure_batch  # the lab uses the same function
from . import CheckResult, call_student, failed, finish, passed

DTYPES = ("bf16", "fp16", "fp32", "int8")
PRESETS = ("llama-2-7b", "llama-3.1-8b", "llama-3.1-70b", "mistral-7b-v0.3", "qwen3-0.6b",
           "smollm2-135m", "qwen2.5-0.5b", "cpu-200m")
REL_TOL = 1e-6
_HINT_TOL = 1e-8  # a wrong formula reproduced exactly: only float rounding separates it


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _num(x: float, digits: int = 7) -> str:
    """``x`` with about ``digits`` significant digits, decimal comma; powers of ten when extreme."""
    x = float(x)
    if x == 0 or not math.isfinite(x):
        return es(x, 0) if x == 0 else str(x)
    e = math.floor(math.log10(abs(x)))
    if -4 <= e < 15:
        return es(x, max(0, digits - 1 - e))
    return f"{es(x / 10**e, digits - 1)} × 10{str(e).translate(_SUPERSCRIPT)}"


def _is_number(x) -> bool:
    return isinstance(x, (int, float, np.number)) and not isinstance(x, (bool, np.bool_))


def _close(a: float, b: float, rel_tol: float = _HINT_TOL) -> bool:
    return math.isclose(a, b, rel_tol=rel_tol, abs_tol=0.0)


# --- (a) bytes, FLOPs and the floor of one decode step -----------------------------------------

def reference_decode_roofline(config: ModelConfig, dtype: str, batch_size: int, context_len: int,
                              bandwidth_bytes_per_s: float) -> dict:
    """The roofline of one decode step: ``batch_size`` sequences each add one token after
    ``context_len`` tokens, weights and KV cache stored at ``dtype``.

    - ``bytes``: every weight read once per step (shared by the whole batch), but only one
      embedding row per token (the table is gathered, not multiplied; a tied table is read whole
      as the lm_head, plus the gathered rows), plus the KV cache of every sequence: its
      ``context_len + 1`` positions (the new token attends to itself too);
    - ``flops``: 2 per matmul weight per token, plus attention (4 x layers x heads x head_dim
      per attended position);
    - ``intensity``: flops / bytes (FLOP per byte);
    - ``floor_s``: bytes / bandwidth, the least time the step can take.
    """
    cost = decode_step_cost(config, batch_size, context_len, dtype)
    return {"bytes": cost.bytes, "flops": cost.flops, "intensity": cost.intensity,
            "floor_s": time_floor_s(cost.bytes, bandwidth_bytes_per_s)}


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


def check_decode_roofline(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(config, dtype, batch_size, context_len, bandwidth_bytes_per_s) -> dict`` with keys
    ``bytes``, ``flops``, ``intensity`` and ``floor_s``, as ``reference_decode_roofline``."""
    name = "techo de memoria de un paso de decodificación"
    cases = decode_roofline_cases(seed)
    keys = ("bytes", "flops", "intensity", "floor_s")
    for i, (config, dtype, batch, ctx, device) in enumerate(cases):
        bw = DEVICE_PRESETS[device].bandwidth_bytes_per_s
        expected = reference_decode_roofline(config, dtype, batch, ctx, bw)
        label = (f"{config.name}, {dtype}, lote {batch}, contexto {ctx}, ancho de banda "
                 f"{es(bw / 1e9, 0)} GB/s ({device})")
        got, crash = call_student(name, fn, config, dtype, batch, ctx, bw)
        if crash:
            return finish(failed(name, i, label, crash), raise_on_fail)
        if not isinstance(got, dict) or any(k not in got for k in keys):
            return finish(failed(name, i, label, f"se espera un dict con las claves "
                                 f"{', '.join(keys)}; se obtuvo {got!r}."), raise_on_fail)
        for key in keys:
            value = got[key]
            if not _is_number(value):
                return finish(failed(name, i, label, f"{key}: devolvió {value!r} "
                                     f"({type(value).__name__}); se espera un número."),
                              raise_on_fail)
            g, e = float(value), expected[key]
            # intensity and floor derive from bytes and flops, each already within REL_TOL
            tol = REL_TOL if key in ("bytes", "flops") else 3 * REL_TOL
            if not math.isclose(g, e, rel_tol=tol):
                hint = _roofline_hint(key, g, config, dtype, batch, ctx, bw, expected)
                return finish(failed(name, i, label, f"{key}: se esperaba {_num(e)}"
                                     f"{_UNITS[key]} y su función devolvió {_num(g)}"
                                     f"{_UNITS[key]}.", hint), raise_on_fail)
    return finish(passed(name, len(cases)), raise_on_fail)


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
            return ("la tabla de embeddings no se multiplica: cada token del lote lee solo su "
                    "fila (batch_size filas por paso), no las vocab_size filas. Solo un modelo "
                    "con embeddings atados lee la tabla entera, porque es también su lm_head.")
        if config.tie_word_embeddings and _close(got, e - table):
            return ("este modelo ata los embeddings (tie_word_embeddings=True): la misma tabla "
                    "es el lm_head, y su matmul la lee entera en cada paso.")
        if not config.tie_word_embeddings and _close(got, e - table):
            return ("falta el lm_head: vocab_size × hidden_size pesos que el último matmul lee "
                    "enteros en cada paso.")
        if _close(got, e - cost.kv_bytes):
            return ("un paso de decodificación lee también la caché KV entera de cada "
                    "secuencia: bytes de KV por token × (context_len + 1) × batch_size.")
        if batch > 1 and _close(got, e - cost.kv_bytes * (batch - 1) / batch):
            return ("contó la caché KV de una sola secuencia: cada una de las batch_size "
                    "secuencias tiene la suya (los pesos, en cambio, se leen una sola vez por "
                    "paso para todo el lote).")
        if _close(got, e - batch * kv_token):
            return ("la caché que se lee tiene context_len + 1 posiciones por secuencia: las "
                    "anteriores y la del token nuevo, que también se atiende a sí mismo.")
        if _close(got, e - batch * h * b):
            return ("falta la fila de la tabla de embeddings que lee cada token del lote "
                    "(batch_size × hidden_size elementos).")
        if batch > 1 and _close(got, e + (batch - 1) * cost.weight_bytes):
            return ("los pesos se leen una sola vez por paso, compartidos por todo el lote; "
                    "lo que crece con batch_size es la caché KV.")
        if _close(got, 8 * e):
            return "el resultado parece estar en bits; se piden bytes."
        return ("bytes = pesos leídos (cada peso una vez, una fila de embeddings por token) + "
                f"caché KV de todas las secuencias; revise también los bytes por elemento de "
                f"{dtype} ({es(b, 0)}).")
    if key == "flops":
        e = expected["flops"]
        matmul = 2 * matmul_params(config) * batch
        attn = e - matmul
        if _close(got, e / 2) or _close(got, matmul / 2 + attn):
            return ("cada peso de un matmul hace 2 FLOP por token: una multiplicación y una "
                    "suma.")
        if _close(got, matmul):
            return ("faltan los FLOP de la atención: cada token nuevo compara su consulta con "
                    "context_len + 1 claves y mezcla otros tantos valores, 4 × capas × cabezas × "
                    "head_dim FLOP por posición atendida.")
        if _close(got, e + 2 * vocab * h * batch):
            return ("la tabla de embeddings no entra en un matmul: leer una fila no hace FLOP. "
                    "Cuente solo los pesos de atención, MLP y lm_head.")
        if _close(got, e - 4 * config.num_layers * config.num_heads * config.head_dim * batch):
            return ("cada token nuevo atiende a context_len + 1 posiciones: las anteriores y la "
                    "suya.")
        return ("flops = 2 × pesos de matmul × batch_size + atención (4 × capas × cabezas × "
                "head_dim × (context_len + 1) por secuencia).")
    if key == "intensity":
        if _close(got, 1 / expected["intensity"], 1e-5):
            return "la intensidad aritmética es flops / bytes (FLOP por byte), no al revés."
        return "intensidad = flops / bytes del mismo paso."
    # floor_s
    e = expected["floor_s"]
    ratio = got / e if e else float("nan")
    if math.isclose(ratio, 8, rel_tol=1e-5):
        return ("el suelo parece calculado en bits: el ancho de banda está en bytes/s, divida "
                "los bytes (no los bits) entre él.")
    if math.isclose(ratio, 1e-9, rel_tol=1e-5) or math.isclose(ratio, 1e9, rel_tol=1e-5):
        return ("mezcla de unidades: pase los bytes y el ancho de banda en las mismas unidades "
                "(bytes y bytes/s, no GB ni GB/s solo en uno de los dos).")
    if math.isclose(ratio, 1e3, rel_tol=1e-5):
        return "floor_s va en segundos, no en milisegundos."
    if _close(got, cost.weight_bytes / bw, 1e-5):
        return "el suelo usa todos los bytes del paso: pesos y caché KV."
    return "floor_s = bytes / ancho de banda, en segundos."


# --- (b) the time of a step ---------------------------------------------------------------------

def reference_predict_step(step_bytes: float, step_flops: float, bandwidth_bytes_per_s: float,
                           peak_flops: float, overhead_s: float) -> float:
    """Seconds one step takes on the roofline: ``max(bytes / BW, flops / peak) + overhead``."""
    model = RooflineCostModel(bandwidth_bytes_per_s, peak_flops, overhead_s)
    return model.step_time_s(StepCost(flops=step_flops, weight_bytes=step_bytes, kv_bytes=0.0))


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
        cases.append((f"{what} en {device}, overhead {es(overhead * 1e3, 3)} ms", cost.bytes,
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
                      f"FLOP/byte, overhead {es(overhead * 1e3, 3)} ms",
                      n_bytes, n_bytes * intensity, bw, peak, overhead))
    return cases


def check_predict_step(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(step_bytes, step_flops, bandwidth_bytes_per_s, peak_flops, overhead_s) -> seconds``,
    as ``RooflineCostModel.step_time_s``."""
    name = "tiempo de un paso según el techo"
    cases = predict_step_cases(seed)
    for i, (label, n_bytes, flops, bw, peak, overhead) in enumerate(cases):
        expected = reference_predict_step(n_bytes, flops, bw, peak, overhead)
        got, crash = call_student(name, fn, n_bytes, flops, bw, peak, overhead)
        if crash:
            return finish(failed(name, i, label, crash), raise_on_fail)
        if not _is_number(got):
            return finish(failed(name, i, label, f"devolvió {got!r} ({type(got).__name__}); "
                                 "se espera un número de segundos."), raise_on_fail)
        if not math.isclose(float(got), expected, rel_tol=REL_TOL):
            hint = _predict_hint(float(got), n_bytes, flops, bw, peak, overhead)
            return finish(failed(name, i, label, f"se esperaban {_num(expected)} s y su función "
                                 f"devolvió {_num(float(got))} s.", hint), raise_on_fail)
    return finish(passed(name, len(cases)), raise_on_fail)


def _predict_hint(got: float, n_bytes: float, flops: float, bw: float, peak: float,
                  overhead: float) -> str:
    t_mem, t_comp = n_bytes / bw, flops / peak
    slow = "la memoria" if t_mem >= t_comp else "el cómputo"
    if _close(got, t_mem + t_comp + overhead) or _close(got, t_mem + t_comp):
        return ("los dos límites no se suman: el paso tarda lo que el más lento, "
                "max(bytes / ancho de banda, flops / pico), más el overhead.")
    if _close(got, min(t_mem, t_comp) + overhead) or _close(got, min(t_mem, t_comp)):
        return (f"su resultado es el límite más rápido de los dos (¿min, o un solo límite?); en "
                f"este caso manda {slow}: el paso tarda lo que el más lento, max(...).")
    if overhead > 0 and _close(got, max(t_mem, t_comp)):
        return "falta sumar overhead_s, el tiempo fijo que el motor añade a cada paso."
    return ("t = max(step_bytes / bandwidth_bytes_per_s, step_flops / peak_flops) + overhead_s, "
            "en segundos.")


# --- (c) where the measurement leaves the prediction ---------------------------------------------

def departure_cases(seed: int = 0) -> list[tuple[str, list[int], list[float], list[float], float]]:
    """(label, batch_sizes, measured_s, predicted_s, tolerance), seeded synthetic curves."""
    rng = np.random.default_rng(seed)
    cases = []
    # 1. Flat prediction; measurement on it (within the tolerance) up to a knee, then rising.
    batches = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    floor = float(rng.uniform(2e-3, 8e-3))
    knee = int(rng.integers(3, 7))
    pred = [floor] * len(batches)
    meas = [p * (1 + float(rng.uniform(0, 0.05))) if k < knee else p * (1.3 + 0.5 * (k - knee))
            for k, p in enumerate(pred)]
    cases.append(("predicción plana, medida que sube a partir de un lote", batches, meas, pred,
                  0.1))
    # 2. Never departs: the prediction rises with the KV cache and the measurement follows it.
    pred = [floor * (1 + 0.002 * b) for b in batches]
    meas = [p * (1 + float(rng.uniform(-0.05, 0.08))) for p in pred]
    cases.append(("la medida nunca se aparta", batches, meas, pred, 0.1))
    # 3. Departs at the first point (a prediction that forgot a fixed overhead).
    batches3 = [4, 8, 16, 32, 64]
    pred = [floor * (1 + 0.001 * b) for b in batches3]
    meas = [p * (1.5 + float(rng.uniform(0, 0.3))) for p in pred]
    cases.append(("se aparta desde el primer punto", batches3, meas, pred, 0.15))
    # 4. Departs, dips back within the tolerance, departs again: the first departure counts.
    pred = [floor] * len(batches)
    first = int(rng.integers(2, 5))
    meas = []
    for k, p in enumerate(pred):
        if k == first or k >= first + 2:
            meas.append(p * (1.25 + 0.3 * max(0, k - first - 2)))
        else:
            meas.append(p * (1 + float(rng.uniform(0, 0.05))))
    cases.append(("se aparta, vuelve a quedar dentro de la tolerancia y se aparta de nuevo",
                  batches, meas, pred, 0.1))
    # 5. Exactly at the boundary (dyadic numbers, exact in binary): equal is not beyond.
    batches5 = [2, 4, 8, 16, 32, 64]
    p = 2.0**-7
    pred = [p] * 6
    meas = [p, 1.125 * p, 1.25 * p, 1.25 * p, 1.5 * p, 2.0 * p]
    cases.append(("medida exactamente en el límite predicted × (1 + tolerance)", batches5, meas,
                  pred, 0.25))
    # 6. Irregular batch sizes, a rising prediction and a tolerance of zero.
    batches6 = [1, 3, 5, 12, 24, 48, 96]
    pred = [floor * (1 + 0.004 * b) for b in batches6]
    cut = int(rng.integers(2, 6))
    meas = [q * (1 - float(rng.uniform(0.001, 0.02))) if k < cut else q * 1.01
            for k, q in enumerate(pred)]
    cases.append(("lotes irregulares, predicción creciente, tolerancia 0", batches6, meas, pred,
                  0.0))
    return cases


def check_departure_batch(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(batch_sizes, measured_s, predicted_s, tolerance) -> int | None``, as
    ``reference_departure_batch``."""
    name = "lote en que la medida se aparta del techo"
    cases = departure_cases(seed)
    for i, (what, batches, meas, pred, tol) in enumerate(cases):
        expected = reference_departure_batch(batches, meas, pred, tol)
        label = f"{what}; lotes {batches}, tolerancia {es(tol, 2)}"
        got, crash = call_student(name, fn, list(batches), list(meas), list(pred), tol)
        if crash:
            return finish(failed(name, i, label, crash), raise_on_fail)
        ok_type = got is None or (_is_number(got) and float(got).is_integer())
        if not ok_type:
            return finish(failed(name, i, label, f"devolvió {got!r} ({type(got).__name__}); se "
                                 "espera un tamaño de lote (int) o None."), raise_on_fail)
        if got != expected:
            shown = "None" if expected is None else str(expected)
            hint = _departure_hint(got, expected, batches, meas, pred, tol)
            return finish(failed(name, i, label, f"se esperaba {shown} y su función devolvió "
                                 f"{got!r}.", hint), raise_on_fail)
    return finish(passed(name, len(cases)), raise_on_fail)


def _first(batches, flags):
    return next((b for b, f in zip(batches, flags) if f), None)


def _departure_hint(got, expected, batches, meas, pred, tol) -> str:
    beyond = [m > p * (1 + tol) for m, p in zip(meas, pred)]
    if got is not None and expected is None:
        return "si ninguna medida supera la tolerancia, devuelva None (no 0 ni −1)."
    if expected is not None and got == batches.index(expected) and got != expected:
        return (f"devolvió la posición en la lista; se pide el tamaño de lote, "
                f"batch_sizes[{got}] = {expected}.")
    if got == _first(batches, [m >= p * (1 + tol) for m, p in zip(meas, pred)]):
        return ("una medida exactamente igual a predicted × (1 + tolerance) todavía está dentro: "
                "use >, no >=.")
    if got == _first(batches, [m - p > tol for m, p in zip(meas, pred)]):
        return ("la tolerancia es relativa: measured > predicted × (1 + tolerance), no "
                "measured − predicted > tolerance (los tiempos están en segundos).")
    last = _first(batches[::-1], beyond[::-1])
    stays = next((b for k, b in enumerate(batches) if all(beyond[k:])), None)
    if got is not None and got in (last, stays):
        return ("se pide el PRIMER lote que se aparta, aunque después la medida vuelva a quedar "
                "dentro de la tolerancia.")
    if got is not None and got == _first(batches, [p > m * (1 + tol)
                                                   for m, p in zip(meas, pred)]):
        return "se busca una medida MÁS LENTA que la predicción: measured > predicted × (1 + tol)."
    return ("recorra los lotes en orden y devuelva el primero con measured > predicted × "
            "(1 + tolerance); None si no hay ninguno.")
