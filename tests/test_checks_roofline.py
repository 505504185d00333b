"""The roofline self-checks accept the references and reject plausible mistakes, naming them."""

import pytest

from ai_evolution.checks import CheckFailed
from ai_evolution.checks import roofline as checks
from ai_evolution.model import dtype_bytes, get_preset, kv_bytes_per_token, weight_bytes
from ai_evolution.sim import decode_step_cost, weight_bytes_read
from checkutil import fails




def _tweak(**changes):
    """The reference decode roofline with some keys recomputed by ``changes[key](ref, args)``."""
    def fn(config, dtype, batch, ctx, bw):
        ref = checks.reference_decode_roofline(config, dtype, batch, ctx, bw)
        args = (config, dtype, batch, ctx, bw)
        for key, f in changes.items():
            ref[key] = f(ref, args)
        if "bytes" in changes:  # a student derives the rest from the wrong bytes
            ref["intensity"] = ref["flops"] / ref["bytes"]
            ref["floor_s"] = ref["bytes"] / bw
        return ref
    return fn


# --- (a) decode roofline -----------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decode_check_accepts_reference(seed):
    assert checks.check_decode_roofline(checks.reference_decode_roofline, seed=seed,
                                        raise_on_fail=False).passed


def test_reference_decode_roofline_reproduces_the_book_floor():
    r = checks.reference_decode_roofline(get_preset("llama-3.1-8b"), "bf16", 1, 0, 3.35e12)
    assert r["floor_s"] * 1e3 == pytest.approx(4.5, abs=0.05)
    assert r["intensity"] == pytest.approx(r["flops"] / r["bytes"])


def _kv(config, dtype, batch, ctx):
    return kv_bytes_per_token(config, dtype) * (ctx + 1) * batch


def test_decode_check_names_the_whole_embedding_table():
    fn = _tweak(bytes=lambda r, a: weight_bytes(a[0], a[1]) + _kv(a[0], a[1], a[2], a[3]))
    fails(checks.check_decode_roofline, fn, "falla el caso 1", "llama-2-7b", "bytes:",
           "tabla de embeddings no se multiplica")


def test_decode_check_names_a_forgotten_kv_cache():
    fn = _tweak(bytes=lambda r, a: weight_bytes_read(a[0], a[1], a[2]))
    fails(checks.check_decode_roofline, fn, "falla el caso 1", "caché KV entera")


def test_decode_check_names_the_kv_of_one_sequence():
    fn = _tweak(bytes=lambda r, a: weight_bytes_read(a[0], a[1], a[2]) + _kv(a[0], a[1], 1, a[3]))
    fails(checks.check_decode_roofline, fn, "una sola secuencia")


def test_decode_check_names_context_off_by_one():
    fn = _tweak(bytes=lambda r, a: r["bytes"] - a[2] * kv_bytes_per_token(a[0], a[1]))
    fails(checks.check_decode_roofline, fn, "también se atiende a sí mismo")


def test_decode_check_names_a_tied_table_treated_as_untied():
    def fn(config, dtype, batch, ctx, bw):
        ref = checks.reference_decode_roofline(config, dtype, batch, ctx, bw)
        if config.tie_word_embeddings:
            ref["bytes"] -= config.vocab_size * config.hidden_size * dtype_bytes(dtype)
        return ref
    fails(checks.check_decode_roofline, fn, "falla el caso 2", "qwen3-0.6b", "ata los embeddings")


def test_decode_check_names_flops_without_factor_two():
    fn = _tweak(flops=lambda r, a: r["flops"] / 2)
    fails(checks.check_decode_roofline, fn, "flops:", "dos operaciones por token")


def test_decode_check_names_missing_attention_flops():
    from ai_evolution.sim import matmul_params
    fn = _tweak(flops=lambda r, a: 2 * matmul_params(a[0]) * a[2])
    fails(checks.check_decode_roofline, fn, "flops:", "atención")


def test_decode_check_names_inverted_intensity():
    fn = _tweak(intensity=lambda r, a: r["bytes"] / r["flops"])
    fails(checks.check_decode_roofline, fn, "intensity:", "el inverso")


def test_decode_check_names_floor_in_bits():
    fn = _tweak(floor_s=lambda r, a: 8 * r["bytes"] / a[4])
    fails(checks.check_decode_roofline, fn, "floor_s:", "bits")


def test_decode_check_names_floor_with_gigabytes():
    fn = _tweak(floor_s=lambda r, a: r["bytes"] / 1e9 / a[4])
    fails(checks.check_decode_roofline, fn, "floor_s:", "Mezcla de unidades")


def test_decode_check_requires_the_four_keys():
    fn = lambda *a: {"bytes": 1.0}  # noqa: E731
    fails(checks.check_decode_roofline, fn, "intensity", "floor_s")


def test_decode_check_prints_numbers_with_decimal_comma():
    fn = _tweak(floor_s=lambda r, a: 2 * r["floor_s"])
    msg = fails(checks.check_decode_roofline, fn, "floor_s:").message
    assert "," in msg.split("floor_s:")[1] and "." not in msg.split("floor_s:")[1].split(" s")[0]


# --- (b) step time -----------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_predict_check_accepts_reference(seed):
    assert checks.check_predict_step(checks.reference_predict_step, seed=seed,
                                     raise_on_fail=False).passed


def test_predict_cases_hold_both_regimes_and_overheads():
    cases = checks.predict_step_cases()
    bound = {b / bw > f / p for _, b, f, bw, p, _ in cases}
    assert bound == {True, False}
    assert {o > 0 for *_, o in cases} == {True, False}


def test_reference_predict_step_names_the_binding_floor_and_the_ridge():
    r = checks.reference_predict_step(1e9, 1e12, 1e12, 1e15, 1e-4)  # both limits take 1 ms
    assert r == {"time_s": pytest.approx(1.1e-3), "bound": "memory", "ridge_intensity": 1000.0}
    assert checks.reference_predict_step(1e9, 2e12, 1e12, 1e15, 0.0)["bound"] == "compute"


def _predict(time=None, bound=None, ridge=None):
    """The reference with one answer replaced by ``f(bytes, flops, bw, peak, overhead)``."""
    def fn(b, f, bw, p, o):
        r = checks.reference_predict_step(b, f, bw, p, o)
        for key, g in (("time_s", time), ("bound", bound), ("ridge_intensity", ridge)):
            if g is not None:
                r[key] = g(b, f, bw, p, o)
        return r
    return fn


def test_predict_check_names_a_sum_of_limits():
    fn = _predict(time=lambda b, f, bw, p, o: b / bw + f / p + o)
    fails(checks.check_predict_step, fn, "falla el caso 1", "time_s:", "no se suman", "más lento")


def test_predict_check_names_min_instead_of_max():
    fn = _predict(time=lambda b, f, bw, p, o: min(b / bw, f / p) + o)
    fails(checks.check_predict_step, fn, "límite más rápido", "la memoria")


def test_predict_check_names_memory_only_on_a_compute_bound_step():
    fn = _predict(time=lambda b, f, bw, p, o: b / bw + o)
    fails(checks.check_predict_step, fn, "falla el caso 2", "prefill", "el cómputo")


def test_predict_check_names_a_forgotten_overhead():
    fn = _predict(time=lambda b, f, bw, p, o: max(b / bw, f / p))
    fails(checks.check_predict_step, fn, "falla el caso 1", "overhead_s")


def test_predict_check_names_the_slower_limit_as_the_binding_one():
    fn = _predict(bound=lambda b, f, bw, p, o: "memory" if b / bw < f / p else "compute")
    fails(checks.check_predict_step, fn, "falla el caso 1", "bound:", "«memory»", "más tarda")


def test_predict_check_tells_ridge_from_the_step_intensity_and_its_inverse():
    fails(checks.check_predict_step, _predict(ridge=lambda b, f, bw, p, o: f / b),
          "falla el caso 1", "ridge_intensity:", "intensidad del paso")
    fails(checks.check_predict_step, _predict(ridge=lambda b, f, bw, p, o: bw / p),
          "falla el caso 1", "el inverso")


def test_predict_check_requires_the_three_keys():
    fails(checks.check_predict_step, lambda *a: 0.01, "time_s, bound, ridge_intensity")


# --- (c) departure batch -----------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_departure_check_accepts_reference(seed):
    assert checks.check_departure_batch(checks.reference_departure_batch, seed=seed,
                                        raise_on_fail=False).passed


def test_reference_departure_batch_calibrates_on_the_first_batch():
    ref = checks.reference_departure_batch
    costs = [{"bytes": 2.0**23, "flops": 0.0}] * 3  # reading takes 2**-7 s at every batch
    u = 2.0**-8
    # measured batch 1 = 3u: overhead u, every prediction 3u; 1,25 x 3u = 3,75u is not beyond
    assert ref([1, 2, 4], [3 * u, 3.75 * u, 4 * u], costs, 2.0**30, 2.0**40, 0.25) == 4
    # batch 1 faster than its roofline: overhead 0, not negative
    assert ref([1, 2, 4], [u, 2.5 * u, 2.5 * u], costs, 2.0**30, 2.0**40, 0.25) is None
    with pytest.raises(ValueError, match="ordenada"):
        ref([4, 2, 1], [1.0] * 3, costs, 1e9, 1e12, 0.1)


def test_departure_cases_cover_the_listed_situations():
    answers = [checks.reference_departure_batch(b, m, c, bw, p, t)
               for _, b, m, c, bw, p, t in checks.departure_cases()]
    assert None in answers and any(a is not None for a in answers)


def _departure(mode="calibrated", memory_only=False, beyond=lambda m, p, t: m > p * (1 + t),
               index=False):
    def fn(batches, meas, costs, bw, peak, tol):
        pred = checks.calibrated_prediction(meas, costs, bw, peak, mode, memory_only)
        return next((k if index else b for k, (b, m, p) in enumerate(zip(batches, meas, pred))
                     if beyond(m, p, tol)), None)
    return fn


def test_departure_check_names_a_prediction_without_overhead():
    fails(checks.check_departure_batch, _departure(mode="none"), "falla el caso 1",
          "no lleva sobrecarga")


def test_departure_check_names_a_negative_overhead():
    fails(checks.check_departure_batch, _departure(mode="signed"), "falla el caso 3",
          "no negativa")


def test_departure_check_names_a_memory_only_prediction():
    fails(checks.check_departure_batch, _departure(memory_only=True), "falla el caso 2",
          "solo cuenta la memoria")


def test_departure_check_names_the_index_instead_of_the_batch():
    fails(checks.check_departure_batch, _departure(index=True), "falla el caso 1",
          "posición en la lista")


def test_departure_check_names_absolute_tolerance():
    fails(checks.check_departure_batch, _departure(beyond=lambda m, p, t: m - p > t),
          "falla el caso 1", "relativa")


def test_departure_check_names_greater_or_equal():
    fails(checks.check_departure_batch, _departure(beyond=lambda m, p, t: m >= p * (1 + t)),
          "falla el caso 5", "exactamente igual")


def test_departure_check_names_the_last_departure():
    def fn(batches, meas, costs, bw, peak, tol):
        pred = checks.calibrated_prediction(meas, costs, bw, peak)
        hits = [b for b, m, p in zip(batches, meas, pred) if m > p * (1 + tol)]
        return hits[-1] if hits else None
    fails(checks.check_departure_batch, fn, "PRIMER")


def test_departure_check_requires_none_when_it_never_departs():
    def fn(*args):
        return checks.reference_departure_batch(*args) or -1
    fails(checks.check_departure_batch, fn, "falla el caso 2", "devuelva None")


def test_check_messages_use_the_decimal_comma():
    import re
    for check, fn in ((checks.check_predict_step, _predict(time=lambda b, f, bw, p, o: 2 * o + 1)),
                      (checks.check_predict_step, _predict(ridge=lambda b, f, bw, p, o: 0.5)),
                      (checks.check_departure_batch, lambda *a: 1.5)):
        msg = check(fn, raise_on_fail=False).message
        assert not re.search(r"(?<![\w-])\d+\.\d", msg), msg


# --- shared behaviour --------------------------------------------------------------------------

@pytest.mark.parametrize("check, arity", [(checks.check_decode_roofline, 5),
                                          (checks.check_predict_step, 5),
                                          (checks.check_departure_batch, 6)])
def test_unimplemented_exercise_propagates_its_hint(check, arity):
    def stub(*args):
        assert len(args) == arity
        raise NotImplementedError("Ejercicio sin resolver. Pista")
    with pytest.raises(NotImplementedError, match="Pista"):
        check(stub)


@pytest.mark.parametrize("check", [checks.check_decode_roofline, checks.check_predict_step,
                                   checks.check_departure_batch])
def test_crashing_student_function_is_reported_not_raised(check):
    result = check(lambda *a: 1 / 0, raise_on_fail=False)
    assert not result.passed and "ZeroDivisionError" in result.message


@pytest.mark.parametrize("check", [checks.check_decode_roofline, checks.check_predict_step,
                                   checks.check_departure_batch])
def test_failed_check_raises_in_notebooks(check):
    with pytest.raises(CheckFailed, match="falla el caso 1"):
        check(lambda *a: "nada")


def test_passing_check_prints_its_verdict(capsys):
    result = checks.check_predict_step(checks.reference_predict_step)
    assert result.passed and "correcto en" in capsys.readouterr().out


def test_decode_step_cost_is_what_the_check_expects():
    cfg = get_preset("llama-2-7b")
    r = checks.reference_decode_roofline(cfg, "fp16", 8, 100, 2e12)
    assert r["bytes"] == decode_step_cost(cfg, 8, 100, "fp16").bytes
