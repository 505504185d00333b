"""Lab ``continuous_batching`` (chapter 3): static vs iteration-level batching on the real engine.

Measured on the reader's device, in one run (``run`` for ``run_lab``; the notebook calls the same
functions with the student's policy and builds its contract with :class:`Findings` and
:func:`report`):

1. :func:`compare_policies`: Anyscale's experiment at laptop scale. One model, prompts of one
   length, output lengths from a capped exponential; for each cap the same workload is served
   ``repeats`` times with each policy, in interleaved pairs (static, continuous; continuous,
   static; ...), so that a neighbour that slows the machine for a while hits both policies;
   :func:`policy_row` turns the runs into plain numbers (steps, occupancy, tokens/s and latency
   of every repetition);
2. :func:`measure_widths` + :func:`simulator_validation`: the simulator checked on this machine.
   Two new workloads (other seeds) are served at several batch widths, every workload and width
   interleaved step by step, ``repeats`` times after a discarded warm-up; each step's fastest
   pass is kept (the schedule does not depend on the clock, so step ``i`` is the same work in
   every pass, and a neighbour can only slow a step down). The cost model is fitted to the
   first workload's steps and predicts the time of the second, which it never saw, at every
   width: both were measured in the same moments, so a neighbour's burst cannot make the fit
   and the test disagree;
3. :func:`datacenter_study`: the same study at datacenter scale in the simulator (a 7-8B model on
   an H100, datasheet numbers), with the same scheduler. Deterministic.

:class:`Findings` holds those plain structures and every conclusion about this machine, each a
:mod:`ai_evolution.claims` claim (a verdict with its interval or criterion, from
:func:`verdicts`), the same object the notebook glues into the page; :func:`report` turns the
findings into the contract's body.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from .. import claims
from ..engine import ModelRunner, Request, StepRecord, build_engine
from ..fmt import es
from ..hardware import get_device_spec, measure_bandwidth
from ..loadgen import WorkItem, capped_exponential_lengths, fixed_prompt_workload
from ..metrics import summarize
from ..model import get_preset, load_model
from ..sim import RooflineCostModel, fit_cost_model, sim_engine, step_cost
from ..timing import torch_threads
from .common import SERVED_MODELS, dtype_name, MODEL_DTYPE_PARAM, served_dtype
from .contract import datasheet_sim_limitation, evidence as _ev, threads_limitation
from .registry import LabParamError, LabSpec, Param

POLICY_NAMES = ("static", "continuous")
SIM_ERROR_LIMIT = 0.15  # the chapter's criterion: the calibrated simulator within 15 % at every width
CALIBRATION_SEED_OFFSET = 1  # the simulator's workloads differ from the experiment's and each
VALIDATION_SEED_OFFSET = 2   # other: the fit never sees the workload it is judged on


def workload(num_requests: int, prompt_len: int, mean_output: float, cap: int, vocab_size: int,
             seed: int) -> list[WorkItem]:
    """The chapter's workload for one cap; the same seed gives the same prompts and lengths."""
    lens = capped_exponential_lengths(num_requests, mean_output, cap, seed)
    return fixed_prompt_workload(num_requests, prompt_len, lens, vocab_size, seed)


def _runner(model, width: int, max_model_len: int) -> ModelRunner:
    """One row of ``max_model_len`` per request; on a GPU, decode steps replay CUDA graphs (a
    small model's step is otherwise bound by kernel launches, and the batching curve would be
    flat for that reason, not because the weights are read once for the whole batch)."""
    return ModelRunner(model, width, max_model_len, decode_graphs="auto", max_num_seqs=width)


def serve(model, items: list[WorkItem], policy, max_num_seqs: int, max_model_len: int
          ) -> tuple[list[Request], list[StepRecord], float]:
    """Run ``items`` through a fresh engine on ``model``: requests, step history, wall seconds."""
    engine = build_engine(model, max_num_seqs=max_num_seqs, max_model_len=max_model_len, policy=policy,
                          executor=_runner(model, max_num_seqs, max_model_len))
    start = time.perf_counter()
    requests = engine.run(items)
    return requests, engine.history, time.perf_counter() - start


def simulate(config, cost_model: RooflineCostModel, items: list[WorkItem], policy,
             max_num_seqs: int, max_model_len: int, dtype: str) -> tuple[list[Request], list[StepRecord]]:
    engine = sim_engine(config, cost_model, max_num_seqs, max_model_len, policy, dtype=dtype)
    requests = engine.run(items)
    return requests, engine.history


def occupancy(history: list[StepRecord], num_rows: int) -> dict:
    """How full the batch was: mean running requests per step, and the share of row-steps that
    were held by a request with nothing to do (finished but not released)."""
    steps = len(history)
    busy = sum(h.batch_size for h in history)
    held = sum(len(h.holders) for h in history)
    return {"steps": steps, "mean_batch": busy / steps,
            "idle_held_fraction": (held - busy) / (steps * num_rows)}


def step_costs(config, history: list[StepRecord], dtype: str):
    return [step_cost(config, h.query_lens, h.context_lens, dtype) for h in history]


def _shape(history: list[StepRecord]) -> list[tuple]:
    return [(tuple(h.query_lens), tuple(h.context_lens)) for h in history]


def fastest_steps(histories: list[list[StepRecord]]) -> tuple[list[StepRecord], list[float]]:
    """One schedule run several times: its steps and each step's fastest duration over the runs.

    The schedule does not depend on the clock, so step ``i`` did the same work in every run (a
    run where it differs raises ``ValueError``). A neighbour on the machine can only make a step
    slower, never faster, so the minimum is the estimate of what this machine takes for that work
    that the neighbour disturbs least; it is taken alike for the steps that fit the simulator and
    for those that test it."""
    first = histories[0]
    for h in histories[1:]:
        if _shape(h) != _shape(first):
            raise ValueError("las repeticiones no planificaron los mismos pasos: el planificador debe "
                             "dar la misma secuencia de pasos con la misma semilla")
    durations = np.min(np.array([[s.duration for s in h] for h in histories]), axis=0)
    return first, [float(d) for d in durations]


# --- 1. static vs continuous on the real engine ----------------------------------------------
def compare_policies(model, items: list[WorkItem], policy, max_num_seqs: int, max_model_len: int,
                     repeats: int) -> dict[str, list[tuple[list[Request], list[StepRecord], float]]]:
    """Serve ``items`` ``repeats`` times with static batching and with ``policy`` (the continuous
    one), in interleaved pairs whose order alternates (S C, C S, S C...): drift, warm-up or a
    neighbour's burst hit both policies alike, and pair ``i`` is measured side by side.
    Returns ``{"static": [(requests, history, wall_s), ...], "continuous": [...]}``."""
    policies = {"static": "static", "continuous": policy}
    runs = {p: [] for p in POLICY_NAMES}
    for i in range(repeats):
        for p in (POLICY_NAMES if i % 2 == 0 else POLICY_NAMES[::-1]):
            runs[p].append(serve(model, items, policies[p], max_num_seqs, max_model_len))
    return runs


def policy_row(cap: int, items: list[WorkItem], runs: dict, max_num_seqs: int,
               summarize_fn=summarize) -> dict:
    """Plain numbers of one cap's runs: per policy, the schedule (steps, occupancy; the same in
    every repetition) and, per repetition, wall time, tokens/s and latency percentiles (by
    ``summarize_fn``: the library's, or the student's)."""
    tokens = sum(i.params.max_tokens for i in items)
    reference = [r.output_token_ids for r in runs["static"][0][0]]
    row = {"cap": cap, "output_tokens": tokens,
           "outputs_identical": all([r.output_token_ids for r in reqs] == reference
                                    for p in POLICY_NAMES for reqs, _, _ in runs[p])}
    for p in POLICY_NAMES:
        requests, history, _ = runs[p][0]
        stats = [summarize_fn(reqs) for reqs, _, _ in runs[p]]
        walls = [float(w) for _, _, w in runs[p]]
        row[p] = {**occupancy(history, max_num_seqs), "wall_s": walls,
                  "throughput_tok_s": [tokens / w for w in walls],
                  **{k: [float(s[k]) for s in stats] for k in ("ttft_p50_s", "e2e_p50_s", "e2e_p99_s")}}
    row["step_ratio"] = row["static"]["steps"] / row["continuous"]["steps"]
    row["throughput_ratio"] = (float(np.median(row["continuous"]["throughput_tok_s"]))
                               / float(np.median(row["static"]["throughput_tok_s"])))
    return row


# --- 2. the simulator on this machine --------------------------------------------------------
def serve_widths(model, workloads: dict[str, list[WorkItem]], widths: list[int],
                 max_model_len: int, policy="continuous") -> dict[str, dict[int, list[StepRecord]]]:
    """Serve every workload once at every batch width, all their steps interleaved: at each tick
    the engine that has generated the smallest share of its tokens runs one step, so every
    workload and width sees the same stretches of the machine's time (a wide batch steps less
    often). Returns ``{workload: {width: history}}``."""
    engines, totals = {}, {}
    for name, items in workloads.items():
        totals[name] = sum(i.params.max_tokens for i in items)
        for b in widths:
            engine = build_engine(model, max_num_seqs=b, max_model_len=max_model_len, policy=policy,
                                  executor=_runner(model, b, max_model_len))
            for item in items:
                engine.add_request(item.prompt_token_ids, item.params, arrival_time=engine.now())
            engines[name, b] = engine
    order = {key: i for i, key in enumerate(engines)}
    done = dict.fromkeys(engines, 0)
    live = set(engines)
    while live:
        key = min(live, key=lambda k: (done[k] / totals[k[0]], order[k]))
        done[key] += len(engines[key].step())
        if not engines[key].has_unfinished_requests():
            live.discard(key)
    return {name: {b: engines[name, b].history for b in widths} for name in workloads}


def measure_widths(model, workloads: dict[str, list[WorkItem]], widths: list[int],
                   max_model_len: int, repeats: int, policy="continuous") -> dict[str, dict[int, dict]]:
    """``repeats`` passes of :func:`serve_widths` after a short discarded warm-up (the first
    steps of each shape pay one-off allocations). Per workload and width: the schedule, each
    step's fastest duration over the passes (:func:`fastest_steps`), and each pass's total busy
    time."""
    first = next(iter(workloads.values()))
    warm = [w._replace(params=dataclasses.replace(w.params, max_tokens=min(2, w.params.max_tokens)))
            for w in first[:max(widths)]]
    serve_widths(model, {"warm-up": warm}, widths, max_model_len, policy)
    passes = [serve_widths(model, workloads, widths, max_model_len, policy) for _ in range(repeats)]
    out = {}
    for name in workloads:
        out[name] = {}
        for b in widths:
            history, durations = fastest_steps([p[name][b] for p in passes])
            out[name][b] = {"history": history, "durations": durations,
                            "pass_totals_s": [float(sum(s.duration for s in p[name][b]))
                                              for p in passes]}
    return out


def _predicted(config, dtype, cost_model, items, policy, width, max_model_len) -> tuple[float, int]:
    _, history = simulate(config, cost_model, items, policy, width, max_model_len, dtype)
    seconds = sum(cost_model.step_time_s(c) for c in step_costs(config, history, dtype))
    return float(seconds), len(history)


def simulator_validation(config, dtype: str, measured: dict[str, dict[int, dict]],
                         workloads: dict[str, list[WorkItem]], bandwidth_gbps: float,
                         max_model_len: int, policy="continuous") -> dict:
    """Fit the cost model to every step of the ``calibration`` workload (errors in seconds, so
    the fit matches total times), then predict the busy time of the ``validation`` workload,
    which the fit never saw, at every width. Plain numbers (plus the fitted ``cost_model``)."""
    calib = measured["calibration"]
    costs = [c for m in calib.values() for c in step_costs(config, m["history"], dtype)]
    seconds = [d for m in calib.values() for d in m["durations"]]
    fitted = fit_cost_model(costs, seconds, bandwidth_gbps * 1e9, name="calibrado en esta máquina",
                            errors="absolute")
    rows = {}
    for name in ("calibration", "validation"):
        rows[name] = []
        for b, m in measured[name].items():
            busy = float(sum(m["durations"]))
            sim_t, steps = _predicted(config, dtype, fitted, workloads[name], policy, b, max_model_len)
            rows[name].append({"max_num_seqs": b, "measured_s": busy, "simulated_s": sim_t,
                               "error": (sim_t - busy) / busy, "steps": steps,
                               "pass_totals_s": m["pass_totals_s"]})
    return {"bandwidth_gbps": bandwidth_gbps, "calibration_steps": len(costs),
            "fitted": {"peak_flops": fitted.peak_flops, "overhead_s": fitted.overhead_s,
                       "overhead_per_seq_s": fitted.overhead_per_seq_s},
            "calibration_fit": rows["calibration"], "widths": rows["validation"],
            "max_abs_error": max(abs(r["error"]) for r in rows["validation"]),
            "limit": SIM_ERROR_LIMIT, "cost_model": fitted}


def validation_workloads(params: dict, vocab_size: int, seed: int) -> dict[str, list[WorkItem]]:
    """The simulator's two workloads at the middle cap: one to fit it, one it never saw."""
    cap = params["caps"][len(params["caps"]) // 2]
    return {name: workload(params["validation_requests"], params["prompt_len"],
                           params["mean_output"], cap, vocab_size, seed + offset)
            for name, offset in (("calibration", CALIBRATION_SEED_OFFSET),
                                 ("validation", VALIDATION_SEED_OFFSET))}


# --- 3. datacenter scale in the simulator -----------------------------------------------------
def datacenter_study(params: dict, seed: int, policy="continuous", summarize_fn=summarize) -> dict:
    """Static vs ``policy`` in the simulator with a datasheet GPU and a 7-8B model, per cap."""
    gpu = get_device_spec(params["dc_device"])
    big = get_preset(params["dc_model"])
    dc_dtype = "bf16" if "bf16" in gpu.peak_flops else "fp16"  # a T4 has no bf16
    dc_cost = RooflineCostModel.from_device_spec(gpu, dc_dtype)
    dc_len = params["dc_prompt_len"] + max(params["dc_caps"])
    runs = []
    for cap in params["dc_caps"]:
        items = workload(params["dc_requests"], params["dc_prompt_len"], params["dc_mean_output"],
                         cap, big.vocab_size, seed)
        row = {"cap": cap}
        for p, pol in (("static", "static"), ("continuous", policy)):
            reqs, hist = simulate(big, dc_cost, items, pol, params["dc_max_num_seqs"], dc_len, dc_dtype)
            stats = summarize_fn(reqs)
            row[p] = {"steps": len(hist), "throughput_tok_s": float(stats["throughput_tok_s"]),
                      "e2e_p50_s": float(stats["e2e_p50_s"]), "e2e_p99_s": float(stats["e2e_p99_s"])}
        row["throughput_ratio"] = row["continuous"]["throughput_tok_s"] / row["static"]["throughput_tok_s"]
        runs.append(row)
    return {"device": gpu.name, "model": big.name, "dtype": dc_dtype,
            "bandwidth_bytes_per_s": gpu.bandwidth_bytes_per_s,
            "peak_flops": gpu.peak_flops[dc_dtype], "max_num_seqs": params["dc_max_num_seqs"],
            "runs": runs, "cost_model": dc_cost, "max_model_len": dc_len, "config": big}


# --- claims: every conclusion about this machine ---------------------------------------------
def gain_claim(row: dict) -> claims.Claim:
    """Tokens/s of continuous over static batching at one cap, paired by repetition."""
    return claims.compare(
        row["continuous"]["throughput_tok_s"], row["static"]["throughput_tok_s"],
        what=f"Con tope {row['cap']}, tokens/s del batching continuo entre los del estático",
        higher="con este tope el continuo rinde más que el estático en esta máquina",
        lower="con este tope el continuo rinde menos que el estático en esta máquina",
        inconclusive=("el intervalo contiene el 1: con este tope y este ruido no se distingue el "
                      "rendimiento de las dos políticas"))


def step_gain_claim(row: dict) -> claims.Claim:
    """Does the measured gain stay below the step ratio (the gain if a step cost the same with
    any batch)? Inconclusive when the gain's interval contains the step ratio."""
    est = claims.ratio_estimate(row["continuous"]["throughput_tok_s"],
                                row["static"]["throughput_tok_s"])
    return claims.threshold(
        est.median, row["step_ratio"], below=True, scale=1, unit="veces", decimals=2,
        interval=est if est.n >= 2 else None,
        what=(f"Con tope {row['cap']}, ganancia medida del continuo frente al cociente de pasos "
              "estático/continuo"),
        passed=("la ganancia queda por debajo del cociente de pasos: en esta máquina un paso con "
                "el lote lleno cuesta más que uno medio vacío"),
        failed=("la ganancia supera el cociente de pasos: en esta máquina un paso con el lote "
                "lleno no cuesta más que uno medio vacío"),
        inconclusive=("el intervalo de la ganancia contiene el cociente de pasos: con este ruido no "
                      "se puede decir si aquí el paso encarece con el lote"))


def latency_claim(row: dict, key: str) -> claims.Claim:
    """End-to-end latency percentile ``key`` (``e2e_p50_s`` / ``e2e_p99_s``) of continuous over
    static, one value per repetition, paired."""
    label = {"e2e_p50_s": "la mediana (p50)", "e2e_p99_s": "el percentil 99"}[key]
    who = {"e2e_p50_s": "la petición mediana tarda",
           "e2e_p99_s": "las peticiones más lentas tardan"}[key]
    return claims.compare(
        row["continuous"][key], row["static"][key],
        what=(f"Con tope {row['cap']}, {label} de la latencia de extremo a extremo del continuo "
              "entre la del estático"),
        higher=f"con el continuo {who} más",
        lower=f"con el continuo {who} menos",
        inconclusive=(f"el intervalo contiene el 1: con este ruido no se distingue si con el "
                      f"continuo {who} más o menos"))


def simulator_claim(validation: dict) -> claims.Claim:
    """The calibrated simulator's worst error over the validation widths against the criterion."""
    widths = ", ".join(str(r["max_num_seqs"]) for r in validation["widths"])
    return claims.threshold(
        validation["max_abs_error"], validation["limit"], below=True,
        what=(f"Error máximo del simulador calibrado al predecir el tiempo de una carga nueva con "
              f"lotes de {widths}"),
        passed=("el simulador queda validado en esta máquina: sigue al motor en todos esos anchos "
                "de lote"),
        failed=("el simulador no queda validado en esta máquina con este ruido: no sigue al motor "
                "en todos esos anchos de lote"))


def simulator_consequence(claim: claims.Claim) -> str:
    """What the validation's verdict means for the datacenter study that follows it."""
    if claim.outcome == claims.PASSED:
        return ("Con la validación superada, el mismo planificador y el mismo modelo de coste "
                "pueden llevarse a otra máquina cambiando sus parámetros por los de la hoja de "
                "datos; lo que esta prueba no cubre son las sobrecargas de esa otra máquina.")
    return ("La validación no se superó en esta ejecución: las predicciones de centro de datos "
            "que siguen no quedan validadas en esta máquina con este nivel de ruido. Léalas como lo "
            "que predice el modelo de coste, no como algo que esta ejecución respalde; repita el "
            "laboratorio con la máquina desocupada para validarlo.")


def identical_sentence(rows: list[dict]) -> str:
    """Did both policies (every repetition) produce the same tokens for every request?"""
    bad = [str(r["cap"]) for r in rows if not r["outputs_identical"]]
    if not bad:
        return (f"Las dos políticas producen exactamente los mismos tokens para cada petición, en "
                f"los {len(rows)} topes y en todas las repeticiones: solo cambia cuándo sale cada uno.")
    return (f"Las dos políticas NO producen los mismos tokens con tope {', '.join(bad)}: con "
            "decodificación voraz deberían; hay un error en la política o en el motor.")


def verdicts(rows: list[dict], validation: dict) -> dict[str, claims.Claim]:
    """Every claim of the lab by key (the notebook glues each as ``cb_<key>_verdict``)."""
    wide, low = rows[-1], rows[0]
    return {"gain_wide": gain_claim(wide), "gain_low": gain_claim(low),
            "step_gain": step_gain_claim(wide),
            "e2e_p50": latency_claim(wide, "e2e_p50_s"), "e2e_p99": latency_claim(wide, "e2e_p99_s"),
            "simulator": simulator_claim(validation)}


CRITERIA = (
    ("tokens", "tokens idénticos en las dos políticas"),
    ("steps", "menos pasos con el continuo cuanto mayor es el tope"),
    ("gain", "una ganancia medida mayor que uno con el tope más alto"),
    ("simulator", f"un error del simulador por debajo del {es(100 * SIM_ERROR_LIMIT, 0)} %"),
)


def criteria_sentence(met: dict[str, bool]) -> str:
    """Which of the chapter's four criteria (``CRITERIA``) this run's contract meets, from the
    booleans (``Findings.criteria_met``)."""
    n_met = sum(met[key] for key, _ in CRITERIA)
    missed = [text for key, text in CRITERIA if not met[key]]
    if not missed:
        return f"El contrato de esta ejecución cumple los {len(CRITERIA)} criterios."
    return (f"El contrato de esta ejecución cumple {n_met} de los {len(CRITERIA)} criterios; no "
            f"cumple: {'; '.join(missed)}. En lo que falla, esta ejecución no respalda el capítulo.")


@dataclasses.dataclass(frozen=True)
class Findings:
    """What the lab found, between its measurements and its report: the three studies
    (:func:`policy_row` per cap, :func:`simulator_validation`, :func:`datacenter_study`), the
    model served (``model_info``: ``name``, ``dtype``, ``parameters``) and the claims drawn
    from them, by name."""

    model_info: dict
    params: dict
    rows: list[dict]
    validation: dict
    datacenter: dict
    gain_wide: claims.Claim
    gain_low: claims.Claim
    step_gain: claims.Claim
    e2e_p50: claims.Claim
    e2e_p99: claims.Claim
    simulator: claims.Claim

    @classmethod
    def from_measurements(cls, model_info: dict, params: dict, rows: list[dict],
                          validation: dict, datacenter: dict,
                          found: dict[str, claims.Claim] | None = None) -> Findings:
        """``found``: the notebook's own ``verdicts(rows, validation)`` (computed here when not
        given)."""
        v = verdicts(rows, validation) if found is None else found
        return cls(model_info, params, rows, validation, datacenter, **v)

    @property
    def widest(self) -> dict:
        """The row of the highest cap."""
        return self.rows[-1]

    @property
    def outputs_identical(self) -> bool:
        return all(r["outputs_identical"] for r in self.rows)

    @property
    def criteria_met(self) -> dict[str, bool]:
        """Which of the chapter's criteria (``CRITERIA``) this run meets."""
        steps = [r["static"]["steps"] / r["continuous"]["steps"] for r in self.rows]
        return {"tokens": self.outputs_identical,
                "steps": all(b >= a for a, b in zip(steps, steps[1:])) and steps[-1] > 1,
                "gain": self.gain_wide.outcome == claims.HIGHER,
                "simulator": self.simulator.outcome == claims.PASSED}


# --- the contract's body ----------------------------------------------------------------------
def _results(f: Findings) -> dict:
    rows = f.rows
    return {
        "model": dict(f.model_info),
        # deterministic for one seed: the schedule does not depend on timing
        "measured": {
            "cap": [r["cap"] for r in rows], "output_tokens": [r["output_tokens"] for r in rows],
            "outputs_identical": [r["outputs_identical"] for r in rows],
            "step_ratio": [r["step_ratio"] for r in rows],
            **{k: {p: [r[p][k] for r in rows] for p in POLICY_NAMES}
               for k in ("steps", "mean_batch", "idle_held_fraction")}},
        # one value per repetition (interleaved pairs), per cap
        "measured_timing": {
            "repeats": len(f.widest["static"]["wall_s"]),
            "throughput_ratio": [r["throughput_ratio"] for r in rows],
            **{k: {p: [r[p][k] for r in rows] for p in POLICY_NAMES}
               for k in ("wall_s", "throughput_tok_s", "ttft_p50_s", "e2e_p50_s", "e2e_p99_s")}},
        "simulator_validation": {k: v for k, v in f.validation.items() if k != "cost_model"},
        "datacenter": {k: v for k, v in f.datacenter.items()
                       if k not in ("cost_model", "config", "max_model_len")},
    }


def _evidence(f: Findings) -> list[dict]:
    wide, datacenter = f.widest, f.datacenter
    dc_wide = datacenter["runs"][-1]
    return [
        f.gain_wide.evidence("x"),
        f.gain_low.evidence("x"),
        _ev(f"Con tope {wide['cap']}, el estático necesita {wide['static']['steps']} pasos y el "
            f"continuo {wide['continuous']['steps']}; en el estático el "
            f"{es(100 * wide['static']['idle_held_fraction'], 0)} % de las filas-paso de la caché "
            "están reservadas por peticiones que ya terminaron.", wide["static"]["idle_held_fraction"],
            "fracción"),
        _ev(f"Con tope {wide['cap']}, el cociente de pasos estático/continuo es "
            f"{es(wide['step_ratio'], 2)}: la ganancia que daría el planificador si un paso costara "
            "lo mismo con cualquier lote.", wide["step_ratio"], "x"),
        f.step_gain.evidence("x"),
        f.e2e_p50.evidence("x"),
        f.e2e_p99.evidence("x"),
        _ev(identical_sentence(f.rows), f.outputs_identical, "bool"),
        f.simulator.evidence("fracción"),
        _ev(f"Simulado en una {datacenter['device']} con {datacenter['model']} en "
            f"{datacenter['dtype']} (datos de la hoja de datos), el batching continuo da "
            f"{es(dc_wide['throughput_ratio'], 2)} veces el rendimiento del estático con tope "
            f"{dc_wide['cap']}.", dc_wide["throughput_ratio"], "x", "computed"),
    ]


def _limitations(f: Findings) -> list[str]:
    return [
        threads_limitation(f.params.get("torch_threads", 0)),
        "En una CPU un paso con el lote lleno puede costar bastante más que uno medio vacío (las "
        "multiplicaciones de pocas filas no salen gratis), y entonces la ganancia medida queda por debajo del "
        "cociente de pasos; en una GPU limitada por memoria el paso casi no depende del lote.",
        "Nuestro batching estático no calcula las filas ya terminadas (una implementación con "
        "relleno, como generate de transformers, sí lo haría): la comparación favorece al estático.",
        "El prefill de las peticiones admitidas va en el mismo paso que la decodificación de las "
        "demás, sin presupuesto de tokens; el capítulo 5 lo trocea.",
        "El simulador se calibra con una carga y se valida con otra, servidas a la vez con varios "
        "anchos de lote en esta máquina; que siga al motor aquí no dice nada de las sobrecargas "
        "de otra máquina.",
        datasheet_sim_limitation(),
        f"Los tiempos se miden en una máquina que puede estar compartida. Cada comparación entre "
        f"políticas usa {len(f.widest['static']['wall_s'])} pares intercalados y un intervalo bootstrap "
        "del 95 % de su cociente: con tan pocos pares, un intervalo que excluya el 1 por azar es "
        "poco probable pero no imposible. La validación del simulador toma de cada paso la más "
        "rápida de sus pasadas: describe la máquina cuando el vecino la deja, no su peor momento.",
    ]


def report(f: Findings) -> dict:
    """The contract's body from the lab's findings (plain numbers; no measurement here)."""
    return {"environment": {"model": f.model_info["name"], "dtype": f.model_info["dtype"]},
            "results": _results(f), "evidence": _evidence(f), "limitations": _limitations(f),
            "volatile_fields": ["results.measured_timing", "results.simulator_validation"]}


def check_params(params: dict, config) -> int:
    """``max_model_len`` of the lab's engines; a cap the model cannot hold raises in Spanish."""
    max_len = params["prompt_len"] + max(params["caps"])
    if max_len > config.max_position_embeddings:
        raise LabParamError(f"prompt_len + el mayor tope ({max_len} tokens) supera las "
                            f"{config.max_position_embeddings} posiciones de {config.name}")
    return max_len


def run(seed: int, profile: str, params: dict, device: torch.device) -> dict:
    with torch_threads(params["torch_threads"]):
        return _run(seed, params, device)


def _run(seed: int, params: dict, device: torch.device) -> dict:
    model = load_model(params["model"], seed, device,
                       dtype=served_dtype(params["model_dtype"], device))
    cfg, dtype = model.config, dtype_name(model)
    width, reps = params["max_num_seqs"], params["repeats"]
    max_len = check_params(params, cfg)
    rows = []
    for cap in params["caps"]:
        items = workload(params["num_requests"], params["prompt_len"], params["mean_output"], cap,
                         cfg.vocab_size, seed)
        rows.append(policy_row(cap, items, compare_policies(model, items, "continuous", width,
                                                            max_len, reps), width))
    bw = measure_bandwidth(device, kind="read", repeats=max(2, reps), progress=False)
    sim_items = validation_workloads(params, cfg.vocab_size, seed)
    widths = measure_widths(model, sim_items, params["validation_widths"], max_len, reps)
    validation = simulator_validation(cfg, dtype, widths, sim_items, bw.max, max_len)
    model_info = {"name": cfg.name, "dtype": dtype, "parameters": model.num_parameters()}
    return report(Findings.from_measurements(model_info, params, rows, validation,
                                             datacenter_study(params, seed)))


SPEC = LabSpec(
    kind="continuous_batching",
    title="Batching continuo",
    chapter=3,
    folder="labs/03-continuous-batching",
    ci_budget_s=185,
    run=run,
    params={
        "model": Param("tiny-es", str, "modelo servido (pesos aleatorios salvo tiny-es)",
                       choices=SERVED_MODELS),
        "model_dtype": MODEL_DTYPE_PARAM,
        "num_requests": Param(96, int, "peticiones de la carga", min=2, max=10_000,
                              by_profile={"ci": 32, "gpu": 128}),
        "prompt_len": Param(32, int, "tokens de cada prompt", min=1, max=4096),
        "mean_output": Param(48, float, "media de la exponencial de longitudes de salida",
                             min=1, max=10_000, by_profile={"ci": 20}),
        "caps": Param([16, 64, 384], int, "topes de la longitud de salida (dispersión creciente)",
                      min=1, max=8192, is_list=True, by_profile={"ci": [8, 32, 192]}),
        "max_num_seqs": Param(8, int, "ancho del lote (filas de caché KV)", min=1, max=1024,
                              by_profile={"gpu": 16}),
        # 5 pairs: with 3, three pairs that agree by chance (1 in 4 under no difference) would
        # already make the bootstrap interval exclude 1
        "repeats": Param(5, int, "repeticiones intercaladas de cada medición", min=1, max=20),
        "torch_threads": Param(0, int, "hilos de torch mientras se miden los tiempos (0: los que "
                               "torch elija)", min=0, max=1024, by_profile={"ci": 1}),
        "validation_requests": Param(48, int, "peticiones de cada carga (calibración y "
                                     "validación) del simulador", min=1, max=10_000,
                                     # ci: 8 calibrate on ~260 steps; the widths' errors stay
                                     # near 5 % against the 15 % criterion, as with 12
                                     by_profile={"ci": 8}),
        "validation_widths": Param([1, 2, 4, 8], int, "anchos de lote de la validación del "
                                   "simulador", min=1, max=1024, is_list=True),
        "dc_device": Param("h100-sxm", str, "GPU del simulador de centro de datos",
                           choices=("h100-sxm", "h200", "a100-80gb", "l4", "t4")),
        "dc_model": Param("llama-3.1-8b", str, "modelo del simulador de centro de datos",
                          choices=("llama-3.1-8b", "llama-2-7b", "mistral-7b-v0.3", "qwen3-0.6b")),
        "dc_requests": Param(1024, int, "peticiones simuladas", min=2, max=100_000,
                             by_profile={"ci": 384}),
        "dc_prompt_len": Param(512, int, "tokens de prompt simulados", min=1, max=100_000),
        "dc_mean_output": Param(128, float, "media de salida simulada", min=1, max=100_000),
        "dc_caps": Param([32, 128, 512, 1536], int, "topes simulados", min=1, max=100_000,
                         is_list=True),
        "dc_max_num_seqs": Param(64, int, "ancho del lote simulado", min=1, max=4096,
                                 by_profile={"ci": 32}),
    },
)
