"""Lab ``observability`` (chapter 6): a load test of the engine, and what its percentiles can tell.

The course seed's experiment, scaled to the profile, on the in-process target (the real engine
with ``max_num_seqs`` KV rows):

1. **Capacity.** A closed loop of ``max_num_seqs`` clients (each sends its next request the
   moment its previous one ends) keeps every row busy: the completions per second while all
   clients are in flight are the most this server can sustain with this workload.
2. **Rate sweep.** Open-loop Poisson runs at fractions of that capacity, from a third to twice it:
   TTFT p50/p99 against the *realized* rate (the hockey stick), the knee, goodput under an SLO.
3. **Repeated runs** at one rate near capacity: how far the p99 of a short run moves from run to
   run, against the bootstrap interval each run reports about itself.
4. **Closed against open loop at overload**, in interleaved pairs: does the closed loop measure
   the capacity a saturated open loop delivers (the seed found them within 2 %)?
5. **The simulator at H100 scale** (datasheet roofline, an 8B model, the same scheduler): the same
   curves, more repetitions, and long runs cut into blocks to count the requests a p99 needs.

Definitions used throughout (and by the contract):

- *capacity*: completions per second between the first completion and the last request sent in
  the closed loop (all clients in flight); tokens/s = that times ``output_len``;
- *saturated throughput* (either loop): completions per second between the first completion and
  the last admission, while every row is busy (the closed loop's capacity, measured the same way
  on an open loop whose queue never empties);
- *knee*: the lowest realized rate of the sweep whose TTFT p99 exceeds ``knee_factor`` times
  the TTFT p99 of the run with the lowest realized rate (runs ordered by what they offered, not
  by what they were configured to offer);
- *SLO*: TTFT <= ``slo_ttft_factor`` x and TPOT <= ``slo_tpot_factor`` x the medians of the
  lowest rate (a target relative to this machine's own unloaded service);
- *settled*: a long run is cut into blocks of ``n`` consecutive requests (30, 60, 120...);
  ``n`` settles when at least three blocks in four, at that size and at every larger one tried,
  have a TTFT p99 within ``settle_tolerance`` of the whole run's p99.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .. import claims
from ..engine import SamplingParams, build_engine
from ..fmt import es
from ..timing import torch_threads
from ..hardware import get_device_spec
from ..loadgen import open_loop_workload, poisson_arrivals, realized_rate
from ..loadgen.inprocess import run_closed_loop, run_open_loop
from ..metrics import bootstrap_ci, load_test_summary, percentile, summarize
from ..model import get_preset
from ..sim import RooflineCostModel, sim_engine
from .contract import datasheet_sim_limitation, evidence as _ev, timing_limitation
from .common import (GPU_TEXT_MODEL, load_served_model, MODEL_DTYPE_PARAM, served_dtype,
                     ServedModel, TEXT_MODELS)
from .registry import LabParamError, LabSpec, Param

# Streams of seeds: the closed loop, the sweep, the repeats and the long runs draw independent
# arrivals and prompts from one lab seed.
_CLOSED, _SWEEP, _REPEAT, _SETTLE, _PAIRS = range(5)


def run_seed(seed: int, stream: int, k: int = 0) -> int:
    return seed * 10_000 + stream * 1_000 + k


@dataclass
class Run:
    """One open-loop run: its configured rate (req/s), the arrival times it was given (s), and
    the served requests."""

    fraction: float        # of capacity
    rate: float
    seed: int
    arrivals: list[float]
    requests: list

    @property
    def rate_ratio(self) -> float:
        """Realized over configured rate of the arrival schedule (independent of the clock)."""
        return realized_rate(self.arrivals) / self.rate


# --- the load generator against one target ------------------------------------------------------
def real_target(model, max_num_seqs: int, max_model_len: int) -> Callable:
    """A factory of fresh engines on the real model (one per run: a clean clock and history)."""
    return lambda: build_engine(model, max_num_seqs=max_num_seqs, max_model_len=max_model_len)


def sim_target(config, cost_model: RooflineCostModel, max_num_seqs: int, max_model_len: int,
               dtype: str) -> Callable:
    return lambda: sim_engine(config, cost_model, max_num_seqs, max_model_len, "continuous",
                              dtype=dtype)


def _items(n: int, prompt_len: int, output_len: int, vocab_size: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    sp = SamplingParams(max_tokens=output_len, ignore_eos=True)
    return [(rng.integers(3, vocab_size, prompt_len).tolist(), sp) for _ in range(n)]


def warm_up(make_engine: Callable, clients: int, prompt_len: int, output_len: int,
            vocab_size: int) -> None:
    """One closed-loop round, discarded: lazy allocations and first-call costs stay out of the
    measurements."""
    items = _items(clients, prompt_len, min(output_len, 4), vocab_size, 0)
    run_closed_loop(make_engine(), clients, clients, lambda i: items[i])


def saturated_throughput(reqs: list, until: float | None = None) -> float:
    """Completions per second between the first completion and ``until`` (default: the last
    admission, when the last request was scheduled), while the server had no free row; the whole
    run's completions per second when that window holds no completion (a run that never filled
    the server, or too few requests for a full window)."""
    finishes = sorted(r.finish_time for r in reqs)
    if until is None:
        until = max(r.arrival_time if r.first_scheduled_time is None else r.first_scheduled_time
                    for r in reqs)
    in_window = sum(1 for f in finishes if finishes[0] < f <= until)
    if until > finishes[0] and in_window:
        return in_window / (until - finishes[0])
    return float(summarize(reqs)["throughput_req_s"])


def measure_capacity(make_engine: Callable, clients: int, total_requests: int, prompt_len: int,
                     output_len: int, vocab_size: int, seed: int, progress: bool = False
                     ) -> tuple[dict, list]:
    """Closed loop of ``clients``: the capacity summary and the requests."""
    items = _items(total_requests, prompt_len, output_len, vocab_size, run_seed(seed, _CLOSED))
    reqs = run_closed_loop(make_engine(), clients, total_requests, lambda i: items[i], seed=seed,
                           progress=progress, desc=f"bucle cerrado ({clients} clientes)")
    stats = summarize(reqs)
    capacity = saturated_throughput(reqs, until=max(r.arrival_time for r in reqs))  # last send
    mean_e2e = float(np.mean([r.e2e_latency for r in reqs]))
    return {"clients": clients, "requests": len(reqs), "capacity_req_s": capacity,
            "capacity_tok_s": capacity * output_len, "overall_req_s": stats["throughput_req_s"],
            "mean_e2e_s": mean_e2e, "little_req_s": clients / mean_e2e,
            "ttft_p50_s": stats["ttft_p50_s"], "ttft_p99_s": stats["ttft_p99_s"],
            "ttft_s": [float(r.ttft) for r in reqs],
            "tpot_s": [float(r.tpot) for r in reqs if r.tpot is not None]}, reqs


def poisson_run(make_engine: Callable, n: int, rate: float, prompt_len: int, output_len: int,
                vocab_size: int, seed: int, arrivals_fn: Callable = poisson_arrivals,
                fraction: float = float("nan"), progress: bool = False, desc: str = "") -> Run:
    """``n`` requests at ``rate`` req/s from ``arrivals_fn(n, rate, seed)``, served in real time
    (or simulated time) by a fresh engine."""
    items = open_loop_workload(n, rate, prompt_len, output_len, vocab_size, seed,
                               arrivals_fn=arrivals_fn)
    reqs = run_open_loop(make_engine(), items, progress=progress, desc=desc or f"{es(rate, 1)} pet/s")
    return Run(fraction, rate, seed, [i.arrival_time for i in items], reqs)


def capacity_pairs(make_engine: Callable, capacity_req_s: float, fraction: float, pairs: int,
                   clients: int, closed_requests: int, n: int, prompt_len: int, output_len: int,
                   vocab_size: int, seed: int, arrivals_fn: Callable = poisson_arrivals,
                   progress: bool = False) -> dict:
    """``pairs`` interleaved pairs of a closed loop of ``clients`` and an open-loop run of ``n``
    requests at ``fraction`` (> 1) times the capacity, each with its own seed: the saturated
    throughput of each (completions/s), side by side."""
    closed, opened = [], []
    for k in range(pairs):
        _, reqs = measure_capacity(make_engine, clients, closed_requests, prompt_len, output_len,
                                   vocab_size, run_seed(seed, _PAIRS, k), progress)
        closed.append(saturated_throughput(reqs))
        run = poisson_run(make_engine, n, fraction * capacity_req_s, prompt_len, output_len,
                          vocab_size, run_seed(seed, _PAIRS, 500 + k), arrivals_fn, fraction,
                          progress, f"par {k + 1}/{pairs}: {es(fraction, 2)} × capacidad")
        opened.append(saturated_throughput(run.requests))
    return {"fraction": fraction, "closed_req_s": closed, "open_req_s": opened}


def rate_sweep(make_engine: Callable, capacity_req_s: float, fractions: list[float], n: int,
               prompt_len: int, output_len: int, vocab_size: int, seed: int,
               arrivals_fn: Callable = poisson_arrivals, progress: bool = False) -> list[Run]:
    """One Poisson run per fraction of capacity, each with its own seed."""
    return [poisson_run(make_engine, n, f * capacity_req_s, prompt_len, output_len, vocab_size,
                        run_seed(seed, _SWEEP, k), arrivals_fn, f, progress,
                        f"{es(f, 2)} × capacidad")
            for k, f in enumerate(sorted(fractions))]


def repeated_runs(make_engine: Callable, capacity_req_s: float, fraction: float, repeats: int,
                  n: int, prompt_len: int, output_len: int, vocab_size: int, seed: int,
                  arrivals_fn: Callable = poisson_arrivals, progress: bool = False) -> list[Run]:
    """``repeats`` runs at the same configured rate; only the seed (the arrivals and prompts)
    changes."""
    return [poisson_run(make_engine, n, fraction * capacity_req_s, prompt_len, output_len,
                        vocab_size, run_seed(seed, _REPEAT, k), arrivals_fn, fraction, progress,
                        f"repetición {k + 1}/{repeats}")
            for k in range(repeats)]


# --- analysis ------------------------------------------------------------------------------------
def run_rows(runs: list[Run], ttft_slo_s: float | None = None, tpot_slo_s: float | None = None,
             percentile_fn: Callable = percentile, ci_fn: Callable = bootstrap_ci,
             n_boot: int = 1000) -> list[dict]:
    """One report row per run (``metrics.load_test_summary``) with its configured rate."""
    return [{"fraction": r.fraction, "configured_rate": r.rate, "seed": r.seed,
             "rate_ratio": r.rate_ratio,
             **load_test_summary(r.requests, ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s,
                                 percentile_fn=percentile_fn, ci_fn=ci_fn, n_boot=n_boot, seed=r.seed)}
            for r in runs]


def low_load_slo(low: dict, ttft_factor: float, tpot_factor: float) -> dict:
    """The SLO relative to the unloaded service: multiples of the lowest rate's medians."""
    return {"ttft_slo_s": ttft_factor * low["ttft_p50_s"], "tpot_slo_s": tpot_factor * low["tpot_p50_s"],
            "ttft_factor": ttft_factor, "tpot_factor": tpot_factor}


def find_knee(rows: list[dict], factor: float) -> dict | None:
    """The first row, by realized rate, whose TTFT p99 exceeds ``factor`` times the first row's;
    None if no row does."""
    rows = sorted(rows, key=lambda r: r["realized_rate"])
    base = rows[0]["ttft_p99_s"]
    for r in rows[1:]:
        if r["ttft_p99_s"] > factor * base:
            return {"fraction": r["fraction"], "configured_rate": r["configured_rate"],
                    "realized_rate": r["realized_rate"], "ttft_p99_s": r["ttft_p99_s"],
                    "low_load_ttft_p99_s": base, "factor": factor}
    return None


def spread(rows: list[dict]) -> dict:
    """How far TTFT p99 moved across repeated runs, and how often one run's bootstrap interval
    held another run's p99."""
    p99 = [r["ttft_p99_s"] for r in rows]
    ci = [r["ttft_p99_ci_s"] for r in rows]
    pairs = [(i, j) for i in range(len(rows)) for j in range(len(rows)) if i != j]
    held = sum(ci[i][0] <= p99[j] <= ci[i][1] for i, j in pairs)
    return {"ttft_p99_min_s": min(p99), "ttft_p99_max_s": max(p99),
            "ratio": max(p99) / min(p99) if min(p99) > 0 else float("nan"),
            "ci_width_min_s": min(h - lo for lo, h in ci), "ci_width_max_s": max(h - lo for lo, h in ci),
            "realized_rate_min": min(r["realized_rate"] for r in rows),
            "realized_rate_max": max(r["realized_rate"] for r in rows),
            "cross_coverage": held / len(pairs) if pairs else float("nan")}


SETTLE_SHARE = 0.75  # blocks within tolerance for a block size to count as settled


def settle(run: Run, tolerance: float, smallest_block: int = 30, min_blocks: int = 4,
           percentile_fn: Callable = percentile) -> dict:
    """Cut a long run (in arrival order) into blocks of 30, 60, 120... requests (while there are
    at least ``min_blocks``), and compare each block's TTFT p99 with the whole run's: the share
    of blocks within ``tolerance``, and the smallest block size from which that share stays at
    least ``SETTLE_SHARE`` (None if it never does)."""
    ttft = [r.ttft for r in run.requests]
    whole = float(percentile_fn(ttft, 99))
    sizes, rows = [], []
    size = smallest_block
    while len(ttft) // size >= min_blocks:
        p99 = [float(percentile_fn(ttft[i:i + size], 99)) for i in range(0, len(ttft) - size + 1, size)]
        rows.append({"block": size, "blocks": len(p99), "p99_min_s": min(p99), "p99_max_s": max(p99),
                     "within_share": float(np.mean([abs(p - whole) <= tolerance * whole for p in p99])),
                     "p99_s": p99})
        sizes.append(size)
        size *= 2
    settled = None
    for k in range(len(rows)):
        if all(r["within_share"] >= SETTLE_SHARE for r in rows[k:]):
            settled = rows[k]["block"]
            break
    return {"fraction": run.fraction, "rate": run.rate, "requests": len(ttft), "ttft_p99_s": whole,
            "tolerance": tolerance, "blocks": rows, "settled_at": settled}


def analyse_sweep(capacity: dict, sweep: list[Run], params: dict,
                  percentile_fn: Callable = percentile, ci_fn: Callable = bootstrap_ci) -> dict:
    """What the report reads from the closed loop and the sweep: rows, SLO, knee, goodput."""
    low = run_rows(sweep[:1], percentile_fn=percentile_fn, ci_fn=ci_fn, n_boot=params["n_boot"])[0]
    slo = low_load_slo(low, params["slo_ttft_factor"], params["slo_tpot_factor"])
    rows = run_rows(sweep, slo["ttft_slo_s"], slo["tpot_slo_s"], percentile_fn, ci_fn, params["n_boot"])
    k_cap = min(range(len(rows)), key=lambda k: abs(rows[k]["fraction"] - 1.0))
    at_capacity = rows[k_cap]
    overload = max(rows, key=lambda r: r["fraction"])
    best = max(rows, key=lambda r: r["goodput_req_s"])
    return {"capacity": capacity, "slo": slo, "sweep": rows,
            "knee": find_knee(rows, params["knee_factor"]),
            "at_capacity": {"fraction": at_capacity["fraction"],
                            "realized_rate": at_capacity["realized_rate"],
                            "ttft_p99_s": at_capacity["ttft_p99_s"],
                            "ttft_s": [float(r.ttft) for r in sweep[k_cap].requests],
                            "tpot_s": [float(r.tpot) for r in sweep[k_cap].requests
                                       if r.tpot is not None]},
            "overload": {"fraction": overload["fraction"], "realized_rate": overload["realized_rate"],
                         "ttft_p99_s": overload["ttft_p99_s"]},
            "best_goodput": {"fraction": best["fraction"], "realized_rate": best["realized_rate"],
                             "goodput_req_s": best["goodput_req_s"]}}


def add_repeats(study: dict, repeats: list[Run], params: dict,
                percentile_fn: Callable = percentile, ci_fn: Callable = bootstrap_ci) -> dict:
    """``study`` (from ``analyse_sweep``) with the repeated runs' rows and their spread."""
    slo = study["slo"]
    rows = run_rows(repeats, slo["ttft_slo_s"], slo["tpot_slo_s"], percentile_fn, ci_fn, params["n_boot"])
    return {**study, "repeats": rows, "spread": spread(rows)}


def analyse(capacity: dict, sweep: list[Run], repeats: list[Run], params: dict,
            percentile_fn: Callable = percentile, ci_fn: Callable = bootstrap_ci) -> dict:
    """Everything the report reads from one target's runs."""
    return add_repeats(analyse_sweep(capacity, sweep, params, percentile_fn, ci_fn), repeats,
                       params, percentile_fn, ci_fn)


def datacenter_target(params: dict) -> tuple[Callable, tuple[int, int, int], dict]:
    """The simulated server: a factory of engines (datasheet roofline of ``dc_device`` serving
    ``dc_model``), the workload shape ``(prompt_len, output_len, vocab_size)`` and a description."""
    gpu, cfg = get_device_spec(params["dc_device"]), get_preset(params["dc_model"])
    dtype = "bf16" if "bf16" in gpu.peak_flops else "fp16"  # a T4 has no bf16
    target = sim_target(cfg, RooflineCostModel.from_device_spec(gpu, dtype), params["dc_max_num_seqs"],
                        params["dc_prompt_len"] + params["dc_output_len"], dtype)
    setup = {"device": gpu.name, "model": cfg.name, "dtype": dtype,
             "max_num_seqs": params["dc_max_num_seqs"], "prompt_len": params["dc_prompt_len"],
             "output_len": params["dc_output_len"], "requests_per_run": params["dc_requests"]}
    return target, (params["dc_prompt_len"], params["dc_output_len"], cfg.vocab_size), setup


def simulate(params: dict, seed: int, arrivals_fn: Callable = poisson_arrivals,
             percentile_fn: Callable = percentile, ci_fn: Callable = bootstrap_ci) -> dict:
    """The whole study at datacenter scale in the simulator (deterministic for one seed)."""
    target, shape, setup = datacenter_target(params)
    n, width = params["dc_requests"], params["dc_max_num_seqs"]
    cap, _ = measure_capacity(target, width, 8 * width, *shape, seed)
    sweep = rate_sweep(target, cap["capacity_req_s"], params["load_fractions"], n, *shape, seed,
                       arrivals_fn)
    reps = repeated_runs(target, cap["capacity_req_s"], params["repeat_fraction"],
                         params["dc_repeats"], n, *shape, seed, arrivals_fn)
    out = analyse(cap, sweep, reps, params, percentile_fn, ci_fn)
    out["settle"] = [settle(poisson_run(target, params["dc_settle_requests"],
                                        f * cap["capacity_req_s"], *shape,
                                        run_seed(seed, _SETTLE, k), arrivals_fn, f),
                            params["settle_tolerance"], percentile_fn=percentile_fn)
                     for k, f in enumerate(params["settle_fractions"])]
    out["setup"] = setup
    return out


# --- the contract ---------------------------------------------------------------------------------
def _clean(x):
    """JSON-ready: tuples as lists, NaN as None, numpy scalars as Python numbers."""
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "item"):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


_ROW_KEYS = ("fraction", "configured_rate", "realized_rate", "throughput_req_s", "throughput_tok_s",
             "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_p50_ci_s", "ttft_p99_ci_s",
             "tpot_p50_s", "tpot_p99_s", "itl_p50_s", "itl_p99_s", "e2e_p50_s", "e2e_p99_s",
             "e2e_p99_ci_s", "goodput_req_s", "slo_attainment")


def _slim(study: dict) -> dict:
    out = {k: v for k, v in study.items() if k not in ("sweep", "repeats", "settle")}
    for key in ("capacity", "at_capacity"):  # raw samples: the claims that read them keep them
        out[key] = {k: v for k, v in study[key].items() if k not in ("ttft_s", "tpot_s")}
    out["sweep"] = [{k: r[k] for k in _ROW_KEYS} for r in study["sweep"]]
    out["repeats"] = [{k: r[k] for k in _ROW_KEYS} for r in study["repeats"]]
    if "settle" in study:
        out["settle"] = [{**s, "blocks": [{k: b[k] for k in ("block", "blocks", "p99_min_s",
                                                             "p99_max_s", "within_share")}
                                          for b in s["blocks"]]} for s in study["settle"]]
    return out


def knee_text(knee: dict | None, factor: float, capacity: float) -> str:
    """Where the TTFT p99 leaves the low-load level, as a clause (no capital, no full stop)."""
    if knee is None:
        return (f"ninguna tasa del barrido lleva el TTFT p99 por encima de {es(factor, 0)} veces el "
                "de la tasa más baja")
    return (f"el TTFT p99 supera {es(factor, 0)} veces el de la tasa más baja a partir de "
            f"{es(knee['realized_rate'], 2)} peticiones/s realizadas "
            f"({es(knee['realized_rate'] / capacity, 2)} veces la capacidad de {es(capacity, 2)}; "
            f"configuradas {es(knee['fraction'], 2)} veces): pasa de "
            f"{es(1e3 * knee['low_load_ttft_p99_s'], 1)} ms a {es(1e3 * knee['ttft_p99_s'], 1)} ms")


def settle_text(near: dict) -> str:
    """Whether blocks of a long run settle on its p99, as a clause (no capital, no full stop)."""
    last = near["blocks"][-1]
    tol = es(100 * near["tolerance"], 0)
    if near["settled_at"]:
        return (f"tres de cada cuatro bloques quedan a ±{tol} % del p99 de la ejecución larga a "
                f"partir de bloques de {near['settled_at']} peticiones")
    return (f"ni con bloques de {last['block']} peticiones quedan tres de cada cuatro a ±{tol} % del "
            f"p99 de la ejecución larga (solo el {es(100 * last['within_share'], 0)} %; su p99 va de "
            f"{es(last['p99_min_s'], 2)} a {es(last['p99_max_s'], 2)} s)")


SPREAD_CRITERION = 2.0  # "p99 of one short run is not a stable number": max/min p99 at least this


def spread_claim(spread: dict, where: str) -> claims.Claim:
    """Do repeated runs at one rate disagree on their TTFT p99 (class 000's phenomenon)?"""
    return claims.threshold(
        spread["ratio"], SPREAD_CRITERION, below=False, scale=1, unit="veces", decimals=1,
        what=f"{where}, el mayor TTFT p99 de las ejecuciones repetidas entre el menor",
        passed=("el p99 de una sola ejecución corta no es un número estable: es el fenómeno de "
                "la clase 000 del curso, reproducido"),
        failed=("aquí las ejecuciones repetidas apenas discrepan: con estos parámetros el "
                "fenómeno de la clase 000 del curso no se reproduce"))


def coordinated_omission(measured: dict) -> claims.Claim:
    """Closed loop at full capacity against the open-loop run nearest 1 × capacity: the same
    offered load, so the only difference is whether the load generator waits for the server.
    Their TTFT p99, compared with a bootstrap interval of the ratio."""
    cap, at = measured["capacity"], measured["at_capacity"]
    return claims.compare(
        at["ttft_s"], cap["ttft_s"], paired=False, q=99,
        what=(f"TTFT p99 del bucle abierto a {es(at['fraction'], 2)} veces la capacidad "
              f"({es(1e3 * at['ttft_p99_s'], 1)} ms) entre el del bucle cerrado a plena capacidad "
              f"({es(1e3 * cap['ttft_p99_s'], 1)} ms), con "
              + ("la misma carga ofrecida" if at["fraction"] == 1 else "una carga ofrecida parecida")),
        higher=("el bucle cerrado, que espera cada respuesta antes de enviar la siguiente, oculta "
                "la cola que ven los usuarios que llegan a su ritmo: omisión coordinada"),
        lower="aquí el bucle cerrado vio más cola que el abierto con la misma carga ofrecida",
        inconclusive=("el intervalo contiene el 1: con estas pocas peticiones la diferencia de "
                      "cola entre los dos bucles no es concluyente"))


def tpot_shift(measured: dict) -> claims.Claim | None:
    """TPOT of the open-loop run nearest 1 x capacity against the closed loop at full capacity
    (medians of the requests, unpaired): under random arrivals a new request's prefill can land
    in the middle of the others' decodes and stretch their time per token. None when either
    side has no request with two tokens."""
    cap, at = measured["capacity"], measured["at_capacity"]
    if not cap.get("tpot_s") or not at.get("tpot_s"):
        return None
    return claims.compare(
        at["tpot_s"], cap["tpot_s"], paired=False,
        what=(f"TPOT mediano del bucle abierto a {es(at['fraction'], 2)} veces la capacidad "
              f"({es(1e3 * float(np.median(at['tpot_s'])), 1)} ms) entre el del bucle cerrado a "
              f"plena capacidad ({es(1e3 * float(np.median(cap['tpot_s'])), 1)} ms)"),
        higher=("con llegadas aleatorias, los prefills caen en medio de las decodificaciones de "
                "otras peticiones y alargan su tiempo por token: el coste del prefill no "
                "desaparece, cambia de sitio"),
        lower="aquí el bucle abierto dio un tiempo por token menor que el bucle cerrado",
        inconclusive=("el intervalo contiene el 1: con estas peticiones no se distingue el "
                      "tiempo por token de los dos bucles"))


def capacity_agreement(pairs: dict, tolerance: float) -> claims.Claim:
    """Does the closed loop measure the capacity that a saturated open loop delivers? The paired
    ratio open / closed (median of the pairs, exact order-statistic interval) and its distance
    from 1, against ``tolerance``: within it over the whole interval, they agree; beyond it over
    the whole interval, they differ; otherwise (or with too few pairs) no verdict."""
    est = claims.ratio_estimate(pairs["open_req_s"], pairs["closed_req_s"], paired=True)
    far = max(abs(est.low - 1), abs(est.high - 1))
    near = 0.0 if est.low <= 1 <= est.high else min(abs(est.low - 1), abs(est.high - 1))
    pct = es(100 * tolerance, 0)
    return claims.threshold(
        abs(est.median - 1), tolerance, interval=(near, far), coverage=est.coverage, n=est.n,
        method=est.method,
        what=(f"Diferencia entre lo que completa por segundo un bucle abierto a "
              f"{es(pairs['fraction'], 2)} veces la capacidad y la capacidad del bucle cerrado, "
              f"|abierto / cerrado − 1| (cociente de las medianas de {est.n} pares: "
              f"{es(est.median, 3)} veces)"),
        passed=(f"las dos cifras coinciden dentro del {pct} %: con el servidor lleno da igual "
                "cómo lleguen las peticiones, y el bucle cerrado sirve para medir la capacidad"),
        failed=(f"las dos cifras se separan más de un {pct} %: aquí el bucle cerrado no mide lo "
                "que sostiene un servidor desbordado"),
        inconclusive=(f"el intervalo llega a ambos lados del {pct} %: con estos pares no se "
                      "puede afirmar que coincidan ni que se separen"))


@dataclass(frozen=True)
class Findings:
    """What the lab found, between its two studies and its report: the engine's study on this
    machine (``measured``, from ``analyse``) and the simulator's (``simulated``, from
    ``simulate``), their claims by name (``omission``: closed against open loop on this machine;
    ``sim_spread``: how far the simulated repeated runs' p99 disagree), and how the model was
    loaded (``served``, whose fallback, if any, the limitations state)."""

    model_name: str
    params: dict
    measured: dict
    simulated: dict
    omission: claims.Claim
    sim_spread: claims.Claim
    served: ServedModel | None = None
    tpot: claims.Claim | None = None  # tpot_shift: open against closed loop, time per token
    capacity_check: claims.Claim | None = None  # capacity_agreement: the two loops' capacity

    @classmethod
    def from_measurements(cls, model_name: str, params: dict, measured: dict, simulated: dict,
                          served: ServedModel | None = None) -> Findings:
        return cls(model_name, params, measured, simulated,
                   omission=coordinated_omission(measured),
                   sim_spread=spread_claim(simulated["spread"], "Simulado"), served=served,
                   tpot=tpot_shift(measured),
                   capacity_check=(capacity_agreement(measured["capacity_pairs"],
                                                      params["capacity_tolerance"])
                                   if "capacity_pairs" in measured else None))

    @property
    def sweep_ratios(self) -> list[float]:
        """Realized / configured rate of each run of the sweep (they do not depend on the clock)."""
        return [r["rate_ratio"] for r in self.measured["sweep"]]

    @property
    def repeat_ratios(self) -> list[float]:
        return [r["rate_ratio"] for r in self.measured["repeats"]]


def _results(f: Findings) -> dict:
    params = f.params
    return {
        "model": {"name": f.model_name},
        "definitions": {"capacity": "terminaciones por segundo entre la primera terminación y el "
                                    "último envío del bucle cerrado",
                        "knee": f"primera tasa realizada con TTFT p99 > {es(params['knee_factor'], 1)} × "
                                "el de la tasa realizada más baja",
                        "slo": f"TTFT <= {es(params['slo_ttft_factor'], 1)} × y TPOT <= "
                               f"{es(params['slo_tpot_factor'], 1)} × las medianas de la tasa más baja"},
        "arrivals": {"sweep_rate_ratio": [round(r, 6) for r in f.sweep_ratios],
                     "repeat_rate_ratio": [round(r, 6) for r in f.repeat_ratios]},
        "measured": _clean(_slim(f.measured)),
        "simulated": _clean(_slim(f.simulated)),
    }


def _capacity_evidence(f: Findings) -> list[dict]:
    """The closed loop's capacity and Little's law, the knee, and how far the arrivals drift."""
    params, measured = f.params, f.measured
    cap, width, n = measured["capacity"], params["max_num_seqs"], params["requests_per_rate"]
    ratios = [round(r, 6) for r in f.sweep_ratios + f.repeat_ratios]
    return [
        _ev(f"Con {width} clientes en bucle cerrado, {f.model_name} sirve {es(cap['capacity_req_s'], 2)} "
            f"peticiones/s ({es(cap['capacity_tok_s'], 0)} tokens/s de salida) en esta máquina, con "
            f"prompts de {params['prompt_len']} y salidas de {params['output_len']} tokens.",
            cap["capacity_req_s"], "peticiones/s", "measured", True),
        _ev(f"Ley de Little en el bucle cerrado: {width} peticiones en el sistema / latencia media "
            f"{es(cap['mean_e2e_s'], 3)} s = {es(cap['little_req_s'], 2)} peticiones/s, frente a "
            f"{es(cap['capacity_req_s'], 2)} medidas.", cap["little_req_s"], "peticiones/s",
            "measured", True),
        _ev("Medido en esta máquina, " + knee_text(measured["knee"], params["knee_factor"],
                                                    cap["capacity_req_s"]) + ".",
            measured["knee"]["realized_rate"] if measured["knee"] else 0.0, "peticiones/s",
            "measured", True),
        _ev(f"Con {n} peticiones por ejecución, la tasa realizada se aparta de la configurada entre "
            f"{es(100 * (min(ratios) - 1), 1)} % y {es(100 * (max(ratios) - 1), 1)} %.",
            max(abs(r - 1) for r in ratios), "fracción", "computed"),
    ]


def _load_evidence(f: Findings) -> list[dict]:
    """The repeated runs' spread, goodput under the SLO, and coordinated omission."""
    params, measured = f.params, f.measured
    sp, slo, worst, n = measured["spread"], measured["slo"], measured["sweep"][-1], params["requests_per_rate"]
    return [
        _ev(f"{len(measured['repeats'])} ejecuciones de {n} peticiones a {es(params['repeat_fraction'], 2)} "
            f"× la capacidad (realizadas entre {es(sp['realized_rate_min'], 2)} y "
            f"{es(sp['realized_rate_max'], 2)} peticiones/s) dan un TTFT p99 entre "
            f"{es(1e3 * sp['ttft_p99_min_s'], 1)} y {es(1e3 * sp['ttft_p99_max_s'], 1)} ms "
            f"({es(sp['ratio'], 1)} veces); sus intervalos bootstrap del 95 % miden entre "
            f"{es(1e3 * sp['ci_width_min_s'], 1)} y {es(1e3 * sp['ci_width_max_s'], 1)} ms.",
            sp["ratio"], "x", "measured", True),
        _ev(f"Con el SLO TTFT <= {es(1e3 * slo['ttft_slo_s'], 1)} ms y TPOT <= "
            f"{es(1e3 * slo['tpot_slo_s'], 1)} ms, a {es(worst['fraction'], 2)} × la capacidad el "
            f"servidor completa {es(worst['throughput_req_s'], 2)} peticiones/s pero su goodput es "
            f"{es(worst['goodput_req_s'], 2)} ({es(100 * worst['slo_attainment'], 0)} % dentro del "
            f"SLO); el mayor goodput, {es(measured['best_goodput']['goodput_req_s'], 2)} peticiones/s, "
            f"se da a {es(measured['best_goodput']['fraction'], 2)} × la capacidad.",
            worst["goodput_req_s"], "peticiones/s", "measured", True),
        f.omission.evidence("x"),
        *([] if f.tpot is None else [f.tpot.evidence("x")]),
        *([] if f.capacity_check is None else [f.capacity_check.evidence("fracción")]),
        _ev(f"El bucle cerrado nunca ofrece más que la capacidad; en bucle abierto, a "
            f"{es(measured['overload']['fraction'], 2)} veces la capacidad, el TTFT p99 es de "
            f"{es(1e3 * measured['overload']['ttft_p99_s'], 1)} ms.",
            measured["overload"]["ttft_p99_s"], "s", "measured", True),
    ]


def _simulated_evidence(f: Findings) -> list[dict]:
    params, simulated = f.params, f.simulated
    scap, ssp, setup = simulated["capacity"], simulated["spread"], simulated["setup"]
    near = simulated["settle"][-1]
    return [
        _ev(f"Simulado ({setup['model']} en {setup['device']}, {setup['dtype']}, {setup['max_num_seqs']} "
            f"filas, {setup['prompt_len']}/{setup['output_len']} tokens): capacidad "
            f"{es(scap['capacity_req_s'], 2)} peticiones/s ({es(scap['capacity_tok_s'], 0)} tokens/s). "
            + "En el simulador, " + knee_text(simulated["knee"], params["knee_factor"],
                                              scap["capacity_req_s"]) + ".",
            scap["capacity_req_s"], "peticiones/s", "computed"),
        _ev(f"Simulado: {len(simulated['repeats'])} ejecuciones de {setup['requests_per_run']} peticiones "
            f"a {es(params['repeat_fraction'], 2)} × la capacidad dan un TTFT p99 entre "
            f"{es(1e3 * ssp['ttft_p99_min_s'], 0)} y {es(1e3 * ssp['ttft_p99_max_s'], 0)} ms "
            f"({es(ssp['ratio'], 1)} veces); el intervalo bootstrap de una ejecución contiene el p99 de "
            f"otra en el {es(100 * ssp['cross_coverage'], 0)} % de los pares.",
            ssp["ratio"], "x", "computed"),
        f.sim_spread.evidence("x", "computed", volatile=False),
        _ev(f"Simulado, al cortar en bloques de peticiones consecutivas una ejecución de "
            f"{near['requests']} peticiones a {es(near['fraction'], 2)} × la capacidad, "
            + settle_text(near) + ".",
            near["settled_at"] or near["blocks"][-1]["block"], "peticiones", "computed"),
    ]


def _limitations(f: Findings) -> list[str]:
    n = f.params["requests_per_rate"]
    top = math.ceil(0.01 * n)  # p99 of n values interpolates among the top one or two
    limitations = [
        f"Con {n} peticiones por ejecución, el p99 se apoya en las {top + 1} mayores: no dice nada "
        "de la cola más allá del máximo observado, y dos ejecuciones iguales pueden diferir varias "
        "veces; el intervalo bootstrap supone peticiones independientes, y en una cola no lo son.",
        "Una prueba de 60 peticiones (la de la clase 000 del curso) no establece la capacidad "
        "sostenida (la cola no llega a su "
        "régimen estable), ni el p99,9, ni el comportamiento con longitudes variables o llegadas "
        "más irregulares que Poisson (ráfagas, ciclos diarios).",
        f"El objetivo es el motor en el mismo proceso ({f.model_name}, longitudes fijas): sin HTTP, "
        "tokenización, red ni streaming, y el generador de carga comparte la CPU con el servidor.",
        timing_limitation(1),
        datasheet_sim_limitation(),
    ]
    return (f.served.limitations() if f.served is not None else []) + limitations


def report(f: Findings) -> dict:
    """The contract's body from the lab's findings.

    Everything measured on this machine goes under ``results.measured`` (volatile); the arrival
    schedules (their realized/configured rate ratios do not depend on the clock) and the
    simulation are reproducible."""
    environment = {"model": f.model_name}
    if f.served is not None:
        environment.update(f.served.environment())
    return {"environment": environment, "results": _results(f),
            "evidence": _capacity_evidence(f) + _load_evidence(f) + _simulated_evidence(f),
            "limitations": _limitations(f), "volatile_fields": ["results.measured"]}


def check_params(params: dict, max_positions: int, served: str | None = None) -> None:
    """``served``: the model actually served (it differs from ``params["model"]`` after a
    fallback)."""
    if params["prompt_len"] + params["output_len"] > max_positions:
        raise LabParamError(f"prompt_len + output_len = {params['prompt_len'] + params['output_len']} "
                            f"supera las {max_positions} posiciones del modelo "
                            f"{served or params['model']}")
    if params["closed_loop_requests"] < 2 * params["max_num_seqs"]:
        raise LabParamError(f"closed_loop_requests={params['closed_loop_requests']} debe ser al menos "
                            f"2 × max_num_seqs = {2 * params['max_num_seqs']} (una ronda completa "
                            "con todos los clientes en vuelo)")
    if not any(0.8 <= f <= 1.25 for f in params["load_fractions"]):
        raise LabParamError(f"load_fractions={params['load_fractions']} necesita una fracción entre 0,8 "
                            "y 1,25 de la capacidad: la omisión coordinada se mide comparando el "
                            "bucle cerrado con el abierto a la misma carga ofrecida")
    if params["dc_settle_requests"] < 4 * 30:
        raise LabParamError(f"dc_settle_requests={params['dc_settle_requests']} debe ser al menos "
                            "120 (cuatro bloques de 30)")


def run(seed: int, profile: str, params: dict, device: torch.device) -> dict:
    served = load_served_model(params["model"], seed, device,
                               dtype=served_dtype(params["model_dtype"], device))
    cfg = served.model.config
    check_params(params, cfg.max_position_embeddings, served.name)
    width, shape = params["max_num_seqs"], (params["prompt_len"], params["output_len"], cfg.vocab_size)
    target = real_target(served.model, width, params["prompt_len"] + params["output_len"])
    progress = sys.stderr.isatty()
    n = params["requests_per_rate"]
    with torch_threads(params["torch_threads"]):
        warm_up(target, width, *shape)
        cap, _ = measure_capacity(target, width, params["closed_loop_requests"], *shape, seed, progress)
        sweep = rate_sweep(target, cap["capacity_req_s"], params["load_fractions"], n, *shape, seed,
                           progress=progress)
        reps = repeated_runs(target, cap["capacity_req_s"], params["repeat_fraction"],
                             params["repeats"], n, *shape, seed, progress=progress)
        pairs = capacity_pairs(target, cap["capacity_req_s"], params["overload_fraction"],
                               params["capacity_pairs"], width, params["closed_loop_requests"], n,
                               *shape, seed, progress=progress)
    measured = {**analyse(cap, sweep, reps, params), "capacity_pairs": pairs}
    simulated = simulate(params, seed)
    return report(Findings.from_measurements(cfg.name, params, measured, simulated, served))


SPEC = LabSpec(
    kind="observability",
    title="Observabilidad y pruebas de carga",
    chapter=6,
    folder="labs/06-observability",
    ci_budget_s=70,
    run=run,
    params={
        "model": Param("tiny-es", str, "modelo servido (los de Qwen se descargan del Hub de "
                       "Hugging Face)", choices=TEXT_MODELS, by_profile={"gpu": GPU_TEXT_MODEL}),
        "model_dtype": MODEL_DTYPE_PARAM,
        "max_num_seqs": Param(8, int, "filas de caché KV del servidor (y clientes del bucle "
                              "cerrado)", min=1, max=1024),
        "prompt_len": Param(256, int, "tokens de cada prompt", min=1, max=100_000,
                            by_profile={"ci": 32, "cpu": 128}),
        "output_len": Param(128, int, "tokens de cada salida", min=2, max=100_000,
                            by_profile={"ci": 16, "cpu": 64}),
        "closed_loop_requests": Param(64, int, "peticiones del bucle cerrado", min=2,
                                      max=100_000, by_profile={"ci": 32}),
        "requests_per_rate": Param(60, int, "peticiones de cada ejecución de Poisson", min=2,
                                   max=100_000, by_profile={"ci": 30}),
        "load_fractions": Param([1 / 3, 0.5, 2 / 3, 0.8, 0.9, 1.0, 1.25, 1.5, 2.0], float,
                                "tasas del barrido, en fracciones de la capacidad", min=0.01,
                                max=100, is_list=True,
                                by_profile={"ci": [1 / 3, 2 / 3, 1.0, 1.5, 2.0]}),
        "repeat_fraction": Param(0.9, float, "tasa de las ejecuciones repetidas (fracción de la "
                                 "capacidad)", min=0.01, max=100),
        "repeats": Param(5, int, "ejecuciones repetidas a la misma tasa", min=2, max=100,
                         by_profile={"ci": 3}),
        "overload_fraction": Param(2.0, float, "tasa del bucle abierto que se compara con el "
                                   "cerrado para medir la capacidad (fracción de la capacidad, "
                                   "mayor que 1: el servidor debe quedar desbordado)", min=1.1,
                                   max=100),
        "capacity_pairs": Param(5, int, "pares intercalados bucle cerrado / bucle abierto "
                                "desbordado (5 o más para un veredicto)", min=1, max=100),
        "capacity_tolerance": Param(0.1, float, "cuánto pueden diferir las dos capacidades para "
                                    "darlas por iguales (fracción)", min=0.001, max=1),
        "knee_factor": Param(3.0, float, "el codo: TTFT p99 por encima de este múltiplo del de "
                             "baja carga", min=1.0, max=1000),
        "slo_ttft_factor": Param(5.0, float, "SLO de TTFT, en múltiplos de la mediana a baja carga",
                                 min=1.0, max=1000),
        "slo_tpot_factor": Param(2.0, float, "SLO de TPOT, en múltiplos de la mediana a baja carga",
                                 min=1.0, max=1000),
        "torch_threads": Param(0, int, "hilos de torch mientras mide el motor real (0: los que "
                               "torch elija)", min=0, max=1024, by_profile={"ci": 1}),
        "n_boot": Param(1000, int, "remuestras de cada intervalo bootstrap", min=100, max=100_000),
        "dc_device": Param("h100-sxm", str, "GPU simulada", choices=("h100-sxm", "h200", "a100-80gb", "l4")),
        "dc_model": Param("llama-3.1-8b", str, "modelo simulado",
                          choices=("llama-3.1-8b", "llama-2-7b", "mistral-7b-v0.3", "qwen3-0.6b")),
        "dc_max_num_seqs": Param(8, int, "filas de caché KV simuladas", min=1, max=4096),
        "dc_prompt_len": Param(256, int, "tokens de prompt simulados", min=1, max=100_000),
        "dc_output_len": Param(128, int, "tokens de salida simulados", min=2, max=100_000,
                               by_profile={"ci": 64}),
        "dc_requests": Param(60, int, "peticiones de cada ejecución simulada", min=2, max=100_000),
        "dc_repeats": Param(20, int, "ejecuciones simuladas repetidas", min=2, max=1000,
                            by_profile={"ci": 8}),
        "dc_settle_requests": Param(7680, int, "peticiones de cada ejecución larga simulada",
                                    min=2, max=1_000_000, by_profile={"ci": 960}),
        "settle_fractions": Param([0.5, 0.9], float, "tasas de las ejecuciones largas (fracción "
                                  "de la capacidad)", min=0.01, max=100, is_list=True),
        "settle_tolerance": Param(0.25, float, "cuánto puede apartarse el p99 de un bloque del de "
                                  "la ejecución larga (fracción)", min=0.01, max=10),
    },
)
