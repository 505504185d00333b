"""Hidden checks of lab 5 (``scheduler``). Loaded by path by the autograder; never imported by a
notebook. Each function is named after a criterion of ``rubric.json`` and yields its stages:
the notebook's public self-check first, then checks the student never saw."""

from __future__ import annotations

from ai_evolution.checks import call_student, failed, passed
from ai_evolution.checks import scheduler as checks
from ai_evolution.engine import tokens_for
from ai_evolution.fmt import es_value
from ai_evolution.grading import hidden, public
from ai_evolution.reference.scheduler import VICTIM_RULES, reference_victim


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
        label = f"want = {want}, budget = {es_value(budget)}, chunked = {chunked}"
        if crash:
            return failed(name, i, label, crash)
        if got != expected or isinstance(got, bool):
            return failed(name, i, label, f"se esperaban {expected} tokens y su función devolvió "
                          f"{es_value(got)}.", _split_hint(want, budget, chunked))
    return passed(name, len(cases))


def _split_hint(want, budget, chunked) -> str:
    if want == budget:
        return "lo que la petición necesita es exactamente lo que queda: cabe, y lo recibe entero."
    if want < budget:
        return "la petición cabe en lo que queda del presupuesto: lo recibe entero."
    if not chunked:
        return ("sin prefill troceado, una petición que no cabe entera no recibe nada: espera al "
                "paso siguiente.")
    if budget < 1:
        return ("con prefill troceado, el trozo es la parte entera de lo que queda; si no queda ni "
                "un token entero, no hay trozo y la petición espera.")
    return ("con prefill troceado, una petición que no cabe recibe la parte entera de lo que queda "
            "del presupuesto (un número entero de tokens).")


def victim(fn, ctx):
    yield public(checks.check_victim, fn, seed=ctx.seed, model=ctx.model())
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_victim, fn, seed=s)
    yield hidden(_victim_edges, fn)


def _victim_edges(fn, raise_on_fail=False):
    """For every rule: finished requests at the end and in the middle, one unfinished left, and
    ties in computed tokens (they go to the most recently admitted)."""
    name = "elección de la víctima (casos límite)"
    # (finished?, computed tokens) of each running request, in admission order
    batches = [[(False, 5), (False, 9), (False, 2), (True, 7)],
               [(False, 4), (True, 1), (False, 4), (True, 12)],
               [(False, 3), (True, 0), (True, 8)],
               [(True, 1), (False, 6), (False, 6), (False, 6)],
               [(False, 0)],
               [(True, 2), (True, 3), (False, 8), (True, 9), (True, 0)],
               [(False, 7), (False, 7), (False, 1), (False, 1)]]
    k = 0
    for rule in VICTIM_RULES:
        for batch in batches:
            running = checks._batch([(done, computed, 12) for done, computed in batch])
            expected = reference_victim(running, rule)
            got, crash = call_student(name, fn, list(running), rule)
            label = f"regla {rule!r}; en curso, en orden de entrada: " + ", ".join(
                f"{r.request_id} ({r.num_computed_tokens} calculados"
                f"{', terminada' if r.is_finished else ''})" for r in running)
            if crash:
                return failed(name, k, label, crash)
            if got is not expected:
                shown = getattr(got, "request_id", got)
                return failed(name, k, label, f"la víctima debía ser {expected.request_id} y su "
                              f"función eligió {shown!r}.", _victim_edge_hint(got, expected, rule))
            k += 1
    return passed(name, k)


def _victim_edge_hint(got, expected, rule: str) -> str:
    if getattr(got, "is_finished", False):
        return "una petición terminada ya no se puede expulsar: elija entre las que no han terminado."
    if rule == "newest":
        return "con 'newest' la víctima es la admitida más tarde de las que no han terminado."
    if getattr(got, "num_computed_tokens", None) == expected.num_computed_tokens:
        return ("su víctima empata en tokens calculados con la esperada: en un empate gana la "
                "admitida más tarde.")
    return (f"con {rule!r} cuentan los tokens ya calculados (num_computed_tokens) de las que no han "
            "terminado, no su orden ni sus tokens totales.")


def extension(ext, contract, ctx):
    yield hidden(_budgets, ext, ctx.params)


def _budgets(ext, params, raise_on_fail=False):
    """The normal step and, for every budget of the lab, the ITL p99 and the TTFT."""
    name = "reto: presupuesto para un objetivo de latencia"
    m = ext["measurement"]
    if not m["normal_step_ms"] > 0:
        return failed(name, 0, "normal_step_ms", f"el paso normal debe ser positivo y es "
                      f"{es_value(m['normal_step_ms'])}.")
    budgets = params["budgets"]
    for i, b in enumerate(budgets, start=1):
        for key in (f"itl_p99_ms_budget_{b}", f"ttft_ms_budget_{b}"):
            v = m.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                return failed(name, i, key, f"se espera un tiempo medido positivo para cada "
                              f"presupuesto del laboratorio ({', '.join(map(str, budgets))}); "
                              f"measurement[{key!r}] es {es_value(v)}.")
    return passed(name, 1 + len(budgets))
