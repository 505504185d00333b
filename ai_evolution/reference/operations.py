"""Reference answers of the operations lab (chapter 12): VTC's admission rule, a token bucket's
decisions at the door, and the goodput read from capacity probes."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from ..engine.scheduling_policy import least_served
from ..server.tenants import TokenBucket


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


def p99_of(records: Sequence[tuple], slo_ttft_s: float, slo_tpot_s: float) -> dict:
    """p99 TTFT (an unfinished request, ``ttft`` None, counts as infinitely late) and p99 TPOT
    (over the requests that have one; 0 if none) of ``(ttft, tpot)`` records, linear
    interpolation, and whether both meet the SLO."""
    ttft = [math.inf if t is None else t for t, _ in records]
    tpot = [p for _, p in records if p is not None]
    with np.errstate(invalid="ignore"):  # inf - inf between two unfinished requests
        p99_ttft = float(np.percentile(ttft, 99))
    p99_ttft = math.inf if math.isnan(p99_ttft) else p99_ttft
    p99_tpot = float(np.percentile(tpot, 99)) if tpot else 0.0
    return {"p99_ttft_s": p99_ttft, "p99_tpot_s": p99_tpot,
            "meets": bool(p99_ttft <= slo_ttft_s and p99_tpot <= slo_tpot_s)}


def reference_goodput_rate(probes: Mapping[float, Sequence[tuple]], slo_ttft_s: float,
                           slo_tpot_s: float):
    """The goodput read from capacity probes (``{rate: [(ttft, tpot), ...]}``): the highest
    probed rate whose p99 TTFT and p99 TPOT meet the SLO and below which every probed rate meets
    it too (the load only grows: a rate above a failing one does not count); None if the lowest
    probe fails."""
    best = None
    for rate in sorted(probes):
        if not p99_of(probes[rate], slo_ttft_s, slo_tpot_s)["meets"]:
            break
        best = rate
    return best
