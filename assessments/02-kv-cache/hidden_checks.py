"""Hidden checks of lab 2 (``kv_cache``). Loaded by path by the autograder; never imported by a
notebook. Each function is named after a criterion of ``rubric.json`` and yields its stages:
the notebook's public self-check first, then checks the student never saw."""

from __future__ import annotations

import math

import numpy as np

from ai_evolution.checks import call_student, failed, passed
from ai_evolution.checks import kv_cache as checks
from ai_evolution.grading import hidden, public
from ai_evolution.model import ModelConfig, get_preset, weight_bytes
from ai_evolution.model import kv_bytes_per_token as reference_kv_bytes
from ai_evolution.timing import fit_growth as reference_fit


def kv_bytes_per_token(fn, ctx):
    yield public(checks.check_kv_bytes_per_token, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_kv_bytes_per_token, fn, seed=s)
    yield hidden(_kv_bytes_edges, fn)


def _kv_bytes_edges(fn, raise_on_fail=False):
    """Multi-query attention, 4- and 8-bit caches, a head_dim that is not hidden / heads."""
    name = "bytes de caché KV por token (casos límite)"
    mqa = ModelConfig(num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=1,
                      intermediate_size=28672, vocab_size=32000, name="mqa-80-capas")
    wide = ModelConfig(num_layers=3, hidden_size=96, num_heads=3, num_kv_heads=3, head_dim=160,
                       intermediate_size=256, vocab_size=500, name="head_dim-explícito")
    cases = [(mqa, "int4"), (mqa, "fp8"), (wide, "fp32"), (get_preset("llama-3.1-70b"), "int8")]
    for i, (config, dtype) in enumerate(cases):
        expected = reference_kv_bytes(config, dtype)
        got, crash = call_student(name, fn, config, dtype)
        label = f"{config.name}, dtype {dtype}"
        if crash:
            return failed(name, i, label, crash)
        if not isinstance(got, (int, float, np.number)) or not math.isclose(float(got), expected,
                                                                            rel_tol=1e-9):
            return failed(name, i, label, f"se esperaban {expected:g} bytes y su función devolvió "
                          f"{got!r}.")
    return passed(name, len(cases))


def cached_attention(fn, ctx):
    yield public(checks.check_cached_attention, fn, seed=ctx.seed, model=ctx.model())
    for s in ctx.hidden_seeds:  # random tensors and the real model, other prompts
        yield hidden(checks.check_cached_attention, fn, seed=s, model=ctx.model(),
                     max_new_tokens=8)


def fit_growth(fn, ctx):
    yield public(checks.check_fit_growth, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_fit_growth, fn, seed=s)
    yield hidden(_fit_unsorted, fn, seed=ctx.hidden_seeds[0])
    yield hidden(_fit_best_feasible, fn)


def _fit_unsorted(fn, seed, raise_on_fail=False):
    """Measurements in any order: quadratic_share and exponent are read at the largest n, not
    the last one."""
    name = "ajuste del crecimiento (mediciones desordenadas)"
    rng = np.random.default_rng(seed)
    for i in range(3):
        n = rng.permutation(np.arange(8, 200, 8)).astype(float)
        t = 0.01 + 0.002 * n + (i + 1) * 1e-5 * n**2
        label = f"{len(n)} mediciones en orden aleatorio, n de {int(n.min())} a {int(n.max())}"
        got, crash = call_student(name, fn, n.copy(), t.copy())
        if crash:
            return failed(name, i, label, crash)
        wrong = checks.compare_fit(got, reference_fit(n, t))
        if wrong:
            return failed(name, i, label, *wrong)
    return passed(name, 3)


def _fit_best_feasible(fn, raise_on_fail=False):
    """Free fits with negative coefficients where dropping them one by one, or all at once, is
    not the best fit without negative coefficients; times that fall (only the constant is left,
    exponent 0)."""
    name = "ajuste del crecimiento (el mejor sin coeficientes negativos)"
    n = np.arange(8, 200, 8).astype(float)
    cases = [((0.5, -0.001, 1e-4), "el ajuste libre da c1 < 0"),
             ((-0.5, 0.012, -2.5e-5), "el ajuste libre da c0 < 0 y c2 < 0"),
             ((-0.09, 0.01, -6e-5), "tiempos que suben y después bajan"),
             ((1.0, -0.001, 0.0), "tiempos que bajan")]
    for i, ((c0, c1, c2), what) in enumerate(cases):
        t = c0 + c1 * n + c2 * n**2
        label = f"{what}: t = {c0:g} + {c1:g}·n + {c2:g}·n², n de 8 a 192".replace(".", ",")
        got, crash = call_student(name, fn, n.copy(), t.copy())
        if crash:
            return failed(name, i, label, crash)
        wrong = checks.compare_fit(got, reference_fit(n, t))
        if wrong:
            return failed(name, i, label, *wrong)
    return passed(name, len(cases))


def sequences_that_fit(fn, ctx):
    yield public(checks.check_sequences_that_fit, fn)
    yield hidden(_budget_edges, fn)


def _budget_edges(fn, raise_on_fail=False):
    """Exact fits, weights that fill the GPU exactly, a utilization of 1 and fractional bytes."""
    name = "presupuesto de memoria (casos límite)"
    cfg = get_preset("llama-3.1-8b")
    w = weight_bytes(cfg, "bf16")
    per_seq = reference_kv_bytes(cfg, "bf16") * 4096
    cases = [(cfg, w + 5 * per_seq, 4096, 1.0, "bf16"),          # exactly five sequences
             (cfg, w + 5 * per_seq - 1, 4096, 1.0, "bf16"),      # one byte short of five
             (cfg, w, 4096, 1.0, "bf16"),                        # weights fill it: none
             (cfg, w / 0.9, 1024, 0.9, "bf16"),                  # weights fill the usable part
             (get_preset("qwen3-0.6b"), 12e9, 131072, 0.95, "int4")]
    for i, (config, mem, ctx_len, util, dtype) in enumerate(cases):
        expected = checks.reference_sequences_that_fit(config, mem, ctx_len, util, dtype)
        got, crash = call_student(name, fn, config, mem, ctx_len, util, dtype)
        label = f"{config.name}, {mem:.6g} bytes × {util}, contexto {ctx_len}, {dtype}"
        if crash:
            return failed(name, i, label, crash)
        if got != expected:
            return failed(name, i, label, f"se esperaban {expected} secuencias y su función "
                          f"devolvió {got!r}.")
    return passed(name, len(cases))


def extension(ext, contract, ctx):
    yield hidden(_cache_bytes_measured, ext)


def _cache_bytes_measured(ext, raise_on_fail=False):
    """The challenge measures a real allocation: 4 sequences of 256 tokens of tiny-es."""
    name = "reto: bytes de la caché contigua"
    cfg = get_preset("tiny-es")
    m = ext["measurement"]
    for i, (key, dtype) in enumerate((("fp32_bytes", "fp32"), ("fp16_bytes", "fp16"))):
        expected = reference_kv_bytes(cfg, dtype) * 4 * 256
        if not math.isclose(float(m[key]), expected, rel_tol=1e-9):
            return failed(name, i, key, f"la caché de 4 secuencias de 256 tokens de tiny-es en "
                          f"{dtype} ocupa {expected:.0f} bytes y measurement dice {m[key]!r}.")
    return passed(name, 2)
