"""The scheduler lab: its contract, its determinism, its parameter errors, and conclusions that
take the branch their numbers support."""

import pytest

from ai_evolution import claims
from ai_evolution.checks import scheduler as checks
from ai_evolution.engine import newest_unfinished, tokens_for
from ai_evolution.grading import find_assessment
from ai_evolution.labs import LabParamError, assemble_contract, run_lab, without_volatile
from ai_evolution.labs.scheduler import (Findings, preemption_sentence, report,
                                         same_tokens_sentence, sim_sentence, verdicts)
from checkutil import fails

FAST = dict(max_model_len=256, decoders=3, decoder_prompt=2, decode_tokens=40, long_prompt=96, warmup_steps=2,
            budgets=[8, 128], dc_decoders=8, dc_long_prompt=1024, dc_budgets=[128, 1040],
            pressure_requests=10, pressure_mean_output=16, pressure_max_num_seqs=6,
            pool_blocks=[64, 12], timing_repeats=3)  # 3 rounds: a range, cheap for a shape test


@pytest.fixture(scope="module")
def contract():
    return run_lab("scheduler", seed=4, profile="ci", **FAST)


def test_contract_claims_are_what_their_numbers_give(contract):
    assert claims.recheck_contract(contract) == []
    whats = [item["claim"]["inputs"]["what"] for item in claims.claims_of(contract)]
    assert len(whats) == 4  # TTFT, ITL, pool tokens/s, preempted vs spared latency
    assert contract["results"]["tradeoff_timing"]["rounds"] == 3
    assert all(len(x) == 3 for x in contract["results"]["tradeoff_timing"]["ttft_s"])
    assert all(len(p["tok_s"]) == 3 for p in contract["results"]["preemption_timing"])
    for item in contract["evidence"]:  # what the clock measured is volatile, nothing else is
        assert item.get("volatile", False) == (item["source"] == "measured"), item["statement"]


def test_small_budgets_delay_the_long_prompt_and_bound_the_step(contract):
    t = contract["results"]["tradeoff"]
    assert t["repeats_identical"]
    # 3 decoders (still decoding throughout) take 3 of 8 tokens: the prompt needs ceil(96 / 5) steps
    assert t["ttft_steps"] == [-(-96 // 5), 1]
    assert t["max_step_tokens"][0] <= 8 and t["max_step_tokens"][1] == 96 + 3


def test_simulated_tradeoff_goes_both_ways(contract):
    lo, hi = contract["results"]["tradeoff_sim"]["rows"]
    assert lo["ttft_s"] > hi["ttft_s"] and lo["itl_p99_s"] < hi["itl_p99_s"]
    assert hi["ttft_steps"] == 1


def test_a_small_pool_preempts_but_changes_no_token(contract):
    p = contract["results"]["preemption"]
    assert p["outputs_identical"] and p["repeats_identical"]
    big, small = p["rows"]
    assert big["num_preemptions"] == 0 and small["num_preemptions"] > 0
    # what preemption threw away is computed again, except what the prefix cache gives back
    assert (small["computed_tokens"] + small["prefix_hit_tokens"] - small["preempted_tokens"]
            == big["computed_tokens"] + big["prefix_hit_tokens"])


@pytest.mark.slow  # a whole lab, a long soak or a sampling statistic: `make test` only
def test_same_seed_gives_the_same_contract_except_volatile_fields(contract):
    assert without_volatile(run_lab("scheduler", seed=4, profile="ci", **FAST)) == without_volatile(contract)


def test_bad_parameters_are_rejected_in_spanish():
    with pytest.raises(LabParamError, match="no cabe la petición más larga"):
        run_lab("scheduler", profile="ci", **{**FAST, "pool_blocks": [2]})
    with pytest.raises(LabParamError, match="long_prompt"):
        run_lab("scheduler", profile="ci", **{**FAST, "long_prompt": 300})


# --- report(): every conclusion follows the numbers it is given -----------------------------------
PARAMS = {"dc_model": "llama-3.1-8b", "dc_device": "h100-sxm", "dc_decoders": 8,
          "dc_long_prompt": 1024}


def real_rows(ttft_lo, ttft_hi, itl_lo, itl_hi):
    """Hand-made ``tradeoff_real`` rows for budgets 8 and 128 (one sample per round)."""
    def row(budget, steps, ttft, itl):
        return {"budget": budget, "ttft_steps": steps, "max_step_tokens": budget,
                "repeats_identical": True, "ttft_s": ttft, "itl_p50_s": itl,
                "itl_p99_s": [2 * x for x in itl], "itl_max_s": [3 * x for x in itl]}
    return [row(8, 20, ttft_lo, itl_lo), row(128, 1, ttft_hi, itl_hi)]


def pressure_rows(tok_big, tok_tight, pre, spared, preempted=(0, 3)):
    def row(blocks, tok, pre_, spared_, n):
        return {"pool_blocks": blocks, "steps": 100, "num_preemptions": 2 * n,
                "preempted_tokens": 50 * n, "preempted_requests": n,
                "computed_tokens": 1000 + 50 * n, "prefix_hit_tokens": 0, "outputs": [[1, 2]],
                "repeats_identical": True,
                "timing": {"wall_s": [1.0] * len(tok), "tok_s": tok,
                           "e2e_preempted_mean_s": pre_, "e2e_spared_mean_s": spared_,
                           "e2e_p99_s": [1.0] * len(tok)}}
    return [row(64, tok_big, [None] * len(tok_big), [1.0] * len(tok_big), preempted[0]),
            row(12, tok_tight, pre, spared, preempted[1])]


SIM = [{"budget": 128, "ttft_s": 0.175, "ttft_steps": 9, "itl_p99_s": 0.0047, "max_step_tokens": 128},
       {"budget": 1040, "ttft_s": 0.016, "ttft_steps": 1, "itl_p99_s": 0.0159, "max_step_tokens": 1032}]

SLOW3, FAST3 = [0.40, 0.42, 0.41, 0.43, 0.39], [0.020, 0.021, 0.019, 0.0205, 0.0195]
NOISE_A, NOISE_B = [0.10, 0.30, 0.15, 0.25, 0.12], [0.20, 0.12, 0.18, 0.15, 0.24]
UNSURE = "no es concluyente"


def build(real, pressure):
    v = verdicts(real, pressure)
    body = report(Findings.from_measurements("tiny-es", PARAMS, real, SIM, pressure, v))
    assert claims.recheck_contract(body) == []
    statements = [e["statement"] for e in body["evidence"]]
    assert all(c.text in statements for c in v.values())  # the page's objects are the contract's
    return v


POOLS = pressure_rows([100.0, 102.0, 98.0, 101.0, 99.0], [60.0, 62.0, 59.0, 61.0, 60.5],
                      [3.0, 3.1, 2.9, 3.05, 2.95], [1.0, 1.1, 0.9, 1.05, 0.95])


@pytest.mark.parametrize("ttft,itl,ttft_says,itl_says", [
    # chunking in small steps delays the long prompt and protects the others
    ((SLOW3, FAST3), (FAST3, SLOW3), "tarda más en dar su primer token", "las protege en esta"),
    # the opposite numbers: the sentences follow them
    ((FAST3, SLOW3), (SLOW3, FAST3), "da antes su primer token", "no las protege"),
    # a machine ten times slower changes no verdict
    (([10 * x for x in SLOW3], [10 * x for x in FAST3]), ([10 * x for x in FAST3], [10 * x for x in SLOW3]),
     "tarda más en dar su primer token", "las protege en esta"),
    # overlapping noise
    ((NOISE_A, NOISE_B), (NOISE_B, NOISE_A), UNSURE, UNSURE),
])
def test_tradeoff_claims_follow_their_samples(ttft, itl, ttft_says, itl_says):
    v = build(real_rows(*ttft, *itl), POOLS)
    assert ttft_says in v["ttft"].text and itl_says in v["itl"].text
    opposite = {"tarda más en dar su primer token": "da antes", "da antes su primer token": "tarda más",
                UNSURE: "su primer token"}
    assert opposite[ttft_says] not in v["ttft"].detail["phrase"]
    if itl_says == "las protege en esta":
        assert "no las protege" not in v["itl"].text
    if itl_says == UNSURE:
        assert "protege" not in v["itl"].text


@pytest.mark.parametrize("tight,outcome,says", [
    ([60.0, 62.0, 59.0, 61.0, 60.5], claims.LOWER, "genera menos tokens"),
    ([160.0, 162.0, 159.0, 161.0, 160.5], claims.HIGHER, "genera más tokens"),
    ([60.0, 162.0, 99.0, 140.0, 70.0], claims.INCONCLUSIVE, UNSURE),
])
def test_pool_throughput_claim_follows_its_samples(tight, outcome, says):
    v = build(real_rows(SLOW3, FAST3, FAST3, SLOW3),
              pressure_rows([100.0, 102.0, 98.0, 101.0, 99.0], tight, [3.0, 3.1, 2.9, 3.05, 2.95],
                            [1.0, 1.1, 0.9, 1.05, 0.95]))
    assert v["throughput"].outcome == outcome and says in v["throughput"].text


@pytest.mark.parametrize("pre,spared,outcome,says,never", [
    ([3.0, 3.1, 2.9, 3.05, 2.95], [1.0, 1.1, 0.9, 1.05, 0.95], claims.HIGHER, "las expulsadas tardan más", "tardan menos"),
    ([1.0, 1.1, 0.9, 1.05, 0.95], [3.0, 3.1, 2.9, 3.05, 2.95], claims.LOWER, "las expulsadas tardan menos", "tardan más"),
    ([1.0, 3.0, 2.0, 2.6, 1.1], [2.5, 1.2, 2.0, 1.0, 2.7], claims.INCONCLUSIVE, UNSURE, "tardan"),
])
def test_preempted_latency_claim_follows_its_samples(pre, spared, outcome, says, never):
    v = build(real_rows(SLOW3, FAST3, FAST3, SLOW3),
              pressure_rows([100.0, 102.0, 98.0, 101.0, 99.0], [60.0, 62.0, 59.0, 61.0, 60.5], pre,
                            spared))
    assert v["latency"].outcome == outcome and says in v["latency"].text.lower()
    assert never not in v["latency"].text


def test_no_latency_claim_without_preempted_requests_and_counts_read_right():
    calm = pressure_rows([100.0, 102.0, 98.0, 101.0, 99.0], [99.0, 101.0, 97.0, 100.0, 98.0],
                         [None] * 5, [1.0] * 5,
                         preempted=(0, 0))
    v = build(real_rows(SLOW3, FAST3, FAST3, SLOW3), calm)
    assert "latency" not in v
    assert preemption_sentence(calm) == "Con 12 bloques no hubo ninguna expulsión."
    text = preemption_sentence(POOLS)
    assert "6 expulsiones de 3 peticiones y 150 tokens" in text and "un 15 % más de tokens" in text
    assert "NO" in same_tokens_sentence(False) and "NO" not in same_tokens_sentence(True)


def test_sim_sentence_takes_the_branch_of_its_numbers():
    text = sim_sentence(PARAMS, SIM)
    assert "(3,4 veces)" in text and "orden de magnitud" not in text and ": baja." in text
    big = [dict(SIM[0]), dict(SIM[1], itl_p99_s=0.0047 * 20, ttft_s=0.2)]
    text = sim_sentence(PARAMS, big)
    assert "más de un orden de magnitud (20 veces)" in text and ": no baja." in text
    flat = [dict(SIM[0]), dict(SIM[1], itl_p99_s=0.004)]
    assert ": no sube" in sim_sentence(PARAMS, flat)


def test_report_assembles_into_a_valid_contract_whose_claims_recheck():
    real, pools = real_rows(SLOW3, FAST3, FAST3, SLOW3), POOLS
    body = report(Findings.from_measurements("tiny-es", PARAMS, real, SIM, pools))  # own claims
    contract = assemble_contract("scheduler", 0, "ci", dict(FAST, **PARAMS), body, "cpu")
    assert claims.recheck_contract(contract) == []
    assert len(claims.claims_of(contract)) == 4
    assert "la mediana de 5 repeticiones" in " ".join(contract["limitations"])


# --- the exercises' checks: the victim rules and what each costs ---------------------------------
def oldest_for_newest(running, rule):
    if rule == "newest":
        return next(r for r in running if not r.is_finished)
    return checks.reference_victim(running, rule)


def total_tokens(running, rule):
    live = [r for r in running if not r.is_finished]
    if rule == "newest":
        return live[-1]
    pick = min if rule == "fewest_computed" else max
    return pick(reversed(live), key=lambda r: r.num_tokens)


def ties_to_oldest(running, rule):
    live = [r for r in running if not r.is_finished]
    if rule == "newest":
        return live[-1]
    pick = min if rule == "fewest_computed" else max
    return pick(live, key=lambda r: r.num_computed_tokens)


def swapped(running, rule):
    other = {"fewest_computed": "most_computed", "most_computed": "fewest_computed"}
    return checks.reference_victim(running, other.get(rule, rule))


@pytest.mark.parametrize("seed", [0, 1, 7919])
def test_victim_check_accepts_the_reference_for_every_rule(seed):
    assert checks.check_victim(checks.reference_victim, seed=seed, raise_on_fail=False).passed
    assert checks.reference_victim.__doc__ and set(checks.VICTIM_RULES) == {
        "newest", "fewest_computed", "most_computed"}


def test_newest_rule_is_the_engines_default():
    batch = checks._batch([(False, 3, 12), (False, 9, 12), (True, 1, 12)])
    assert checks.reference_victim(batch, "newest") is newest_unfinished(batch) is batch[1]
    assert checks.reference_victim(batch, "fewest_computed") is batch[0]
    assert checks.reference_victim(batch, "most_computed") is batch[1]
    with pytest.raises(ValueError, match="desconocida"):
        checks.reference_victim(batch, "oldest")


@pytest.mark.parametrize("fn,rule,hint", [
    (oldest_for_newest, "'newest'", "la admitida más tarde de las que no han terminado"),
    (total_tokens, "'fewest_computed'", "no los tokens totales"),
    (ties_to_oldest, "'fewest_computed'", "en un empate de tokens calculados"),
    (swapped, "'fewest_computed'", "la que menos tokens calculados tiene, no la que más"),
])
def test_each_victim_mistake_is_named_with_its_rule_and_its_own_hint(fn, rule, hint):
    result = fails(checks.check_victim, fn, f"con la regla {rule}", "la referencia ejecuta", hint)
    assert result.message.index("Pista:") < result.message.index(hint)


def test_rule_comparison_counts_what_each_rule_costs():
    rows = checks.compare_victim_rules(checks.reference_victim, seed=0)
    assert [r["rule"] for r in rows] == list(checks.VICTIM_RULES)
    by = {r["rule"]: r for r in rows}
    assert by["newest"]["out_of_order"] == 0  # first come, first served: never out of order
    assert all(r["preemptions"] > 0 and r["recomputed_tokens"] > 0 for r in rows)
    assert all(1 <= r["max_preemptions"] <= r["preemptions"] for r in rows)
    assert by["fewest_computed"]["out_of_order"] > 0 and by["most_computed"]["out_of_order"] > 0
    # deterministic, and measured with the function it is given: one rule for all gives one row
    assert checks.compare_victim_rules(checks.reference_victim, seed=0) == rows
    same = checks.compare_victim_rules(lambda running, rule: newest_unfinished(running), seed=0)
    assert all({k: v for k, v in r.items() if k != "rule"} ==
               {k: v for k, v in by["newest"].items() if k != "rule"} for r in same)


def test_hidden_split_edges_name_the_case_in_spanish_numbers():
    edges = find_assessment("scheduler").hidden_module._split_edges
    assert edges(tokens_for).passed
    floor_chunk = edges(lambda want, budget, chunked: round(budget) if want > budget and chunked
                        else tokens_for(want, budget, chunked))
    assert not floor_chunk.passed and "budget = 0,99" in floor_chunk.message
    assert "no hay trozo" in floor_chunk.message
