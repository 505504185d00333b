"""Hidden checks of lab 3 (``continuous_batching``). Loaded by path by the autograder; never
imported by a notebook. Each function is named after a criterion of ``rubric.json`` and yields
its stages: the notebook's public self-check first, then checks the student never saw."""

from __future__ import annotations

import math

import numpy as np

from ai_evolution.checks import call_student, failed, passed
from ai_evolution.checks import continuous_batching as checks
from ai_evolution.engine import Request, SamplingParams
from ai_evolution.grading import hidden, public
from ai_evolution.metrics import summarize as reference_summarize


def policy(fn, ctx):
    yield public(checks.check_policy, fn, seed=ctx.seed, model=ctx.model())
    for s in ctx.hidden_seeds:  # on the simulator: only the schedule matters
        yield hidden(checks.check_policy, fn, seed=s)


def summarize(fn, ctx):
    yield public(checks.check_summarize, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_summarize, fn, seed=s)
    yield hidden(_summarize_edges, fn)


def _request(k: int, arrival: float, times: list[float]) -> Request:
    r = Request(str(k), [1, 2, 3], SamplingParams(max_tokens=len(times)), arrival_time=arrival)
    r.output_token_ids = [7] * len(times)
    r.first_token_time, r.token_times, r.finish_time = times[0], list(times), times[-1]
    return r


def _summarize_edges(fn, raise_on_fail=False):
    """One request; two; requests listed by finish time in reverse; a late first arrival."""
    name = "métricas de servicio (casos límite)"
    cases = [
        [_request(0, 0.0, [0.25, 0.5])],
        [_request(0, 0.0, [0.1, 0.2, 0.3]), _request(1, 0.0, [0.4])],
        [_request(k, 0.01 * k, list(np.cumsum([0.05] * (10 - k)) + 0.01 * k)) for k in range(9)][::-1],
        [_request(0, 1.5, [1.75, 2.0]), _request(1, 1.0, [1.25, 3.0]), _request(2, 2.0, [2.5])],
    ]
    for i, reqs in enumerate(cases):
        expected = reference_summarize(reqs)
        got, crash = call_student(name, fn, reqs)
        label = f"{len(reqs)} peticiones"
        if crash:
            return failed(name, i, label, crash)
        for key in checks.METRIC_KEYS:
            g = got.get(key) if isinstance(got, dict) else None
            if not isinstance(g, (int, float, np.number)) or \
                    not math.isclose(float(g), expected[key], rel_tol=1e-9):
                return failed(name, i, label, f"{key}: se esperaba {expected[key]:.6g} y su "
                              f"función devolvió {g!r}.")
    return passed(name, len(cases))


def extension(ext, contract, ctx):
    yield hidden(_gains, ext, ctx.params)


def _gains(ext, params, raise_on_fail=False):
    """Three widths, the highest cap of the datacenter study, gains that are ratios."""
    name = "reto: ganancia según el ancho del lote"
    m = ext["measurement"]
    cap = params["dc_caps"][-1]
    if m["cap"] != cap:
        return failed(name, 0, "cap", f"el reto usa el tope más alto, {cap}, y measurement dice "
                      f"{m['cap']!r}.")
    for i, b in enumerate((8, 32, 128), start=1):
        g = m[f"gain_width_{b}"]
        if not 0.5 < g < 50:
            return failed(name, i, f"gain_width_{b}", f"una ganancia de {g!r} no es un cociente "
                          "de rendimientos plausible.")
    return passed(name, 4)
