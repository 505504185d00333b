"""SLO capacity planning with the simulator (chapter 12).

An SLO here is a pair of tail targets: p99 TTFT <= ``ttft_s`` and p99 TPOT <= ``tpot_s``. With
an engine factory (the real scheduler on the simulator's clock, ``sim_engine``) and a workload
factory (a rate -> the requests), this module answers the operator's three questions:

- ``slo_report``: did a run meet the SLO? (its p99s, and the *attainment*: the share of requests
  whose own TTFT and TPOT met the targets);
- ``max_rate_meeting_slo``: the highest arrival rate one replica serves within the SLO (the
  *goodput* in DistServe's sense: requests per second that meet both targets), by a geometric
  sweep then bisection, every probe a deterministic simulation;
- ``replicas_for``: how many replicas a target rate needs, checked by simulating one replica at
  its share of the load (a random split of a Poisson stream is Poisson);
- ``replay_autoscaling``: a day-shaped, bursty arrival trace replayed on a fleet of simulated
  replicas that an autoscaling policy grows and shrinks (``queue_policy``: from the arrival rate
  and the SLO capacity, plus the queue; ``utilization_policy``: from the busy fraction of the
  replicas), with a start-up delay for new replicas; it reports SLO attainment and
  replica-hours.

Everything is simulated time: deterministic for a seed, and as good as the cost model (the lab
checks the calibrated one against a real run on this machine).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..engine.request import Request, SamplingParams
from ..metrics import percentile


@dataclass(frozen=True)
class SLO:
    """p99 TTFT <= ``ttft_s`` and p99 TPOT <= ``tpot_s`` (seconds)."""

    ttft_s: float
    tpot_s: float

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} debe ser un número de segundos > 0; se recibió {v!r}")

    def met_by(self, r: Request) -> bool:
        """This request's own TTFT and TPOT within the targets (a one-token request has no TPOT)."""
        if r.ttft is None:
            return False
        return r.ttft <= self.ttft_s and (r.tpot is None or r.tpot <= self.tpot_s)


def slo_percentiles(records: Sequence[tuple], slo: SLO) -> dict:
    """p99 TTFT and p99 TPOT of ``(ttft, tpot)`` records (linear interpolation; an unfinished
    request, ``ttft`` None, counts as infinitely late; TPOT over the requests that have one, 0 if
    none) and whether both meet ``slo``."""
    ttft = [math.inf if t is None else t for t, _ in records]
    tpot = [p for _, p in records if p is not None]
    with np.errstate(invalid="ignore"):  # inf - inf between two unfinished requests
        p99_ttft = float(np.percentile(ttft, 99)) if ttft else math.nan
    if ttft and math.isnan(p99_ttft):
        p99_ttft = math.inf
    p99_tpot = percentile(tpot, 99) if tpot else 0.0
    return {"p99_ttft_s": p99_ttft, "p99_tpot_s": p99_tpot,
            "meets": bool(p99_ttft <= slo.ttft_s and p99_tpot <= slo.tpot_s)}


def slo_report(requests: Sequence[Request], slo: SLO) -> dict:
    """p99 TTFT and TPOT of ``requests`` (unfinished ones count as infinitely late), whether they
    meet ``slo``, and the attainment (share of requests that met it on their own)."""
    return {"requests": len(requests), **slo_percentiles([(r.ttft, r.tpot) for r in requests], slo),
            "attainment": sum(slo.met_by(r) for r in requests) / len(requests)}


def max_rate_meeting_slo(run_at: Callable[[float], Sequence[Request]], slo: SLO, low: float,
                         high: float, steps: int = 6, bisections: int = 5) -> dict:
    """The highest rate in ``[low, high]`` whose run (``run_at(rate)`` -> requests) meets
    ``slo``: ``steps`` geometric probes, then ``bisections`` between the last rate that met it and
    the first that did not. Returns ``{"rate", "probes": [{"rate", report...}]}``; ``rate`` is
    None if even ``low`` misses the SLO (and ``high`` if ``high`` meets it)."""
    if not 0 < low < high:
        raise ValueError(f"hace falta 0 < low < high; se recibió low={low}, high={high}")
    probes = []

    def probe(rate: float) -> bool:
        rep = slo_report(run_at(rate), slo)
        probes.append({"rate": rate, **rep})
        return rep["meets"]

    grid = np.geomspace(low, high, steps).tolist()
    good, bad = None, None
    for rate in grid:
        if probe(rate):
            good = rate
        else:
            bad = rate
            break
    if good is not None and bad is not None:
        for _ in range(bisections):
            mid = math.sqrt(good * bad)
            if probe(mid):
                good = mid
            else:
                bad = mid
    return {"rate": good, "first_failing_rate": bad, "probes": sorted(probes, key=lambda p: p["rate"])}


def replicas_for(target_rate: float, per_replica_rate: float | None) -> int | None:
    """Replicas needed to serve ``target_rate`` when one serves ``per_replica_rate`` within the
    SLO (None when one replica cannot meet it at any probed rate)."""
    if per_replica_rate is None or per_replica_rate <= 0:
        return None
    return max(1, math.ceil(target_rate / per_replica_rate - 1e-9))


# --- a fleet of simulated replicas ----------------------------------------------------------------
def day_shaped_rates(hours: int, peak_rate: float, trough_fraction: float = 0.2,
                     bursts: Sequence[tuple[float, float, float]] = ()) -> Callable[[float], float]:
    """An arrival rate over a compressed day of ``hours`` units: a cosine between
    ``trough_fraction * peak_rate`` (at 0) and ``peak_rate`` (at the middle), plus ``bursts``
    ``(start, end, extra_rate)``. Returns rate(t)."""
    def rate(t: float) -> float:
        base = trough_fraction + (1 - trough_fraction) * 0.5 * (1 - math.cos(2 * math.pi * t / hours))
        return peak_rate * base + sum(extra for s, e, extra in bursts if s <= t < e)
    return rate


def inhomogeneous_poisson(rate: Callable[[float], float], max_rate: float, duration: float,
                          seed: int) -> list[float]:
    """Arrival times of a Poisson process of intensity ``rate(t)`` <= ``max_rate`` over
    ``[0, duration)``, by thinning (Lewis and Shedler): seeded."""
    rng = np.random.default_rng(seed)
    t, out = 0.0, []
    while True:
        t += rng.exponential(1.0 / max_rate)
        if t >= duration:
            return out
        if rng.random() * max_rate <= rate(t):
            out.append(t)


@dataclass
class Replica:
    engine: object
    ready_at: float
    draining: bool = False
    retired_at: float | None = None
    busy_s: float = 0.0  # simulated seconds spent running steps

    def advance(self, t: float) -> None:
        """Run steps until the replica's clock reaches ``t`` or nothing is left to run."""
        e = self.engine
        while e.has_unfinished_requests() and e.now() < t:
            before = e.now()
            e.step(outputs=False)
            self.busy_s += e.now() - before
        if e.now() < t:
            e.executor.idle_until(t)

    def drain(self) -> None:
        """Run until every request in it has finished."""
        e = self.engine
        while e.has_unfinished_requests():
            before = e.now()
            e.step(outputs=False)
            self.busy_s += e.now() - before

    @property
    def load(self) -> int:
        return self.engine.num_running + self.engine.num_waiting


@dataclass
class Observation:
    """What an autoscaling policy sees at a decision: the time, the replicas serving (and
    starting), the arrival rate and the busy fraction over the last window, the queue."""

    t: float
    serving: int
    starting: int
    arrival_rate: float
    busy_fraction: float
    waiting: int


def queue_policy(per_replica_rate: float, headroom: float = 1.0, queue_per_replica: int = 8):
    """SLO/queue-driven: enough replicas for the last window's arrival rate at the SLO capacity
    ``per_replica_rate`` (times ``headroom``), one more while the queue is long."""
    def decide(obs: Observation) -> int:
        need = math.ceil(obs.arrival_rate * headroom / per_replica_rate - 1e-9)
        if obs.waiting > queue_per_replica * max(1, obs.serving):
            need = max(need, obs.serving + obs.starting + 1)
        return max(1, need)
    return decide


def utilization_policy(target: float = 0.7, low: float = 0.3):
    """Utilization-driven (as a CPU autoscaler): scale up by the ratio busy / ``target`` when the
    replicas are busier than ``target``, down by one when less busy than ``low``."""
    def decide(obs: Observation) -> int:
        n = obs.serving + obs.starting
        if obs.busy_fraction > target:
            return max(n, math.ceil(obs.serving * obs.busy_fraction / target))
        if obs.busy_fraction < low:
            return max(1, n - 1)
        return n
    return decide


@dataclass
class AutoscaleRun:
    requests: list[Request]
    replica_hours: float
    timeline: list[dict] = field(default_factory=list)


def replay_autoscaling(make_engine: Callable[[], object], arrivals: Sequence[float],
                       make_request: Callable[[int], tuple[list[int], SamplingParams]],
                       decide: Callable[[Observation], int], duration: float, interval: float,
                       startup_s: float, initial: int = 1, max_replicas: int = 64,
                       hour_s: float = 3600.0) -> AutoscaleRun:
    """Replay ``arrivals`` (seconds) on a fleet of replicas (``make_engine()``: a fresh simulated
    engine). Each request goes to the serving replica with the fewest requests in it. Every
    ``interval`` s the policy ``decide(Observation)`` names the replicas wanted: new ones serve
    after ``startup_s``; surplus ones stop receiving requests and retire once drained (the
    newest first). ``replica_hours``: the integral of started-not-retired replicas, in units of
    ``hour_s`` seconds."""
    fleet = [Replica(make_engine(), 0.0) for _ in range(initial)]
    for r in fleet:
        r.engine.executor.idle_until(0.0)
    requests: list[Request] = []
    timeline = []
    k, t_next = 0, interval
    window_arrivals, t = 0, 0.0
    started = {id(r): 0.0 for r in fleet}

    def alive() -> list[Replica]:
        return [r for r in fleet if r.retired_at is None]

    def advance_all(now: float) -> None:
        for r in alive():
            r.advance(now)
            if r.draining and not r.engine.has_unfinished_requests():
                r.retired_at = max(now, r.engine.now())

    busy_before = 0.0
    while t_next <= duration + 1e-9 or k < len(arrivals):
        t_arr = arrivals[k] if k < len(arrivals) else math.inf
        if t_arr < t_next:
            t = t_arr
            advance_all(t)
            serving = [r for r in alive() if not r.draining and r.ready_at <= t] or \
                [r for r in alive() if not r.draining]
            target = min(serving, key=lambda r: r.load)
            prompt, params = make_request(k)
            requests.append(target.engine.add_request(prompt, params, arrival_time=t))
            window_arrivals += 1
            k += 1
            continue
        t = t_next
        advance_all(t)
        live = alive()
        serving = [r for r in live if not r.draining and r.ready_at <= t]
        starting = [r for r in live if not r.draining and r.ready_at > t]
        busy = sum(r.busy_s for r in fleet)
        obs = Observation(t, len(serving), len(starting), window_arrivals / interval,
                          min(1.0, (busy - busy_before) / (interval * max(1, len(serving)))),
                          sum(r.engine.num_waiting for r in serving))
        busy_before, window_arrivals = busy, 0
        want = max(1, min(max_replicas, int(decide(obs))))
        have = len(serving) + len(starting)
        for _ in range(want - have):
            rep = Replica(make_engine(), t + startup_s)
            rep.engine.executor.idle_until(t)
            fleet.append(rep)
            started[id(rep)] = t
        for rep in sorted(serving + starting, key=lambda r: -started[id(r)])[:max(0, have - want)]:
            rep.draining = True
        timeline.append({"t": t, "wanted": want, "serving": len(serving), "starting": len(starting),
                         "arrival_rate": obs.arrival_rate, "busy_fraction": obs.busy_fraction,
                         "waiting": obs.waiting})
        t_next += interval
        if t_next > duration + 1e-9 and k >= len(arrivals):
            break
    end = t
    for r in alive():
        r.drain()
        end = max(end, r.engine.now())
    seconds = sum(((r.retired_at if r.retired_at is not None else end) - started[id(r)])
                  for r in fleet)
    return AutoscaleRun(requests, seconds / hour_s, timeline)


__all__ = ["AutoscaleRun", "Observation", "Replica", "SLO", "day_shaped_rates",
           "inhomogeneous_poisson", "max_rate_meeting_slo", "queue_policy", "replay_autoscaling",
           "replicas_for", "slo_report", "utilization_policy"]


# --- one replica of a datasheet GPU, realistic lengths --------------------------------------------
def simulated_goodput(device: str, model: str, slo: SLO, target_rate: float, *, seed: int,
                      trace: str, trace_scale: float, max_model_len: int, max_num_seqs: int,
                      min_requests: int, max_requests: int, min_seconds: float, low: float,
                      high: float, steps: int, bisections: int, keep_records: bool = False) -> dict:
    """The highest rate one simulated replica (``device``'s datasheet roofline, ``model``'s
    preset) serves within ``slo`` with ``trace``'s lengths, and the replicas ``target_rate``
    needs. Each probe lasts at least ``min_requests`` requests and ``min_seconds`` simulated
    seconds (at most ``max_requests``), so that the queue reaches its steady state.
    ``keep_records``: each probe also keeps its requests' ``(ttft, tpot)``."""
    from ..hardware import get_device_spec
    from ..loadgen.realistic import realistic_workload
    from ..model import get_preset
    from .cost_model import RooflineCostModel
    from .executor import sim_engine

    gpu, big = get_device_spec(device), get_preset(model)
    dtype = "bf16" if "bf16" in gpu.peak_flops else "fp16"
    cost = RooflineCostModel.from_device_spec(gpu, dtype)
    records = {}

    def run_at(rate: float):
        n = min(max_requests, max(min_requests, math.ceil(rate * min_seconds)))
        items = realistic_workload(n, rate, big.vocab_size, seed, trace, trace_scale, max_model_len)
        reqs = sim_engine(big, cost, max_num_seqs, max_model_len, dtype=dtype).run(items)
        if keep_records:
            records[rate] = [(r.ttft, r.tpot) for r in reqs]
        return reqs

    res = max_rate_meeting_slo(run_at, slo, low, high, steps=steps, bisections=bisections)
    out = {"device": device, "goodput_rate": res["rate"], "first_failing_rate": res["first_failing_rate"],
           "probes": res["probes"], "target_rate": target_rate,
           "replicas": replicas_for(target_rate, res["rate"])}
    if keep_records:
        out["records"] = records
    return out


def capacity_study(params: dict, seed: int, device: str | None = None,
                   keep_records: bool = False) -> dict:
    """:func:`simulated_goodput` with the operations lab's parameters (``dc_device``,
    ``dc_model``, ``slo_ttft_s``, ``slo_tpot_s``, ``target_rate``, ``trace``, ``trace_scale``,
    ``dc_max_model_len``, ``capacity_max_num_seqs``, ``capacity_requests``,
    ``capacity_max_requests``, ``capacity_seconds``, ``rate_low``, ``rate_high``, ``rate_steps``,
    ``rate_bisections``) for the lab seed ``seed``; ``device`` replaces ``dc_device``."""
    return simulated_goodput(
        device or params["dc_device"], params["dc_model"],
        SLO(params["slo_ttft_s"], params["slo_tpot_s"]), params["target_rate"],
        seed=seed + 3, trace=params["trace"], trace_scale=params["trace_scale"],
        max_model_len=params["dc_max_model_len"], max_num_seqs=params["capacity_max_num_seqs"],
        min_requests=params["capacity_requests"], max_requests=params["capacity_max_requests"],
        min_seconds=params["capacity_seconds"], low=params["rate_low"], high=params["rate_high"],
        steps=params["rate_steps"], bisections=params["rate_bisections"], keep_records=keep_records)
