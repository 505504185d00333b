"""The operations lab (chapter 12): its contract, conclusions that take the branch their numbers
support, determinism of everything simulated, and parameter errors."""

from __future__ import annotations

import re

import pytest

from ai_evolution import claims
from ai_evolution.labs import LabParamError, run_lab, without_volatile
from ai_evolution.labs.operations import SPEC, Findings, benchmark_study, fairness_study, report
from ai_evolution.reference.operations import reference_bucket_waits, reference_pick_tenant

pytestmark = pytest.mark.usefixtures("one_thread")

FAST = dict(polite_requests=16, fair_seeds=2, bench_requests=60, bench_seeds=5,
            capacity_requests=60, capacity_seconds=0.5, rate_steps=4, rate_bisections=2,
            day_requests=150, calib_requests=6)


@pytest.fixture(scope="module")
def contract():
    return run_lab("operations", seed=1, profile="ci", **FAST)


def test_contract_claims_are_what_their_numbers_give(contract):
    assert claims.recheck_contract(contract) == []
    kinds = [c["claim"]["inputs"]["what"] for c in claims.claims_of(contract)]
    assert len(kinds) == 4 + 2 + 2 + 2 + 1  # policies (and the limit), gaps, benchmark,
    #                                         autoscaling, calibration
    for item in contract["evidence"]:  # only the real run's timing is volatile
        assert item.get("volatile", False) == ("simulador calibrado" in item["statement"]), item


def test_vtc_and_priority_protect_the_polite_tenant_and_fcfs_does_not(contract):
    by = {c["claim"]["inputs"]["what"].split(",")[0]: c["claim"]["outcome"]
          for c in claims.claims_of(contract) if "inquilino educado" in c["statement"]}
    assert by == {"Con FCFS y un inundador a 8 veces su ritmo": "failed",
                  "Con prioridad y un inundador a 8 veces su ritmo": "passed",
                  "Con VTC y un inundador a 8 veces su ritmo": "passed",
                  "Con FCFS y el inundador limitado a la entrada por un cubo de fichas (2": "passed"}
    for row in contract["results"]["fairness"]:
        assert row["vtc"]["service_gap"] <= row["bound"] < row["fcfs"]["service_gap"]


def test_the_capacity_and_replicas_are_consistent(contract):
    c = contract["results"]["capacity"]
    assert c["goodput_rate"] is not None and c["first_failing_rate"] > c["goodput_rate"]
    probes = {round(p["rate"], 9): p["meets"] for p in c["probes"]}
    assert probes[round(c["goodput_rate"], 9)] and not probes[round(c["first_failing_rate"], 9)]
    assert (c["replicas"] - 1) * c["goodput_rate"] < c["target_rate"] <= c["replicas"] * c["goodput_rate"]


def test_simulated_studies_are_deterministic_and_the_findings_rebuild_the_body(contract):
    params = contract["params"]
    # the notebook's seams: the reference rules plugged in give the library's rows
    assert fairness_study(params, 1, pick_fn=reference_pick_tenant,
                          bucket_fn=reference_bucket_waits) == contract["results"]["fairness"]
    assert benchmark_study(params, 1) == contract["results"]["benchmark"]
    r = contract["results"]
    body = report(Findings(params, contract["environment"]["model"], r["fairness"], r["benchmark"],
                           r["capacity"], r["autoscaling"], r["calibration"]))
    assert [e["statement"] for e in body["evidence"]] == [e["statement"] for e in contract["evidence"]]


def test_a_flood_that_breaks_the_criterion_turns_the_verdict(contract):
    r = contract["results"]
    params = dict(contract["params"], slo_ttft_s=1e-6)  # nobody's first token comes that fast
    f = Findings(params, "m", r["fairness"], r["benchmark"], r["capacity"], r["autoscaling"],
                 r["calibration"])
    assert f.found["ttft_vtc"].outcome == "failed"
    slow = dict(r["calibration"], busy_error=0.9)
    g = Findings(contract["params"], "m", r["fairness"], r["benchmark"], r["capacity"],
                 r["autoscaling"], slow)
    assert g.found["calibration"].outcome == "failed"


def _bench_tpot(contract, uniform_tpot) -> claims.Claim:
    """The TPOT benchmark verdict with the uniform benchmark's p99 TPOT of each seed replaced."""
    r = contract["results"]
    bench = [dict(row, uniform=dict(row["uniform"], p99_tpot_s=uniform_tpot(row)))
             for row in r["benchmark"]]
    return Findings(contract["params"], "m", r["fairness"], bench, r["capacity"],
                    r["autoscaling"], r["calibration"]).found["bench_p99_tpot_s"]


def test_the_benchmark_verdict_is_the_median_interval_over_seeds(contract):
    found = _bench_tpot(contract, lambda row: row["uniform"]["p99_tpot_s"])
    assert found.outcome == claims.HIGHER  # the trace's TPOT tail is longer on every seed
    # five seeds paired by seed: the min-max range of the ratios, with its exact coverage
    assert "intervalo del 93\u00a0%" in found.text and "5 pares de cargas con la misma semilla" in found.text
    assert "intercalados" not in found.text
    # one seed where the uniform benchmark shows the longer tail: the interval holds 1
    flip = contract["results"]["benchmark"][0]["seed"]
    one = _bench_tpot(contract, lambda row: 2 * row["realistic"]["p99_tpot_s"]
                      if row["seed"] == flip else row["uniform"]["p99_tpot_s"])
    assert one.outcome == claims.INCONCLUSIVE and "no se distingue" in one.text
    # every seed: the uniform benchmark has the longer tail
    every = _bench_tpot(contract, lambda row: 2 * row["realistic"]["p99_tpot_s"])
    assert every.outcome == claims.LOWER
    # four seeds give a range (it covers the median 87 % of the time), no verdict
    r = contract["results"]
    four = Findings(contract["params"], "m", r["fairness"], r["benchmark"][:4], r["capacity"],
                    r["autoscaling"], r["calibration"]).found["bench_p99_tpot_s"]
    assert four.outcome == claims.INCONCLUSIVE and "solo hay un rango" in four.text


@pytest.mark.slow  # a whole lab, a long soak or a sampling statistic: `make test` only
def test_same_seed_same_contract_except_the_measured_run(contract):
    again = run_lab("operations", seed=1, profile="ci", **FAST)
    assert without_volatile(again) == without_volatile(contract)


@pytest.mark.parametrize("bad, words", [
    ({"rate_low": 10.0, "rate_high": 5.0}, "rate_low (10.0) debe ser menor que rate_high"),
    ({"max_model_len": 4096}, "supera las 512 posiciones"),
    ({"trace": "chat"}, "valores aceptados: uno de conversation, code"),
])
def test_bad_parameters_are_refused_in_spanish(bad, words):
    with pytest.raises(LabParamError, match=re.escape(words)):
        run_lab("operations", seed=0, profile="ci", **bad)


def test_the_spec_names_the_chapter():
    assert (SPEC.chapter, SPEC.folder, SPEC.kind) == (12, "labs/12-operations", "operations")
