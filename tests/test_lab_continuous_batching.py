"""The continuous-batching lab: its contract, its determinism, its parameter errors, and the
verdicts its report computes (each must take the branch its own numbers support)."""

import pytest

from ai_evolution import claims
from ai_evolution.engine import StepEntry, StepRecord
from ai_evolution.labs import LabParamError, run_lab, without_volatile
from ai_evolution.labs.continuous_batching import (SIM_ERROR_LIMIT, Findings, criteria_sentence,
                                                   fastest_steps, identical_sentence, report,
                                                   simulator_consequence, verdicts, workload)
from ai_evolution.model import get_preset
from ai_evolution.sim import RooflineCostModel, fit_cost_model, step_cost

FAST = dict(num_requests=12, prompt_len=8, mean_output=8, caps=[2, 48], max_num_seqs=4,
            repeats=2, validation_requests=6, validation_widths=[1, 4], dc_requests=64,
            dc_caps=[8, 1024], dc_max_num_seqs=16)


@pytest.fixture(scope="module")
def contract():
    return run_lab("continuous_batching", seed=2, profile="ci", **FAST)


def test_both_policies_give_the_same_tokens_and_continuous_takes_fewer_steps(contract):
    m = contract["results"]["measured"]
    assert m["outputs_identical"] == [True, True]
    # cap 2: every output is 1 or 2 tokens, the batches drain together; cap 48: a long tail
    assert m["steps"]["continuous"][-1] < m["steps"]["static"][-1]
    assert all(c <= s for c, s in zip(m["steps"]["continuous"], m["steps"]["static"]))
    assert m["idle_held_fraction"]["continuous"] == [0.0, 0.0]
    assert m["idle_held_fraction"]["static"][-1] > 0.2
    assert m["mean_batch"]["continuous"][-1] > m["mean_batch"]["static"][-1]


def test_every_timing_is_kept_per_repetition(contract):
    t = contract["results"]["measured_timing"]
    assert t["repeats"] == 2
    for key in ("wall_s", "throughput_tok_s", "e2e_p50_s", "e2e_p99_s"):
        for p in ("static", "continuous"):
            assert [len(x) for x in t[key][p]] == [2, 2]


def test_simulator_validation_and_datacenter_study_are_reported(contract):
    r = contract["results"]
    v = r["simulator_validation"]
    assert [w["max_num_seqs"] for w in v["widths"]] == [1, 4]
    assert all(len(w["pass_totals_s"]) == 2 for w in v["widths"])
    assert v["max_abs_error"] == max(abs(w["error"]) for w in v["widths"])
    assert v["limit"] == SIM_ERROR_LIMIT
    # fitted on one workload, judged on another that was served at the same widths and moments
    assert [w["max_num_seqs"] for w in v["calibration_fit"]] == [1, 4]
    assert [w["steps"] for w in v["calibration_fit"]] != [w["steps"] for w in v["widths"]]
    runs = r["datacenter"]["runs"]
    assert [run["cap"] for run in runs] == [8, 1024]
    assert runs[-1]["throughput_ratio"] > 1.5 and runs[-1]["throughput_ratio"] > runs[0]["throughput_ratio"]
    assert runs[-1]["continuous"]["steps"] < runs[-1]["static"]["steps"]


def test_every_claim_of_a_real_contract_is_what_its_numbers_give(contract):
    assert claims.recheck_contract(contract) == []
    kinds = sorted(item["claim"]["kind"] for item in claims.claims_of(contract))
    assert kinds == ["compare"] * 4 + ["threshold"] * 2
    sim = next(i for i in claims.claims_of(contract) if "simulador" in i["statement"])
    v = contract["results"]["simulator_validation"]
    assert sim["value"] == v["max_abs_error"]
    assert sim["claim"]["outcome"] == ("passed" if v["max_abs_error"] <= SIM_ERROR_LIMIT else "failed")


@pytest.mark.slow  # a whole lab, a long soak or a sampling statistic: `make test` only
def test_same_seed_gives_the_same_contract_except_volatile_fields(contract):
    again = run_lab("continuous_batching", seed=2, profile="ci", **FAST)
    assert without_volatile(again) == without_volatile(contract)
    assert "measured_timing" not in without_volatile(contract)["results"]


def test_workload_is_seeded_and_capped():
    a = workload(50, 4, 20, 16, 100, seed=1)
    assert a == workload(50, 4, 20, 16, 100, seed=1)
    assert a != workload(50, 4, 20, 16, 100, seed=2)
    lengths = [w.params.max_tokens for w in a]
    assert max(lengths) == 16 and min(lengths) >= 1
    assert all(len(w.prompt_token_ids) == 4 and w.params.ignore_eos for w in a)


@pytest.mark.parametrize("params,accepted", [
    ({"model": "gpt-5"}, "tiny-es"),
    ({"dc_device": "tpu"}, "h100-sxm"),
    ({"caps": "0,8"}, ">= 1"),
])
def test_bad_parameters_name_the_accepted_values(params, accepted):
    with pytest.raises(LabParamError, match=accepted):
        run_lab("continuous_batching", profile="ci", **params)


def test_caps_longer_than_the_model_are_rejected_in_spanish():
    with pytest.raises(LabParamError, match="supera las 512 posiciones"):
        run_lab("continuous_batching", profile="ci", prompt_len=32, caps=[600])


# --- the report's verdicts on hand-made measurements --------------------------------------------
def _row(cap, static_tok_s, cont_tok_s, steps=(300, 150), p50=None, p99=None, identical=True):
    p50 = p50 or ([2.0] * len(static_tok_s), [1.5] * len(static_tok_s))
    p99 = p99 or ([6.0] * len(static_tok_s), [4.0] * len(static_tok_s))
    side = lambda tok_s, n, e50, e99: {  # noqa: E731
        "steps": n, "mean_batch": 4.0, "idle_held_fraction": 0.3 if n == steps[0] else 0.0,
        "wall_s": [1000 / t for t in tok_s], "throughput_tok_s": list(tok_s),
        "ttft_p50_s": [0.1] * len(tok_s), "e2e_p50_s": list(e50), "e2e_p99_s": list(e99)}
    return {"cap": cap, "output_tokens": 1000, "outputs_identical": identical,
            "static": side(static_tok_s, steps[0], p50[0], p99[0]),
            "continuous": side(cont_tok_s, steps[1], p50[1], p99[1]),
            "step_ratio": steps[0] / steps[1],
            "throughput_ratio": sorted(cont_tok_s)[len(cont_tok_s) // 2]
            / sorted(static_tok_s)[len(static_tok_s) // 2]}


def _validation(errors, limit=SIM_ERROR_LIMIT):
    widths = [{"max_num_seqs": b, "measured_s": 1.0, "simulated_s": 1.0 + e, "error": e,
               "steps": 10, "pass_totals_s": [1.0, 1.1, 0.9]} for b, e in zip((1, 2, 4, 8), errors)]
    return {"bandwidth_gbps": 20.0, "calibration_steps": 100,
            "fitted": {"peak_flops": 1e11, "overhead_s": 1e-3, "overhead_per_seq_s": 1e-4},
            "widths": widths, "max_abs_error": max(abs(e) for e in errors), "limit": limit}


DATACENTER = {"device": "H100", "model": "llama", "dtype": "bf16", "bandwidth_bytes_per_s": 3.35e12,
              "peak_flops": 9.9e14, "max_num_seqs": 32,
              "runs": [{"cap": 32, "throughput_ratio": 1.1}, {"cap": 1536, "throughput_ratio": 3.0}]}
MODEL = {"name": "tiny-es", "dtype": "fp32", "parameters": 5_000_000}
LOW_EVEN = _row(8, [100, 104, 98, 102, 99], [101, 99, 103, 100, 102], steps=(48, 48))  # no spread: a tie


def _body(rows, validation):
    """The report's body, the verdicts and the criteria met, from hand-made measurements."""
    findings = Findings.from_measurements(MODEL, {}, rows, validation, DATACENTER)
    body = report(findings)
    assert claims.recheck_contract(body) == []
    return body, verdicts(rows, validation), findings.criteria_met


def test_continuous_faster_in_every_pair_says_so_and_nothing_else():
    rows = [LOW_EVEN, _row(192, [100, 90, 110, 95, 105], [150, 140, 160, 145, 155])]
    _, v, met = _body(rows, _validation([0.05, -0.08, 0.02, 0.1]))
    assert v["gain_wide"].outcome == claims.HIGHER
    assert "rinde más" in v["gain_wide"].text and "rinde menos" not in v["gain_wide"].text
    assert "no se distingue" not in v["gain_wide"].text
    assert v["gain_low"].outcome == claims.INCONCLUSIVE and "no se distingue" in v["gain_low"].text
    # 1,5 times against a step ratio of 2: the step costs more with a full batch
    assert v["step_gain"].outcome == claims.PASSED and "por debajo" in v["step_gain"].text


def test_scaled_timings_keep_the_verdicts():
    slow = [LOW_EVEN, _row(192, [10, 9, 11, 9.5, 10.5], [15, 14, 16, 14.5, 15.5])]
    fast = [LOW_EVEN, _row(192, [1000, 900, 1100, 950, 1050], [1500, 1400, 1600, 1450, 1550])]
    a = verdicts(slow, _validation([0.05] * 4))
    b = verdicts(fast, _validation([0.05] * 4))
    assert {k: c.outcome for k, c in a.items()} == {k: c.outcome for k, c in b.items()}


def test_static_faster_says_continuous_is_slower():
    rows = [LOW_EVEN, _row(192, [150, 140, 160, 145, 155], [100, 90, 110, 95, 105])]
    _, v, met = _body(rows, _validation([0.05] * 4))
    assert v["gain_wide"].outcome == claims.LOWER
    assert "rinde menos" in v["gain_wide"].text and "rinde más" not in v["gain_wide"].text
    assert "no cumple: una ganancia medida mayor que uno" in criteria_sentence(met)


def test_overlapping_noise_is_inconclusive():
    rows = [LOW_EVEN, _row(192, [100, 160, 90, 150, 95], [150, 95, 105, 100, 160])]
    _, v, met = _body(rows, _validation([0.05] * 4))
    assert v["gain_wide"].outcome == claims.INCONCLUSIVE
    assert "rinde más" not in v["gain_wide"].text and "rinde menos" not in v["gain_wide"].text


def test_a_gain_above_the_step_ratio_is_not_called_below_it():
    above = [LOW_EVEN, _row(192, [100, 101, 99, 100, 102], [300, 310, 305, 300, 308], steps=(300, 150))]
    v = verdicts(above, _validation([0.05] * 4))
    assert v["step_gain"].outcome == claims.FAILED
    assert "supera el cociente" in v["step_gain"].text and "por debajo" not in v["step_gain"].text
    straddles = [LOW_EVEN, _row(192, [100] * 5, [150, 250, 210, 180, 230], steps=(300, 150))]
    v = verdicts(straddles, _validation([0.05] * 4))
    assert v["step_gain"].outcome == claims.INCONCLUSIVE


def test_latency_verdicts_follow_their_numbers():
    faster = _row(192, [100, 90, 110, 95, 105], [150, 140, 160, 145, 155], p50=([2.0, 2.2, 1.9, 2.1, 2.0], [1.0, 1.1, 0.9, 1.0, 1.05]),
                  p99=([6.0, 6.5, 5.5, 6.2, 5.8], [6.6, 7.2, 6.1, 6.8, 6.4]))
    v = verdicts([LOW_EVEN, faster], _validation([0.05] * 4))
    assert v["e2e_p50"].outcome == claims.LOWER and "tarda menos" in v["e2e_p50"].text
    assert v["e2e_p99"].outcome == claims.HIGHER and "tardan más" in v["e2e_p99"].text


def test_simulator_within_the_criterion_is_validated():
    rows = [LOW_EVEN, _row(192, [100, 90, 110, 95, 105], [150, 140, 160, 145, 155])]
    body, v, met = _body(rows, _validation([0.05, -0.12, 0.02, 0.1]))
    sim = v["simulator"]
    assert sim.outcome == claims.PASSED and "queda validado" in sim.text
    assert "no queda validado" not in sim.text
    assert "12,0\u00a0%" in sim.text and "15,0\u00a0%" in sim.text
    assert "no se superó" not in simulator_consequence(sim)
    assert criteria_sentence(met) == "El contrato de esta ejecución cumple los 4 criterios."
    assert sim.text in [e["statement"] for e in body["evidence"]]


def test_simulator_beyond_the_criterion_is_not_trusted_downstream():
    rows = [LOW_EVEN, _row(192, [100, 90, 110, 95, 105], [150, 140, 160, 145, 155])]
    _, v, met = _body(rows, _validation([0.05, -0.169, 0.02, 0.1]))
    sim = v["simulator"]
    assert sim.outcome == claims.FAILED and "no queda validado" in sim.text.lower()
    assert "16,9\u00a0%" in sim.text
    consequence = simulator_consequence(sim)
    assert "no se superó" in consequence and "no quedan validadas" in consequence
    assert "Con la validación superada" not in consequence
    assert "no cumple: un error del simulador" in criteria_sentence(met)


def test_outputs_that_differ_are_reported_as_an_error():
    rows = [LOW_EVEN, _row(192, [100, 90, 110, 95, 105], [150, 140, 160, 145, 155], identical=False)]
    text = identical_sentence(rows)
    assert "NO producen" in text and "192" in text
    assert "exactamente los mismos" not in text
    body, v, met = _body(rows, _validation([0.05] * 4))
    assert "no cumple: tokens idénticos" in criteria_sentence(met)
    assert any(e["statement"] == text and e["value"] is False for e in body["evidence"])


# --- per-step medians and the fit -----------------------------------------------------------------
def _record(i, start, end, queries):
    entries = tuple(StepEntry(str(k), k, q, q + i, q > 1) for k, q in enumerate(queries))
    return StepRecord(i, start, end, entries, {e.request_id: e.first_block for e in entries}, 4)


def test_fastest_steps_takes_each_steps_fastest_run_and_rejects_other_schedules():
    runs = [[_record(0, 0, d0, [4, 4]), _record(1, 0, d1, [1, 1])]
            for d0, d1 in ((0.010, 0.002), (0.500, 0.003), (0.012, 0.900))]
    history, durations = fastest_steps(runs)
    assert history is runs[0] and durations == pytest.approx([0.010, 0.002])
    other = runs + [[_record(0, 0, 0.01, [4]), _record(1, 0, 0.01, [1])]]
    with pytest.raises(ValueError, match="mismos pasos"):
        fastest_steps(other)


def test_fit_with_absolute_errors_recovers_a_known_model_and_keeps_overheads_non_negative():
    cfg = get_preset("llama-3.1-8b")
    costs = [step_cost(cfg, [1] * b, [512] * b) for b in (1, 2, 4, 8, 16, 32)]
    costs += [step_cost(cfg, [p], [p]) for p in (64, 1024)]
    truth = RooflineCostModel(2e12, 1e14, overhead_s=3e-3, overhead_per_seq_s=2e-4)
    fit = fit_cost_model(costs, [truth.step_time_s(c) for c in costs], 2e12, errors="absolute")
    for c in costs:
        assert fit.step_time_s(c) == pytest.approx(truth.step_time_s(c), rel=1e-6)
    # times that fall as the batch grows: the per-sequence term is clipped at zero and the fixed
    # term refitted alone, so the steps' total time is still matched
    decode = [step_cost(cfg, [1] * b, [16] * b) for b in (1, 8)] * 5
    times = [0.5, 0.3] * 5
    fit = fit_cost_model(decode, times, 1e20, errors="absolute")
    assert fit.overhead_per_seq_s == 0.0
    assert sum(fit.step_time_s(c) for c in decode) == pytest.approx(sum(times), rel=1e-3)
    with pytest.raises(ValueError, match="relative"):
        fit_cost_model(decode, times, 1e20, errors="squared")
