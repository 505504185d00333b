"""Hidden checks of lab 11 (``hybrid``). Loaded by path by the autograder; never imported by a
notebook. Each function is named after a criterion of ``rubric.json`` and yields its stages:
the notebook's public self-check first, then checks the student never saw."""

from __future__ import annotations

import random

import torch

from ai_evolution.checks import call_student, failed, passed
from ai_evolution.checks import hybrid as checks
from ai_evolution.fmt import es_value
from ai_evolution.grading import hidden, public
from ai_evolution.model import get_preset
from ai_evolution.reference.hybrid import reference_delta_step, reference_sequences_that_fit


def state_bytes(fn, ctx):
    yield public(checks.check_state_bytes, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_state_bytes, fn, seed=s)
    yield hidden(_state_edges, fn)


def _state_edges(fn, raise_on_fail=False):
    """A two-layer hybrid with one linear layer whose convolution has a kernel of 2 (a window of
    one input), and Qwen3.5-9B with one byte per element."""
    name = "bytes de estado por secuencia (casos límite)"
    qwen = get_preset("qwen3.5-9b")
    tiny = checks.random_hybrid(random.Random(5)).replace(
        num_layers=2, layer_types=("linear_attention", "full_attention"),
        linear_conv_kernel_dim=2)
    return checks.state_bytes_failure(name, fn, [("Qwen3.5-9B con 1 byte por elemento", qwen, 1.0),
                                                 ("una capa lineal con núcleo 2", tiny, 4.0)])


def delta_step(fn, ctx):
    yield public(checks.check_delta_step, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_delta_step, fn, seed=s)
    yield hidden(_delta_edges, fn)


def _delta_edges(fn, raise_on_fail=False):
    """No decay (g = 0) and no write (beta = 0): the state is kept as it is; and the input state
    is not modified in place."""
    name = "un paso de la regla delta con compuerta (casos límite)"
    g = torch.Generator().manual_seed(3)
    S = torch.randn(2, 3, 4, 5, generator=g)
    q, k = torch.randn(2, 3, 4, generator=g), torch.randn(2, 3, 4, generator=g)
    v = torch.randn(2, 3, 5, generator=g)
    cases = [("beta = 0: no escribe", torch.zeros(2, 3), torch.zeros(2, 3)),
             ("g = 0 y beta = 1: escritura completa", torch.zeros(2, 3), torch.ones(2, 3)),
             ("desvanecimiento fuerte", torch.full((2, 3), -5.0), torch.full((2, 3), 0.5))]
    for i, (label, decay, beta) in enumerate(cases):
        before = S.clone()
        got, crash = call_student(name, fn, S, q, k, v, decay, beta)
        if crash:
            return failed(name, i, label, crash)
        want_out, want_state = reference_delta_step(before, q, k, v, decay, beta)
        try:
            out, new = got
            ok = (torch.allclose(out.float(), want_out, atol=1e-5, rtol=1e-5)
                  and torch.allclose(new.float(), want_state, atol=1e-5, rtol=1e-5)
                  and torch.equal(S, before))
        except (TypeError, ValueError, AttributeError, RuntimeError):
            ok = False
        if not ok:
            return failed(name, i, label, "la salida o el estado nuevo no son los de la regla, o "
                          "la función modificó el estado de entrada.")
    return passed(name, len(cases))


def sequences_that_fit(fn, ctx):
    yield public(checks.check_sequences_that_fit, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_sequences_that_fit, fn, seed=s)
    yield hidden(_fit_edges, fn)


def _fit_edges(fn, raise_on_fail=False):
    """A context of one token, a utilization of 1, and the longest context Qwen3.5 accepts
    (262 144 tokens), where the KV of one sequence dwarfs its state."""
    name = "secuencias que caben (casos límite)"
    cases = [("Qwen3.5-9B, 141 GB, 1 token", "qwen3.5-9b", 141e9, 1, 0.9),
             ("Llama-3.1-8B, 24 GB, utilización 1", "llama-3.1-8b", 24e9, 2048, 1.0),
             ("Qwen3.5-9B, 80 GB, 262 144 tokens", "qwen3.5-9b", 80e9, 262144, 0.95)]
    for i, (label, preset, gpu, ctx, util) in enumerate(cases):
        config = get_preset(preset)
        want = reference_sequences_that_fit(config, gpu, ctx, util)
        got, crash = call_student(name, fn, config, gpu, ctx, util)
        if crash:
            return failed(name, i, label, crash)
        if isinstance(got, bool) or not isinstance(got, int) or got != want:
            return failed(name, i, label, f"se esperaban {es_value(want)} secuencias y su función "
                          f"devolvió {es_value(got)}.")
    return passed(name, len(cases))


def extension(ext, contract, ctx):
    yield hidden(checks.check_challenge, ext)


def reusable_tokens(fn, ctx):
    yield public(checks.check_reusable_tokens, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_reusable_tokens, fn, seed=s)
    yield hidden(_reuse_edges, fn)


def _reuse_edges(fn, raise_on_fail=False):
    """A one-token prompt, a prefix exactly one interval long with nothing after it, nothing
    shared, and an interval of one token."""
    return checks.reuse_failure("tokens reutilizables de la caché de prefijos (casos límite)", fn,
                                [("un prompt de 1 token", 1, 1, 16),
                                 ("prefijo de 64 tokens, el prompt entero, intervalo 64", 64, 64,
                                  64),
                                 ("nada compartido", 0, 50, 16),
                                 ("intervalo de 1 token, prefijo de 30 en un prompt de 31", 30,
                                  31, 1)])
