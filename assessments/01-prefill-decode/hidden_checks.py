"""Hidden checks of lab 1 (``roofline``). Loaded by path by the autograder; never imported by a
notebook. Each function is named after a criterion of ``rubric.json`` and yields its stages:
the notebook's public self-check first, then checks the student never saw."""

from __future__ import annotations

import math

from ai_evolution.checks import call_student, failed, passed
from ai_evolution.checks import roofline as checks
from ai_evolution.grading import hidden, public
from ai_evolution.hardware import get_device_spec
from ai_evolution.sim import departure_batch as reference_departure


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
    """Exactly at the ridge point, no FLOPs, no bytes."""
    name = "tiempo de un paso según el techo (casos límite)"
    cases = [(1e9, 1e12, 1e12, 1e15, 0.0),      # both limits equal: 1 ms
             (5e8, 0.0, 2e12, 1e14, 1e-4),      # no FLOPs: memory only
             (0.0, 3e12, 1e12, 6e13, 2e-5),     # no bytes: compute only
             (7.5e10, 7.5e10, 3.35e12, 9.89e14, 0.0)]
    for i, (b, f, bw, peak, over) in enumerate(cases):
        expected = checks.reference_predict_step(b, f, bw, peak, over)
        got, crash = call_student(name, fn, b, f, bw, peak, over)
        label = f"{b:g} bytes, {f:g} FLOP, {bw:g} B/s, pico {peak:g} FLOP/s, overhead {over:g} s"
        if crash:
            return failed(name, i, label, crash)
        if not isinstance(got, (int, float)) or not math.isclose(float(got), expected,
                                                                 rel_tol=1e-9):
            return failed(name, i, label, f"se esperaban {expected:g} s y su función devolvió "
                          f"{got!r}.")
    return passed(name, len(cases))


def departure_batch(fn, ctx):
    yield public(checks.check_departure_batch, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_departure_batch, fn, seed=s)
    yield hidden(_departure_edges, fn)


def _departure_edges(fn, raise_on_fail=False):
    """One point; a departure at the last point only; batch sizes that are not powers of two."""
    name = "lote en que la medida se aparta del techo (casos límite)"
    cases = [([1], [0.02], [0.01], 0.5),
             ([1], [0.0149], [0.01], 0.5),
             ([3, 6, 12, 24], [1.0, 1.0, 1.0, 1.3], [1.0, 1.0, 1.0, 1.0], 0.25),
             ([2, 5, 7], [0.5, 0.5, 0.5], [1.0, 1.0, 1.0], 0.0)]
    for i, (b, m, p, tol) in enumerate(cases):
        expected = reference_departure(b, m, p, tol)
        got, crash = call_student(name, fn, list(b), list(m), list(p), tol)
        label = f"lotes {b}, medidas {m}, predicciones {p}, tolerancia {tol}"
        if crash:
            return failed(name, i, label, crash)
        if got != expected:
            return failed(name, i, label, f"se esperaba {expected!r} y su función devolvió {got!r}.")
    return passed(name, len(cases))


def extension(ext, contract, ctx):
    yield hidden(_quantized_floors, ext)


def _quantized_floors(ext, raise_on_fail=False):
    """int4 halves the int8 floor (every byte of the step halves); the seed's efficiency is the
    cited 42,6 tokens/s against its datasheet floor for 5,38 GB."""
    name = "reto: suelos cuantizados"
    m = ext["measurement"]
    ratio = m["floor_int8_ms"] / m["floor_int4_ms"]
    if not math.isclose(ratio, 2.0, rel_tol=1e-6):
        return failed(name, 0, "floor_int8_ms / floor_int4_ms", f"con la mitad de bytes por "
                      f"elemento el suelo se divide por 2, y el cociente medido es {ratio:.6g}.")
    laptop = get_device_spec("apple-m5-pro-laptop")
    expected = 5.38e9 / laptop.bandwidth_bytes_per_s * 42.6
    if not math.isclose(m["seed_efficiency"], expected, rel_tol=1e-3):
        return failed(name, 1, "seed_efficiency", f"con 5,38 GB, el ancho de banda del preset y "
                      f"42,6 tokens/s la eficiencia es {expected:.4f}, y measurement dice "
                      f"{m['seed_efficiency']!r}.")
    if not 0 < m["measured_efficiency"] <= 1.5:
        return failed(name, 2, "measured_efficiency", f"una eficiencia de "
                      f"{m['measured_efficiency']!r} no es una fracción del suelo.")
    return passed(name, 3)
