"""Hidden checks of lab 12 (``operations``). Loaded by path by the autograder; never imported by
a notebook. Each function is named after a criterion of ``rubric.json`` and yields its stages:
the notebook's public self-check first, then checks the student never saw."""

from __future__ import annotations

import math

from ai_evolution.checks import call_student, failed, passed
from ai_evolution.checks import operations as checks
from ai_evolution.engine.scheduling_policy import VTCPolicy
from ai_evolution.fmt import es_value
from ai_evolution.grading import hidden, public
from ai_evolution.hardware import get_device_spec
from ai_evolution.loadgen.realistic import flood_mix
from ai_evolution.model import get_preset
from ai_evolution.reference.operations import (reference_bucket_waits, reference_goodput_rate,
                                               reference_pick_tenant)
from ai_evolution.sim import RooflineCostModel, sim_engine


def pick_tenant(fn, ctx):
    yield public(checks.check_pick_tenant, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_pick_tenant, fn, seed=s)
    yield hidden(_pick_edges, fn)
    yield hidden(_pick_in_the_engine, fn)


def _pick_edges(fn, raise_on_fail=False):
    """Integer tenant names, counters that differ in the last bit, and one backlogged tenant
    among many known ones."""
    name = "regla de admisión de VTC (casos límite)"
    cases = [("inquilinos con nombres enteros", {3: 7.0, 1: 7.0, 2: 9.0}, [3, 1, 2]),
             ("contadores que difieren en el último bit", {"a": 1.0 + 2**-52, "b": 1.0}, ["a", "b"]),
             ("uno solo en cola entre muchos conocidos",
              {f"t{i}": float(i) for i in range(50)}, ["t49"])]
    for i, (label, counters, backlogged) in enumerate(cases):
        want = reference_pick_tenant(counters, backlogged)
        got, crash = call_student(name, fn, dict(counters), list(backlogged))
        if crash:
            return failed(name, i, label, crash)
        if got != want:
            return failed(name, i, label, f"se esperaba {want!r} y su función devolvió {es_value(got)}.")
    return passed(name, len(cases))


def _pick_in_the_engine(fn, raise_on_fail=False):
    """Plugged into the engine's VTC policy (a small flood on a simulated L4), the student's rule
    schedules exactly the steps the library's rule schedules."""
    name = "regla de admisión de VTC en el motor"
    big, gpu = get_preset("llama-3.1-8b"), get_device_spec("l4")
    cost = RooflineCostModel.from_device_spec(gpu, "fp16")
    mix = flood_mix(4, 8.0, 3.0, big.vocab_size, 5, "conversation", 16.0, 1024)
    schedules = []
    for rule in (reference_pick_tenant, fn):
        engine = sim_engine(big, cost, 2, 1024, dtype="fp16",
                            scheduling_policy=lambda rule=rule: VTCPolicy(pick_fn=rule))
        try:
            engine.run(mix)
        except Exception as err:  # noqa: BLE001 - the student's rule inside the engine
            return failed(name, 0, "carga de dos inquilinos", getattr(err, "feedback", None)
                          or f"el motor se detuvo: {type(err).__name__}: {err}")
        schedules.append([tuple(e.request_id for e in h.scheduled) for h in engine.history])
    if schedules[0] != schedules[1]:
        n = min(map(len, schedules))
        step = next((i for i in range(n) if schedules[0][i] != schedules[1][i]), n)
        return failed(name, 0, "carga de dos inquilinos", f"el paso {step + 1} no programa las "
                      f"mismas peticiones que la regla de VTC.")
    return passed(name, 1)


def bucket_waits(fn, ctx):
    yield public(checks.check_bucket_waits, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_bucket_waits, fn, seed=s)
    yield hidden(_bucket_edges, fn)


def _bucket_edges(fn, raise_on_fail=False):
    """No arrivals, a cost exactly equal to the level, fractional costs and a slow refill."""
    name = "cubo de fichas (casos límite)"
    cases = [("sin llegadas", [], [], 1.0, 1.0),
             ("coste igual a lo que hay", [0.0, 0.5], [2.0, 1.0], 2.0, 2.0),
             ("costes fraccionarios", [0.0, 0.1, 0.2], [0.25, 0.5, 0.5], 1.0, 1.0),
             ("relleno lento", [0.0, 1.0, 2.0], [1, 1, 1], 0.01, 1.0)]
    for i, (label, times, costs, rate, capacity) in enumerate(cases):
        want = reference_bucket_waits(times, costs, rate, capacity)
        got, crash = call_student(name, fn, list(times), list(costs), rate, capacity)
        if crash:
            return failed(name, i, label, crash)
        try:
            ok = len(got) == len(want) and all(
                (math.isinf(w) and math.isinf(float(g))) or math.isclose(float(g), w, abs_tol=1e-9)
                for g, w in zip(got, want))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            return failed(name, i, label, f"se esperaba {es_value(want)} y su función devolvió "
                          f"{es_value(got)}.")
    return passed(name, len(cases))


def goodput_rate(fn, ctx):
    yield public(checks.check_goodput_rate, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_goodput_rate, fn, seed=s)
    yield hidden(_goodput_edges, fn)


def _goodput_edges(fn, raise_on_fail=False):
    """One probe, integer rates, a p99 exactly on the SLO, and every request of one token."""
    name = "goodput desde las sondas (casos límite)"
    exact = [(0.5, 0.01)] * 99 + [(1.0, 0.01)]  # p99 interpolates between 0,5 and 1,0
    cases = [("una sola sonda que cumple", {5.0: [(0.1, 0.01)] * 10}, 1.0, 0.05),
             ("ritmos enteros", {1: [(0.1, 0.01)] * 10, 2: [(0.1, 0.01)] * 10}, 1.0, 0.05),
             ("p99 justo en el SLO", {1.0: exact, 2.0: exact}, 0.995, 0.05),
             ("todas de un token", {1.0: [(0.3, None)] * 5, 4.0: [(2.0, None)] * 5}, 1.0, 0.05)]
    for i, (label, probes, slo_ttft, slo_tpot) in enumerate(cases):
        want = reference_goodput_rate(probes, slo_ttft, slo_tpot)
        got, crash = call_student(name, fn, {r: list(v) for r, v in probes.items()}, slo_ttft, slo_tpot)
        if crash:
            return failed(name, i, label, crash)
        ok = (got is None) == (want is None) and (want is None or (
            isinstance(got, (int, float)) and not isinstance(got, bool)
            and math.isclose(float(got), want, rel_tol=1e-12)))
        if not ok:
            return failed(name, i, label, f"se esperaba {es_value(want)} y su función devolvió "
                          f"{es_value(got)}.")
    return passed(name, len(cases))


def extension(ext, contract, ctx):
    yield hidden(checks.check_challenge, ext, ctx.params, seed=ctx.seed)
