"""Hidden checks of lab 2 (``kv_cache``). Loaded by path by the autograder; never imported by a
notebook. Each function is named after a criterion of ``rubric.json`` and yields its stages:
the notebook's public self-check first, then checks the student never saw."""

from __future__ import annotations

import math

import numpy as np

from ai_evolution.checks import call_student, failed, passed
from ai_evolution.checks import kv_cache as checks
from ai_evolution.fmt import es_sig, es_value
from ai_evolution.grading import hidden, public
from ai_evolution.model import ModelConfig, get_preset, weight_bytes
from ai_evolution.model import kv_bytes_per_token as reference_kv_bytes
from ai_evolution.timing import fit_growth as reference_fit


def kv_bytes_per_token(fn, ctx):
    yield public(checks.check_kv_bytes_per_token, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_kv_bytes_per_token, fn, seed=s)
    yield hidden(_kv_bytes_edges, fn, ctx.rng("kv_bytes_edges"))


def _kv_bytes_edges(fn, rng, raise_on_fail=False):
    """Multi-query attention, 4- and 8-bit caches, a head_dim that is not hidden / heads; the
    sizes drawn per grading run (``rng``, from the instructor's secret)."""
    layers, heads = int(rng.integers(2, 97)), int(rng.choice([8, 16, 32, 64]))
    mqa = ModelConfig(num_layers=layers, hidden_size=128 * heads, num_heads=heads,
                      num_kv_heads=1, intermediate_size=4 * 128 * heads, vocab_size=32000,
                      name=f"mqa-{layers}-capas")
    width = int(rng.integers(1, 7))
    wide = ModelConfig(num_layers=int(rng.integers(1, 9)), hidden_size=32 * width,
                       num_heads=width, num_kv_heads=width, head_dim=int(rng.integers(3, 65)) * 8,
                       intermediate_size=256, vocab_size=500, name="head_dim-explícito")
    presets = ["llama-3.1-70b", "llama-3.1-8b", "qwen3-0.6b"]
    dtypes = ["int4", "fp8", "int8", "fp32", "bf16", "fp16"]
    cases = [(mqa, "int4"), (mqa, str(rng.choice(["fp8", "int8"]))),
             (wide, str(rng.choice(dtypes))),
             (get_preset(str(rng.choice(presets))), str(rng.choice(dtypes)))]
    return checks.kv_bytes_result("bytes de caché KV por token (casos límite)", fn, cases)


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
    yield hidden(_fit_best_feasible, fn, float(ctx.rng("fit_scale").uniform(0.5, 2.0)))


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


def _fit_best_feasible(fn, scale=1.0, raise_on_fail=False):
    """Free fits with negative coefficients where dropping them one by one, or all at once, is
    not the best fit without negative coefficients; times that fall (only the constant is left,
    exponent 0). The times are scaled by ``scale`` (drawn per grading run): the signs of the
    coefficients, and so each case's trap, stay."""
    name = "ajuste del crecimiento (el mejor sin coeficientes negativos)"
    n = np.arange(8, 200, 8).astype(float)
    cases = [((0.5, -0.001, 1e-4), "el ajuste libre da c1 < 0"),
             ((-0.5, 0.012, -2.5e-5), "el ajuste libre da c0 < 0 y c2 < 0"),
             ((-0.09, 0.01, -6e-5), "tiempos que suben y después bajan"),
             ((1.0, -0.001, 0.0), "tiempos que bajan")]
    for i, ((c0, c1, c2), what) in enumerate(cases):
        c0, c1, c2 = c0 * scale, c1 * scale, c2 * scale
        t = c0 + c1 * n + c2 * n**2
        label = f"{what}: t = {es_sig(c0)} + {es_sig(c1)}·n + {es_sig(c2)}·n², n de 8 a 192"
        got, crash = call_student(name, fn, n.copy(), t.copy())
        if crash:
            return failed(name, i, label, crash)
        wrong = checks.compare_fit(got, reference_fit(n, t))
        if wrong:
            return failed(name, i, label, *wrong)
    return passed(name, len(cases))


def sequences_that_fit(fn, ctx):
    yield public(checks.check_sequences_that_fit, fn)
    yield hidden(_budget_edges, fn, ctx.rng("budget_edges"))


def _budget_edges(fn, rng, raise_on_fail=False):
    """Exact fits, one byte short, weights plus reserve that fill the GPU exactly, a block size
    of one token, a context that is a whole number of blocks and one that is one token more;
    the model, the counts and the sizes drawn per grading run (``rng``, from the secret)."""
    name = "presupuesto de memoria (casos límite)"
    cfg = get_preset(str(rng.choice(["llama-3.1-8b", "llama-3.1-70b", "qwen3-0.6b"])))
    wdt, kdt = str(rng.choice(["bf16", "fp16", "int8"])), str(rng.choice(["bf16", "fp8", "int4"]))
    bs = int(rng.choice([8, 16, 32]))
    blocks_per_seq = int(rng.integers(16, 513))
    ctx_len = bs * blocks_per_seq
    fit = int(rng.integers(2, 12))
    w = weight_bytes(cfg, wdt)
    block = reference_kv_bytes(cfg, kdt) * bs
    act = int(rng.integers(1, 9)) * 2**28
    room = w + act + fit * blocks_per_seq * block
    cases = [(cfg, room, 1.0, act, wdt, kdt, bs, ctx_len),                 # `fit` exactly
             (cfg, room - 1, 1.0, act, wdt, kdt, bs, ctx_len),             # one byte short
             (cfg, w + act, 1.0, act, wdt, kdt, bs, ctx_len),              # weights and reserve
             (cfg, room, 1.0, act, wdt, kdt, bs, ctx_len + 1),             # one block more
             (cfg, w + fit * ctx_len * block / bs, 1.0, 0.0, wdt, kdt, 1, ctx_len),  # 1-token blocks
             (get_preset("qwen3-0.6b"), float(rng.integers(4, 80)) * 1e9,
              float(rng.choice([0.8, 0.9, 0.95])), 0.0, "bf16", "int4", bs,
              int(rng.integers(1, 129)) * 1024)]
    for i, args in enumerate(cases):
        got, crash = call_student(name, fn, *args)
        label = checks.budget_label(*args)
        if crash:
            return failed(name, i, label, crash)
        wrong = checks.compare_budget(got, args)
        if wrong:
            return failed(name, i, label, *wrong)
    return passed(name, len(cases))


def extension(ext, contract, ctx):
    yield hidden(_context_cost, ext, ctx.params)


def _context_cost(ext, params, raise_on_fail=False):
    """The challenge's prediction is the KV cache the first decode step reads (the prompt and
    the new token) in one of the dtypes tiny-es runs in; the long prompt is at least eight
    times the short one and fits in the model; the measured ratio is the ratio of the medians,
    inside its interval, over at least two interleaved rounds."""
    name = "reto: lo que cuesta el contexto con caché"
    m = ext["measurement"]
    cfg = get_preset("tiny-es")
    short, long_, new = (int(m[k]) for k in ("short_prompt_len", "long_prompt_len", "new_tokens"))
    if long_ < 8 * short or short < 1:
        return failed(name, 0, "long_prompt_len", f"el prompt largo ({long_} tokens) debe tener "
                      f"al menos ocho veces los tokens del corto ({short}).")
    if long_ + new > cfg.max_position_embeddings or new < 2:
        return failed(name, 1, "long_prompt_len + new_tokens", f"{long_} + {new} tokens no caben "
                      f"en las {cfg.max_position_embeddings} posiciones de tiny-es, o no hay "
                      "pasos de decodificación que medir.")
    per_token = [reference_kv_bytes(cfg, d) for d in ("fp32", "bf16", "fp16")]
    if not any(math.isclose(m["short_kv_bytes"], p * (short + 1), rel_tol=1e-9) and
               math.isclose(m["long_kv_bytes"], p * (long_ + 1), rel_tol=1e-9)
               for p in per_token):
        return failed(name, 2, "short_kv_bytes, long_kv_bytes", f"el primer paso lee la caché "
                      f"del prompt y de su propio token: {short + 1} y {long_ + 1} posiciones "
                      f"de {es_value(per_token[0])} bytes en fp32 (o la mitad en 16 bits), y "
                      f"measurement dice {es_value(m['short_kv_bytes'])} y "
                      f"{es_value(m['long_kv_bytes'])}.")
    if not 1 < m["bytes_ratio"] < m["long_kv_bytes"] / m["short_kv_bytes"]:
        return failed(name, 3, "bytes_ratio", f"el paso lee también los pesos, los mismos con las "
                      f"dos longitudes, así que el cociente de sus bytes queda entre 1 y el de "
                      f"la caché sola; measurement dice "
                      f"{es_value(m['bytes_ratio'])}.")
    ratio = m["long_ms_per_token"] / m["short_ms_per_token"]
    if not math.isclose(m["time_ratio"], ratio, rel_tol=1e-6):
        return failed(name, 4, "time_ratio", f"el cociente de las medianas medidas es "
                      f"{es_sig(ratio)} y measurement dice {es_value(m['time_ratio'])}.")
    if not m["time_ratio_low"] <= m["time_ratio"] <= m["time_ratio_high"]:
        return failed(name, 5, "time_ratio_low, time_ratio_high", "el intervalo del cociente "
                      "debe contener el cociente medido.")
    if m["repeats"] < 2 or m["repeats"] != int(m["repeats"]):
        return failed(name, 6, "repeats", f"con {es_value(m['repeats'])} rondas no se puede "
                      "separar una diferencia del ruido: hacen falta al menos 2.")
    return passed(name, 7)
