"""The distributed lab (chapter 13): its contract, conclusions that take the branch their
numbers support (and the other branch when the numbers change), determinism of everything
computed, the notebook's seams, and parameter errors."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from ai_evolution import claims
from ai_evolution.labs import LabParamError, run_lab
from ai_evolution.labs.distributed import (SPEC, Findings, h100_study, routing_comparison,
                                           split_study)
from ai_evolution.model import load_model
from ai_evolution.reference.distributed import reference_affinity_choice

pytestmark = pytest.mark.usefixtures("one_thread")

FAST = dict(tp_max_tokens=6, route_sessions=2, rr_sessions=12, ar_repeats=3,
            ar_sizes=[1024, 65536])


@pytest.fixture(scope="module")
def contract():
    return run_lab("distributed", seed=1, profile="ci", **FAST)


def outcomes(contract) -> dict[str, str]:
    return {c["claim"]["inputs"]["what"]: c["claim"]["outcome"] for c in claims.claims_of(contract)}


def test_contract_claims_are_what_their_numbers_give(contract):
    assert claims.recheck_contract(contract) == []
    assert len(claims.claims_of(contract)) == 2 + 2 + 1 + 1 + 3 + 2 + 2  # split, exact, ratio,
    #                                                  h100 fit, TP speedups + PCIe, routes, rr
    for item in contract["evidence"]:  # what ran on this machine is volatile, the rest is not
        ran_here = item["source"] == "measured"
        assert item.get("volatile", False) == ran_here, item["statement"]
        if "TP=2 / con TP=1" in item["statement"] or "gloo" in item["statement"]:
            assert ran_here, item["statement"]  # timings are measured here
    assert {i["source"] for i in contract["evidence"]} == {"measured", "computed"}


def test_exact_facts_hold_on_this_machine(contract):
    exact = contract["results"]["tp_exact"]
    assert exact["mismatched_requests"] == 0
    assert exact["allreduce_bytes_counted"] == exact["allreduce_bytes_predicted"] > 0
    split = contract["results"]["split"]
    assert split["column"]["identical"] and split["row"]["rel_error"] < 1e-5
    by = outcomes(contract)
    for what, outcome in by.items():
        if what.startswith(("Capa 0", "Bytes que", "Peticiones cuyos", "Paso de decodificación",
                            "Con TP=8 en PCIe")) or "réplicas simuladas" in what:
            assert outcome == "passed", what
        if what.startswith("Pesos y caché KV de llama-3.1-70b"):
            assert outcome == "failed", what   # 70B does not fit one H100
    assert len(contract["results"]["tp_timing"]["pairs"]) == SPEC.params["tp_pairs"].default_for("ci")


def test_computed_studies_are_deterministic_and_the_notebook_seams_give_the_library_rows(contract):
    params = contract["params"]
    assert h100_study(params) == contract["results"]["h100"]
    routed = routing_comparison(params, 1, rule=reference_affinity_choice)
    library = contract["results"]["routing"]
    for got, want in zip(routed["rows"], library["rows"]):
        assert {k: v for k, v in got.items() if k != "reasons"} == \
            {k: v for k, v in want.items() if k != "reasons"}
    assert routed["round_robin"] == library["round_robin"]
    model = load_model(params["model"], 1, "cpu")
    assert split_study(model, params, 1) == contract["results"]["split"]


def findings_of(contract) -> Findings:
    r = contract["results"]
    return Findings(contract["params"], "tiny-es", r["split"],
                    {"exact": r["tp_exact"], "timing": r["tp_timing"]},
                    r["allreduce"], r["h100"], r["routing"])


def test_verdicts_follow_the_numbers_when_they_change(contract):
    f = findings_of(contract)
    tp = copy.deepcopy(f.tp)
    tp["exact"]["mismatched_requests"] = 1
    tp["exact"]["allreduce_bytes_predicted"] += 4
    found = dataclasses.replace(f, tp=tp).found
    assert found["tokens"].outcome == found["bytes"].outcome == "failed"
    # TP=2 faster in some pairs, slower in others: the ratio's interval holds 1
    tp["timing"]["pairs"] = [{**p, "tp2_step_s": p["tp1_step_s"] * s}
                             for p, s in zip(tp["timing"]["pairs"], (0.8, 1.2, 0.9, 1.1, 1.0))]
    assert dataclasses.replace(f, tp=tp).found["tp_ratio"].outcome == "inconclusive"
    split = copy.deepcopy(f.split)
    split["row"]["rel_error"] = 1e-3
    assert dataclasses.replace(f, split=split).found["split_row"].outcome == "failed"


def test_a_wrong_split_is_caught_by_the_reconstruction():
    params = SPEC.resolve_params("ci", {})
    model = load_model(params["model"], 0, "cpu")

    def interleaved(weight, rank, n, mode):
        return (weight[rank::n] if mode == "column" else weight[:, rank::n]).clone()

    out = split_study(model, params, 0, shard_fn=interleaved)
    assert out["column"]["rel_error"] > 1e-3 and not out["column"]["identical"]


@pytest.mark.parametrize("given, what", [
    ({"split_ranks": 3}, "split_ranks=3 no divide"),
    ({"tp_pairs": 4}, "tp_pairs"),
    ({"tp_prompt_len": 500, "tp_max_tokens": 100}, "supera las 512 posiciones"),
    ({"dc_model": "gpt-5"}, "dc_model"),
    ({"model": "smollm2-135m"}, "no se puede servir con TP=2"),
])
def test_bad_parameters_get_spanish_errors(given, what):
    with pytest.raises(LabParamError, match=what):
        run_lab("distributed", seed=0, profile="ci", **given)


def test_the_tp_engine_leaves_no_worker_behind(contract):
    import multiprocessing
    assert [p for p in multiprocessing.active_children() if p.name.startswith(("tp-", "allreduce"))] == []
    assert torch.get_num_threads() >= 1
