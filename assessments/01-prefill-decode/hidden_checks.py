"""Hidden checks of lab 1 (``roofline``). Loaded by path by the autograder; never imported by a
notebook. Each function is named after a criterion of ``rubric.json`` and yields its stages:
the notebook's public self-check first, then checks the student never saw."""

from __future__ import annotations

import math

from ai_evolution.checks import call_student, failed, passed
from ai_evolution.checks import roofline as checks
from ai_evolution.fmt import es_sig, es_value
from ai_evolution.grading import hidden, public
from ai_evolution.reference.roofline import reference_departure_batch


def decode_roofline(fn, ctx):
    yield public(checks.check_decode_roofline, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_decode_roofline, fn, seed=s)


def predict_step(fn, ctx):
    yield public(checks.check_predict_step, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_predict_step, fn, seed=s)
    yield hidden(_predict_edges, fn)


def _predict_edges(fn, raise_on_fail=False):
    """Exactly at the ridge point (a tie: memory), no FLOPs, no bytes, neither."""
    name = "tiempo de un paso según el roofline (casos límite)"
    cases = [(1e9, 1e12, 1e12, 1e15, 0.0),      # both limits take 1 ms: memory still binds
             (5e8, 0.0, 2e12, 1e14, 1e-4),      # no FLOPs: memory only
             (0.0, 3e12, 1e12, 6e13, 2e-5),     # no bytes: compute only
             (0.0, 0.0, 1e12, 6e13, 3e-4),      # an empty step: only the overhead
             (7.5e10, 7.5e10, 3.35e12, 9.89e14, 0.0)]
    for i, (b, f, bw, peak, over) in enumerate(cases):
        got, crash = call_student(name, fn, b, f, bw, peak, over)
        label = (f"{es_sig(b)} bytes, {es_sig(f)} FLOP, {es_sig(bw)} B/s, pico {es_sig(peak)} "
                 f"FLOP/s, sobrecarga {es_sig(over)} s")
        if crash:
            return failed(name, i, label, crash)
        wrong = checks.compare_predict(got, b, f, bw, peak, over)
        if wrong:
            return failed(name, i, label, *wrong)
    return passed(name, len(cases))


def departure_batch(fn, ctx):
    yield public(checks.check_departure_batch, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_departure_batch, fn, seed=s)
    yield hidden(_departure_edges, fn)


def _departure_edges(fn, raise_on_fail=False):
    """One point (it calibrates itself: never departs); a departure at the last point only;
    batch sizes that are not powers of two; a first batch below its roofline."""
    name = "lote en que la medida se aparta del roofline (casos límite)"
    u = 2.0**-8
    read = {"bytes": 2.0**23, "flops": 0.0}  # 2**-7 s at 2**30 B/s
    cases = [([1], [0.02], [read], 2.0**30, 2.0**40, 0.5),
             ([3, 6, 12, 24], [3 * u, 3 * u, 3 * u, 4 * u], [read] * 4, 2.0**30, 2.0**40, 0.25),
             ([2, 5, 7], [3 * u, 3.5 * u, 4 * u], [read] * 3, 2.0**30, 2.0**40, 0.25),
             ([1, 2, 4], [u, 2.5 * u, 2.75 * u], [read] * 3, 2.0**30, 2.0**40, 0.25)]
    for i, (b, m, costs, bw, peak, tol) in enumerate(cases):
        expected = reference_departure_batch(b, m, costs, bw, peak, tol)
        got, crash = call_student(name, fn, list(b), list(m), [dict(c) for c in costs], bw, peak,
                                  tol)
        label = (f"lotes {b}, medidas {es_value(m)} s, cada paso lee {es_sig(read['bytes'])} "
                 f"bytes a {es_sig(bw)} B/s, tolerancia {es_sig(tol)}")
        if crash:
            return failed(name, i, label, crash)
        if got != expected:
            return failed(name, i, label, f"se esperaba {expected!r} y su función devolvió "
                          f"{es_value(got)}.")
    return passed(name, len(cases))


def extension(ext, contract, ctx):
    yield hidden(_dtype_floors, ext)


def _dtype_floors(ext, raise_on_fail=False):
    """Every byte a decode step reads (weights and KV cache) halves from 32 to 16 bits; the
    measured ratio is the ratio of the two medians, inside its own interval; no step beats its
    floor by much."""
    name = "reto: suelo y paso en 32 y 16 bits"
    m = ext["measurement"]
    if not math.isclose(m["bytes_ratio"], 2.0, rel_tol=1e-6):
        return failed(name, 0, "bytes_ratio", f"de 32 a 16 bits por elemento, los bytes del paso "
                      f"(pesos y caché KV) se dividen por 2, y measurement dice "
                      f"{es_value(m['bytes_ratio'])}.")
    floors = m["fp32_floor_ms"] / m["half_floor_ms"]
    if not math.isclose(floors, m["bytes_ratio"], rel_tol=1e-6):
        return failed(name, 1, "fp32_floor_ms / half_floor_ms", f"con el mismo ancho de banda, "
                      f"los suelos guardan el cociente de los bytes, y el suyo es {es_sig(floors)}.")
    ratio = m["fp32_step_ms"] / m["half_step_ms"]
    if not math.isclose(m["time_ratio"], ratio, rel_tol=1e-6):
        return failed(name, 2, "time_ratio", f"el cociente de las medianas medidas es "
                      f"{es_sig(ratio)} y measurement dice {es_value(m['time_ratio'])}.")
    if not m["time_ratio_low"] <= m["time_ratio"] <= m["time_ratio_high"]:
        return failed(name, 3, "time_ratio_low, time_ratio_high", "el intervalo del cociente "
                      "debe contener el cociente medido.")
    if m["repeats"] < 2 or m["repeats"] != int(m["repeats"]):
        return failed(name, 4, "repeats", f"con {es_value(m['repeats'])} rondas no se puede "
                      "separar una diferencia del ruido: hacen falta al menos 2.")
    for i, key in enumerate(("fp32", "half"), start=5):
        eff = m[f"{key}_floor_ms"] / m[f"{key}_step_ms"]
        if not 0 < eff <= 1.5:
            return failed(name, i, f"{key}_floor_ms / {key}_step_ms", f"un paso medido "
                          f"{es_sig(1 / eff if eff else float('inf'), 3)} veces su suelo no "
                          "es una medida de este paso.")
    return passed(name, 7)
