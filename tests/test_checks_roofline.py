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
    fails(checks.check_decode_roofline, fn, "context_len + 1")


def test_decode_check_names_a_tied_table_treated_as_untied():
    def fn(config, dtype, batch, ctx, bw):
        ref = checks.reference_decode_roofline(config, dtype, batch, ctx, bw)
        if config.tie_word_embeddings:
            ref["bytes"] -= config.vocab_size * config.hidden_size * dtype_bytes(dtype)
        return ref
    fails(checks.check_decode_roofline, fn, "falla el caso 2", "qwen3-0.6b", "ata los embeddings")


def test_decode_check_names_flops_without_factor_two():
    fn = _tweak(flops=lambda r, a: r["flops"] / 2)
    fails(checks.check_decode_roofline, fn, "flops:", "2 FLOP por token")


def test_decode_check_names_missing_attention_flops():
    from ai_evolution.sim import matmul_params
    fn = _tweak(flops=lambda r, a: 2 * matmul_params(a[0]) * a[2])
    fails(checks.check_decode_roofline, fn, "flops:", "atención")


def test_decode_check_names_inverted_intensity():
    fn = _tweak(intensity=lambda r, a: r["bytes"] / r["flops"])
    fails(checks.check_decode_roofline, fn, "intensity:", "no al revés")


def test_decode_check_names_floor_in_bits():
    fn = _tweak(floor_s=lambda r, a: 8 * r["bytes"] / a[4])
    fails(checks.check_decode_roofline, fn, "floor_s:", "bits")


def test_decode_check_names_floor_with_gigabytes():
    fn = _tweak(floor_s=lambda r, a: r["bytes"] / 1e9 / a[4])
    fails(checks.check_decode_roofline, fn, "floor_s:", "mezcla de unidades")


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


def test_predict_check_names_a_sum_of_limits():
    fn = lambda b, f, bw, p, o: b / bw + f / p + o  # noqa: E731
    fails(checks.check_predict_step, fn, "falla el caso 1", "no se suman", "más lento")


def test_predict_check_names_min_instead_of_max():
    fn = lambda b, f, bw, p, o: min(b / bw, f / p) + o  # noqa: E731
    fails(checks.check_predict_step, fn, "límite más rápido", "la memoria")


def test_predict_check_names_memory_only_on_a_compute_bound_step():
    fn = lambda b, f, bw, p, o: b / bw + o  # noqa: E731
    fails(checks.check_predict_step, fn, "falla el caso 2", "prefill", "el cómputo")


def test_predict_check_names_a_forgotten_overhead():
    fn = lambda b, f, bw, p, o: max(b / bw, f / p)  # noqa: E731
    fails(checks.check_predict_step, fn, "falla el caso 1", "overhead_s")


# --- (c) departure batch -----------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_departure_check_accepts_reference(seed):
    assert checks.check_departure_batch(checks.reference_departure_batch, seed=seed,
                                        raise_on_fail=False).passed


def test_reference_departure_batch_semantics():
    ref = checks.reference_departure_batch
    assert ref([1, 2, 4], [1.0, 1.5, 1.0], [1.0, 1.0, 1.0], 0.1) == 2
    assert ref([1, 2, 4], [1.0, 1.1, 1.0], [1.0, 1.0, 1.0], 0.25) is None
    assert ref([1, 2], [1.25, 2.0], [1.0, 1.0], 0.25) == 2  # equal is not beyond
    with pytest.raises(ValueError, match="ordenada"):
        ref([4, 2, 1], [1.0] * 3, [1.0] * 3, 0.1)
    with pytest.raises(ValueError, match="longitud"):
        ref([1, 2], [1.0], [1.0, 1.0], 0.1)


def test_departure_cases_cover_the_listed_situations():
    answers = [checks.reference_departure_batch(b, m, p, t)
               for _, b, m, p, t in checks.departure_cases()]
    assert None in answers
    assert any(a == b[0] for a, (_, b, *_) in zip(answers, checks.departure_cases()))


def _departure(flag):
    def fn(batches, meas, pred, tol):
        return next((b for b, m, p in zip(batches, meas, pred) if flag(m, p, tol)), None)
    return fn


def test_departure_check_names_the_index_instead_of_the_batch():
    def fn(batches, meas, pred, tol):
        return next((k for k, (m, p) in enumerate(zip(meas, pred)) if m > p * (1 + tol)), None)
    fails(checks.check_departure_batch, fn, "falla el caso 1", "posición en la lista")


def test_departure_check_names_absolute_tolerance():
    fails(checks.check_departure_batch, _departure(lambda m, p, t: m - p > t),
           "falla el caso 1", "relativa")


def test_departure_check_names_greater_or_equal():
    fails(checks.check_departure_batch, _departure(lambda m, p, t: m >= p * (1 + t)),
           "falla el caso 5", "exactamente", "use >, no >=")


def test_departure_check_names_the_last_departure():
    def fn(batches, meas, pred, tol):
        hits = [b for b, m, p in zip(batches, meas, pred) if m > p * (1 + tol)]
        return hits[-1] if hits else None
    fails(checks.check_departure_batch, fn, "PRIMER")


def test_departure_check_requires_none_when_it_never_departs():
    def fn(batches, meas, pred, tol):
        return checks.reference_departure_batch(batches, meas, pred, tol) or -1
    fails(checks.check_departure_batch, fn, "falla el caso 2", "devuelva None")


# --- shared behaviour --------------------------------------------------------------------------

@pytest.mark.parametrize("check, arity", [(checks.check_decode_roofline, 5),
                                          (checks.check_predict_step, 5),
                                          (checks.check_departure_batch, 4)])
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
