"""SLO capacity planning in the simulator (chapter 12): SLO reports, the highest rate that meets
an SLO, replicas for a target rate, and autoscaling replayed on a day-shaped trace."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ai_evolution.engine import Request
from ai_evolution.loadgen.realistic import realistic_workload
from ai_evolution.sim import sim_engine
from ai_evolution.sim.capacity import (SLO, day_shaped_rates, inhomogeneous_poisson,
                                       max_rate_meeting_slo, queue_policy, replay_autoscaling,
                                       replicas_for, slo_report, utilization_policy)
from engine_helpers import COST, SMALL, greedy

pytestmark = pytest.mark.usefixtures("one_thread")


def req(ttft, tpot=None, n=3):
    r = Request("x", [1, 2], greedy(n), arrival_time=0.0)
    if ttft is not None:
        r.first_token_time = ttft
        r.token_times = [ttft + i * (tpot or 0) for i in range(n if tpot else 1)]
    return r


def test_slo_report_counts_unfinished_as_late_and_attainment_per_request():
    slo = SLO(ttft_s=1.0, tpot_s=0.1)
    rs = [req(0.5, 0.05)] * 98 + [req(0.5, 0.2), req(None)]
    rep = slo_report(rs, slo)
    assert rep["attainment"] == pytest.approx(0.98)
    assert math.isinf(rep["p99_ttft_s"]) and not rep["meets"]
    ok = slo_report([req(0.5, 0.05)] * 10, slo)
    assert ok["meets"] and ok["attainment"] == 1.0


@pytest.mark.parametrize("bad", [0, -1, float("nan"), True, "1"])
def test_slo_refuses_bad_targets_in_spanish(bad):
    with pytest.raises(ValueError, match="debe ser un número de segundos > 0"):
        SLO(bad, 1.0)


def test_max_rate_brackets_the_capacity_of_a_monotone_server():
    capacity = 7.3  # a fake server: every request meets the SLO below this rate, none above
    slo = SLO(1.0, 1.0)
    res = max_rate_meeting_slo(lambda rate: [req(0.5 if rate <= capacity else 5.0)], slo,
                               low=1, high=64, steps=5, bisections=8)
    assert res["rate"] <= capacity < res["first_failing_rate"]
    assert res["first_failing_rate"] / res["rate"] < 1.05
    none = max_rate_meeting_slo(lambda rate: [req(5.0)], slo, 1, 64)
    assert none["rate"] is None
    assert replicas_for(20, res["rate"]) == math.ceil(20 / res["rate"])
    assert replicas_for(20, None) is None and replicas_for(3, 3.0) == 1


def test_the_simulated_capacity_falls_when_the_slo_tightens():
    def run_at(rate):
        items = realistic_workload(60, rate, SMALL.vocab_size, seed=0, scale=32, max_model_len=64)
        return sim_engine(SMALL, COST, 8, 64).run(items)
    loose = max_rate_meeting_slo(run_at, SLO(0.5, 0.05), 5, 2000, steps=6, bisections=3)
    tight = max_rate_meeting_slo(run_at, SLO(0.02, 0.05), 5, 2000, steps=6, bisections=3)
    assert loose["rate"] is not None and tight["rate"] is not None
    assert tight["rate"] < loose["rate"]


def test_inhomogeneous_poisson_follows_its_rate():
    rate = day_shaped_rates(24, peak_rate=500.0, trough_fraction=0.2)
    times = inhomogeneous_poisson(rate, 500.0, 24.0, seed=0)
    counts = np.histogram(times, bins=4, range=(0, 24))[0]
    grid = np.linspace(0, 24, 2401)[:-1] + 0.005  # the integral per bin, by the midpoint rule
    expected = [sum(rate(t) for t in grid[i * 600:(i + 1) * 600]) * 0.01 for i in range(4)]
    assert counts.tolist() == pytest.approx(expected, rel=0.1)
    assert counts[1] > 1.5 * counts[0]  # the day's shape: quiet night, busy middle


def _fleet(decide, arrivals, duration, **kw):
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 90, int(rng.integers(4, 20))).tolist() for _ in arrivals]
    return replay_autoscaling(lambda: sim_engine(SMALL, COST, 4, 64), arrivals,
                              lambda k: (prompts[k], greedy(8)), decide, duration=duration, **kw)


def test_a_fixed_fleet_serves_everything_and_costs_its_size_in_replica_hours():
    arrivals = inhomogeneous_poisson(lambda t: 40.0, 40.0, 4.0, seed=1)
    run = _fleet(lambda obs: 3, arrivals, 4.0, interval=0.5, startup_s=0.2, initial=3, hour_s=1.0)
    assert len(run.requests) == len(arrivals) and all(r.is_finished for r in run.requests)
    assert run.replica_hours == pytest.approx(3 * 4.0, rel=0.05)
    assert all(row["wanted"] == 3 for row in run.timeline)


def test_policies_scale_up_under_a_burst_and_back_down():
    rate = day_shaped_rates(8, peak_rate=150.0, trough_fraction=0.1, bursts=[(3.0, 4.0, 150.0)])
    arrivals = inhomogeneous_poisson(rate, 300.0, 8.0, seed=2)
    for decide in (queue_policy(per_replica_rate=40.0), utilization_policy()):
        run = _fleet(decide, arrivals, 8.0, interval=0.25, startup_s=0.25, hour_s=1.0)
        wanted = [row["wanted"] for row in run.timeline]
        assert max(wanted) > 1 and wanted[-1] < max(wanted)
        assert all(r.is_finished for r in run.requests)
