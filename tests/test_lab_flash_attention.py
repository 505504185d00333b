"""Lab 8 (flash_attention): its contract's conclusions rebuild from their numbers and take the
branch hand-made measurements support; its self-checks pass the references and name each
plausible mistake; the challenge check holds the IO model's answer."""

from __future__ import annotations

import functools
import os

import pytest
import torch

from ai_evolution import claims
from ai_evolution.checks import flash_attention as checks
from ai_evolution.labs import LabParamError, assemble_contract, get_spec, run_lab, without_volatile
from ai_evolution.labs import flash_attention as lab
from ai_evolution.model.flash import (IOCounter, flash_attention, flash_cached_attention,
                                      naive_attention, online_softmax_update, random_qkv)
from ai_evolution.sim.attention_io import best_tiles, flash_io, naive_io, working_set_bytes

PARAMS = get_spec("flash_attention").resolve_params("ci", {})
# A real, small ``ci`` run (seconds): three sizes for the growth fits, two interleaved rounds
# (test_fp16_cpu reuses those of the engine labs).
FAST = dict(sizes=[64, 128, 256], repeats=2, exactness_n=48, exactness_tokens=4, prompts=2,
            io_sizes=[256, 1024, 4096], io_sweep_n=1024)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def contract():
    return run_lab("flash_attention", seed=3, profile="ci", **FAST)


def test_every_claim_of_a_real_contract_rebuilds_from_its_inputs(contract):
    assert claims.recheck_contract(contract) == []
    kinds = sorted(item["claim"]["kind"] for item in claims.claims_of(contract))
    assert kinds == ["compare"] * 2 + ["growth"] * 3 + ["threshold"] * 6
    r = contract["results"]
    met = r["chapter_criteria"]
    # Deterministic given the library: exactness, overflow of the naive fp16, greedy tokens.
    assert met["exact_fp32"] and met["exact_fp16"] and met["naive_overflows"] and met["tokens"]
    assert met["logits"]
    assert r["timing"]["torch_threads"] == 1 and len(r["timing"]["ms"]["tiled"][0]) == 2
    assert r["memory"]["sizes"] == [64, 128, 256] and len(r["memory"]["peak_bytes"]["naive"]) == 3
    assert r["io_model"]["tiled_bytes"] == [flash_io_best(n) for n in FAST["io_sizes"]]
    assert r["sdpa_backends"]["accepts"]["MATH"] is True and r["sdpa_backends"]["default_ops"]
    statements = " ".join(e["statement"] for e in contract["evidence"])
    assert "no representa nada por encima de 65\u00a0504" in statements


def flash_io_best(n: int) -> int:
    d, m = PARAMS["io_head_dim"], PARAMS["fast_memory_kib"] * 1024
    bq, bk = best_tiles(n, d, m, PARAMS["io_elem_bytes"], causal=True)
    return flash_io(n, d, bq, bk, PARAMS["io_elem_bytes"], causal=True).hbm_bytes


def test_the_same_seed_gives_the_same_contract_but_the_volatile_fields(contract):
    again = run_lab("flash_attention", seed=3, profile="ci", **FAST)
    assert without_volatile(again) == without_volatile(contract)
    assert "timing" not in without_volatile(contract)["results"]


def test_profiler_lines_do_not_reach_stderr(capfd):
    q, k, v = random_qkv(1, 1, 1, 32, 32, 8)
    _, peak = lab.measured_peak(lambda: naive_attention(q, k, v), "cpu")
    with lab.quiet_native_stderr():
        os.write(2, b"USDT profiler_start\n")
    assert peak > 0 and "USDT" not in capfd.readouterr().err


# --- hand-made measurements ---------------------------------------------------------------------

def case(dtype="fp32", extreme=None, tiled=1e-7, naive=1e-7, textbook=1e-7, bad_naive=0.0,
         bad_tiled=0.0, raw=40.0) -> dict:
    diffs = {"tiled": None if bad_tiled else tiled, "naive": None if bad_naive else naive,
             "textbook": textbook, "sdpa": tiled}
    return {"dtype": dtype, "scores_around": extreme, "n": 64, "max_abs_diff": diffs,
            "nonfinite_share": {"tiled": bad_tiled, "naive": bad_naive,
                                "textbook": 0.0 if textbook is not None else 1.0, "sdpa": 0.0},
            "max_raw_score": raw, "max_scaled_score": raw / 8, "max_abs_v": 4.0,
            "dtype_max": 65504.0 if dtype == "fp16" else 3.4e38}


GOOD_EXACT = [case(), case(extreme=1e4, textbook=None, raw=4e5),
              case("fp16", tiled=1e-3, naive=2e-3, textbook=1e-3),
              case("fp16", extreme=1e4, tiled=8e-4, naive=None, textbook=None, bad_naive=0.97,
                   raw=4e5)]
MODEL = {"name": "prueba", "prompt_lens": [21, 28], "tokens_per_prompt": 4,
         "identical_greedy_tokens": True, "first_difference": None,
         "logits": {"fp32": {"max_abs_diff": 8e-6, "max_abs_logit": 12.0, "positions": 25},
                    "fp16": {"max_abs_diff": 1.2e-2, "max_abs_logit": 12.0, "positions": 25}}}
SIZES = [128, 256, 512, 1024]


def memory(naive=lambda n: 3.2 * 16 * n * n, tiled=lambda n: 2e5 + 1024 * n,
           sdpa=lambda n: 1e5 + 1024 * n) -> dict:
    return {"sizes": SIZES, "dtype": "fp32", "device": "cpu", "measure": lab.MEASURES["cpu"],
            "block": 64, "heads": 4, "kv_heads": 2, "head_dim": 64,
            "peak_bytes": {"naive": [int(naive(n)) for n in SIZES],
                           "tiled": [int(tiled(n)) for n in SIZES],
                           "sdpa": [int(sdpa(n)) for n in SIZES]},
            "score_matrix_bytes": [16 * n * n for n in SIZES],
            "output_bytes": [1024 * n for n in SIZES]}


def timing(tiled=10.0, sdpa=1.0, naive=30.0, noise=0.0) -> dict:
    def rows(base):
        return [[base * (1 + noise * ((i * 7 + j) % 5 - 2)) for j in range(5)] for i, _ in
                enumerate(SIZES)]
    return {"sizes": SIZES, "dtype": "fp32", "torch_threads": 1, "repeats": 5, "block": 64,
            "ms": {"tiled": rows(tiled), "sdpa": rows(sdpa), "naive": rows(naive)}}


CPU = {"device": "cpu", "dtype": "fp32",
       "accepts": {"FLASH_ATTENTION": True, "EFFICIENT_ATTENTION": False,
                   "CUDNN_ATTENTION": False, "MATH": True},
       "default_ops": ["aten::_scaled_dot_product_flash_attention_for_cpu"],
       "default": [lab.BACKEND_OPS["aten::_scaled_dot_product_flash_attention_for_cpu"]]}


def test_theory_shaped_measurements_meet_every_criterion():
    found = lab.verdicts(GOOD_EXACT, MODEL, memory(), timing())
    assert all(found[k].outcome == claims.PASSED for k in found if k.startswith(("exact", "logits")))
    assert found["memory_naive"].outcome == claims.SUPERLINEAR and "N²" in found["memory_naive"].text
    assert found["memory_tiled"].outcome == claims.LINEAR
    assert "de la memoria ajustada" in found["memory_naive"].text
    assert "tiempo" not in found["memory_naive"].text
    assert claims.rebuild({"kind": "growth", "inputs": found["memory_naive"].inputs}).text == \
        found["memory_naive"].text
    assert found["time_tiled_sdpa"].outcome == claims.HIGHER
    assert "tarda más que el núcleo fusionado" in found["time_tiled_sdpa"].text
    body = lab.report(lab.Findings.from_measurements(PARAMS, GOOD_EXACT, MODEL, memory(), timing(),
                                                     CPU, found))
    assert body["results"]["chapter_criteria"] == {key: True for key, _ in lab.CRITERIA}
    assert lab.criteria_sentence(body["results"]["chapter_criteria"]) == \
        f"Esta ejecución cumple los {len(lab.CRITERIA)} criterios."
    assert {i["statement"] for i in claims.claims_of(body)} == {c.text for c in found.values()}
    contract = assemble_contract("flash_attention", 0, "ci", PARAMS, body, "cpu")
    assert claims.recheck_contract(contract) == []


def test_a_wrong_tiled_attention_is_stated_as_wrong():
    bad = [case(tiled=0.3), GOOD_EXACT[1], GOOD_EXACT[2],
           case("fp16", extreme=1e4, bad_tiled=0.5, bad_naive=0.97, naive=None, textbook=None,
                raw=4e5)]
    found = lab.exactness_verdicts(bad)
    assert found["exact_fp32"].outcome == claims.FAILED
    assert "no calcula el mismo softmax" in found["exact_fp32"].text
    assert "es redondeo" not in found["exact_fp32"].text
    assert found["exact_fp16_extreme"].outcome == claims.FAILED
    assert "valores no finitos" in found["exact_fp16_extreme"].text
    body = lab.report(lab.Findings.from_measurements(PARAMS, bad, MODEL, memory(), timing(), CPU))
    met = body["results"]["chapter_criteria"]
    assert not met["exact_fp32"] and not met["exact_fp16"] and met["naive_overflows"]


def test_the_tolerance_grows_with_the_scores_rounding():
    unit, extreme = GOOD_EXACT[0], GOOD_EXACT[1]
    assert lab.exact_limit(unit) == pytest.approx(1e-4, rel=0.1)
    eps = torch.finfo(torch.float32).eps
    assert lab.exact_limit(extreme) == pytest.approx(1e-4 + 2 * eps * 5e4 * 4.0)
    # a 0.3 error is far above both
    assert lab.exactness_claim(case(extreme=1e4, tiled=0.3, raw=4e5)).outcome == claims.FAILED


def test_swapped_memory_and_time_say_the_opposite():
    swapped = memory(naive=lambda n: 2e5 + 1024 * n, tiled=lambda n: 3.2 * 16 * n * n)
    found = lab.memory_verdicts(swapped)
    assert found["memory_naive"].outcome == claims.LINEAR
    assert "no se ve el muro" in found["memory_naive"].text
    assert found["memory_tiled"].outcome == claims.SUPERLINEAR
    assert "guarda algo de tamaño N × N" in found["memory_tiled"].text
    fast_loop = lab.timing_verdicts(timing(tiled=1.0, sdpa=10.0))
    assert fast_loop["time_tiled_sdpa"].outcome == claims.LOWER
    assert "tarda más" not in fast_loop["time_tiled_sdpa"].text
    noisy = lab.timing_verdicts(timing(tiled=5.0, sdpa=5.0, noise=0.3))
    assert noisy["time_tiled_sdpa"].outcome == claims.INCONCLUSIVE
    body = lab.report(lab.Findings.from_measurements(PARAMS, GOOD_EXACT, MODEL, swapped, timing(),
                                                     CPU))
    met = body["results"]["chapter_criteria"]
    assert not met["memory_naive"] and not met["memory_tiled"]
    sentence = lab.criteria_sentence(met)
    assert sentence.startswith("Esta ejecución no cumple 2 de los 7 criterios")


def test_different_tokens_and_logits_are_stated():
    broken = MODEL | {"identical_greedy_tokens": False, "first_difference": [0, 2],
                      "logits": {"fp32": {"max_abs_diff": 0.4, "max_abs_logit": 12.0,
                                          "positions": 25}}}
    body = lab.report(lab.Findings.from_measurements(PARAMS, GOOD_EXACT, broken, memory(), timing(),
                                                     CPU))
    text = " ".join(e["statement"] for e in body["evidence"])
    assert "genera distintos tokens" in text and "los mismos tokens" not in text
    met = body["results"]["chapter_criteria"]
    assert not met["tokens"] and not met["logits"]


def test_overflow_sentence_says_why_from_the_raw_scores():
    sentence = lab.overflow_sentence(GOOD_EXACT)
    assert "97,0\u00a0% de salidas no finitas" in sentence and "desborda antes" in sentence
    fits = [GOOD_EXACT[0], GOOD_EXACT[1], GOOD_EXACT[2], GOOD_EXACT[3] | {"max_raw_score": 3e4}]
    assert "el producto cabe en fp16" in lab.overflow_sentence(fits)


def test_backend_sentence_names_what_ran_and_the_fallback_without_flash():
    text = lab.backends_sentence(CPU)
    assert "la CPU" in text and "_scaled_dot_product_flash_attention_for_cpu" in text
    assert "no los aceptan EFFICIENT_ATTENTION, CUDNN_ATTENTION" in text
    t4 = {"device": "cuda", "dtype": "fp16", "device_name": "Tesla T4", "compute_capability": "7.5",
          "accepts": {"FLASH_ATTENTION": False, "EFFICIENT_ATTENTION": True,
                      "CUDNN_ATTENTION": False, "MATH": True},
          "default_ops": ["aten::_scaled_dot_product_efficient_attention"],
          "default": [lab.BACKEND_OPS["aten::_scaled_dot_product_efficient_attention"]]}
    text = lab.backends_sentence(t4)
    assert "Tesla T4 (capacidad de cómputo 7,5)" in text or "Tesla T4 (capacidad de cómputo 7.5)" in text
    assert "EFFICIENT_ATTENTION" in text and "Sin FLASH_ATTENTION" in text


def test_sdpa_backends_are_read_at_run_time_on_this_cpu():
    info = lab.sdpa_backends(PARAMS | {"sizes": [32, 64, 128]}, "cpu")
    assert info["device"] == "cpu" and set(info["accepts"]) == set(lab.BACKENDS)
    assert info["accepts"]["MATH"] and info["default_ops"]
    assert all(op in lab.BACKEND_OPS for op in info["default_ops"])


@pytest.mark.parametrize("changes,message", [
    ({"heads": 3, "kv_heads": 2}, "no es múltiplo de kv_heads"),
    ({"sizes": [64, 128]}, "al menos 3 longitudes"),
    ({"sizes": [256, 128, 512]}, "orden creciente"),
    ({"fast_memory_kib": 1, "io_head_dim": 1024}, "no guarda ni un bloque"),
])
def test_bad_parameters_are_refused_in_spanish(changes, message):
    with pytest.raises(LabParamError, match=message):
        lab.check_params(PARAMS | changes)


def test_a_tile_of_zero_is_refused_before_anything_runs():
    with pytest.raises(LabParamError, match="block"):
        run_lab("flash_attention", profile="ci", block=0)


# --- the self-checks ------------------------------------------------------------------------------

def test_checks_pass_the_library_references(tiny):
    assert checks.check_online_softmax_update(online_softmax_update, raise_on_fail=False).passed
    assert checks.check_tiled_attention(flash_attention, raise_on_fail=False).passed
    odd = functools.partial(flash_cached_attention, block_q=5, block_k=3)
    assert checks.check_flash_step(odd, model=tiny, max_new_tokens=4, raise_on_fail=False).passed
    assert checks.check_tiled_bytes(checks.reference_tiled_bytes, raise_on_fail=False).passed


def forgot_rescale(m, l, o, scores, v):
    m_new = torch.maximum(m, scores.amax(-1))
    shift = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
    p = torch.exp(scores - shift[..., None])
    return m_new, l + p.sum(-1), o + p @ v


def max_not_updated(m, l, o, scores, v):
    first = torch.where(torch.isneginf(m), scores.amax(-1), m)
    shift = torch.where(torch.isneginf(first), torch.zeros_like(first), first)
    alpha, p = torch.exp(m - shift), torch.exp(scores - shift[..., None])
    return first, alpha * l + p.sum(-1), alpha[..., None] * o + p @ v


def no_guard(m, l, o, scores, v):
    m_new = torch.maximum(m, scores.amax(-1))
    alpha, p = torch.exp(m - m_new), torch.exp(scores - m_new[..., None])
    return m_new, alpha * l + p.sum(-1), alpha[..., None] * o + p @ v


def normalised(m, l, o, scores, v):
    m_new, l_new, o_new = online_softmax_update(m, l, o, scores, v)
    return m_new, l_new, o_new / l_new[..., None]


@pytest.mark.parametrize("wrong,case,hint", [
    (forgot_rescale, 2, "multiplíquelo por la exponencial de la diferencia"),
    (max_not_updated, 2, "el mayor de todas las puntuaciones vistas"),
    (no_guard, 6, "-inf menos -inf no es un número"),
    (normalised, 1, "va sin normalizar"),
])
def test_update_mistakes_are_named_with_their_hint(wrong, case, hint):
    result = checks.check_online_softmax_update(wrong, raise_on_fail=False)
    assert not result.passed and f"falla el caso {case} " in result.message
    assert hint in result.message


def strict_mask(q, k, v, causal=False, q_positions=None, block_q=64, block_k=64):
    """A student's loop with ``key < position``: run the reference one position earlier."""
    S, T = k.shape[2], q.shape[2]
    if causal:
        pos = torch.arange(S - T, S) if q_positions is None else torch.as_tensor(q_positions)
        q_positions = pos - 1
    return flash_attention(q, k, v, causal=causal, q_positions=q_positions, block_q=block_q,
                           block_k=block_k)


def top_left(q, k, v, causal=False, q_positions=None, block_q=64, block_k=64):
    if q_positions is None:
        q_positions = torch.arange(q.shape[2])
    return flash_attention(q, k, v, causal=causal, q_positions=q_positions, block_q=block_q,
                           block_k=block_k)


def full_matrix(q, k, v, causal=False, q_positions=None, block_q=64, block_k=64):
    return naive_attention(q.float(), k.float(), v.float(), causal=causal,
                           q_positions=q_positions).to(q.dtype)


def fp16_scores(q, k, v, causal=False, q_positions=None, block_q=64, block_k=64):
    """Scores computed in the inputs' dtype: fp16 overflows with extreme logits."""
    return naive_attention(q, k, v, causal=causal, q_positions=q_positions)


@pytest.mark.parametrize("wrong,case,hint", [
    (strict_mask, 2, "ella misma incluida"),
    (top_left, 4, "las T últimas posiciones"),
    (fp16_scores, 9, "en float32"),
    (full_matrix, 10, "No guarde la matriz de puntuaciones entera"),
])
def test_tiled_mistakes_are_named_with_their_hint(wrong, case, hint):
    result = checks.check_tiled_attention(wrong, raise_on_fail=False)
    assert not result.passed and f"falla el caso {case} " in result.message
    assert hint in result.message


def test_a_step_that_forgets_the_cache_or_the_mask_fails(tiny):
    def no_write(q, k_new, v_new, k_cache, v_cache, positions):
        return flash_cached_attention(q, k_new, v_new, k_cache.clone(), v_cache.clone(), positions)

    result = checks.check_flash_step(no_write, model=tiny, raise_on_fail=False)
    assert not result.passed and "la caché quedó mal escrita" in result.message

    def no_mask(q, k_new, v_new, k_cache, v_cache, positions):
        flash_cached_attention(q, k_new, v_new, k_cache, v_cache, positions)  # writes the cache
        L = int(positions.max()) + 1
        return flash_attention(q, k_cache[:, :, :L], v_cache[:, :, :L], block_q=16, block_k=16)

    result = checks.check_flash_step(no_mask, model=tiny, raise_on_fail=False)
    assert not result.passed and "pase esas posiciones" in result.message


@pytest.mark.parametrize("wrong,case,hint", [
    (lambda n, d, bq, bk, e=2, causal=False: e * 4 * n * d, 1, "una vez por bloque de consultas"),
    (lambda n, d, bq, bk, e=2, causal=False: checks.reference_tiled_bytes(n, d, bq, bk, 1, causal),
     1, "multiplique los elementos por los bytes"),
    (lambda n, d, bq, bk, e=2, causal=False: (
        checks.reference_tiled_bytes(n, d, bq, bk, e, causal) if causal else
        e * (2 * n * d + 2 * (n // bq) * n * d)), 2, "redondeando hacia arriba"),
    (lambda n, d, bq, bk, e=2, causal=False: checks.reference_tiled_bytes(n, d, bq, bk, e, False),
     3, "no lee los bloques de claves que empiezan después"),
    (lambda n, d, bq, bk, e=2, causal=False: e * (2 * n * d + 2 * d * sum(
        min(n, r0 + bq) if causal else n for r0 in range(0, n, bq))), 4, "bloques enteros"),
])
def test_byte_count_mistakes_are_named_with_their_hint(wrong, case, hint):
    result = checks.check_tiled_bytes(wrong, raise_on_fail=False)
    assert not result.passed and f"falla el caso {case} " in result.message
    assert hint in result.message


# --- the challenge --------------------------------------------------------------------------------

def challenge(**changes) -> dict:
    n, d, mem = PARAMS["challenge_n"], PARAMS["challenge_head_dim"], \
        PARAMS["challenge_fast_memory_kib"] * 1024
    bq, bk = best_tiles(n, d, mem, 2, causal=True)
    tiled = flash_io(n, d, bq, bk, 2, causal=True).hbm_bytes
    m = {"n": n, "head_dim": d, "fast_memory_bytes": mem, "block_q": bq, "block_k": bk,
         "working_set_bytes": working_set_bytes(bq, bk, d), "tiled_bytes": tiled,
         "naive_bytes": naive_io(n, d, 2).hbm_bytes, "counted_bytes": tiled} | changes
    return {"assumption": "Los bloques de consultas más grandes que quepan.", "measurement": m,
            "conclusion": "Mueven menos bytes que la atención ingenua.",
            "limitation": "El modelo solo cuenta bytes, no la forma de las unidades de cálculo."}


def test_the_challenge_answer_is_the_io_model_and_the_counted_loop():
    ext = challenge()
    m = ext["measurement"]
    assert (m["block_q"], m["block_k"]) == (64, 32)   # 48 KiB, d = 64: the statement's problem
    io = IOCounter()
    q, k, v = random_qkv(1, 1, 1, m["n"], m["n"], m["head_dim"])
    flash_attention(q, k, v, causal=True, block_q=m["block_q"], block_k=m["block_k"], io=io)
    assert 2 * io.elements == m["tiled_bytes"]
    assert checks.check_challenge(ext, raise_on_fail=False).passed


@pytest.mark.parametrize("changes,where", [
    ({"block_q": 128, "block_k": 16}, "block_q, block_k"),   # fits 64 KiB, not 48
    ({"block_q": 32, "block_k": 32}, "block_q, block_k"),    # fits, moves more bytes
    ({"block_q": 64, "block_k": 16}, "block_q, block_k"),    # a smaller key tile
    ({"tiled_bytes": 1.0}, "tiled_bytes"),
    ({"naive_bytes": 1.0}, "naive_bytes"),
    ({"working_set_bytes": 48 * 1024}, "working_set_bytes"),
    ({"counted_bytes": 2}, "counted_bytes"),
    ({"n": 512}, "n, head_dim"),
])
def test_wrong_challenge_answers_are_refused(changes, where):
    result = checks.check_challenge(challenge(**changes), raise_on_fail=False)
    assert not result.passed and where in result.message


def test_a_challenge_without_its_keys_is_refused():
    ext = challenge()
    del ext["measurement"]["counted_bytes"]
    result = checks.check_challenge(ext, raise_on_fail=False)
    assert not result.passed and "counted_bytes" in result.message


# --- the figures ----------------------------------------------------------------------------------

def test_figures_show_the_io_model_the_measured_memory_and_the_time():
    import matplotlib
    matplotlib.use("Agg")
    from ai_evolution.plots import attention_time_figure, flash_io_memory_figure

    io = lab.io_model(PARAMS)
    fig = flash_io_memory_figure(io, memory())
    io_ax, sweep_ax, mem_ax = fig.axes
    assert all(ax.get_title() for ax in fig.axes) and "MB" in io_ax.get_ylabel()
    hollow = [ln for ln in sweep_ax.get_lines() if ln.get_markerfacecolor() == "none"]
    assert len(hollow[0].get_xdata()) == sum(not r["fits"] for r in io["sweep"]) > 0
    labels = [t.get_text() for t in mem_ax.get_legend().get_texts()]
    assert labels[:3] == ["ingenua", "por bloques", "SDPA"]
    fig = attention_time_figure(timing())
    assert "ms" in fig.axes[0].get_ylabel() and len(fig.axes[0].get_lines()) == 3
