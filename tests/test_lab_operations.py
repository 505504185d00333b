"""The operations lab (chapter 12): its contract, conclusions that take the branch their numbers
support, determinism of everything simulated, and parameter errors."""

from __future__ import annotations

import re

import pytest

from ai_evolution import claims
from ai_evolution.labs import LabParamError, registry, run_lab, without_volatile
from ai_evolution.labs.operations import SPEC, Findings, benchmark_study, fairness_study, report

pytestmark = pytest.mark.usefixtures("one_thread", "registered")


@pytest.fixture(scope="module", autouse=True)
def registered():
    """The kind joins the registry with its chapter (lab folder, notebooks, assessment); until
    then the tests register it for themselves."""
    added = "operations" not in registry._LABS
    registry._LABS.setdefault("operations", "ai_evolution.labs.operations")
    yield
    if added:
        registry._LABS.pop("operations")

FAST = dict(polite_requests=16, fair_seeds=2, bench_requests=60, bench_seeds=3,
            capacity_requests=60, capacity_seconds=0.5, rate_steps=4, rate_bisections=2,
            day_requests=150, calib_requests=6)


@pytest.fixture(scope="module")
def contract():
    return run_lab("operations", seed=1, profile="ci", **FAST)


def test_contract_claims_are_what_their_numbers_give(contract):
    assert claims.recheck_contract(contract) == []
    kinds = [c["claim"]["inputs"]["what"] for c in claims.claims_of(contract)]
    assert len(kinds) == 3 + 2 + 2 + 2 + 1  # policies, gaps, benchmark, autoscaling, calibration
    for item in contract["evidence"]:  # only the real run's timing is volatile
        assert item.get("volatile", False) == ("simulador calibrado" in item["statement"]), item


def test_vtc_and_priority_protect_the_polite_tenant_and_fcfs_does_not(contract):
    by = {c["claim"]["inputs"]["what"].split(" y ")[0]: c["claim"]["outcome"]
          for c in claims.claims_of(contract) if "inquilino educado" in c["statement"]}
    assert by == {"Con FCFS": "failed", "Con prioridad": "passed", "Con VTC": "passed"}
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
    assert fairness_study(params, 1) == contract["results"]["fairness"]
    assert benchmark_study(params, 1) == contract["results"]["benchmark"]
    r = contract["results"]
    body = report(Findings(params, contract["environment"]["model"], r["fairness"], r["benchmark"],
                           r["capacity"], r["autoscaling"], r["calibration"]))
    assert [e["statement"] for e in body["evidence"]] == [e["statement"] for e in contract["evidence"]]


def test_a_flood_that_breaks_the_criterion_turns_the_verdict(contract):
    r = contract["results"]
    params = dict(contract["params"], ttft_factor=1.0)  # nobody keeps its solo p99 exactly
    f = Findings(params, "m", r["fairness"], r["benchmark"], r["capacity"], r["autoscaling"],
                 r["calibration"])
    assert f.found["ttft_vtc"].outcome == "failed"
    slow = dict(r["calibration"], busy_error=0.9)
    g = Findings(contract["params"], "m", r["fairness"], r["benchmark"], r["capacity"],
                 r["autoscaling"], slow)
    assert g.found["calibration"].outcome == "failed"


def test_same_seed_same_contract_except_the_measured_run():
    a = run_lab("operations", seed=2, profile="ci", **FAST)
    b = run_lab("operations", seed=2, profile="ci", **FAST)
    assert without_volatile(a) == without_volatile(b)


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
