"""The load generator (arrivals, lengths, open and closed loops) and the load-test metrics
(bootstrap intervals, goodput). Pure numpy and the simulator: no model runs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ai_evolution.engine import FinishReason, SamplingParams
from ai_evolution.engine.request import Request, RequestRejected
from ai_evolution.loadgen import (LENGTH_KINDS, WorkItem, burst_arrivals, closed_loop,
                                  length_sampler, open_loop_workload, poisson_arrivals,
                                  realized_rate)
from ai_evolution.metrics import bootstrap_ci, goodput, percentile, summarize
from ai_evolution.model import get_preset
from ai_evolution.sim import sim_engine
from engine_helpers import COST

CONFIG = get_preset("tiny-es")
MAX_LEN = 96


# --- arrivals ----------------------------------------------------------------------------------
def test_poisson_seeded_and_shaped():
    a = poisson_arrivals(50, 4.0, seed=1)
    assert a == poisson_arrivals(50, 4.0, seed=1)
    assert a != poisson_arrivals(50, 4.0, seed=2)
    assert len(a) == 50 and a[0] == 0.0
    assert all(isinstance(t, float) for t in a)
    assert np.all(np.diff(a) > 0)
    assert poisson_arrivals(1, 4.0, seed=1) == [0.0]


def test_poisson_gaps_mean_is_one_over_rate():
    rate, n = 8.0, 200_000
    gaps = np.diff(poisson_arrivals(n, rate, seed=0))
    # Standard error of the mean gap: (1 / rate) / sqrt(n) ~ 0.22 %; 1 % is > 4 standard errors
    # (and the seed is fixed, so this cannot flake).
    assert abs(gaps.mean() * rate - 1) < 0.01
    # Exponential: the standard deviation equals the mean, and P(gap > mean) = 1/e.
    assert abs(gaps.std() * rate - 1) < 0.02
    assert abs((gaps > 1 / rate).mean() - math.exp(-1)) < 0.01


def test_realized_rate_long_run_close_short_run_off():
    rate = 5.0
    long = poisson_arrivals(50_000, rate, seed=3)
    assert abs(realized_rate(long) / rate - 1) < 0.02
    short = poisson_arrivals(20, rate, seed=3)
    r = realized_rate(short)
    assert r == pytest.approx(19 / (short[-1] - short[0]), rel=1e-12)
    # 19 gaps: the realized rate of this seeded run is measurably off the configured one.
    assert abs(r / rate - 1) > 0.05


def test_realized_rate_rules():
    assert realized_rate([3.0, 1.0, 2.0]) == pytest.approx(1.0)  # unsorted: max - min
    assert realized_rate([0.0, 0.0, 0.0]) == math.inf
    for bad in ([], [1.0]):
        with pytest.raises(ValueError, match="al menos 2 llegadas"):
            realized_rate(bad)
    with pytest.raises(ValueError, match="finitos"):
        realized_rate([0.0, float("nan"), 1.0])


@pytest.mark.parametrize("n, rate", [(0, 1.0), (5, 0.0), (5, -1.0), (5, float("nan")),
                                     (5, float("inf")), (2.5, 1.0)])
def test_poisson_rejects(n, rate):
    with pytest.raises(ValueError, match="rate|n debe"):
        poisson_arrivals(n, rate, seed=0)


def test_bursts_shape():
    a = burst_arrivals(10, 4, 0.5)
    assert a == [0.0] * 4 + [0.5] * 4 + [1.0] * 2
    assert burst_arrivals(3, 5, 2.0) == [0.0, 0.0, 0.0]
    j = burst_arrivals(12, 4, 1.0, seed=7, jitter_s=0.1)
    assert j == burst_arrivals(12, 4, 1.0, seed=7, jitter_s=0.1)
    assert j != burst_arrivals(12, 4, 1.0, seed=8, jitter_s=0.1)
    for k in range(3):  # each burst stays inside [k * gap, k * gap + jitter)
        chunk = j[4 * k: 4 * k + 4]
        assert all(k <= t < k + 0.1 for t in chunk)
    with pytest.raises(ValueError, match="burst_size"):
        burst_arrivals(4, 0, 1.0)
    with pytest.raises(ValueError, match="gap_s"):
        burst_arrivals(4, 2, -1.0)
    with pytest.raises(ValueError, match="jitter_s"):
        burst_arrivals(8, 2, 1.0, seed=0, jitter_s=1.0)


# --- lengths -----------------------------------------------------------------------------------
def test_samplers_bounds_caps_and_determinism():
    assert length_sampler("fixed", value=7)(4) == [7, 7, 7, 7]
    exp = length_sampler("exponential", seed=0, mean=50, cap=80)
    draws = exp(5000)
    assert min(draws) >= 1 and max(draws) == 80  # the cap is hit (P(x > 80) ~ 20 %)
    assert all(isinstance(x, int) for x in draws)
    assert draws == length_sampler("exponential", seed=0, mean=50, cap=80)(5000)
    assert exp(10) != draws[:10]  # successive calls continue the stream
    logn = length_sampler("lognormal", seed=1, median=100, sigma=1.0, cap=400)(5000)
    assert min(logn) >= 1 and max(logn) == 400
    assert abs(np.median(logn) / 100 - 1) < 0.1
    assert min(length_sampler("lognormal", seed=1, median=0.2, sigma=0.5, cap=9)(100)) == 1
    values = [3, 30, 300]
    lst = length_sampler("list", seed=2, values=values)(3000)
    assert set(lst) == set(values)
    assert all(abs(lst.count(v) / 3000 - 1 / 3) < 0.05 for v in values)
    assert length_sampler("fixed", value=7)(0) == []


def test_sampler_errors_name_accepted_values():
    with pytest.raises(ValueError) as err:
        length_sampler("uniforme", value=3)
    assert all(k in str(err.value) for k in LENGTH_KINDS)
    with pytest.raises(ValueError, match="faltan: cap"):
        length_sampler("exponential", mean=3)
    with pytest.raises(ValueError, match="sobran: mean"):
        length_sampler("fixed", value=3, mean=3)
    for kind, kw in [("fixed", {"value": 0}), ("exponential", {"mean": 0, "cap": 5}),
                     ("exponential", {"mean": 5, "cap": 0}),
                     ("lognormal", {"median": 5, "sigma": -1, "cap": 5}),
                     ("list", {"values": []}), ("list", {"values": [2, 0]})]:
        with pytest.raises(ValueError):
            length_sampler(kind, **kw)


# --- metrics -----------------------------------------------------------------------------------
def test_bootstrap_contains_point_narrows_and_is_seeded():
    rng = np.random.default_rng(0)
    sample = rng.exponential(1.0, 400)
    for kw, point in [({"q": 50}, percentile(sample, 50)), ({"q": 90}, percentile(sample, 90)),
                      ({}, sample.mean()), ({"stat": np.median}, np.median(sample))]:
        low, high = bootstrap_ci(sample, **kw)
        assert low < point < high, kw
    assert bootstrap_ci(sample, q=90, seed=5) == bootstrap_ci(sample, q=90, seed=5)
    assert bootstrap_ci(sample, q=90, seed=5) != bootstrap_ci(sample, q=90, seed=6)
    small_w = np.subtract(*bootstrap_ci(sample[:50], q=50)[::-1])
    big_w = np.subtract(*bootstrap_ci(rng.exponential(1.0, 5000), q=50)[::-1])
    assert big_w < small_w / 4  # ~ sqrt(100) = 10 times narrower
    # A statistic without ``axis`` is applied row by row: same interval as the vectorised one.
    by_row = bootstrap_ci(sample, stat=lambda row: float(np.mean(row)), n_boot=200, seed=3)
    assert by_row == pytest.approx(bootstrap_ci(sample, n_boot=200, seed=3), rel=1e-12)
    # Constant sample: the interval collapses on the value.
    assert bootstrap_ci([2.0] * 10, q=99) == (2.0, 2.0)


def test_bootstrap_rejects():
    with pytest.raises(ValueError, match="vacía"):
        bootstrap_ci([])
    with pytest.raises(ValueError, match="vacía"):
        bootstrap_ci([None, None])
    with pytest.raises(ValueError, match="finitos"):
        bootstrap_ci([1.0, float("nan")])
    with pytest.raises(ValueError, match="no ambos"):
        bootstrap_ci([1.0, 2.0], stat=np.mean, q=50)
    with pytest.raises(ValueError, match="alpha"):
        bootstrap_ci([1.0, 2.0], alpha=1.5)
    with pytest.raises(ValueError, match="n_boot"):
        bootstrap_ci([1.0, 2.0], n_boot=0)


def _req(rid: str, arrival: float, token_times: list[float]) -> Request:
    r = Request(rid, [1, 2, 3], SamplingParams(max_tokens=max(1, len(token_times))),
                arrival_time=arrival)
    r.output_token_ids = [7] * len(token_times)
    r.token_times = list(token_times)
    if token_times:
        r.first_token_time, r.finish_time = token_times[0], token_times[-1]
        r.finish_reason = FinishReason.LENGTH
    return r


def test_goodput_on_hand_built_requests():
    reqs = [_req("a", 0.0, [0.1, 0.2, 0.3]),          # ttft 0.1, tpot 0.1
            _req("b", 1.0, [1.5, 1.55, 1.6]),         # ttft 0.5, tpot 0.05
            _req("c", 2.0, [2.05]),                   # ttft 0.05, one token: no tpot
            _req("d", 3.0, [3.15, 3.6, 4.0])]         # ttft 0.15, tpot 0.425; finishes last
    span = 4.0 - 0.0
    assert goodput(reqs) == pytest.approx(4 / span)
    assert goodput(reqs, ttft_slo_s=0.2) == pytest.approx(3 / span)       # b misses
    assert goodput(reqs, tpot_slo_s=0.1) == pytest.approx(3 / span)       # d misses
    assert goodput(reqs, ttft_slo_s=0.2, tpot_slo_s=0.1) == pytest.approx(2 / span)
    assert goodput(reqs, ttft_slo_s=0.1) == pytest.approx(2 / span)       # <= is inclusive (a)
    assert goodput(reqs, ttft_slo_s=0.01) == 0.0
    # An unfinished request does not count and does not stretch the span.
    pending = _req("e", 3.5, [])
    assert goodput(reqs + [pending], ttft_slo_s=0.2) == pytest.approx(3 / span)
    aborted = _req("f", 0.5, [0.6])
    aborted.finish_reason = FinishReason.ABORT
    assert goodput(reqs + [aborted]) == pytest.approx(4 / span)
    with pytest.raises(ValueError, match="terminadas"):
        goodput([pending])
    with pytest.raises(ValueError, match="ttft_slo_s"):
        goodput(reqs, ttft_slo_s=-1)


def test_summarize_keeps_keys_and_adds_p90_and_rate():
    reqs = [_req(str(i), 0.5 * i, [0.5 * i + 0.1 * (i + 1), 0.5 * i + 0.3 * (i + 1)])
            for i in range(5)]
    s = summarize(reqs)
    ttft = [0.1 * (i + 1) for i in range(5)]
    assert s["ttft_p50_s"] == pytest.approx(np.percentile(ttft, 50))
    assert s["ttft_p99_s"] == pytest.approx(np.percentile(ttft, 99))
    assert s["ttft_p90_s"] == pytest.approx(np.percentile(ttft, 90))
    assert s["tpot_p90_s"] == pytest.approx(np.percentile([0.2 * (i + 1) for i in range(5)], 90))
    assert s["realized_rate"] == pytest.approx(4 / 2.0)
    assert s["duration_s"] == pytest.approx(2.0 + 1.5)
    assert math.isnan(summarize(reqs[:1])["realized_rate"])


# --- open and closed loops on the simulator ----------------------------------------------------
def test_open_loop_workload_seeded_and_served():
    prompts = length_sampler("list", seed=0, values=[4, 16, 40])
    outputs = length_sampler("exponential", seed=1, mean=8, cap=24)
    w = open_loop_workload(30, 50.0, prompts, outputs, CONFIG.vocab_size, seed=4)
    again = open_loop_workload(30, 50.0, length_sampler("list", seed=0, values=[4, 16, 40]),
                               length_sampler("exponential", seed=1, mean=8, cap=24),
                               CONFIG.vocab_size, seed=4)
    assert w == again
    assert all(isinstance(x, WorkItem) for x in w)
    assert [x.arrival_time for x in w] == poisson_arrivals(30, 50.0, seed=4)
    assert all(3 <= t < CONFIG.vocab_size for x in w for t in x.prompt_token_ids)
    assert {len(x.prompt_token_ids) for x in w} <= {4, 16, 40}
    assert all(x.params.ignore_eos and 1 <= x.params.max_tokens <= 24 for x in w)
    engine = sim_engine(CONFIG, COST, max_num_seqs=4, max_model_len=MAX_LEN)
    done = engine.run(w)
    assert len(done) == 30 and all(r.is_finished for r in done)
    assert [len(r.output_token_ids) for r in done] == [x.params.max_tokens for x in w]
    assert [r.arrival_time for r in done] == pytest.approx([x.arrival_time for x in w])
    fixed = open_loop_workload(5, 1.0, 8, 3, CONFIG.vocab_size, seed=0)
    assert all(len(x.prompt_token_ids) == 8 and x.params.max_tokens == 3 for x in fixed)
    with pytest.raises(ValueError, match="vocab_size"):
        open_loop_workload(5, 1.0, 8, 3, 3, seed=0)


def _make_item(seed: int):
    rng = np.random.default_rng(seed)

    def make(i: int):
        prompt = rng.integers(3, CONFIG.vocab_size, int(rng.integers(2, 30))).tolist()
        return prompt, SamplingParams(max_tokens=int(rng.integers(1, 20)), ignore_eos=True)
    return make


@pytest.mark.parametrize("policy", ["continuous", "static"])
@pytest.mark.parametrize("clients", [1, 3])
def test_closed_loop_on_simulator(policy, clients):
    total = 11
    engine = sim_engine(CONFIG, COST, max_num_seqs=6, max_model_len=MAX_LEN, policy=policy)
    # Instrument: how many of the engine's requests are unfinished each time one is added.
    in_flight_at_add = []
    add = engine.add_request

    def counting_add(*a, **kw):
        in_flight_at_add.append(sum(not r.is_finished for r in engine.requests.values()))
        return add(*a, **kw)
    engine.add_request = counting_add
    run = closed_loop(engine, clients, total, _make_item(0), seed=None)
    assert len(run) == total and len(engine.requests) == total
    assert all(r.is_finished for r in run)
    assert max(in_flight_at_add) == clients - 1  # the engine is never given a (clients+1)th
    assert max(h.batch_size for h in engine.history) <= clients
    # Never more than ``clients`` requests between arrival and finish at any instant.
    events = sorted([(r.arrival_time, 1) for r in run] + [(r.finish_time, -1) for r in run],
                    key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    assert peak == clients
    # Each client's next request arrives exactly when its previous one finished.
    by_client = run.by_client()
    assert sorted(by_client) == list(range(clients))
    for reqs in by_client.values():
        assert reqs[0].arrival_time == 0.0
        for prev, nxt in zip(reqs, reqs[1:]):
            assert nxt.arrival_time == prev.finish_time
            assert nxt.first_token_time > prev.finish_time
    # Send order: arrivals never go back in time.
    assert all(a.arrival_time <= b.arrival_time for a, b in zip(run, run[1:]))
    assert not engine.has_unfinished_requests() and not engine.scheduler.running


def test_closed_loop_is_deterministic_and_one_client_is_serial():
    def go(seed):
        engine = sim_engine(CONFIG, COST, max_num_seqs=4, max_model_len=MAX_LEN)
        run = closed_loop(engine, 4, 9, _make_item(1), seed=seed)
        return [(r.arrival_time, r.finish_time, len(r.output_token_ids)) for r in run], run.clients
    assert go(None) == go(None)
    assert go(5) == go(5)
    engine = sim_engine(CONFIG, COST, max_num_seqs=4, max_model_len=MAX_LEN)
    serial = closed_loop(engine, 1, 5, _make_item(2))
    assert all(b.arrival_time == a.finish_time for a, b in zip(serial, serial[1:]))
    # More clients than requests: every request is sent at once.
    engine = sim_engine(CONFIG, COST, max_num_seqs=4, max_model_len=MAX_LEN)
    run = closed_loop(engine, 8, 3, _make_item(2))
    assert [r.arrival_time for r in run] == [0.0] * 3 and run.clients == [0, 1, 2]


def test_closed_loop_rejects():
    engine = sim_engine(CONFIG, COST, max_num_seqs=4, max_model_len=MAX_LEN)
    with pytest.raises(ValueError, match="clients"):
        closed_loop(engine, 0, 3, _make_item(0))
    with pytest.raises(ValueError, match="total_requests"):
        closed_loop(engine, 2, 0, _make_item(0))
    with pytest.raises(RequestRejected, match="petición 0"):
        closed_loop(engine, 2, 3, lambda i: ([], SamplingParams(max_tokens=2, ignore_eos=True)))
