"""The observability lab: its contract and determinism, its parameter errors, the load-test
metrics it reports, and its self-checks (which accept the references and name plausible
mistakes)."""

from __future__ import annotations

import math
import re

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from ai_evolution.checks import observability as checks  # noqa: E402
from ai_evolution.engine import FinishReason, SamplingParams  # noqa: E402
from ai_evolution.engine.request import Request  # noqa: E402
from ai_evolution.fmt import table  # noqa: E402
from ai_evolution.labs import (LabParamError, assemble_contract, get_spec, run_lab,  # noqa: E402
                               validate_contract, without_volatile)
from ai_evolution import claims  # noqa: E402
from ai_evolution.labs.observability import (Run, coordinated_omission, tpot_shift,  # noqa: E402
                                             capacity_agreement, saturated_throughput,
                                             datacenter_target, find_knee, poisson_run, settle,
                                             spread, spread_claim)
from ai_evolution.loadgen import open_loop_workload, poisson_arrivals  # noqa: E402
from ai_evolution.loadgen.inprocess import progress_bar, run_open_loop  # noqa: E402
from ai_evolution.metrics import (bootstrap_ci, load_test_summary, percentile,  # noqa: E402
                                  records, summarize)
from ai_evolution.model import get_preset  # noqa: E402
from ai_evolution.plots import load_curve_figure, repeat_spread_figure, settle_figure  # noqa: E402
from ai_evolution.sim import sim_engine  # noqa: E402
from checkutil import fails  # noqa: E402
from engine_helpers import COST  # noqa: E402

FAST = dict(prompt_len=8, output_len=4, closed_loop_requests=16, requests_per_rate=12,
            load_fractions=[0.5, 1.0, 2.0], repeats=2, n_boot=200, dc_requests=20, dc_repeats=3,
            dc_output_len=16, dc_settle_requests=240, settle_fractions=[0.9], capacity_pairs=2)


@pytest.fixture(scope="module")
def contract(one_thread):
    return run_lab("observability", seed=3, profile="ci", **FAST)


# --- the lab -------------------------------------------------------------------------------------
def test_contract_reports_capacity_sweep_repeats_and_simulation(contract):
    r = contract["results"]
    m, s = r["measured"], r["simulated"]
    assert m["capacity"]["capacity_req_s"] > 0 and m["capacity"]["clients"] == 8
    assert m["capacity"]["capacity_tok_s"] == pytest.approx(4 * m["capacity"]["capacity_req_s"])
    assert [row["fraction"] for row in m["sweep"]] == [0.5, 1.0, 2.0]
    assert len(m["repeats"]) == 2 and len(s["repeats"]) == 3
    for row in m["sweep"] + s["sweep"] + s["repeats"]:
        lo, hi = row["ttft_p99_ci_s"]
        assert lo <= hi and 0 <= row["slo_attainment"] <= 1
        assert row["goodput_req_s"] <= row["throughput_req_s"] + 1e-12
    assert s["setup"]["model"] == "llama-3.1-8b" and s["capacity"]["capacity_req_s"] > 0
    assert [b["block"] for b in s["settle"][0]["blocks"]] == [30, 60]  # 240 requests: >= 4 blocks
    assert len(r["arrivals"]["sweep_rate_ratio"]) == 3 and len(r["arrivals"]["repeat_rate_ratio"]) == 2
    # the simulated server is overloaded at twice its capacity: its TTFT grows
    assert s["sweep"][-1]["ttft_p99_s"] > s["sweep"][0]["ttft_p99_s"]
    assert contract["volatile_fields"] == ["results.measured"]


def test_every_evidence_sentence_carries_its_number_and_limitations_name_the_short_test(contract):
    for item in contract["evidence"]:
        assert any(ch.isdigit() for ch in item["statement"]), item
        if item["source"] == "measured":
            assert item.get("volatile") is True, item
    text = " ".join(contract["limitations"])
    assert "60 peticiones" in text and "p99" in text and "Con 12 peticiones" in text


def test_same_seed_gives_the_same_contract_except_volatile_fields(contract):
    again = run_lab("observability", seed=3, profile="ci", **FAST)
    assert without_volatile(again) == without_volatile(contract)
    assert "measured" not in without_volatile(contract)["results"]
    assert without_volatile(contract)["results"]["simulated"]["sweep"]


def test_assemble_contract_checks_params_like_run_lab(contract):
    body = {k: contract[k] for k in ("results", "evidence", "limitations", "volatile_fields")}
    params = {name: p.default_for("ci") for name, p in get_spec("observability").params.items()}
    built = assemble_contract("observability", 3, "ci", params, body, "cpu")
    assert validate_contract(built)["params"] == params
    with pytest.raises(LabParamError, match="parámetro desconocido 'rate'"):
        assemble_contract("observability", 3, "ci", {**params, "rate": 2}, body, "cpu")


@pytest.mark.parametrize("params,match", [
    ({"prompt_len": 400, "output_len": 200}, "supera las 512 posiciones"),
    ({"closed_loop_requests": 10}, "al menos 2 × max_num_seqs = 16"),
    ({"dc_settle_requests": 100}, "al menos 120"),
    ({"load_fractions": "0.5,2"}, "entre 0,8 y 1,25"),
    ({"load_fractions": "0.5,-1"}, "valores aceptados"),
    ({"model": "gpt-5"}, "tiny-es"),
    ({"repeats": 1}, ">= 2"),
    ({"overload_fraction": 1.0}, "overload_fraction"),
    ({"capacity_tolerance": 0}, "capacity_tolerance"),
])
def test_bad_parameters_are_rejected_in_spanish(params, match):
    with pytest.raises(LabParamError, match=match):
        run_lab("observability", profile="ci", **{**FAST, **params})


def test_every_claim_in_the_contract_is_what_its_own_numbers_give(contract):
    assert claims.recheck_contract(contract) == []
    kinds = [item["claim"]["kind"] for item in claims.claims_of(contract)]
    assert kinds.count("compare") == 2 and kinds.count("threshold") == 2
    loops = next(i for i in claims.claims_of(contract) if "|abierto / cerrado − 1|" in i["statement"])
    pairs = contract["results"]["measured"]["capacity_pairs"]
    assert len(pairs["closed_req_s"]) == len(pairs["open_req_s"]) == 2 and pairs["fraction"] == 2.0
    # two pairs give a range, never a verdict
    assert loops["claim"]["outcome"] == claims.INCONCLUSIVE and "solo hay un rango" in loops["statement"]
    omission = next(i for i in claims.claims_of(contract) if "TTFT p99" in i["statement"])
    tpot = next(i for i in claims.claims_of(contract) if "TPOT mediano" in i["statement"])
    assert "a 1,00 veces la capacidad" in tpot["statement"]
    # the closed loop is compared with the open-loop run at the same offered load (1 ×)
    assert "a 1,00 veces la capacidad" in omission["statement"]
    assert len(omission["claim"]["inputs"]["a"]) == FAST["requests_per_rate"]
    assert len(omission["claim"]["inputs"]["b"]) == FAST["closed_loop_requests"]


@pytest.mark.parametrize("scale,outcome,says", [
    (1.2, claims.HIGHER, "cambia de sitio"),
    (0.8, claims.LOWER, "tiempo por token menor"),
    (1.0, claims.INCONCLUSIVE, "no se distingue"),
])
def test_tpot_under_poisson_against_the_closed_loop_follows_the_numbers(scale, outcome, says):
    rng = np.random.default_rng(1)
    closed = rng.uniform(0.09, 0.11, 200).tolist()
    open_ = (scale * rng.uniform(0.09, 0.11, 200)).tolist()
    c = tpot_shift({"capacity": {"tpot_s": closed},
                    "at_capacity": {"tpot_s": open_, "fraction": 1.0}})
    assert c.outcome == outcome and says in c.text
    assert tpot_shift({"capacity": {"tpot_s": []}, "at_capacity": {"tpot_s": open_,
                                                                  "fraction": 1.0}}) is None


def _omission_study(open_ttft, closed_ttft, fraction=1.0) -> dict:
    return {"capacity": {"ttft_s": closed_ttft, "ttft_p99_s": float(np.percentile(closed_ttft, 99))},
            "at_capacity": {"ttft_s": open_ttft, "fraction": fraction,
                            "ttft_p99_s": float(np.percentile(open_ttft, 99))}}


@pytest.mark.parametrize("scale,outcome,says,never", [
    (10.0, claims.HIGHER, "omisión coordinada", "vio más cola"),
    (0.1, claims.LOWER, "vio más cola", "omisión coordinada"),
    (1.0, claims.INCONCLUSIVE, "no es concluyente", "omisión coordinada"),
])
def test_coordinated_omission_verdict_follows_the_numbers(scale, outcome, says, never):
    # A p99 needs hundreds of requests per side before an interval can cover it 90 % of the
    # time (from n draws the widest interval covers at most 1 - 0,99**n).
    rng = np.random.default_rng(0)
    closed = rng.uniform(0.01, 0.02, 600).tolist()
    open_ = (scale * rng.uniform(0.01, 0.02, 500)).tolist()
    c = coordinated_omission(_omission_study(open_, closed))
    assert c.outcome == outcome and says in c.text and never not in c.text
    assert "la misma carga ofrecida" in c.text
    assert "parecida" in coordinated_omission(_omission_study(open_, closed, 0.9)).text
    few = coordinated_omission(_omission_study(open_[:30], closed[:40]))
    assert few.outcome == claims.INCONCLUSIVE and "solo hay un rango" in few.text


@pytest.mark.parametrize("ratios,outcome,says", [
    ([1.01, 0.98, 1.03, 0.99, 1.02], claims.PASSED, "coinciden dentro del 10"),
    ([1.3, 1.25, 1.4, 1.35, 1.28], claims.FAILED, "se separan más de un 10"),
    ([0.8, 0.95, 1.0, 1.05, 1.2], claims.INCONCLUSIVE, "ni que se separen"),
    ([1.0, 1.01, 0.99], claims.INCONCLUSIVE, "solo hay un rango"),
])
def test_closed_and_open_loop_capacity_verdict_follows_the_pairs(ratios, outcome, says):
    closed = [20.0 + k for k in range(len(ratios))]
    pairs = {"fraction": 2.0, "closed_req_s": closed,
             "open_req_s": [r * c for r, c in zip(ratios, closed)]}
    c = capacity_agreement(pairs, 0.1)
    assert c.outcome == outcome and says in c.text, c.text
    # the point is the ratio of the medians (what the contract's ratios are everywhere)
    assert c.value == pytest.approx(abs(float(np.median(pairs["open_req_s"]) / np.median(closed)) - 1))
    assert claims.recheck(c.evidence("fracción")) == []


def _timed(arrival, scheduled, finish):
    return type("R", (), {"arrival_time": arrival, "first_scheduled_time": scheduled,
                          "finish_time": finish, "first_token_time": scheduled,
                          "token_times": [finish], "num_output_tokens": 1})()


def test_saturated_throughput_counts_completions_while_no_row_is_free():
    # first completion at 1 s, last admission at 3 s: the completions at 2 and 3 s count
    reqs = [_timed(0, 0, 1), _timed(0, 0.5, 2), _timed(0, 1, 3), _timed(0, 3, 5)]
    assert saturated_throughput(reqs) == pytest.approx(2 / 2)
    # the admission is what counts, not the arrival (an open loop's queue waits)
    assert saturated_throughput([_timed(0, 0, 1), _timed(0.1, 2, 2.5), _timed(0.2, 4, 6)]) == \
        pytest.approx(1 / 3)
    # the closed loop's capacity ends its window at the last send instead
    assert saturated_throughput(reqs, until=2) == pytest.approx(1 / 1)


@pytest.mark.parametrize("ratio,outcome", [(15.1, claims.PASSED), (1.2, claims.FAILED)])
def test_spread_verdict_follows_the_ratio(ratio, outcome):
    c = spread_claim({"ratio": ratio}, "Simulado")
    assert c.outcome == outcome
    assert ("reproducido" in c.text) == (outcome == claims.PASSED)
    assert ("no se reproduce" in c.text) == (outcome == claims.FAILED)


# --- analysis helpers ----------------------------------------------------------------------------
def _row(rate: float, p99: float, ci=(0.0, 1.0), fraction: float = 1.0) -> dict:
    return {"realized_rate": rate, "configured_rate": rate, "fraction": fraction,
            "ttft_p99_s": p99, "ttft_p99_ci_s": ci}


def test_knee_is_the_first_realized_rate_past_the_factor():
    rows = [_row(10, 0.02, fraction=1 / 3), _row(30, 0.05), _row(20, 0.07), _row(40, 0.5)]
    knee = find_knee(rows, 3.0)
    # by realized rate: 10 (base 0.02), 20 (0.07 > 0.06: the knee), 30, 40
    assert knee["realized_rate"] == 20 and knee["low_load_ttft_p99_s"] == 0.02
    assert find_knee(rows, 100.0) is None


def test_spread_counts_how_often_one_interval_holds_another_run():
    rows = [_row(1, 0.1, (0.09, 0.2)), _row(1, 0.15, (0.14, 0.16)), _row(1, 0.4, (0.3, 0.5))]
    s = spread(rows)
    assert s["ratio"] == pytest.approx(4.0)
    assert s["ci_width_min_s"] == pytest.approx(0.02) and s["ci_width_max_s"] == pytest.approx(0.2)
    # interval 0 holds run 1's p99; interval 1 holds none; interval 2 holds run 2's own only
    assert s["cross_coverage"] == pytest.approx(1 / 6)


def test_settle_cuts_a_long_run_into_blocks_and_finds_where_p99_settles():
    class R:
        def __init__(self, t):
            self.ttft = t
    # one slow request in every 30: every block of 30 or more has the same p99 shape
    ttft = [1.0 if i % 30 == 29 else 0.01 for i in range(480)]
    out = settle(Run(0.9, 1.0, 0, list(range(480)), [R(t) for t in ttft]), tolerance=0.25)
    assert [b["block"] for b in out["blocks"]] == [30, 60, 120]
    assert out["blocks"][0]["blocks"] == 16
    # blocks of 30 interpolate between 0.01 and 1.0 (0.71, 29 % off); from 60 on, p99 = 1.0
    assert out["settled_at"] == 60 and out["blocks"][0]["within_share"] == 0.0
    steady = settle(Run(0.5, 1.0, 0, [], [R(0.01) for _ in range(240)]), tolerance=0.25)
    assert steady["settled_at"] == 30 and steady["blocks"][-1]["within_share"] == 1.0


def test_datacenter_target_serves_a_poisson_run_deterministically():
    params = {name: p.default_for("ci") for name, p in get_spec("observability").params.items()}
    target, shape, setup = datacenter_target({**params, "dc_output_len": 8})
    a = poisson_run(target, 10, 5.0, *shape, seed=1)
    b = poisson_run(target, 10, 5.0, *shape, seed=1)
    assert [r.ttft for r in a.requests] == [r.ttft for r in b.requests]
    assert a.arrivals[0] == 0.0 and a.rate_ratio == pytest.approx(9 / a.arrivals[-1] / 5.0)
    assert setup["device"].startswith("NVIDIA H100")


# --- metrics, tables, the in-process target --------------------------------------------------------
def _req(rid: str, arrival: float, token_times: list[float]) -> Request:
    r = Request(rid, [1, 2, 3], SamplingParams(max_tokens=len(token_times)), arrival_time=arrival)
    r.output_token_ids = [7] * len(token_times)
    r.token_times = list(token_times)
    r.first_token_time, r.finish_time = token_times[0], token_times[-1]
    r.finish_reason = FinishReason.LENGTH
    return r


def test_load_test_summary_adds_intervals_goodput_and_pooled_itl():
    reqs = [_req("a", 0.0, [0.1, 0.2, 0.4]), _req("b", 1.0, [1.5, 1.55, 1.6]),
            _req("c", 2.0, [2.05, 2.1])]
    row = load_test_summary(reqs, ttft_slo_s=0.2, n_boot=200, seed=1)
    itl = [0.1, 0.2, 0.05, 0.05, 0.05]
    assert row["itl_p50_s"] == pytest.approx(np.percentile(itl, 50))
    assert row["itl_p99_s"] == pytest.approx(np.percentile(itl, 99))
    assert row["throughput_req_s"] == pytest.approx(3 / 2.1)
    assert row["goodput_req_s"] == pytest.approx(2 / 2.1) and row["slo_attainment"] == pytest.approx(2 / 3)
    assert row["ttft_p99_ci_s"] == pytest.approx(bootstrap_ci([0.1, 0.5, 0.05], q=99, n_boot=200, seed=1))
    # the percentile and interval functions are the ones given (a student's, in the lab)
    calls = []
    row = load_test_summary(reqs, percentile_fn=lambda v, q: calls.append(q) or 0.0,
                            ci_fn=lambda v, q, n_boot, alpha, seed: (0.0, 0.0))
    assert row["ttft_p99_s"] == 0.0 and set(calls) == {50, 90, 99}
    assert summarize(reqs)["ttft_p90_s"] == pytest.approx(np.percentile([0.1, 0.5, 0.05], 90))


def test_records_are_flat_and_tagged():
    recs = records([_req("a", 0.0, [0.1, 0.2, 0.4])], rate=2.0, run=1)
    assert recs == [{"rate": 2.0, "run": 1, "request_id": "a", "arrival_s": 0.0, "prompt_tokens": 3,
                     "output_tokens": 3, "ttft_s": 0.1, "tpot_s": pytest.approx(0.15),
                     "itl_max_s": pytest.approx(0.2), "e2e_s": 0.4, "finish_reason": "length"}]


def test_table_prints_spanish_numbers_intervals_and_missing_values():
    text = table([{"r": 1234.5, "ci": (0.1, 0.25), "x": None}, {"r": 2.0, "ci": (1, 2), "x": math.nan}],
                 [("tasa", "r", 1), ("IC (ms)", "ci", 0, 1e3), ("x", "x", 1)])
    lines = text.splitlines()
    assert lines[0].split() == ["tasa", "IC", "(ms)", "x"]
    assert "1234,5" in lines[2] and "[100; 250]" in lines[2] and lines[2].endswith("—")
    assert lines[3].split()[0] == "2,0"


def test_open_loop_workload_uses_the_given_arrivals_and_checks_them():
    items = open_loop_workload(5, 2.0, 4, 3, 100, seed=1, arrivals_fn=lambda n, r, s: [0, 1, 2, 3, 4])
    assert [i.arrival_time for i in items] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert items == open_loop_workload(5, 2.0, 4, 3, 100, seed=1,
                                       arrivals_fn=lambda n, r, s: [0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match="5 instantes"):
        open_loop_workload(5, 2.0, 4, 3, 100, seed=1, arrivals_fn=lambda n, r, s: [0.0] * 4)
    with pytest.raises(ValueError, match="negativo o no finito"):
        open_loop_workload(3, 2.0, 4, 3, 100, seed=1, arrivals_fn=lambda n, r, s: [0, -1, 2])


def test_progress_bar_counts_finished_requests_and_restores_the_engine():
    config = get_preset("tiny-es")
    engine = sim_engine(config, COST, 4, 64, "continuous", dtype="fp32")
    items = open_loop_workload(6, 50.0, 8, 3, config.vocab_size, seed=2)
    reqs = run_open_loop(engine, items, progress=True, desc="prueba")
    assert all(r.is_finished for r in reqs)
    assert "step" not in vars(engine) and engine.step_hooks == []  # its hook is gone
    with pytest.raises(RuntimeError):
        with progress_bar(engine, 1, "x"):
            raise RuntimeError("boom")
    assert "step" not in vars(engine) and engine.step_hooks == []


def test_figures_have_titles_and_units(contract):
    m, s = contract["results"]["measured"], contract["results"]["simulated"]
    fig = load_curve_figure({"medido": {"rows": m["sweep"], "repeats": m["repeats"],
                                        "capacity": m["capacity"]["capacity_req_s"], "knee": m["knee"]}})
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and "peticiones/s" in ax.get_xlabel() and "TTFT" in ax.get_ylabel()
    fig = repeat_spread_figure({"simulado": s["repeats"]})
    assert "ms" in fig.axes[0].get_ylabel()
    blocks = [{"block": 30, "blocks": 2, "p99_s": [0.1, 0.2]}, {"block": 60, "blocks": 1, "p99_s": [0.15]}]
    fig = settle_figure([{"fraction": 0.9, "requests": 60, "ttft_p99_s": 0.15, "tolerance": 0.25,
                          "blocks": blocks}])
    assert "peticiones por bloque" in fig.axes[0].get_xlabel()


# --- self-checks: the references pass, plausible mistakes fail with a precise message -------------
def ref_percentile(values, q):
    x = sorted(values)
    h = (len(x) - 1) * q / 100
    lo = math.floor(h)
    hi = min(lo + 1, len(x) - 1)
    return x[lo] + (h - lo) * (x[hi] - x[lo])


def ref_bootstrap(values, q, n_boot=1000, alpha=0.05, seed=0):
    return bootstrap_ci(values, q=q, n_boot=n_boot, alpha=alpha, seed=seed)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_checks_accept_the_references(seed):
    assert checks.check_percentile(percentile, seed=seed, raise_on_fail=False).passed
    assert checks.check_percentile(ref_percentile, seed=seed, raise_on_fail=False).passed
    assert checks.check_bootstrap(ref_bootstrap, seed=seed, raise_on_fail=False).passed
    assert checks.check_arrivals(poisson_arrivals, seed=seed, raise_on_fail=False).passed


def test_a_correct_generator_with_another_random_recipe_passes():
    def inverse_transform(n, rate, seed):
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate {rate!r}")
        u = np.random.default_rng(seed).random(n - 1)
        return [0.0] + np.cumsum(-np.log1p(-u) / rate).tolist()
    for seed in range(5):
        assert checks.check_arrivals(inverse_transform, seed=seed, raise_on_fail=False).passed


def test_percentile_without_sorting_is_named():
    def unsorted(values, q):
        h = (len(values) - 1) * q / 100
        lo = math.floor(h)
        return values[lo] + (h - lo) * (values[min(lo + 1, len(values) - 1)] - values[lo])
    fails(checks.check_percentile, unsorted, "falla el caso 1", "se esperaba 2 y su función devolvió 1",
          "sin ordenar")


def test_percentile_off_by_one_rank_is_named():
    def off_by_one(values, q):
        x = sorted(values)
        h = min(len(x) * q / 100, len(x) - 1)
        lo = math.floor(h)
        return x[lo] + (h - lo) * (x[min(lo + 1, len(x) - 1)] - x[lo])
    fails(checks.check_percentile, off_by_one, "devolvió 2,5", "h = (n − 1)·q/100, no n·q/100")


def test_percentile_nearest_rank_and_in_place_sort_are_named():
    fails(checks.check_percentile, lambda v, q: sorted(v)[max(0, math.ceil(q / 100 * len(v)) - 1)],
          "rango más cercano")

    def in_place(values, q):
        values.sort()
        return ref_percentile(values, q)
    fails(checks.check_percentile, in_place, "reordenó la lista", "sorted(values)")


def test_bootstrap_mistakes_are_named():
    def without_replacement(values, q, n_boot=1000, alpha=0.05, seed=0):
        rng = np.random.default_rng(seed)
        stats = [np.percentile(rng.permutation(values), q) for _ in range(n_boot)]
        return tuple(np.quantile(stats, [alpha / 2, 1 - alpha / 2]))
    fails(checks.check_bootstrap, without_replacement, "anchura 0", "sin reemplazo")

    def whole_alpha(values, q, n_boot=1000, alpha=0.05, seed=0):
        x = np.asarray(values)
        idx = np.random.default_rng(seed).integers(0, len(x), (n_boot, len(x)))
        return tuple(np.quantile(np.percentile(x[idx], q, axis=1), [alpha, 1 - alpha]))
    fails(checks.check_bootstrap, whole_alpha, "alpha/2 a cada lado")

    def global_state(values, q, n_boot=1000, alpha=0.05, seed=0):
        x = np.asarray(values)
        idx = np.random.randint(0, len(x), (n_boot, len(x)))
        return tuple(np.quantile(np.percentile(x[idx], q, axis=1), [alpha / 2, 1 - alpha / 2]))
    fails(checks.check_bootstrap, global_state, "falla el caso 1", "misma semilla",
          "np.random.default_rng(seed)")


def _valid(rate):
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate {rate!r}")


def test_fixed_gap_arrivals_fail_the_exponential_test():
    def fixed(n, rate, seed):
        _valid(rate)
        return [i / rate for i in range(n)]
    fails(checks.check_arrivals, fixed, "Kolmogorov-Smirnov", "todos los huecos son iguales")


def test_uniform_gaps_fail_the_exponential_test():
    def uniform(n, rate, seed):
        _valid(rate)
        return [0.0] + np.cumsum(np.random.default_rng(seed).uniform(0, 2 / rate, n - 1)).tolist()
    fails(checks.check_arrivals, uniform, "Kolmogorov-Smirnov", "¿huecos uniformes?")


def test_rate_passed_as_the_mean_gap_is_named():
    def mean_rate(n, rate, seed):
        _valid(rate)
        return [0.0] + np.cumsum(np.random.default_rng(seed).exponential(rate, n - 1)).tolist()
    fails(checks.check_arrivals, mean_rate, "debería ser 1/rate = 2,0000 s", "recibe la escala")


def test_arrivals_without_the_seed_are_named():
    def global_state(n, rate, seed):
        _valid(rate)
        return [0.0] + np.cumsum(np.random.exponential(1 / rate, n - 1)).tolist()
    fails(checks.check_arrivals, global_state, "con la misma semilla devolvió instantes distintos")

    def fixed_seed(n, rate, seed):
        _valid(rate)
        return [0.0] + np.cumsum(np.random.default_rng(0).exponential(1 / rate, n - 1)).tolist()
    fails(checks.check_arrivals, fixed_seed, "con semillas distintas devolvió los mismos instantes")


def test_arrivals_shape_and_bad_rates_are_named():
    def gaps(n, rate, seed):
        _valid(rate)
        return [0.0] + np.random.default_rng(seed).exponential(1 / rate, n - 1).tolist()
    fails(checks.check_arrivals, gaps, "no crecen: [0; 0,", "el anterior más su hueco")

    def first_not_zero(n, rate, seed):
        _valid(rate)
        return np.cumsum(np.random.default_rng(seed).exponential(1 / rate, n)).tolist()
    fails(checks.check_arrivals, first_not_zero, "la primera llegada es", "t = 0")

    def no_validation(n, rate, seed):
        return [0.0] + np.cumsum(np.random.default_rng(seed).exponential(1 / rate, n - 1)).tolist()
    fails(checks.check_arrivals, no_validation, "(rate = 0)", "ZeroDivisionError", "ValueError")

    def accepts_negative(n, rate, seed):
        if rate == 0:
            raise ValueError("cero")
        return [0.0] + np.cumsum(np.random.default_rng(seed).exponential(abs(1 / rate), n - 1)).tolist()
    fails(checks.check_arrivals, accepts_negative, "(rate = −2)", "sin lanzar ValueError")


def test_check_messages_write_numbers_with_a_decimal_comma():
    """Expected and obtained values, labels and intervals: Spanish numbers, intervals as [a; b]."""
    def off_by_one(values, q):
        x = sorted(values)
        h = min(len(x) * q / 100, len(x) - 1)
        lo = math.floor(h)
        return x[lo] + (h - lo) * (x[min(lo + 1, len(x) - 1)] - x[lo])

    def whole_alpha(values, q, n_boot=1000, alpha=0.05, seed=0):
        x = np.asarray(values)
        idx = np.random.default_rng(seed).integers(0, len(x), (n_boot, len(x)))
        return tuple(np.quantile(np.percentile(x[idx], q, axis=1), [alpha, 1 - alpha]))

    def first_not_zero(n, rate, seed):
        _valid(rate)
        return np.cumsum(np.random.default_rng(seed).exponential(1 / rate, n)).tolist()

    messages = [fails(checks.check_percentile, off_by_one).message,
                fails(checks.check_bootstrap, whole_alpha, "se esperaba el intervalo [0,").message,
                fails(checks.check_arrivals, first_not_zero, "la primera llegada es 0,").message]
    for message in messages:
        assert not re.search(r"\d\.\d", message), message
