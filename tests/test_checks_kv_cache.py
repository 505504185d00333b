"""The KV-cache self-checks accept the reference and reject plausible mistakes, naming them."""

import math

import numpy as np
import pytest
import torch

from ai_evolution.checks import CheckFailed
from ai_evolution.checks import kv_cache as checks
from ai_evolution.model import dtype_bytes, kv_bytes_per_token, weight_bytes
from ai_evolution.model.attention import cached_attention
from ai_evolution.timing import fit_growth
from checkutil import fails




def test_kv_bytes_check_accepts_reference():
    assert checks.check_kv_bytes_per_token(kv_bytes_per_token, raise_on_fail=False).passed


def test_kv_bytes_check_names_missing_factor_two():
    fn = lambda c, d: c.num_layers * c.num_kv_heads * c.head_dim * dtype_bytes(d)  # noqa: E731
    fails(checks.check_kv_bytes_per_token, fn, "falla el caso 1", "K y V")


def test_kv_bytes_check_names_query_heads_instead_of_kv_heads():
    fn = lambda c, d: 2 * c.num_layers * c.num_heads * c.head_dim * dtype_bytes(d)  # noqa: E731
    fails(checks.check_kv_bytes_per_token, fn, "llama-3.1-8b", "num_kv_heads")


def test_kv_bytes_check_names_bits_instead_of_bytes():
    fn = lambda c, d: 8 * kv_bytes_per_token(c, d)  # noqa: E731
    fails(checks.check_kv_bytes_per_token, fn, "bits")


def test_failed_check_raises_in_notebooks():
    with pytest.raises(CheckFailed, match="se esperaban"):
        checks.check_kv_bytes_per_token(lambda c, d: 0)


def test_unimplemented_exercise_propagates_its_hint():
    def stub(c, d):
        raise NotImplementedError("Ejercicio sin resolver. Pista")
    with pytest.raises(NotImplementedError, match="Pista"):
        checks.check_kv_bytes_per_token(stub)


def test_crashing_student_function_is_reported_not_raised():
    result = checks.check_kv_bytes_per_token(lambda c, d: 1 / 0, raise_on_fail=False)
    assert "ZeroDivisionError" in result.message


@pytest.fixture(scope="module")
def small_model():
    from ai_evolution.model import ModelConfig
    from ai_evolution.model.checkpoint import random_model
    cfg = ModelConfig(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                      intermediate_size=128, vocab_size=96, name="prueba")
    return random_model(cfg, seed=0)


def test_attention_check_accepts_reference(small_model):
    assert checks.check_cached_attention(cached_attention, model=small_model,
                                         raise_on_fail=False).passed


def _no_mask(q, k_new, v_new, k_cache, v_cache, positions):
    b, hkv, t, d = k_new.shape
    idx = positions[:, None, :, None].expand(b, hkv, t, d)
    k_cache.scatter_(2, idx, k_new)
    v_cache.scatter_(2, idx, v_new)
    s = int(positions.max()) + 1
    k = k_cache[:, :, :s].repeat_interleave(q.shape[1] // hkv, 1)
    v = v_cache[:, :, :s].repeat_interleave(q.shape[1] // hkv, 1)
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), -1) @ v


def test_attention_check_rejects_attending_to_future_positions(small_model):
    fails(checks.check_cached_attention, _no_mask, "la salida difiere", model=small_model)


def test_attention_check_rejects_a_cache_that_is_not_written(small_model):
    def forgets_cache(q, k_new, v_new, k_cache, v_cache, positions):
        return cached_attention(q, k_new, v_new, k_cache.clone(), v_cache.clone(), positions)
    fails(checks.check_cached_attention, forgets_cache, "caché quedó mal escrita",
           model=small_model)


def test_attention_check_rejects_off_by_one_cache_index(small_model):
    def off_by_one(q, k_new, v_new, k_cache, v_cache, positions):
        return cached_attention(q, k_new, v_new, k_cache, v_cache, positions + 1)
    fails(checks.check_cached_attention, off_by_one, "caché quedó mal escrita", model=small_model)


def _at_max(c0, c1, c2, n_at):
    fitted = c0 + c1 * n_at + c2 * n_at**2
    return {"c0": c0, "c1": c1, "c2": c2, "quadratic_share": c2 * n_at**2 / fitted,
            "exponent": (c1 * n_at + 2 * c2 * n_at**2) / fitted}


def test_fit_check_accepts_reference_and_rejects_reversed_coefficients():
    assert checks.check_fit_growth(fit_growth, raise_on_fail=False).passed

    def reversed_fit(n, t):
        f = fit_growth(n, t)
        return f | {"c0": f["c2"], "c2": f["c0"]}
    fails(checks.check_fit_growth, reversed_fit, "c2", "orden de los coeficientes")


def test_fit_check_rejects_free_least_squares_with_the_physical_hint():
    def free_fit(n, t):
        c2, c1, c0 = np.polyfit(np.asarray(n, float), np.asarray(t, float), 2)
        return _at_max(c0, c1, c2, float(np.max(n)))
    fails(checks.check_fit_growth, free_fit, "el ajuste libre da", "no tiene sentido físico")


def test_fit_check_rejects_dropping_every_negative_term_at_once():
    """Greedy: drop all negative terms, refit, stop at the first feasible fit (not the best)."""
    def greedy(n, t):
        n, t = np.asarray(n, float), np.asarray(t, float)
        design, cols = np.stack([np.ones_like(n), n, n**2], axis=1), [0, 1, 2]
        while True:
            coef, *_ = np.linalg.lstsq(design[:, cols], t, rcond=None)
            if np.all(coef >= 0):
                full = np.zeros(3)
                full[cols] = coef
                return _at_max(*full, float(n.max()))
            cols = [c for c, v in zip(cols, coef) if v >= 0]
    from ai_evolution.grading.assessment import find_assessment
    hidden = find_assessment("kv_cache").hidden_module._fit_best_feasible
    result = hidden(greedy)
    assert not result.passed and "menor error" in result.message, result.message


def test_fit_check_names_the_missing_exponent():
    def no_exponent(n, t):
        return {k: v for k, v in fit_growth(n, t).items() if k != "exponent"}
    fails(checks.check_fit_growth, no_exponent, "exponent")


def test_fit_reference_stays_physical_on_noisy_linear_data():
    """The metric the chapter reads: shares in [0, 1] and exponents in [0, 2], never 115 %."""
    rng = np.random.default_rng(0)
    n = np.arange(1, 161, dtype=float)
    for _ in range(50):
        t = np.cumsum(0.004 + 0.002 * rng.standard_normal(n.shape).clip(-1.5, 3))
        f = fit_growth(n, t)
        assert min(f["c0"], f["c1"], f["c2"]) >= 0
        assert 0 <= f["quadratic_share"] <= 1 and 0 <= f["exponent"] <= 2


def _budget(rounding=math.floor, reserve=True, blocks=True, kv_in_weight_dtype=False,
            negative=False):
    """The memory budget, written as a student would, with one of the plausible mistakes."""
    def fn(cfg, mem, util, act, wdt, kdt, block, ctx):
        budget = mem * util - weight_bytes(cfg, wdt) - (act if reserve else 0.0)
        if budget <= 0 and not negative:
            return {"kv_budget_bytes": 0.0, "num_blocks": 0, "max_tokens": 0, "sequences": 0}
        per_token = kv_bytes_per_token(cfg, wdt if kv_in_weight_dtype else kdt)
        n_blocks = math.floor(budget / (per_token * block))
        seqs = rounding(n_blocks / math.ceil(ctx / block)) if blocks else \
            rounding(budget / (per_token * ctx))
        return {"kv_budget_bytes": budget, "num_blocks": n_blocks,
                "max_tokens": n_blocks * block, "sequences": seqs}
    return fn


def test_budget_check_accepts_reference_and_a_student_version():
    assert checks.check_sequences_that_fit(checks.reference_sequences_that_fit,
                                           raise_on_fail=False).passed
    assert checks.check_sequences_that_fit(_budget(), raise_on_fail=False).passed


@pytest.mark.parametrize("mistake, match", [
    (dict(rounding=math.ceil), "Redondee hacia abajo"),
    (dict(reserve=False), "reserva de activaciones"),
    (dict(blocks=False), "bloques enteros"),
    (dict(kv_in_weight_dtype=True), "La caché va en fp8"),
    (dict(negative=True), "no negativo"),
])
def test_budget_check_names_each_plausible_mistake(mistake, match):
    fails(checks.check_sequences_that_fit, _budget(**mistake), "Pista:", match)


def test_budget_check_rejects_ignoring_the_weights_and_old_answers():
    def no_weights(cfg, mem, util, act, wdt, kdt, block, ctx):
        return _budget()(cfg, mem + weight_bytes(cfg, wdt) / util, util, act, wdt, kdt, block, ctx)
    fails(checks.check_sequences_that_fit, no_weights, "kv_budget_bytes: se esperaba")
    fails(checks.check_sequences_that_fit, lambda *a: 4, "se espera un dict con las claves")


def test_kv_cache_check_messages_use_the_decimal_comma():
    import re
    for check, fn in ((checks.check_kv_bytes_per_token, lambda c, d: 1.5),
                      (checks.check_sequences_that_fit, _budget(reserve=False)),
                      (checks.check_fit_growth, lambda n, t: {k: 0.25 for k in checks.FIT_KEYS})):
        msg = check(fn, raise_on_fail=False).message
        assert not re.search(r"(?<![\w-])\d+\.\d", msg), msg


def test_extension_check_requires_four_keys_and_a_number():
    good = {"assumption": "La caché crece lineal.", "measurement": {"bytes": 10},
            "conclusion": "Coincide con la fórmula.", "limitation": "Solo un tamaño medido."}
    assert checks.check_student_extension(good, raise_on_fail=False).passed
    assert "'limitation'" in checks.check_student_extension(
        {**good, "limitation": ""}, raise_on_fail=False).message
    assert "ningún número" in checks.check_student_extension(
        {**good, "measurement": {"bytes": "diez"}}, raise_on_fail=False).message
