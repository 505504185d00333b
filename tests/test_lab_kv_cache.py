"""Lab 2 (kv_cache): every conclusion in its contract is a claim its own numbers rebuild, and
each claim takes the branch that hand-made measurements support, whatever this machine does."""

from __future__ import annotations

import numpy as np
import pytest

from ai_evolution import claims
from ai_evolution.labs import assemble_contract, get_spec, run_lab
from ai_evolution.labs.kv_cache import (CRITERIA, Findings, criteria_sentence, report,
                                        timing_summary, verdicts)
from ai_evolution.timing import fit_growth

PARAMS = get_spec("kv_cache").resolve_params("ci", {})
N_NEW = 160
# A real, small ``ci`` run (a few seconds): two interleaved rounds so the comparison has an
# interval (test_fp16_cpu reuses those of the engine labs).
FAST = dict(max_new_tokens=24, repeats=2, exactness_tokens=6, batch_size=2)


@pytest.fixture(scope="module")
def contract():
    return run_lab("kv_cache", seed=3, profile="ci", **FAST)


def test_every_claim_of_a_real_contract_rebuilds_from_its_inputs(contract):
    assert claims.recheck_contract(contract) == []
    kinds = sorted(item["claim"]["kind"] for item in claims.claims_of(contract))
    assert kinds == ["compare", "growth", "growth", "threshold"]
    timing = contract["results"]["timing"]
    assert timing["runs"] == 2 and len(timing["step_ms_cached"]) == 24
    assert timing["torch_threads"] == PARAMS["torch_threads"] == 1
    for fit in (timing["fit_total_cached"], timing["fit_total_uncached"]):
        assert min(fit["c0"], fit["c1"], fit["c2"]) >= 0
        assert 0 <= fit["quadratic_share"] <= 1 and 0 <= fit["exponent"] <= 2
    speed = next(i for i in claims.claims_of(contract) if i["claim"]["kind"] == "compare")
    assert speed["value"] == timing["speedup_at_end"]


# --- hand-made measurements ---------------------------------------------------------------------

def facts(identical=True, allocated=3_244_032, predicted=3_244_032, diff=2e-5) -> dict:
    return {
        "model": {"name": "prueba", "parameters": 5_500_000, "dtype": "float32",
                  "kv_bytes_per_token": 6144, "batch_size": 3, "max_len": 176,
                  "cache_bytes_predicted": predicted, "cache_bytes_allocated": allocated},
        "exactness": {"prompts": 3, "tokens_per_prompt": 16, "identical_greedy_tokens": identical},
        "numerics": {"max_abs_logit_diff_cached_vs_uncached": diff, "max_abs_logit": 12.0,
                     "steps": 16},
    }


def flat(ms: float):
    """A step that costs the same at every length (the cached path of the theory)."""
    return lambda n: np.full(n.shape, ms)


def growing(ms: float, per_token: float, prompt: int = 16):
    """A step that recomputes the whole sequence (the uncached path of the theory)."""
    return lambda n: ms + per_token * (prompt + n)


def timing(cached, uncached, rounds=5, noise=0.02, scale=1.0, seed=0) -> dict:
    """Interleaved rounds of per-step milliseconds with multiplicative noise."""
    rng = np.random.default_rng(seed)
    n = np.arange(1, N_NEW + 1)

    def runs(step):
        return [(scale * step(n) * (1 + noise * rng.standard_normal(n.shape))).tolist()
                for _ in range(rounds)]
    return {"prompt_len": 16, "torch_threads": 1, "runs_ms_cached": runs(cached),
            "runs_ms_uncached": runs(uncached)}


THEORY = timing(flat(3.0), growing(2.0, 0.3))
SWAPPED = timing(growing(2.0, 0.3), flat(3.0))   # the "slow" side wins: the cache costs more
OVERLAP = timing(flat(5.0), flat(5.0), noise=0.3)  # same cost, heavy noise


def texts(found: dict) -> dict[str, str]:
    return {k: c.text for k, c in found.items()}


def test_theory_shaped_measurements_take_the_theory_branches():
    found = verdicts(facts(), THEORY)
    assert found["speed"].outcome == claims.HIGHER
    assert "sin caché cada token cuesta más" in found["speed"].text.lower()
    assert "cuesta menos" not in found["speed"].text and "no es concluyente" not in found["speed"].text
    assert found["growth_uncached"].outcome == claims.SUPERLINEAR
    assert "claramente más rápido que lineal" in found["growth_uncached"].text
    assert found["growth_cached"].outcome == claims.LINEAR
    assert "casi lineal" in found["growth_cached"].text
    assert "más rápido que lineal" not in found["growth_cached"].text
    assert found["logits"].outcome == claims.PASSED and "es redondeo" in found["logits"].text
    body = report(Findings.from_measurements(PARAMS, facts(), THEORY, found))
    assert body["results"]["timing"]["chapter_criteria"] == {key: True for key, _ in CRITERIA}
    assert criteria_sentence(body["results"]["timing"]["chapter_criteria"]) == \
        f"Esta ejecución cumple los {len(CRITERIA)} criterios."


def test_scaled_timings_keep_every_branch():
    slow_machine = timing(flat(3.0), growing(2.0, 0.3), scale=40.0)
    assert {k: c.outcome for k, c in verdicts(facts(), slow_machine).items()} == \
        {k: c.outcome for k, c in verdicts(facts(), THEORY).items()}


def test_swapped_measurements_say_the_opposite_and_never_the_theory():
    found = verdicts(facts(), SWAPPED)
    assert found["speed"].outcome == claims.LOWER
    assert "cuesta menos que con caché" in found["speed"].text
    assert "cuesta más" not in found["speed"].text
    assert found["growth_uncached"].outcome == claims.LINEAR
    assert "casi lineal" in found["growth_uncached"].text
    assert "domina el recálculo" not in found["growth_uncached"].text
    assert found["growth_cached"].outcome == claims.SUPERLINEAR
    assert "cada paso cuesta casi lo mismo" not in found["growth_cached"].text
    body = report(Findings.from_measurements(PARAMS, facts(), SWAPPED, found))
    met = body["results"]["timing"]["chapter_criteria"]
    assert met == {"bytes": True, "tokens": True, "logits": True, "speed": False,
                   "growth_uncached": False, "growth_cached": False}
    sentence = criteria_sentence(met)
    assert sentence.startswith("Esta ejecución no cumple 3 de los 6 criterios")
    assert "«el tiempo total con caché crece de forma casi lineal»" in sentence
    assert "«la caché asignada" not in sentence


def test_overlapping_noise_is_inconclusive():
    found = verdicts(facts(), OVERLAP)
    assert found["speed"].outcome == claims.INCONCLUSIVE
    assert "no es concluyente" in found["speed"].text
    assert "cuesta más" not in found["speed"].text and "cuesta menos" not in found["speed"].text
    body = report(Findings.from_measurements(PARAMS, facts(), OVERLAP, found))
    met = body["results"]["timing"]["chapter_criteria"]
    assert met["speed"] is False


def test_one_round_is_inconclusive():
    one = timing(flat(3.0), growing(2.0, 0.3), rounds=1)
    found = verdicts(facts(), one)
    assert found["speed"].outcome == claims.INCONCLUSIVE
    assert "una sola medición" in found["speed"].text


def test_a_broken_cache_is_stated_as_broken():
    bad = facts(identical=False, allocated=3_244_033, diff=0.5)
    body = report(Findings.from_measurements(PARAMS, bad, THEORY))
    statements = " ".join(item["statement"] for item in body["evidence"])
    assert "distinta de la predicción" in statements and "igual a la predicción" not in statements
    assert "produce distintos tokens" in statements and "los mismos tokens" not in statements
    found = verdicts(bad, THEORY)
    assert found["logits"].outcome == claims.FAILED
    assert "no calculan lo mismo" in found["logits"].text and "es redondeo" not in found["logits"].text
    met = body["results"]["timing"]["chapter_criteria"]
    assert not met["bytes"] and not met["tokens"] and not met["logits"]


@pytest.mark.parametrize("measured", [THEORY, SWAPPED, OVERLAP], ids=["teoria", "al reves", "ruido"])
def test_the_contract_carries_the_glued_objects_and_rebuilds_them(measured):
    found = verdicts(facts(), measured)
    body = report(Findings.from_measurements(PARAMS, facts(), measured, found))
    by_text = {item["statement"] for item in claims.claims_of(body)}
    assert by_text == set(texts(found).values())  # the page's sentences, not new ones
    assert claims.recheck_contract(body) == []
    contract = assemble_contract("kv_cache", 0, "ci", PARAMS, body, "cpu")
    assert claims.recheck_contract(contract) == []


def test_a_tampered_statement_is_caught():
    body = report(Findings.from_measurements(PARAMS, facts(), SWAPPED))
    item = next(i for i in body["evidence"] if i.get("claim", {}).get("kind") == "compare")
    item["statement"] = item["statement"].replace("cuesta menos", "cuesta más")
    assert claims.recheck_contract(body)


def test_growth_reads_the_same_fit_as_the_exercise():
    s = timing_summary(THEORY)
    found = verdicts(facts(), THEORY)
    fit = fit_growth(s["n"], s["total_s_uncached"])
    assert found["growth_uncached"].value == pytest.approx(fit["exponent"], rel=1e-12)
    assert found["growth_uncached"].value == \
        claims.fit_growth(s["n"], s["total_s_uncached"])["exponent"]


def test_only_a_small_model_is_said_to_be_bound_by_per_operation_overhead():
    small = report(Findings.from_measurements(PARAMS, facts(), THEORY))["limitations"][0]
    real = facts()
    real["model"] = {**real["model"], "name": "Qwen/Qwen2.5-0.5B-Instruct", "parameters": 494_032_768}
    large = report(Findings.from_measurements(PARAMS, real, THEORY))["limitations"][0]
    assert "5,5 M parámetros" in small and "dominado por la sobrecarga por operación" in small
    assert "Qwen/Qwen2.5-0.5B-Instruct (494,0 M parámetros)" in large
    assert "sobrecarga" not in large and "no se trasladan a otro modelo ni a otra GPU" in large
