"""Lab ``operations`` (chapter 12): operating the service.

1. :func:`fairness_study`: a polite tenant and a flooder sending ``flood_factor`` times its rate,
   in the simulator at datacenter scale (the engine's own scheduler, a datasheet GPU), under the
   three scheduling policies (``fcfs``; ``priority`` with the polite tenant first; ``vtc``) and
   under FCFS with the flooder limited at the door by a token bucket (429s). For each of
   ``fair_seeds`` workloads: the polite tenant's p99 TTFT (the verdict: within the SLO's TTFT; the
   ratio to its p99 alone is reported), and the largest service gap between the two tenants while
   both were backlogged, against VTC's bound. Deterministic for a seed. The notebook plugs the
   student's VTC admission rule (``pick_fn``) and token bucket (``bucket_fn``) in here.
2. :func:`benchmark_study`: chapter 6's load test rerun the honest way: the same arrivals and the
   same mean lengths (the same offered tokens/s) with uniform lengths and with the lengths of a
   production trace (``loadgen.realistic``); p99 TTFT and TPOT of each, per seed. The verdict is
   ``claims.compare`` paired by seed: the order-statistic interval of the median of the per-seed
   ratios, with its exact coverage (five seeds: their min-max range, 93,75 %; fewer decide
   nothing).
3. ``capacity_study`` (from ``sim.capacity``): the highest rate one replica serves within the SLO
   (p99 TTFT and TPOT), and the replicas a target rate needs.
4. :func:`autoscaling_study`: a compressed day with a burst, replayed on a fleet whose size an
   SLO/queue-driven and a utilisation-driven policy decide: SLO attainment and replica-hours.
5. :func:`calibration_check`: the simulator calibrated on this machine (chapter 3's method: the
   cost model fitted to a real run's steps) predicts a second real run it never saw.

:class:`Findings` holds the numbers and the claims; :func:`report` makes the contract's body.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from .. import claims
from ..engine import KVCacheManager, build_engine
from ..engine.scheduling_policy import VTCPolicy, vtc_bound
from ..fairness import max_service_gap, tagged
from ..fmt import es
from ..hardware import get_device_spec, measure_bandwidth
from ..loadgen.realistic import TRACES, flood_mix, realistic_workload, uniform_workload
from ..metrics import percentile
from ..model import get_preset, load_model
from ..reference.operations import reference_bucket_waits
from ..sim import RooflineCostModel, fit_cost_model, sim_engine, step_cost
from ..sim.capacity import (SLO, capacity_study, day_shaped_rates, inhomogeneous_poisson,
                            queue_policy, replay_autoscaling, slo_report,
                            utilization_policy)
from ..timing import torch_threads
from .common import MODEL_DTYPE_PARAM, SERVED_MODELS, served_dtype
from .contract import datasheet_sim_limitation, evidence as _ev, threads_limitation
from .registry import LabParamError, LabSpec, Param

POLICIES = ("fcfs", "priority", "vtc")


# --- the simulated datacenter -------------------------------------------------------------------
def dc_setup(params: dict) -> tuple:
    """The simulated GPU's cost model, the model's config and its dtype."""
    gpu = get_device_spec(params["dc_device"])
    big = get_preset(params["dc_model"])
    dtype = "bf16" if "bf16" in gpu.peak_flops else "fp16"
    return RooflineCostModel.from_device_spec(gpu, dtype), big, dtype


def dc_engine(params: dict, policy: str = "fcfs", max_num_seqs: int | None = None):
    cost, big, dtype = dc_setup(params)
    return sim_engine(big, cost, max_num_seqs or params["dc_max_num_seqs"],
                      params["dc_max_model_len"], dtype=dtype, scheduling_policy=policy)


def p99(values) -> float:
    return percentile([v for v in values if v is not None], 99)


# --- 1. fairness ----------------------------------------------------------------------------------
def fairness_study(params: dict, seed: int, pick_fn=None, bucket_fn=None) -> list[dict]:
    """Per workload seed: the polite tenant's p99 TTFT alone and under each policy, and the
    largest service gap while both tenants were backlogged (VTC's cost: prompt x 1 + output x 2).
    ``pick_fn(counters, backlogged) -> tenant``: VTC's admission rule (default the library's).
    Also FCFS with the flooder limited at the door (``fcfs_limited``): a token bucket of
    ``limit_burst`` requests refilled at ``limit_factor`` times the polite rate answers 429 to
    what exceeds it; ``bucket_fn(times, costs, rate, capacity) -> waits`` decides (default the
    reference)."""
    _, big, _ = dc_setup(params)
    bucket_fn = bucket_fn or reference_bucket_waits
    vtc = "vtc" if pick_fn is None else (lambda: VTCPolicy(pick_fn=pick_fn))
    rows = []
    for k in range(params["fair_seeds"]):
        mix = flood_mix(params["polite_requests"], params["polite_rate"], params["flood_factor"],
                        big.vocab_size, seed + 100 * k, params["trace"], params["trace_scale"],
                        params["dc_max_model_len"])
        # vLLM's priority: the polite tenant's requests first (0), the flooder's after (1)
        mix = [w._replace(tags={**w.tags, "priority": 0 if w.tags["tenant"] == "polite" else 1})
               for w in mix]
        tenants = [w.tags["tenant"] for w in mix]
        polite = [w for w in mix if w.tags["tenant"] == "polite"]
        solo = p99(r.ttft for r in dc_engine(params).run(polite))
        row = {"seed": seed + 100 * k, "solo_p99_ttft_s": solo, "requests": len(mix),
               "max_prompt": max(len(w.prompt_token_ids) for w in mix)}
        for policy in POLICIES:
            engine = dc_engine(params, vtc if policy == "vtc" else policy)
            reqs = engine.run(mix)
            mine = [r for r, t in zip(reqs, tenants) if t == "polite"]
            row[policy] = {"polite_p99_ttft_s": p99(r.ttft for r in mine),
                           "flood_p99_ttft_s": p99(r.ttft for r, t in zip(reqs, tenants) if t == "flood"),
                           "service_gap": max_service_gap(engine.history, tagged(reqs, tenants))}
            row["kv_capacity_tokens"] = engine.scheduler.kv.capacity_tokens
        row["bound"] = vtc_bound(row["max_prompt"], row["kv_capacity_tokens"])
        flood = [w for w in mix if w.tags["tenant"] == "flood"]
        waits = [float(x) for x in bucket_fn([w.arrival_time for w in flood], [1.0] * len(flood),
                                             params["limit_factor"] * params["polite_rate"],
                                             float(params["limit_burst"]))]
        refused = {id(w) for w, x in zip(flood, waits) if x > 0}
        kept = [w for w in mix if id(w) not in refused]
        reqs = dc_engine(params).run(kept)
        row["fcfs_limited"] = {
            "polite_p99_ttft_s": p99(r.ttft for r, w in zip(reqs, kept) if w.tags["tenant"] == "polite"),
            "refused": len(refused), "flood_requests": len(flood),
            "max_retry_after_s": max(waits, default=0.0)}
        rows.append(row)
    return rows


# --- 2. uniform vs realistic ----------------------------------------------------------------------
def benchmark_study(params: dict, seed: int) -> list[dict]:
    """Per seed: p99 TTFT/TPOT of the realistic workload and of its uniform twin (same arrivals,
    same mean lengths)."""
    _, big, _ = dc_setup(params)
    rows = []
    for k in range(params["bench_seeds"]):
        real = realistic_workload(params["bench_requests"], params["bench_rate"], big.vocab_size,
                                  seed + 7 + k, params["trace"], params["trace_scale"],
                                  params["dc_max_model_len"])
        uni = uniform_workload(real, big.vocab_size, seed + 7 + k)
        row = {"seed": seed + 7 + k,
               "uniform_prompt": len(uni[0].prompt_token_ids), "uniform_output": uni[0].params.max_tokens}
        for name, items in (("realistic", real), ("uniform", uni)):
            reqs = dc_engine(params).run(items)
            row[name] = {"p99_ttft_s": p99(r.ttft for r in reqs), "p99_tpot_s": p99(r.tpot for r in reqs),
                         "p50_ttft_s": percentile([r.ttft for r in reqs], 50),
                         "offered_tokens": sum(len(w.prompt_token_ids) + w.params.max_tokens
                                               for w in items)}
        rows.append(row)
    return rows


# --- 3. capacity: ``capacity_study`` (sim.capacity) -----------------------------------------------
def slo_of(params: dict) -> SLO:
    return SLO(params["slo_ttft_s"], params["slo_tpot_s"])


# --- 4. autoscaling -------------------------------------------------------------------------------
def autoscaling_study(params: dict, seed: int, per_replica_rate: float) -> dict:
    """A compressed day (``day_hours`` units of ``hour_s`` simulated seconds) whose peak needs
    ``day_peak_replicas`` replicas at the SLO capacity ``per_replica_rate``, with a burst of as
    much again for one hour at two thirds of the day, on a fleet scaled by each policy; SLO
    attainment and replica-hours."""
    _, big, _ = dc_setup(params)
    hours, trough = params["day_hours"], params["day_trough_fraction"]
    peak = params["day_peak_replicas"] * per_replica_rate  # the peak needs that many replicas
    # one "hour" lasts what makes the day about ``day_requests`` requests long (the mean of the
    # cosine day is the midpoint of trough and peak; the burst adds one hour of peak)
    mean_rate = peak * (trough + 1) / 2 + peak / hours
    hour_s = params["day_requests"] / (mean_rate * hours)
    burst = (2 * hours / 3 * hour_s, (2 * hours / 3 + 1) * hour_s, peak)
    rate = day_shaped_rates(hours * hour_s, peak, trough, [burst])
    arrivals = inhomogeneous_poisson(rate, 2 * peak, hours * hour_s, seed + 11)
    prompt, output = zip(*[(len(w.prompt_token_ids), w.params.max_tokens) for w in realistic_workload(
        len(arrivals), 1.0, big.vocab_size, seed + 11, params["trace"], params["trace_scale"],
        params["dc_max_model_len"])])
    rng = np.random.default_rng(seed + 12)
    from ..engine import SamplingParams

    def make_request(k: int):
        return (rng.integers(3, big.vocab_size, prompt[k]).tolist(),
                SamplingParams(max_tokens=int(output[k]), ignore_eos=True))

    out = {"arrivals": len(arrivals), "peak_rate": peak, "burst": list(burst), "hour_s": hour_s,
           "per_replica_rate": per_replica_rate, "policies": {}}
    decide = {"slo_queue": queue_policy(per_replica_rate, headroom=params["queue_headroom"]),
              "utilization": utilization_policy(params["util_target"], params["util_low"])}
    for name, policy in decide.items():
        run = replay_autoscaling(lambda: dc_engine(params, max_num_seqs=params["capacity_max_num_seqs"]),
                                 arrivals, make_request, policy, duration=hours * hour_s,
                                 interval=params["scale_interval_h"] * hour_s,
                                 startup_s=params["startup_h"] * hour_s,
                                 initial=1, hour_s=hour_s)
        rep = slo_report(run.requests, slo_of(params))
        out["policies"][name] = {"attainment": rep["attainment"], "p99_ttft_s": rep["p99_ttft_s"],
                                 "p99_tpot_s": rep["p99_tpot_s"], "replica_hours": run.replica_hours,
                                 "max_replicas": max(r["wanted"] for r in run.timeline),
                                 "wanted": [r["wanted"] for r in run.timeline]}
    return out


# --- 5. the calibrated simulator against a real run ---------------------------------------------
def calibration_check(model, params: dict, seed: int, device) -> dict:
    """Fit the cost model to a real run of a realistic workload (every request at t = 0), then
    predict a second real run (open loop, other seed) that the fit never saw: the busy time of
    its steps (the fitted model on the same steps) and its p50 TTFT (a full simulation of the
    workload, whose schedule may differ: the real one followed the wall clock)."""
    config = model.config
    L, width = params["max_model_len"], params["max_num_seqs"]
    dtype = "fp32" if next(model.parameters()).dtype == torch.float32 else "bf16"

    def real(items):
        engine = build_engine(model, max_num_seqs=width, max_model_len=L)
        with torch_threads(params["torch_threads"]):
            reqs = engine.run(items)
        return reqs, engine.history

    def workload(seed_, rate):
        items = realistic_workload(params["calib_requests"], rate, config.vocab_size, seed_,
                                   params["trace"], params["calib_scale"], L)
        return items

    calib_items = [w._replace(arrival_time=0.0) for w in workload(seed + 21, 1.0)]
    real(calib_items[:2])  # warm-up, discarded
    _, history = real(calib_items)
    bw = measure_bandwidth(device, kind="read", repeats=2, progress=False)
    costs = [step_cost(config, h.query_lens, h.context_lens, dtype) for h in history]
    fitted = fit_cost_model(costs, [h.duration for h in history], bw.max * 1e9,
                            name="calibrado en esta máquina", errors="absolute")
    valid = workload(seed + 22, params["calib_rate"])
    reqs, vhist = real(valid)
    sim = sim_engine(config, fitted, width, L, dtype=dtype)
    sreqs = sim.run(valid)
    # the cost model on the real run's own steps (its schedule followed the wall clock)
    measured_busy = float(sum(h.duration for h in vhist))
    sim_busy = float(sum(fitted.step_time_s(step_cost(config, h.query_lens, h.context_lens, dtype))
                         for h in vhist))
    return {"bandwidth_gbps": bw.max, "calibration_steps": len(history),
            "fitted": {"peak_flops": fitted.peak_flops, "overhead_s": fitted.overhead_s,
                       "overhead_per_seq_s": fitted.overhead_per_seq_s},
            "validation_requests": len(valid),
            "measured_busy_s": measured_busy, "simulated_busy_s": sim_busy,
            "busy_error": (sim_busy - measured_busy) / measured_busy,
            "measured_p50_ttft_s": percentile([r.ttft for r in reqs], 50),
            "simulated_p50_ttft_s": percentile([r.ttft for r in sreqs], 50),
            "real_steps": len(vhist), "simulated_steps": len(sim.history)}


# --- findings and claims --------------------------------------------------------------------------
@dataclass(frozen=True)
class Findings:
    """What the lab measured and simulated; ``found``: the claims drawn from it."""

    params: dict
    model_name: str
    fairness: list[dict]
    bench: list[dict]
    capacity: dict
    autoscaling: dict
    calibration: dict

    @cached_property
    def found(self) -> dict:
        return verdicts(self)

    def worst_p99(self, policy: str) -> float:
        return max(r[policy]["polite_p99_ttft_s"] for r in self.fairness)

    def worst_ratio(self, policy: str) -> float:
        return max(r[policy]["polite_p99_ttft_s"] / r["solo_p99_ttft_s"] for r in self.fairness)

    @property
    def autoscaling_cost_ratio(self) -> float:
        a = self.autoscaling["policies"]
        return a["utilization"]["replica_hours"] / a["slo_queue"]["replica_hours"]

    def worst_gap_share(self) -> float:
        return max(r["vtc"]["service_gap"] / r["bound"] for r in self.fairness)


POLICY_ES = {"fcfs": "FCFS", "priority": "prioridad", "vtc": "VTC"}


def verdicts(f: Findings) -> dict:
    p = f.params
    n = len(f.fairness)
    out = {}
    refused = sum(r["fcfs_limited"]["refused"] for r in f.fairness)
    offered = sum(r["fcfs_limited"]["flood_requests"] for r in f.fairness)
    how = {policy: f"Con {POLICY_ES[policy]} y un inundador a {es(p['flood_factor'], 0)} veces su ritmo"
           for policy in POLICIES}
    how["fcfs_limited"] = (f"Con FCFS y el inundador limitado a la entrada por un cubo de fichas "
                           f"({es(p['limit_factor'], 1)} veces el ritmo del educado, ráfaga de "
                           f"{p['limit_burst']}; {refused} de sus {offered} peticiones reciben un 429)")
    for policy in (*POLICIES, "fcfs_limited"):
        # the criterion is the service's own: the polite tenant keeps its p99 TTFT SLO
        out[f"ttft_{policy}"] = claims.threshold(
            f.worst_p99(policy), p["slo_ttft_s"], scale=1000, unit="ms", decimals=0,
            what=(f"{how[policy]}, p99 del TTFT del inquilino educado (el peor de {n} cargas; "
                  f"{es(f.worst_ratio(policy), 1)} veces el suyo a solas) frente al SLO"),
            passed=("el límite a la entrada le mantiene el SLO aun con FCFS"
                    if policy == "fcfs_limited" else "la política le mantiene el SLO"),
            failed=("el límite a la entrada no basta: lo admitido le rompe el SLO"
                    if policy == "fcfs_limited" else
                    "la política no lo protege: el inundador le rompe el SLO"))
    out["gap"] = claims.threshold(
        f.worst_gap_share(), 1.0, scale=100, unit="%", decimals=1,
        what=(f"Con VTC, mayor diferencia de servicio entre los dos inquilinos mientras ambos "
              f"esperaban, respecto de la cota 2·U del artículo (el peor de {n} cargas)"),
        passed="la diferencia medida respeta la cota", failed="la diferencia medida supera la cota")
    out["fcfs_gap"] = claims.threshold(
        max(r["fcfs"]["service_gap"] / r["bound"] for r in f.fairness), 1.0, scale=100, unit="%",
        decimals=1, what="Con FCFS, la misma diferencia de servicio respecto de la misma cota",
        passed="FCFS también la respeta con esta carga",
        failed="FCFS no tiene cota: el inundador se lleva el servicio")
    for metric, label in (("p99_ttft_s", "TTFT"), ("p99_tpot_s", "TPOT")):
        # paired by seed (the same arrivals and offered tokens): the order-statistic interval of
        # the median of the per-seed ratios, whose coverage is exact (5 seeds: min-max, 93,75 %)
        out[f"bench_{metric}"] = claims.compare(
            [r["realistic"][metric] for r in f.bench], [r["uniform"][metric] for r in f.bench],
            what=(f"cola del {label} (p99) con las longitudes de la traza / con longitudes "
                  f"uniformes de la misma media y las mismas llegadas"),
            higher=f"el benchmark uniforme subestima la cola del {label}",
            lower=f"aquí el benchmark uniforme da más cola del {label} que la traza",
            inconclusive=(f"el intervalo contiene el 1: de una semilla a otra no se distingue "
                          f"la cola del {label} de los dos benchmarks"),
            pairs="pares de cargas con la misma semilla")
    target = p["slo_attainment"]
    for name, row in f.autoscaling["policies"].items():
        out[f"autoscale_{name}"] = claims.threshold(
            row["attainment"], target, below=False, scale=100, unit="%", decimals=1,
            what=(f"peticiones que cumplen el SLO con el autoescalado "
                  f"{'por cola y SLO' if name == 'slo_queue' else 'por utilización'} "
                  f"({es(row['replica_hours'], 1)} réplicas-hora)"),
            passed="cumple el objetivo de cumplimiento", failed="no cumple el objetivo de cumplimiento")
    c = f.calibration
    out["calibration"] = claims.threshold(
        abs(c["busy_error"]), p["calib_error_limit"], scale=100, unit="%", decimals=1,
        what=("Error del simulador calibrado al predecir el tiempo de cómputo de una ejecución real "
              "que no vio"),
        passed="el simulador calibrado reproduce esta máquina dentro del criterio",
        failed="el simulador calibrado no reproduce esta máquina dentro del criterio")
    return out


def _results(f: Findings) -> dict:
    cap = dict(f.capacity)
    return {"fairness": f.fairness, "benchmark": f.bench, "capacity": cap,
            "autoscaling": f.autoscaling, "calibration": f.calibration,
            "trace": {"name": f.params["trace"], "source": TRACES[f.params["trace"]].source,
                      "scale": f.params["trace_scale"]}}


def capacity_sentence(f: Findings) -> str:
    c, p = f.capacity, f.params
    slo = f"p99 del TTFT ≤ {es(p['slo_ttft_s'], 2)} s y p99 del TPOT ≤ {es(1000 * p['slo_tpot_s'], 0)} ms"
    if c["goodput_rate"] is None:
        return (f"En el simulador ({p['dc_model']} en {p['dc_device']}), ni a "
                f"{es(p['rate_low'], 1)} peticiones/s una réplica cumple {slo}.")
    upto = "hasta" if c["first_failing_rate"] is not None else "al menos hasta (el mayor ritmo sondeado)"
    n = c["replicas"]
    return (f"En el simulador ({p['dc_model']} en {p['dc_device']}, longitudes de la traza), una "
            f"réplica cumple {slo} {upto} {es(c['goodput_rate'], 1)} peticiones/s (el goodput); "
            f"para {es(c['target_rate'], 0)} peticiones/s hacen falta {n} "
            f"{'réplica' if n == 1 else 'réplicas'}.")


def autoscaling_sentence(f: Findings) -> str:
    a = f.autoscaling["policies"]
    q, u = a["slo_queue"], a["utilization"]
    return (f"En el día comprimido ({f.autoscaling['arrivals']} peticiones, pico de "
            f"{es(f.autoscaling['peak_rate'], 0)} peticiones/s), el autoescalado por utilización usa "
            f"{es(u['replica_hours'], 1)} réplicas-hora (hasta {u['max_replicas']} réplicas) y el "
            f"de cola y SLO {es(q['replica_hours'], 1)} (hasta {q['max_replicas']}): "
            f"{es(f.autoscaling_cost_ratio, 1)} veces; la utilización de un servidor con batching "
            "continuo está cerca del 100 % en cuanto tiene una petición, así que no mide cuánta "
            "capacidad sobra.")


def _evidence(f: Findings) -> list[dict]:
    fd = f.found
    items = [fd[f"ttft_{p}"].evidence("veces", source="computed", volatile=False)
             for p in (*POLICIES, "fcfs_limited")]
    items += [fd["gap"].evidence("%", source="computed", volatile=False),
              fd["fcfs_gap"].evidence("%", source="computed", volatile=False),
              fd["bench_p99_ttft_s"].evidence("veces", source="computed", volatile=False),
              fd["bench_p99_tpot_s"].evidence("veces", source="computed", volatile=False),
              _ev(capacity_sentence(f), f.capacity["goodput_rate"] or 0.0, "peticiones/s")]
    items += [fd[k].evidence("%", source="computed", volatile=False)
              for k in fd if k.startswith("autoscale_")]
    items.append(_ev(autoscaling_sentence(f), f.autoscaling_cost_ratio, "veces"))
    items.append(fd["calibration"].evidence("%"))
    return items


def _limitations(f: Findings) -> list[str]:
    p = f.params
    scale = p["trace_scale"]
    return [
        datasheet_sim_limitation(),
        (f"Las longitudes siguen los cuantiles de la traza de Azure de 2023 ({p['trace']})"
         + (f", divididas entre {es(scale, 0)} para que el perfil quepa en el tiempo de CI"
            if scale != 1 else "") + "; prompt y salida se sortean por separado (la traza publica "
         "sus marginales, no su dependencia) y las llegadas son de Poisson, no las de la traza."),
        ("La cota de VTC es la del artículo para clientes continuamente en cola; la diferencia "
         "medida cuenta el coste del artículo (prompt x 1, salida x 2), no el tiempo de GPU."),
        ("El autoescalado reproduce un día comprimido con un retardo de arranque fijo y un "
         "enrutado al menos cargado: sin fallos, sin costes de calentamiento de la caché."),
        ("La comprobación del simulador calibrado usa el modelo pequeño en esta máquina compartida: "
         "un único par de ejecuciones, con el ruido de los vecinos."),
        threads_limitation(p.get("torch_threads", 0)),
    ]


def report(f: Findings) -> dict:
    return {"environment": {"model": f.model_name}, "results": _results(f),
            "evidence": _evidence(f), "limitations": _limitations(f),
            "volatile_fields": ["results.calibration"]}


def check_params(params: dict, config) -> None:
    if params["max_model_len"] > config.max_position_embeddings:
        raise LabParamError(f"max_model_len={params['max_model_len']} supera las "
                            f"{config.max_position_embeddings} posiciones de {config.name}")
    if params["rate_low"] >= params["rate_high"]:
        raise LabParamError(f"rate_low ({params['rate_low']}) debe ser menor que rate_high "
                            f"({params['rate_high']})")


def run(seed: int, profile: str, params: dict, device: torch.device) -> dict:
    model = load_model(params["model"], seed, device, dtype=served_dtype(params["model_dtype"], device))
    check_params(params, model.config)
    fairness = fairness_study(params, seed)
    bench = benchmark_study(params, seed)
    capacity = capacity_study(params, seed)
    per_replica = capacity["goodput_rate"] or params["rate_low"]
    autoscaling = autoscaling_study(params, seed, per_replica)
    calibration = calibration_check(model, params, seed, device)
    return report(Findings(params, model.config.name, fairness, bench, capacity, autoscaling,
                           calibration))


SPEC = LabSpec(
    kind="operations",
    title="Operar el servicio",
    chapter=12,
    folder="labs/12-operations",
    ci_budget_s=55,
    run=run,
    params={
        "model": Param("tiny-es", str, "modelo servido en la calibración", choices=SERVED_MODELS),
        "model_dtype": MODEL_DTYPE_PARAM,
        "max_model_len": Param(512, int, "tokens por petición (modelo real)", min=16, max=8192),
        "max_num_seqs": Param(8, int, "ancho del lote (modelo real)", min=1, max=1024),
        "torch_threads": Param(0, int, "hilos de torch en la ejecución real (0: los de torch)",
                               min=0, max=256, by_profile={"ci": 1}),
        "trace": Param("conversation", str, "traza de longitudes", choices=tuple(TRACES)),
        "trace_scale": Param(1.0, float, "divisor de las longitudes de la traza (simulador)",
                             min=1, max=1000, by_profile={"ci": 4.0}),
        "dc_device": Param("h100-sxm", str, "GPU simulada", choices=("h100-sxm", "h200", "a100-80gb", "l4")),
        "dc_model": Param("llama-3.1-8b", str, "modelo simulado",
                          choices=("llama-3.1-8b", "llama-2-7b", "mistral-7b-v0.3")),
        "dc_max_num_seqs": Param(16, int, "ancho del lote simulado (estudio de justicia y "
                                 "benchmark)", min=1, max=4096),
        "dc_max_model_len": Param(8192, int, "tokens por petición simulada", min=16,
                                  max=131_072, by_profile={"ci": 2048}),
        "polite_requests": Param(60, int, "peticiones del inquilino educado", min=2, max=100_000,
                                 by_profile={"ci": 30}),
        "polite_rate": Param(4.0, float, "peticiones/s del inquilino educado", min=0.001,
                             max=1e6, by_profile={"ci": 16.0}),
        "flood_factor": Param(8.0, float, "veces el ritmo del educado que envía el inundador",
                              min=1, max=1000),
        "fair_seeds": Param(5, int, "cargas (semillas) del estudio de justicia", min=1, max=100,
                            by_profile={"ci": 3}),
        "limit_factor": Param(2.0, float, "cubo de fichas del inundador: peticiones/s "
                              "admitidas, en múltiplos del ritmo del educado", min=0.01, max=1e6),
        "limit_burst": Param(8, int, "cubo de fichas del inundador: capacidad (peticiones "
                             "seguidas que admite)", min=1, max=1_000_000),
        "bench_requests": Param(400, int, "peticiones de cada benchmark", min=10, max=100_000,
                                by_profile={"ci": 150}),
        "bench_rate": Param(20.0, float, "peticiones/s del benchmark", min=0.001, max=1e6,
                            by_profile={"ci": 60.0}),
        "bench_seeds": Param(5, int, "semillas del benchmark uniforme frente a realista", min=5,
                             max=100),
        "slo_ttft_s": Param(2.0, float, "SLO: p99 del TTFT (s)", min=1e-6, max=1e6,
                            by_profile={"ci": 0.5}),
        "slo_tpot_s": Param(0.05, float, "SLO: p99 del TPOT (s)", min=1e-6, max=1e6),
        "slo_attainment": Param(0.99, float, "objetivo: fracción de peticiones dentro del SLO",
                                min=0, max=1),
        "capacity_requests": Param(400, int, "peticiones de cada sonda de capacidad", min=10,
                                   max=100_000, by_profile={"ci": 120}),
        "capacity_max_num_seqs": Param(64, int, "ancho del lote de una réplica (capacidad y "
                                       "autoescalado)", min=1, max=4096, by_profile={"ci": 16}),
        "capacity_max_requests": Param(2000, int, "peticiones de una sonda como mucho", min=10,
                                       max=1_000_000, by_profile={"ci": 400}),
        "capacity_seconds": Param(20.0, float, "duración mínima de cada sonda de capacidad (s "
                                  "simulados)", min=0.01, max=1e6, by_profile={"ci": 2.0}),
        "rate_low": Param(1.0, float, "menor ritmo sondeado (peticiones/s)", min=1e-3, max=1e6),
        "rate_high": Param(2048.0, float, "mayor ritmo sondeado", min=1e-3, max=1e6),
        "rate_steps": Param(7, int, "sondas geométricas", min=2, max=100, by_profile={"ci": 5}),
        "rate_bisections": Param(5, int, "bisecciones tras las sondas", min=0, max=50,
                                 by_profile={"ci": 3}),
        "target_rate": Param(200.0, float, "ritmo objetivo de la flota (peticiones/s)", min=1e-3,
                             max=1e9),
        "day_hours": Param(24, int, "horas del día comprimido", min=2, max=24 * 14,
                           by_profile={"ci": 12}),
        "day_requests": Param(3000, int, "peticiones del día comprimido (fija lo que dura una "
                              "hora simulada)", min=10, max=10_000_000, by_profile={"ci": 400}),
        "day_peak_replicas": Param(3.0, float, "réplicas que necesita el pico del día (a la "
                                   "capacidad de una réplica con el SLO)", min=0.01, max=1000),
        "day_trough_fraction": Param(0.15, float, "ritmo de madrugada / pico", min=0, max=1),
        "scale_interval_h": Param(0.25, float, "cada cuánto decide el autoescalador (horas del "
                                  "día comprimido)", min=0.001, max=24),
        "startup_h": Param(0.5, float, "arranque de una réplica nueva (horas del día comprimido)",
                           min=0, max=24),
        "queue_headroom": Param(1.2, float, "autoescalado por cola: réplicas para el ritmo "
                                "observado por este margen", min=1, max=10),
        "util_target": Param(0.7, float, "utilización objetivo del autoescalado por utilización",
                             min=0.01, max=1),
        "util_low": Param(0.3, float, "utilización por debajo de la cual se retira una réplica",
                          min=0, max=1),
        "challenge_device": Param("h200", str, "reto: la GPU que se compara con la H100",
                                  choices=("h200", "a100-80gb", "l4")),
        "challenge_target_rate": Param(250.0, float, "reto: ritmo objetivo de la flota "
                                       "(peticiones/s)", min=1e-3, max=1e9),
        "calib_requests": Param(24, int, "peticiones de cada ejecución real", min=4, max=10_000,
                                by_profile={"ci": 12}),
        "calib_scale": Param(16.0, float, "divisor de las longitudes en el modelo pequeño", min=1,
                             max=1000),
        "calib_rate": Param(8.0, float, "peticiones/s de la ejecución real de validación",
                            min=0.001, max=1e6),
        "calib_error_limit": Param(0.25, float, "criterio: error del simulador calibrado", min=0,
                                   max=10),
    },
)
