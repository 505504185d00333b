"""Hidden checks of lab 5 (``scheduler``). Loaded by path by the autograder; never imported by a
notebook. Each function is named after a criterion of ``rubric.json`` and yields its stages:
the notebook's public self-check first, then checks the student never saw."""

from __future__ import annotations

from ai_evolution.checks import call_student, failed, passed
from ai_evolution.checks import scheduler as checks
from ai_evolution.engine import Request, SamplingParams, newest_unfinished, tokens_for
from ai_evolution.engine.request import RequestStatus
from ai_evolution.grading import hidden, public


def token_split(fn, ctx):
    yield public(checks.check_token_split, fn, seed=ctx.seed, model=ctx.model())
    for s in ctx.hidden_seeds:  # on the simulator: only the schedule matters
        yield hidden(checks.check_token_split, fn, seed=s)
    yield hidden(_split_edges, fn)


def _split_edges(fn, raise_on_fail=False):
    """What is left equals what is needed; less than one token left; a budget that is not an
    integer (the budget left after other requests can be any number)."""
    name = "reparto del presupuesto de tokens (casos límite)"
    cases = [(5, 5, False), (5, 5, True), (1, 1, False), (40, 39, False), (40, 39, True),
             (3, 0.5, True), (3, 0, True), (7, 6.5, True), (6, 6.5, False), (1, 0.99, True)]
    for i, (want, budget, chunked) in enumerate(cases):
        expected = tokens_for(want, budget, chunked)
        got, crash = call_student(name, fn, want, budget, chunked)
        label = f"want={want}, budget={budget}, chunked={chunked}"
        if crash:
            return failed(name, i, label, crash)
        if got != expected or isinstance(got, bool):
            return failed(name, i, label, f"se esperaban {expected} tokens y su función devolvió "
                          f"{got!r}.", "si want <= budget, want; si no, int(budget) con prefill "
                          "troceado y budget >= 1; si no, 0.")
    return passed(name, len(cases))


def victim(fn, ctx):
    yield public(checks.check_victim, fn, seed=ctx.seed, model=ctx.model())
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_victim, fn, seed=s)
    yield hidden(_victim_edges, fn)


def _victim_edges(fn, raise_on_fail=False):
    """Finished requests at the end, in the middle, and only one unfinished left."""
    name = "elección de la víctima (casos límite)"
    patterns = ["rrrf", "rfrf", "rff", "frrr", "r", "ffrff"]  # r running, f finished; in order
    for i, pattern in enumerate(patterns):
        running = []
        for k, p in enumerate(pattern):
            r = Request(f"p{k}", [1, 2], SamplingParams(max_tokens=4))
            r.status = RequestStatus.FINISHED if p == "f" else RequestStatus.RUNNING
            running.append(r)
        expected = newest_unfinished(running)
        got, crash = call_student(name, fn, list(running))
        label = "en curso, en orden de entrada: " + ", ".join(
            f"{r.request_id}{' (terminada)' if r.is_finished else ''}" for r in running)
        if crash:
            return failed(name, i, label, crash)
        if got is not expected:
            shown = getattr(got, "request_id", got)
            return failed(name, i, label, f"la víctima debía ser {expected.request_id} y su "
                          f"función eligió {shown!r}.", "la más reciente que no haya terminado.")
    return passed(name, len(patterns))


def extension(ext, contract, ctx):
    yield hidden(_budgets, ext, ctx.params)


def _budgets(ext, params, raise_on_fail=False):
    """The normal step and, for every budget of the lab, the ITL p99 and the TTFT."""
    name = "reto: presupuesto para un objetivo de latencia"
    m = ext["measurement"]
    if not m["normal_step_ms"] > 0:
        return failed(name, 0, "normal_step_ms", f"el paso normal debe ser positivo y es "
                      f"{m['normal_step_ms']!r}.")
    budgets = params["budgets"]
    for i, b in enumerate(budgets, start=1):
        for key in (f"itl_p99_ms_budget_{b}", f"ttft_ms_budget_{b}"):
            v = m.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                return failed(name, i, key, f"se espera un tiempo medido positivo para cada "
                              f"presupuesto del laboratorio ({', '.join(map(str, budgets))}); "
                              f"measurement[{key!r}] es {v!r}.")
    return passed(name, 1 + len(budgets))
