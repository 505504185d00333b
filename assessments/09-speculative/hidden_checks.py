"""Hidden checks of lab 9 (``speculative``). Loaded by path by the autograder; never imported by
a notebook. Each function is named after a criterion of ``rubric.json`` and yields its stages:
the notebook's public self-check first, then checks the student never saw."""

from __future__ import annotations

import torch

from ai_evolution.checks import call_student, failed, passed
from ai_evolution.checks import speculative as checks
from ai_evolution.fmt import es_value
from ai_evolution.grading import hidden, public
from ai_evolution.reference.speculative import reference_speedup_table
from ai_evolution.speculative import greedy_accept as reference_greedy_accept


def greedy_accept(fn, ctx):
    yield public(checks.check_greedy_accept, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_greedy_accept, fn, seed=s)
    yield hidden(_greedy_edges, fn)


def _greedy_edges(fn, raise_on_fail=False):
    """Tokens given as tensors, a long run of agreements, large token ids, and a proposal that
    matches the target's token one place later (a shifted comparison would accept it)."""
    name = "verificación voraz (casos límite)"
    cases = [("propuestas y argmax como tensores", torch.tensor([3, 4, 5]), torch.tensor([3, 4, 6, 1])),
             ("16 propuestas, todas aceptadas", list(range(16)), list(range(17))),
             ("ids grandes", [128_000, 127_999], [128_000, 5, 9]),
             ("la propuesta coincide con el token siguiente del objetivo", [8, 9], [7, 8, 9])]
    for i, (label, draft, target) in enumerate(cases):
        want = reference_greedy_accept(draft, target)
        got, crash = call_student(name, fn, draft, target)
        if crash:
            return failed(name, i, label, crash)
        try:
            ok = tuple(int(x) for x in got) == want
        except (TypeError, ValueError):
            ok = False
        if not ok:
            return failed(name, i, label, f"se esperaba {want} y su función devolvió {es_value(got)}.")
    return passed(name, len(cases))


def acceptance_and_residual(fn, ctx):
    yield public(checks.check_acceptance_and_residual, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_acceptance_and_residual, fn, seed=s)
    yield hidden(_residual_edges, fn)


def _residual_edges(fn, raise_on_fail=False):
    """A one-token vocabulary, float32 inputs, and a vocabulary of 64 where both models put zero
    on most tokens: the emitted token's exact distribution must still be p."""
    name = "paso de muestreo por rechazo (casos límite)"
    g = torch.Generator().manual_seed(5)
    wide_p, wide_q = torch.zeros(64, dtype=torch.float64), torch.zeros(64, dtype=torch.float64)
    wide_p[:5] = torch.softmax(torch.randn(5, generator=g, dtype=torch.float64), -1)
    wide_q[3:9] = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64), -1)
    cases = [("vocabulario de un token", torch.tensor([1.0]), torch.tensor([1.0])),
             ("float32", torch.tensor([0.6, 0.3, 0.1]), torch.tensor([0.2, 0.2, 0.6])),
             ("vocabulario de 64 con soportes que apenas se solapan", wide_p, wide_q)]
    for i, (label, p, q) in enumerate(cases):
        got, crash = call_student(name, fn, p.clone(), q.clone())
        if crash:
            return failed(name, i, label, crash)
        try:
            accept, residual = (torch.as_tensor(x, dtype=torch.float64) for x in got)
            kept = q.double() * torch.where(q > 0, accept, torch.zeros_like(accept))
            emitted = kept + (1 - kept.sum()) * residual
            ok = emitted.shape == p.shape and torch.allclose(emitted, p.double(), atol=1e-6)
        except (TypeError, ValueError, RuntimeError):
            ok = False
        if not ok:
            return failed(name, i, label, "la distribución exacta del token emitido no es p.")
    return passed(name, len(cases))


def speedup_table(fn, ctx):
    yield public(checks.check_speedup_table, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_speedup_table, fn, seed=s)
    yield hidden(_speedup_edges, fn)


def _speedup_edges(fn, raise_on_fail=False):
    """k_max = 1, a tie across every k (α = 0 with a free draft), and α = 1 with a free draft
    (the best k is the largest)."""
    name = "aceleración esperada y mejor k (casos límite)"
    cases = [("k_max = 1", 0.5, 0.2, 1), ("α = 0 y borrador gratis: todos empatan", 0.0, 0.0, 5),
             ("α = 1 y borrador gratis", 1.0, 0.0, 7)]
    for i, (label, alpha, c, k_max) in enumerate(cases):
        want = reference_speedup_table(alpha, c, k_max)
        got, crash = call_student(name, fn, alpha, c, k_max)
        if crash:
            return failed(name, i, label, crash)
        try:
            ok = (int(got["best_k"]) == want["best_k"] and len(got["speedup"]) == k_max
                  and all(abs(float(a) - b) <= 1e-6 * max(1.0, b)
                          for a, b in zip(got["speedup"], want["speedup"])))
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            return failed(name, i, label, f"se esperaba {es_value(want)} y su función devolvió "
                          f"{es_value(got)}.")
    return passed(name, len(cases))


def extension(ext, contract, ctx):
    yield hidden(checks.check_challenge, ext)
