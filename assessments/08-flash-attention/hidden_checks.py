"""Hidden checks of lab 8 (``flash_attention``). Loaded by path by the autograder; never imported
by a notebook. Each function is named after a criterion of ``rubric.json`` and yields its stages:
the notebook's public self-check first, then checks the student never saw."""

from __future__ import annotations

import math

import torch

from ai_evolution.checks import call_student, failed, passed
from ai_evolution.checks import flash_attention as checks
from ai_evolution.fmt import es_sig, es_value
from ai_evolution.grading import hidden, public
from ai_evolution.model.flash import init_state, online_softmax_update as reference_update
from ai_evolution.reference.flash_attention import exact_attention, reference_tiled_bytes


def online_softmax_update(fn, ctx):
    yield public(checks.check_online_softmax_update, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_online_softmax_update, fn, seed=s)
    yield hidden(_update_edges, fn)


def _update_edges(fn, raise_on_fail=False):
    """Ties at the maximum, a tile of one key that equals the running max, a float64 state, a
    row whose scores are all equal and very negative (exp underflows without the max)."""
    name = "actualización en línea del softmax (casos límite)"
    g = torch.Generator().manual_seed(11)
    cases = []
    s, v = torch.zeros(2, 6), torch.randn(6, 3, generator=g)
    cases.append(("puntuaciones empatadas en el máximo", init_state((2,), 3), s, v))
    m, l, o = reference_update(*init_state((2,), 3), torch.tensor([[1.0, 2.0], [0.0, 3.0]]),
                               torch.randn(2, 3, generator=g))
    cases.append(("un bloque de una clave igual al máximo del estado", (m, l, o),
                  torch.tensor([[2.0], [3.0]]), torch.randn(1, 3, generator=g)))
    s64, v64 = torch.randn(3, 5, generator=g).double(), torch.randn(5, 2, generator=g).double()
    cases.append(("estado y bloque en float64", init_state((3,), 2, dtype=torch.float64), s64, v64))
    cases.append(("puntuaciones iguales y muy negativas (−2000): sin restar el máximo, todo se "
                  "anula", init_state((1,), 2), torch.full((1, 4), -2000.0),
                  torch.randn(4, 2, generator=g)))
    for i, (label, state, scores, vals) in enumerate(cases):
        expected = reference_update(*state, scores, vals)
        got, crash = call_student(name, fn, *(t.clone() for t in state), scores.clone(), vals.clone())
        if crash:
            return failed(name, i, label, crash)
        if not (isinstance(got, (tuple, list)) and len(got) == 3 and all(torch.is_tensor(t) for t in got)):
            return failed(name, i, label, f"se esperaba una tupla (m, l, o) de tres tensores y se "
                          f"obtuvo {type(got).__name__}.")
        for key, a, b in zip("mlo", got, expected):
            if a.shape != b.shape or not torch.allclose(a.double(), b.double(), rtol=1e-6, atol=1e-9):
                return failed(name, i, label, f"{key} difiere del esperado.")
    return passed(name, len(cases))


def tiled_attention(fn, ctx):
    yield public(checks.check_tiled_attention, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_tiled_attention, fn, seed=s, memory_n=512)
    yield hidden(_tiled_edges, fn)


def _tiled_edges(fn, raise_on_fail=False):
    """A decode row against a long cache with one-key tiles, multi-query attention (one KV head
    for eight query heads), a single token, and a prefill whose query tile is one row."""
    name = "atención por bloques (casos límite)"
    g = torch.Generator().manual_seed(23)
    specs = [(1, 2, 1, 1, 40, 8, True, 1, 1, "un paso de decodificación, bloques de 1 × 1"),
             (2, 8, 1, 9, 9, 4, True, 4, 4, "8 cabezas de consulta sobre 1 cabeza KV (MQA)"),
             (1, 1, 1, 1, 1, 4, True, 16, 16, "un solo token"),
             (1, 2, 2, 12, 12, 8, True, 1, 5, "bloques de una fila de consulta"),
             (1, 2, 2, 6, 11, 8, False, 4, 4, "sin máscara, menos consultas que claves")]
    for i, (b, h, hkv, t, s, d, causal, bq, bk, label) in enumerate(specs):
        case = {"q": torch.randn(b, h, t, d, generator=g), "k": torch.randn(b, hkv, s, d, generator=g),
                "v": torch.randn(b, hkv, s, d, generator=g), "causal": causal, "q_positions": None,
                "block_q": bq, "block_k": bk}
        got, crash = checks._call_tiled(fn, case)
        if crash:
            return failed(name, i, label, crash)
        expected = exact_attention(case["q"], case["k"], case["v"], causal)
        if not torch.is_tensor(got) or got.shape != expected.shape:
            return failed(name, i, label, f"se esperaba un tensor de forma {tuple(expected.shape)}.")
        err = float((got.double() - expected).abs().max())
        if not err <= 1e-4:
            return failed(name, i, label, f"la salida difiere de la atención exacta (diferencia "
                          f"máxima {es_sig(err, 3)}).")
    return passed(name, len(specs))


def flash_step(fn, ctx):
    yield public(checks.check_flash_step, fn, seed=ctx.seed, model=ctx.model())
    for s in ctx.hidden_seeds:  # random tensors and the real model, other prompts
        yield hidden(checks.check_flash_step, fn, seed=s, model=ctx.model(), max_new_tokens=6)


def tiled_bytes(fn, ctx):
    yield public(checks.check_tiled_bytes, fn)
    yield hidden(_bytes_edges, fn, ctx.rng("bytes_edges"))


def _bytes_edges(fn, rng, raise_on_fail=False):
    """One token, tiles of the whole sequence, a key tile longer than the sequence, a long
    sequence with tiles that do not divide it, 4-byte elements; then sizes drawn per grading
    run (``rng``, from the instructor's secret), so that no table of cases can pass."""
    name = "bytes que mueve la atención por bloques (casos límite)"
    cases = [(1, 64, 64, 64, 2, True), (512, 64, 512, 512, 2, True), (100, 32, 16, 256, 2, True),
             (1 << 17, 128, 96, 80, 2, True), (333, 64, 7, 3, 4, False), (64, 16, 1, 1, 2, True)]
    for _ in range(6):
        cases.append((int(rng.integers(1, 1 << 16)), int(rng.choice([16, 32, 64, 128])),
                      int(rng.integers(1, 257)), int(rng.integers(1, 257)),
                      int(rng.choice([1, 2, 4])), bool(rng.random() < 0.7)))
    for i, (n, d, bq, bk, e, causal) in enumerate(cases):
        label = f"n = {n}, d = {d}, bloques de {bq} × {bk}, {e} bytes, causal = {causal}"
        expected = reference_tiled_bytes(n, d, bq, bk, e, causal)
        got, crash = call_student(name, fn, n, d, bq, bk, e, causal)
        if crash:
            return failed(name, i, label, crash)
        try:
            ok = math.isclose(float(got), expected, rel_tol=1e-12)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            return failed(name, i, label, f"se esperaban {es_sig(expected, 12)} bytes y su función "
                          f"devolvió {es_value(got)}.")
    return passed(name, len(cases))


def extension(ext, contract, ctx):
    yield hidden(checks.check_challenge, ext)
