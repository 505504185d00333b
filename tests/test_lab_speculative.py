"""Lab 9 (speculative): its contract's conclusions rebuild from their numbers and take the branch
hand-made measurements support; the greedy replay reproduces the measured acceptances; its
self-checks pass the references and name each plausible mistake; the challenge check holds the
simulator's answer."""

from __future__ import annotations

import pytest
import torch

from ai_evolution import claims
from ai_evolution.checks import CheckFailed
from ai_evolution.checks import speculative as checks
from ai_evolution.labs import LabParamError, get_spec, run_lab, without_volatile
from ai_evolution.labs import speculative as lab
from ai_evolution.sim.cost_model import expected_tokens_per_step, predict_speculation_h100
from ai_evolution.speculative import SpecStep, SpeculativeOutput, greedy_accept

PARAMS = get_spec("speculative").resolve_params("ci", {})
# A real, small ``ci`` run (seconds).
FAST = dict(ks=[1, 3], prompts=2, new_tokens=10, repeats=2, step_repeats=3, batch_sizes=[1, 2],
            engine_repeats=2, engine_tokens=6, gof_samples=2000, h100_k=3, ngram_ks=[2],
            ngram_prompts=2, ngram_passage=16, ngram_tokens=6, ngram_repeats=2)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def contract():
    return run_lab("speculative", seed=3, profile="ci", **FAST)


def test_every_claim_of_a_real_contract_rebuilds_from_its_inputs(contract):
    assert claims.recheck_contract(contract) == []
    kinds = sorted(item["claim"]["kind"] for item in claims.claims_of(contract))
    # speedup per k (2), per batch (2) and per workload and method (2 x 2); formula per k >= 2
    # (1: at k = 1 it is an identity), exactness (2), distribution (2)
    assert kinds == ["compare"] * 8 + ["threshold"] * 5
    assert "formula_k1" not in lab.formula_verdicts(contract["results"]["acceptance"])
    r = contract["results"]
    assert r["chapter_criteria"] == {"exact_loop": True, "exact_engine": True, "replay": True,
                                     "distribution": True, "control": True, "exact_ngram": True}
    for w in r["ngram"]["workloads"].values():
        assert [row["k"] for row in w["per_k"]] == [2]
        assert len(w["per_k"][0]["ms"]["ngram"]) == 2 * 2
    assert 0 <= r["ngram"]["workloads"]["copia"]["copy_rate"] <= 1
    acc = r["acceptance"]
    assert [row["k"] for row in acc["per_k"]] == [1, 3] and acc["runs_identical"] == 4
    for row in acc["per_k"]:
        assert 0 < row["alpha"] < 1 and len(row["alpha_by_position"]) == row["k"]
        assert row["predicted_tokens_per_step"] == pytest.approx(
            expected_tokens_per_step(row["alpha"], row["k"]))
    assert all(b["speculative_identical"] for b in r["engine"]["batches"])
    assert r["h100"]["assumed"]["speedup"] == [
        s.speedup for s in predict_speculation_h100(PARAMS["h100_alpha"], 3, PARAMS["h100_batches"],
                                                    PARAMS["h100_context"])]
    assert r["timing"]["torch_threads"] == 1 and len(r["timing"]["ms"]["plain"]) == 2 * 2


@pytest.mark.slow  # a whole lab, a long soak or a sampling statistic: `make test` only
def test_the_same_seed_gives_the_same_contract_but_the_volatile_fields(contract):
    again = run_lab("speculative", seed=3, profile="ci", **FAST)
    assert without_volatile(again) == without_volatile(contract)
    assert "timing" not in without_volatile(contract)["results"]


def test_prompts_come_from_the_held_out_text_and_wrap_to_later_windows():
    first = lab.held_out_prompts("tiny-es", 3, 16)
    assert [len(p) for p in first] == [16] * 3
    many = lab.held_out_prompts("tiny-es", 30, 16)
    assert many[:3] == first and len(many) == 30 and many[20] != many[0]


# --- the greedy replay ----------------------------------------------------------------------------

def test_replay_recovers_the_acceptances_and_flags_a_wrong_next_token():
    ref = [10, 11, 12, 13, 14, 15, 16]
    # prefill gave 10; step 1 proposes [11, 99] (1 kept, next 12); step 2 proposes [13, 14] (bonus 15)
    out = SpeculativeOutput(tokens=ref[:6], k=2, steps=[
        SpecStep(2, 1, 2, (11, 99)), SpecStep(2, 2, 3, (13, 14))])
    good = lab.replay_steps(out, ref)
    assert [(s.accepted, s.emitted) for s in good] == [(1, 2), (2, 3)]
    shifted = lab.replay_steps(out, ref, lambda d, t: (greedy_accept(d, t)[0], -1))
    assert [s.emitted for s in shifted] == [0, 0]


# --- hand-made measurements -----------------------------------------------------------------------

def timing(plain, spec) -> dict:
    return {"ms": {"plain": plain, "k2": spec}, "new_tokens": 8, "repeats": len(plain)}


def test_speedup_branches_follow_the_paired_times():
    faster = lab.speedup_verdicts(timing([10.0, 10.2, 9.9, 10.1, 10.0], [5.0, 5.1, 5.0, 5.2, 5.05]))
    slower = lab.speedup_verdicts(timing([5.0, 5.1, 5.0, 5.2, 5.05], [10.0, 10.2, 9.9, 10.1, 10.0]))
    assert faster["speedup_k2"].outcome == claims.HIGHER and faster["speedup_k2"].value > 1.9
    assert slower["speedup_k2"].outcome == claims.LOWER
    assert "más lenta" in slower["speedup_k2"].text


def engine(ratios: dict[int, float], identical=True) -> dict:
    return {"k": 2, "batches": [
        {"batch_size": b, "ms": {"plain": [10.0 * r, 10.1 * r, 9.9 * r, 10.0 * r, 10.05 * r],
                                 "speculative": [10.0, 10.0, 10.0, 10.1, 10.0]},
         "speculative_identical": identical} for b, r in ratios.items()]}


def test_batch_sentence_says_where_speculation_stops_paying():
    e = engine({1: 1.5, 2: 1.3, 4: 0.8})
    found = lab.engine_verdicts(e)
    assert lab.batch_sentence(e, found).startswith("En el motor, la especulación paga hasta el "
                                                   "lote 2 y deja de pagar en el lote 4")
    never = engine({1: 0.7, 2: 0.6})
    assert "no paga con ningún lote" in lab.batch_sentence(never, lab.engine_verdicts(never))
    mixed = engine({1: 0.7, 2: 1.0, 4: 0.6})
    mixed["batches"][1]["ms"]["plain"] = [8.0, 12.0, 9.0, 11.0, 10.0]  # noisy: inconclusive
    text = lab.batch_sentence(mixed, lab.engine_verdicts(mixed))
    assert "no paga de forma concluyente" in text and "los lotes 1, 4 es más lenta" in text


def acceptance(per_k, identical=4, compared=4, replays=4) -> dict:
    return {"prompts": 2, "per_k": per_k, "runs_compared": compared, "runs_identical": identical,
            "replays_matching": replays}


def row(k, alpha, tokens) -> dict:
    return {"k": k, "alpha": alpha, "tokens_per_step": tokens,
            "predicted_tokens_per_step": expected_tokens_per_step(alpha, k)}


def test_formula_claim_passes_near_the_prediction_and_fails_far_from_it():
    near = lab.formula_verdicts(acceptance([row(2, 0.5, 1.70)]))["formula_k2"]
    far = lab.formula_verdicts(acceptance([row(2, 0.5, 1.20)]))["formula_k2"]
    assert near.outcome == claims.PASSED and far.outcome == claims.FAILED
    assert "no es la misma en cada posición" in far.text


def test_best_k_sentence_says_when_no_k_pays():
    def claim(outcome, value):
        return claims.Claim("compare", outcome, "", value, {})

    slower = {1: claim(claims.LOWER, 0.84), 2: claim(claims.LOWER, 0.72)}
    text = lab.best_k_sentence(slower, {1: 0.9, 2: 0.8})
    assert text.startswith("Ningún k paga aquí") and "el menos malo, k = 1, da 0,84" in text
    assert "tampoco ve ningún k que pague" in text and "mejor k medido" not in text
    mixed = {1: claim(claims.INCONCLUSIVE, 1.02), 2: claim(claims.LOWER, 0.9)}
    assert lab.best_k_sentence(mixed, {1: 1.1, 2: 1.2}).startswith(
        "Ningún k paga de forma concluyente aquí (la mayor aceleración medida, con k = 1, es 1,02)")
    assert "elige k = 2 y predice 1,20" in lab.best_k_sentence(mixed, {1: 1.1, 2: 1.2})
    paying = {1: claim(claims.HIGHER, 1.3), 2: claim(claims.HIGHER, 1.5), 4: claim(claims.INCONCLUSIVE, 1.6)}
    assert lab.best_k_sentence(paying, {1: 1.2, 2: 1.4, 4: 1.3}).startswith(
        "El mejor k medido fue 2, con una aceleración de 1,50")


def test_ngram_sentence_explains_from_the_copy_rate():
    def claim(outcome, value):
        return claims.Claim("compare", outcome, "", value, {})

    def workload(copy_rate):
        return {"copy_rate": copy_rate, "per_k": [{"k": 2, "ngram": {"acceptance": 0.8,
                                                                      "tokens_per_step": 2.4}}]}

    found = {"ngram_copia_ngram_k2": claim(claims.HIGHER, 1.9),
             "ngram_libre_ngram_k2": claim(claims.INCONCLUSIVE, 1.01)}
    text = lab.ngram_sentence({"workloads": {"copia": workload(0.9), "libre": workload(None)}}, found)
    assert "«copia» el n-grama paga (mejor k = 2: 1,90 veces, 80 % de" in text
    assert "«libre» el n-grama no paga de forma concluyente" in text
    assert "reproduce el 90 % de sus tokens en su sitio: copia" in text
    found["ngram_copia_ngram_k2"] = claim(claims.LOWER, 0.8)
    text = lab.ngram_sentence({"workloads": {"copia": workload(0.02), "libre": workload(None)}}, found)
    assert "«copia» el n-grama no paga (" in text and "el 2 % de sus tokens en su sitio: no copia" in text


def test_copy_rate_counts_tokens_in_their_place():
    assert lab.copy_rate([[1, 2, 3], [4]], [[1, 9, 3, 7], [5, 6]]) == pytest.approx(2 / 4)


def test_alpha_vs_c_sentence_takes_its_branch_from_the_numbers():
    assert "0,30 no supera a c = 0,31" in lab.alpha_vs_c_sentence(0.3, 0.31)
    assert lab.alpha_vs_c_sentence(0.3, 0.31).endswith("predice que la especulación no paga.")
    assert lab.alpha_vs_c_sentence(0.6, 0.1).endswith("predice que la especulación paga.")
    assert "gratis" not in lab.alpha_vs_c_sentence(0.6, 0.1)


def test_a_mismatch_fails_the_exactness_criteria():
    found = lab.exactness_verdicts(acceptance([], identical=3), engine({1: 1.0}, identical=False))
    assert found["exact_loop"].outcome == claims.FAILED
    assert found["exact_engine"].outcome == claims.FAILED


def test_a_wrong_residual_is_caught_by_the_chi_square_and_the_control_by_its_own():
    params = PARAMS | {"gof_samples": 4000}
    good = lab.distribution_verdicts(lab.measure_distribution(params, 0))
    assert good["distribution"].outcome == claims.PASSED and good["control"].outcome == claims.PASSED
    wrong = lab.measure_distribution(params, 0, pieces=lambda p, q: (
        checks.reference_acceptance_and_residual(p, q)[0], p))  # resamples from p, not the residual
    assert lab.distribution_verdicts(wrong)["distribution"].outcome == claims.FAILED


def test_break_even_text():
    assert lab.break_even_text(None) == "no deja de pagar en los lotes calculados"
    assert lab.break_even_text(1) == "no paga ni con lote 1"
    assert lab.break_even_text(122) == "deja de pagar en el lote 122"


@pytest.mark.parametrize("changes,message", [
    ({"ks": [4, 2]}, "orden creciente"),
    ({"batch_sizes": [1, 8], "prompts": 4}, "no puede pasar del número de prompts"),
])
def test_bad_parameters_are_refused_in_spanish(changes, message):
    with pytest.raises(LabParamError, match=message):
        run_lab("speculative", profile="ci", **changes)


def test_k_below_one_is_refused_by_the_parameters():
    with pytest.raises(LabParamError, match="ks"):
        run_lab("speculative", profile="ci", ks=[0, 1])


# --- self-checks ----------------------------------------------------------------------------------

def test_checks_pass_the_library_references():
    assert checks.check_greedy_accept(greedy_accept).passed
    assert checks.check_acceptance_and_residual(checks.reference_acceptance_and_residual).passed


def _next_one_further(d, t):
    n, _ = greedy_accept(d, t)
    return n, int(t[min(n + 1, len(t) - 1)])


def _bonus_repeats_last(d, t):
    n, nxt = greedy_accept(d, t)
    return n, (int(t[n - 1]) if n == len(d) else nxt)


def _counts_mismatch(d, t):
    n, nxt = greedy_accept(d, t)
    return min(n + 1, len(d)), nxt


@pytest.mark.parametrize("wrong,hint", [
    (_next_one_further, "error por uno en el token siguiente"),
    (_bonus_repeats_last, "error por uno en el bonus"),
    (_counts_mismatch, "cuenta como aceptada la primera propuesta que no coincide"),
])
def test_greedy_mistakes_are_named_with_their_hint(wrong, hint):
    with pytest.raises(CheckFailed, match=hint):
        checks.check_greedy_accept(wrong)


def _unnormalised(p, q):
    return checks.reference_acceptance_and_residual(p, q)[0], torch.clamp(p - q, min=0)


def _inverted(p, q):
    return (torch.clamp(q / torch.where(p > 0, p, torch.ones_like(p)), max=1),
            checks.reference_acceptance_and_residual(p, q)[1])


def _nan_when_equal(p, q):
    excess = torch.clamp(p - q, min=0)
    return checks.reference_acceptance_and_residual(p, q)[0], excess / excess.sum()


@pytest.mark.parametrize("wrong,case,hint", [
    (_unnormalised, "caso 1", "normalizado para que sume 1"),
    (_inverted, "caso 1", "sin pasar de 1"),
    (_nan_when_equal, "caso 2", "distribución exacta del token emitido"),
])
def test_rejection_mistakes_are_named_with_their_hint(wrong, case, hint):
    with pytest.raises(CheckFailed, match=f"{case}.*{hint}"):
        checks.check_acceptance_and_residual(wrong)


# --- the challenge --------------------------------------------------------------------------------

def challenge(**changes) -> dict:
    steps = predict_speculation_h100(0.5, 4, list(range(1, 513)), 4096)
    b = next(s.batch_size for s in steps if s.speedup < 1)
    m = {"alpha": 0.5, "k": 4, "context_len": 4096, "break_even_batch": b,
         "speedup_batch1": steps[0].speedup, "speedup_before": steps[b - 2].speedup,
         "speedup_at_break_even": steps[b - 1].speedup} | changes
    return {"assumption": "x" * 12, "measurement": m, "conclusion": "y" * 12, "limitation": "z" * 12}


def test_the_challenge_answer_is_the_simulators():
    assert checks.check_challenge(challenge()).passed
    assert challenge()["measurement"]["break_even_batch"] > 1


@pytest.mark.parametrize("changes,where", [
    ({"break_even_batch": 128}, "ya baja de 1"),       # the first power of two past it
    ({"break_even_batch": 64}, "no es menor que 1"),
    ({"speedup_batch1": 1.0}, "speedup_batch1"),
    ({"alpha": 1.5}, "0 < α < 1"),
])
def test_wrong_challenge_answers_are_refused(changes, where):
    result = checks.check_challenge(challenge(**changes), raise_on_fail=False)
    assert not result.passed and where in result.message


def test_a_challenge_without_its_keys_is_refused():
    ext = challenge()
    del ext["measurement"]["speedup_before"]
    result = checks.check_challenge(ext, raise_on_fail=False)
    assert not result.passed and "speedup_before" in result.message
