"""Hidden checks of lab 3 (``continuous_batching``). Loaded by path by the autograder; never
imported by a notebook. Each function is named after a criterion of ``rubric.json`` and yields
its stages: the notebook's public self-check first, then checks the student never saw."""

from __future__ import annotations

import math

import numpy as np

from ai_evolution.checks import failed, passed
from ai_evolution.checks import continuous_batching as checks
from ai_evolution.engine import Request, SamplingParams
from ai_evolution.fmt import es_sig, es_value
from ai_evolution.grading import hidden, public
from ai_evolution.reference.continuous_batching import CHALLENGE_WIDTHS, simulated_gains


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
    cases = [
        [_request(0, 0.0, [0.25, 0.5])],
        [_request(0, 0.0, [0.1, 0.2, 0.3]), _request(1, 0.0, [0.4])],
        [_request(k, 0.01 * k, list(np.cumsum([0.05] * (10 - k)) + 0.01 * k)) for k in range(9)][::-1],
        [_request(0, 1.5, [1.75, 2.0]), _request(1, 1.0, [1.25, 3.0]), _request(2, 2.0, [2.5])],
    ]
    return checks.summarize_result("métricas de servicio (casos límite)", fn, cases)


def extension(ext, contract, ctx):
    yield hidden(_gains, ext, ctx.params, ctx.seed)


WIDTHS = CHALLENGE_WIDTHS


def _gains(ext, params, seed, raise_on_fail=False):
    """The highest cap of the datacenter study, the three widths' H_B, and the gains the
    simulator gives for them (simulated again here: the challenge is measured, not typed)."""
    name = "reto: ganancia según el ancho del lote"
    m = ext["measurement"]
    cap = params["dc_caps"][-1]
    if m["cap"] != cap:
        return failed(name, 0, "cap", f"el reto usa el tope más alto, {cap}, y measurement dice "
                      f"{es_value(m['cap'])}.")
    for i, b in enumerate(WIDTHS, start=1):
        h_b = sum(1 / k for k in range(1, b + 1))
        if not math.isclose(m[f"hb_width_{b}"], h_b, rel_tol=1e-9):
            return failed(name, i, f"hb_width_{b}", f"H_{b} = {es_sig(h_b)} (la suma de 1/k "
                          f"para k de 1 a {b}), y measurement dice {es_value(m[f'hb_width_{b}'])}.")
    gains = simulated_gains(params["dc_device"], params["dc_model"], params["dc_requests"],
                            params["dc_prompt_len"], params["dc_mean_output"], cap,
                            max(params["dc_caps"]), seed)
    for i, b in enumerate(WIDTHS, start=1 + len(WIDTHS)):
        if not math.isclose(m[f"gain_width_{b}"], gains[b], rel_tol=1e-6):
            return failed(name, i, f"gain_width_{b}", f"el simulador de la sección 6 da una "
                          f"ganancia de {es_sig(gains[b], 4)} veces con lote {b} y tope {cap}, y "
                          f"measurement dice {es_value(m[f'gain_width_{b}'])}.")
    return passed(name, 1 + 2 * len(WIDTHS))
