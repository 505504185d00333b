"""Reference answers of the operations lab (chapter 12): VTC's admission rule, a token bucket's
decisions at the door, and the goodput read from capacity probes."""

from __future__ import annotations

from typing import Mapping, Sequence

from ..engine.scheduling_policy import least_served
from ..server.tenants import TokenBucket
from ..sim.capacity import SLO, slo_percentiles


def reference_pick_tenant(counters: dict, backlogged: list):
    """VTC's admission rule: the backlogged tenant with the smallest counter (ties: the first
    in ``backlogged``, which lists them in queue order)."""
    return least_served(counters, backlogged)


def reference_bucket_waits(times: Sequence[float], costs: Sequence[float], rate: float,
                           capacity: float) -> list[float]:
    """A token bucket at the door (``capacity`` tokens, full at the first arrival, refilled at
    ``rate`` per second): for each arrival in time order, 0.0 if it is admitted (it takes its
    ``cost``), else the seconds until its cost would be available (the Retry-After; ``inf`` if
    the cost exceeds the capacity). A refused request takes nothing."""
    if not times:
        return []
    bucket = TokenBucket(rate, capacity, float(times[0]))
    out = []
    for t, n in zip(times, costs):
        wait = bucket.wait_s(n, float(t))
        if wait == 0:
            bucket.take(n, float(t))
        out.append(float(wait))
    return out


def reference_goodput_rate(probes: Mapping[float, Sequence[tuple]], slo_ttft_s: float,
                           slo_tpot_s: float):
    """The goodput read from capacity probes (``{rate: [(ttft, tpot), ...]}``): the highest
    probed rate whose p99 TTFT and p99 TPOT meet the SLO and below which every probed rate meets
    it too (the load only grows: a rate above a failing one does not count); None if the lowest
    probe fails."""
    best = None
    for rate in sorted(probes):
        if not slo_percentiles(probes[rate], SLO(slo_ttft_s, slo_tpot_s))["meets"]:
            break
        best = rate
    return best
