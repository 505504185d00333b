"""Hidden checks of lab 10 (``determinism``). Loaded by path by the autograder; never imported by
a notebook. Each function is named after a criterion of ``rubric.json`` and yields its stages:
the notebook's public self-check first, then checks the student never saw."""

from __future__ import annotations

import torch

from ai_evolution.checks import call_student, failed, passed
from ai_evolution.checks import determinism as checks
from ai_evolution.fmt import es_value
from ai_evolution.grading import hidden, public
from ai_evolution.reference.determinism import reference_compare_runs


def invariant_linear(fn, ctx):
    yield public(checks.check_invariant_linear, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_invariant_linear, fn, seed=s)
    yield hidden(_linear_edges, fn)


def _linear_edges(fn, raise_on_fail=False):
    """One row, 64 rows, a weight with a single output, and a row of zeros beside real rows: the
    result is F.linear's and each row keeps its bits alone."""
    name = "matmul invariante al lote (casos límite)"
    g = torch.Generator().manual_seed(11)
    x64 = torch.randn(64, 128, generator=g)
    x64[7] = 0
    cases = [("una sola fila", torch.randn(1, 64, generator=g), torch.randn(32, 64, generator=g)),
             ("64 filas, una de ceros", x64, torch.randn(48, 128, generator=g) / 11),
             ("una sola salida", torch.randn(5, 96, generator=g), torch.randn(1, 96, generator=g))]
    for i, (label, x, w) in enumerate(cases):
        got, crash = call_student(name, fn, x.clone(), w.clone(), None)
        if crash:
            return failed(name, i, label, crash)
        try:
            ok = (tuple(got.shape) == (x.shape[0], w.shape[0])
                  and torch.allclose(got.double(), x.double() @ w.double().T, atol=1e-3)
                  and all(torch.equal(fn(x[r:r + 1].clone(), w.clone(), None)[0], got[r])
                          for r in (0, x.shape[0] - 1)))
        except (TypeError, ValueError, RuntimeError, AttributeError):
            ok = False
        if not ok:
            return failed(name, i, label, "el resultado no es el de F.linear o una fila cambia sus "
                          "bits al calcularse sola.")
    return passed(name, len(cases))


def compare_runs(fn, ctx):
    yield public(checks.check_compare_runs, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_compare_runs, fn, seed=s)
    yield hidden(_compare_edges, fn)


def _compare_edges(fn, raise_on_fail=False):
    """Empty runs, tokens given as tensors, and one run empty beside a longer one."""
    name = "comparar una petición sola y en un lote (casos límite)"
    z = torch.zeros(3, 4)
    cases = [("dos ejecuciones vacías", [], torch.empty(0, 4), [], torch.empty(0, 4)),
             ("tokens como tensores", torch.tensor([1, 2, 3]), z, torch.tensor([1, 2, 0]), z.clone()),
             ("una ejecución vacía", [1, 2], z[:2], [], torch.empty(0, 4))]
    for i, (label, ta, la, tb, lb) in enumerate(cases):
        want = reference_compare_runs(ta, la, tb, lb)
        got, crash = call_student(name, fn, ta, la.clone(), tb, lb.clone())
        if crash:
            return failed(name, i, label, crash)
        try:
            ok = (got["first_token_step"] == want["first_token_step"]
                  and got["first_logit_step"] == want["first_logit_step"]
                  and abs(float(got["max_abs_diff"]) - want["max_abs_diff"]) <= 1e-9)
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            return failed(name, i, label, f"se esperaba {es_value(want)} y su función devolvió "
                          f"{es_value(got)}.")
    return passed(name, len(cases))


def extension(ext, contract, ctx):
    yield hidden(checks.check_challenge, ext)
