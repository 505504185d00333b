"""Lab ``scheduler`` (chapter 5): the token budget, chunked prefill and preemption.

1. The chunked-prefill trade-off (Sarathi-Serve): requests are decoding when a long prompt
   arrives; for each token budget, the long request's TTFT against the inter-token latency of
   the others, on the real engine and in the simulator at H100 scale.
2. Preemption by recompute: the same workload with a KV pool shrunk step by step; throughput,
   preemptions, recomputed tokens, and who pays (the latency of the preempted requests).

Step, token and preemption counts are deterministic; every time is measured in interleaved rounds
(``timing_repeats``) and a conclusion drawn from times is a ``claims.compare``. The measurement
functions run the lab; ``Findings`` holds what they measured and the claims drawn from it, and
``report`` turns the findings into the contract's body, so a notebook that measured with the
student's functions builds its contract from its own numbers (``Findings`` + ``report`` +
``assemble_contract``) and ``run`` (= measure + findings + report) serves ``run_lab``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from .. import claims
from ..engine import LLMEngine, SamplingParams, build_engine
from ..fmt import es
from ..hardware import get_device_spec
from ..loadgen import varied_workload
from ..metrics import percentile, summarize
from ..model import get_preset, load_model
from ..sim import RooflineCostModel, sim_engine
from ..timing import torch_threads
from .contract import (datasheet_sim_limitation, evidence as _ev, threads_limitation,
                       timing_limitation)
from .common import SERVED_MODELS, MODEL_DTYPE_PARAM, served_dtype
from .registry import LabParamError, LabSpec, Param


def long_prompt_arrival(engine: LLMEngine, vocab_size: int, decoders: int, decoder_prompt: int,
                        decode_tokens: int, long_prompt: int, warmup_steps: int, seed: int) -> dict:
    """``decoders`` requests start decoding; after ``warmup_steps`` steps a ``long_prompt``
    arrives. Returns the long request's TTFT (and in steps), the decoders' inter-token gaps while
    it was being prefilled, and the largest step."""
    rng = np.random.default_rng(seed)
    sp = SamplingParams(max_tokens=decode_tokens, ignore_eos=True)
    decs = [engine.add_request(rng.integers(3, vocab_size, decoder_prompt).tolist(), sp)
            for _ in range(decoders)]
    for _ in range(warmup_steps):
        engine.step(outputs=False)
    first_step = len(engine.history)
    long = engine.add_request(rng.integers(3, vocab_size, long_prompt).tolist(),
                              SamplingParams(max_tokens=4, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step(outputs=False)
    ttft_steps = next(i for i, h in enumerate(engine.history[first_step:], 1)
                      if any(e.request_id == long.request_id and e.context_len == long.num_prompt_tokens
                             for e in h.scheduled))
    window_end = long.first_token_time
    # gaps of the decoders that ended while the long prompt was in flight
    gaps = [b - a for r in decs for a, b in zip(r.token_times, r.token_times[1:])
            if long.arrival_time < b <= window_end]
    return {"ttft_s": long.ttft, "ttft_steps": ttft_steps,
            "itl_p50_s": percentile(gaps, 50), "itl_p99_s": percentile(gaps, 99),
            "itl_max_s": max(gaps) if gaps else float("nan"),
            "max_step_tokens": max(h.num_tokens for h in engine.history[first_step:])}


TIMED = ("ttft_s", "itl_p50_s", "itl_p99_s", "itl_max_s")


def _rounds(values: list, repeats: int):
    """``values`` in ``repeats`` rounds, in order in even rounds and reversed in odd ones, so a
    slow drift of the machine or a warm-up favours none of them."""
    for k in range(repeats):
        yield from (values if k % 2 == 0 else values[::-1])


def tradeoff_real(model, params: dict, seed: int, repeats: int = 1, token_fn=None) -> list[dict]:
    """The long-prompt arrival on the real engine for every budget (``token_fn``: a student's
    token split plugs in here), in ``repeats`` interleaved rounds. One row per budget: the step
    counts of the first round (every round must repeat them) and, for each timed quantity, one
    sample per round."""
    cfg = model.config
    runs: dict[int, list[dict]] = {b: [] for b in params["budgets"]}
    with torch_threads(params.get("torch_threads", 0)):
        for budget in _rounds(list(params["budgets"]), repeats):
            engine = build_engine(model, max_num_seqs=params["decoders"] + 1,
                                  max_model_len=params["max_model_len"], kv_layout="paged",
                                  max_num_batched_tokens=budget, enable_chunked_prefill=True,
                                  enable_prefix_caching=False, token_fn=token_fn)
            runs[budget].append(long_prompt_arrival(engine, cfg.vocab_size, params["decoders"],
                                                    params["decoder_prompt"], params["decode_tokens"],
                                                    params["long_prompt"], params["warmup_steps"],
                                                    seed))
    out = []
    for budget, rs in runs.items():
        counts = [(r["ttft_steps"], r["max_step_tokens"]) for r in rs]
        out.append({"budget": budget, "ttft_steps": rs[0]["ttft_steps"],
                    "max_step_tokens": rs[0]["max_step_tokens"],
                    "repeats_identical": all(c == counts[0] for c in counts),
                    **{k: [r[k] for r in rs] for k in TIMED}})
    return out


def median_rows(rows: list[dict]) -> list[dict]:
    """``tradeoff_real``'s rows with the median of each timed quantity (for tables and figures)."""
    return [{**r, **{k: float(np.median(r[k])) for k in TIMED}} for r in rows]


def tradeoff_sim(params: dict, seed: int) -> list[dict]:
    gpu, cfg = get_device_spec(params["dc_device"]), get_preset(params["dc_model"])
    cost = RooflineCostModel.from_device_spec(gpu, "bf16" if "bf16" in gpu.peak_flops else "fp16")
    max_len = params["dc_long_prompt"] + 16
    out = []
    for budget in params["dc_budgets"]:
        engine = sim_engine(cfg, cost, params["dc_decoders"] + 1, max_len,
                            max_num_batched_tokens=budget, enable_chunked_prefill=True)
        row = long_prompt_arrival(engine, cfg.vocab_size, params["dc_decoders"], 512, 256,
                                  params["dc_long_prompt"], 4, seed)
        out.append({"budget": budget, **row})
    return out


def preemption_study(model, params: dict, seed: int, victim_fn=None, repeats: int = 1) -> list[dict]:
    """The same workload with each pool size (``victim_fn``: a student's choice of victim plugs
    in here), in ``repeats`` interleaved rounds. One row per pool: the counts and tokens of the
    first round (every round must repeat them) and ``timing`` with one sample per round."""
    cfg, bs = model.config, 16
    items = varied_workload(params["pressure_requests"], 48, params["pressure_mean_output"],
                            params["max_model_len"] - 48, cfg.vocab_size, seed)
    longest = max(len(i.prompt_token_ids) + i.params.max_tokens for i in items)
    for blocks in params["pool_blocks"]:
        if blocks * bs < longest:
            raise LabParamError(f"un pool de {blocks} bloques ({blocks * bs} tokens) no cabe la "
                                f"petición más larga ({longest} tokens); use pool_blocks >= "
                                f"{-(-longest // bs)}")
    runs: dict[int, list[dict]] = {b: [] for b in params["pool_blocks"]}
    with torch_threads(params.get("torch_threads", 0)):
        for blocks in _rounds(list(params["pool_blocks"]), repeats):
            engine = build_engine(model, max_num_seqs=params["pressure_max_num_seqs"],
                                  max_model_len=params["max_model_len"], kv_layout="paged",
                                  block_size=bs, num_blocks=blocks, max_num_batched_tokens=128,
                                  enable_chunked_prefill=True, victim_fn=victim_fn)
            start = time.perf_counter()
            reqs = engine.run([(0.0, i.prompt_token_ids, i.params) for i in items])
            wall = time.perf_counter() - start
            hit = [r for r in reqs if r.num_preemptions]
            spared = [r for r in reqs if not r.num_preemptions]
            runs[blocks].append({
                "pool_blocks": blocks, "steps": len(engine.history),
                "num_preemptions": engine.scheduler.num_preemptions,
                "preempted_tokens": engine.scheduler.preempted_tokens,
                "preempted_requests": len(hit),
                "computed_tokens": sum(h.num_tokens for h in engine.history),
                "prefix_hit_tokens": engine.kv_usage()["prefix_hit_tokens"],
                "outputs": [r.output_token_ids for r in reqs],
                "timing": {"wall_s": wall, "tok_s": sum(len(r.output_token_ids) for r in reqs) / wall,
                           "e2e_preempted_mean_s": float(np.mean([r.e2e_latency for r in hit])) if hit else None,
                           "e2e_spared_mean_s": float(np.mean([r.e2e_latency for r in spared])) if spared else None,
                           "e2e_p99_s": summarize(reqs)["e2e_p99_s"]},
            })
    rows = []
    for blocks, rs in runs.items():
        first = {k: v for k, v in rs[0].items() if k != "timing"}
        same = all({k: v for k, v in r.items() if k != "timing"} == first for r in rs)
        rows.append({**first, "repeats_identical": same,
                     "timing": {k: [r["timing"][k] for r in rs] for k in rs[0]["timing"]}})
    return rows


# --- conclusions -------------------------------------------------------------------------------
def _finite_pairs(a: list, b: list) -> tuple[list[float], list[float]]:
    """The pairs where both samples exist (an empty window gives no latency)."""
    keep = [(float(x), float(y)) for x, y in zip(a, b) if x is not None and y is not None
            and np.isfinite(x) and np.isfinite(y)]
    return [x for x, _ in keep], [y for _, y in keep]


def tradeoff_verdicts(real: list[dict]) -> dict[str, claims.Claim]:
    """The chunked-prefill trade-off on this machine, smallest budget against the largest, from
    ``tradeoff_real``'s interleaved rounds: the long prompt's TTFT, and the others' median
    inter-token gap while it is computed (the median, not the p99: a p99 over the many short
    steps of a small budget catches the machine's noise spikes, one over the few gaps of a large
    budget does not, and the two would not compare like with like)."""
    lo, hi = min(real, key=lambda r: r["budget"]), max(real, key=lambda r: r["budget"])
    b_lo, b_hi = lo["budget"], hi["budget"]
    ttft_lo, ttft_hi = _finite_pairs(lo["ttft_s"], hi["ttft_s"])
    itl_hi, itl_lo = _finite_pairs(hi["itl_p50_s"], lo["itl_p50_s"])
    out = {"ttft": claims.compare(
        ttft_lo, ttft_hi, what=f"TTFT del prompt largo con {b_lo} tokens por paso / con {b_hi}",
        higher=f"con pasos de {b_lo} tokens el prompt largo tarda más en dar su primer token",
        lower=f"con pasos de {b_lo} tokens el prompt largo da antes su primer token")}
    if itl_lo:
        out["itl"] = claims.compare(
            itl_hi, itl_lo, what=f"ITL mediano de las peticiones en curso mientras se calcula el "
                                 f"prompt largo, con {b_hi} tokens por paso / con {b_lo}",
            higher=f"los pasos de {b_hi} tokens las retrasan más: trocear en pasos de {b_lo} las "
                   f"protege en esta máquina",
            lower=f"con pasos de {b_hi} tokens esperan menos: aquí trocear en pasos de {b_lo} no "
                  f"las protege")
    return out


def preemption_verdicts(pressure: list[dict]) -> dict[str, claims.Claim]:
    """What a small pool costs on this machine, from ``preemption_study``'s interleaved rounds:
    tokens/s with the smallest pool against the largest, and (when the smallest pool preempted
    some requests and spared others) the end-to-end latency of the preempted against the spared."""
    big = max(pressure, key=lambda r: r["pool_blocks"])
    tight = min(pressure, key=lambda r: r["pool_blocks"])
    out = {"throughput": claims.compare(
        tight["timing"]["tok_s"], big["timing"]["tok_s"],
        what=f"tokens/s con {tight['pool_blocks']} bloques / con {big['pool_blocks']}",
        higher="con el pool pequeño el motor genera más tokens por segundo en esta máquina",
        lower="con el pool pequeño el motor genera menos tokens por segundo en esta máquina")}
    pre, spared = _finite_pairs(tight["timing"]["e2e_preempted_mean_s"],
                                tight["timing"]["e2e_spared_mean_s"])
    if pre:
        out["latency"] = claims.compare(
            pre, spared, what=f"latencia media de extremo a extremo de las peticiones expulsadas / "
                              f"de las nunca expulsadas, con {tight['pool_blocks']} bloques",
            higher="las expulsadas tardan más: pagan la espera en la cola y el recálculo",
            lower="las expulsadas tardan menos que las demás en esta ejecución")
    return out


def verdicts(real: list[dict], pressure: list[dict]) -> dict[str, claims.Claim]:
    """Every timed conclusion of the lab: ``ttft``, ``itl``, ``throughput`` and ``latency``
    (the last two only when their samples exist)."""
    return {**tradeoff_verdicts(real), **preemption_verdicts(pressure)}


def sim_sentence(params: dict, sim: list[dict]) -> str:
    """The simulated trade-off, smallest budget against the largest, with the branch its
    (deterministic) numbers support."""
    lo, hi = min(sim, key=lambda r: r["budget"]), max(sim, key=lambda r: r["budget"])
    head = (f"Simulado ({params['dc_model']} en {params['dc_device']}, {params['dc_decoders']} "
            f"peticiones en curso y un prompt de {params['dc_long_prompt']} tokens), al pasar de "
            f"{lo['budget']} a {hi['budget']} tokens por paso")
    itl_x = hi["itl_p99_s"] / lo["itl_p99_s"]
    itl = (f"el ITL p99 de las peticiones en curso pasa de {es(1e3 * lo['itl_p99_s'], 1)} ms a "
           f"{es(1e3 * hi['itl_p99_s'], 1)} ms")
    itl += (f", más de un orden de magnitud ({es(itl_x, 0)} veces)" if itl_x >= 10 else
            f" ({es(itl_x, 1)} veces)" if itl_x > 1 else ": no sube")
    ttft = (f"el TTFT del prompt largo, de {es(1e3 * lo['ttft_s'], 0)} ms a "
            f"{es(1e3 * hi['ttft_s'], 0)} ms")
    ttft += ": baja" if hi["ttft_s"] < lo["ttft_s"] else ": no baja"
    return f"{head}, {itl}, y {ttft}."


def preemption_sentence(pressure: list[dict]) -> str:
    """The counts of the smallest pool against the largest, read right for any value."""
    big = max(pressure, key=lambda r: r["pool_blocks"])
    tight = min(pressure, key=lambda r: r["pool_blocks"])
    if tight["num_preemptions"] == 0:
        return f"Con {tight['pool_blocks']} bloques no hubo ninguna expulsión."
    extra = tight["computed_tokens"] / big["computed_tokens"] - 1
    more = (f"el motor calculó un {es(100 * extra, 0)} % más de tokens que con {big['pool_blocks']} "
            f"bloques" if extra > 0 else
            f"el motor no calculó más tokens que con {big['pool_blocks']} bloques (la caché de "
            f"prefijos devolvió lo expulsado)")
    n, k = tight["num_preemptions"], tight["preempted_requests"]
    return (f"Con {tight['pool_blocks']} bloques hubo {n} {'expulsión' if n == 1 else 'expulsiones'} "
            f"de {k} {'petición' if k == 1 else 'peticiones'} y {tight['preempted_tokens']} tokens "
            f"tirados para recalcular: {more}.")


def same_tokens_sentence(same: bool) -> str:
    return ("Todas las peticiones terminaron con los mismos tokens con cualquier pool." if same else
            "Las peticiones NO terminaron con los mismos tokens con todos los pools: la expulsión "
            "tiene un error.")


@dataclass(frozen=True)
class Findings:
    """What the lab found, between its measurements and its report: the three measurements
    (``tradeoff_real``, ``tradeoff_sim`` and ``preemption_study`` rows) and the claims drawn
    from them, by name (``itl`` and ``latency`` are None when their samples do not exist)."""

    model_name: str
    params: dict
    real: list[dict]
    sim: list[dict]
    pressure: list[dict]
    ttft: claims.Claim
    itl: claims.Claim | None
    throughput: claims.Claim
    latency: claims.Claim | None

    @classmethod
    def from_measurements(cls, model_name: str, params: dict, real: list[dict], sim: list[dict],
                          pressure: list[dict],
                          found: dict[str, claims.Claim] | None = None) -> Findings:
        """The findings of the three measurements. ``found``: the notebook's own
        ``verdicts(real, pressure)`` (computed here when not given), so the page and its
        contract carry the same claims."""
        v = verdicts(real, pressure) if found is None else found
        return cls(model_name, params, real, sim, pressure, ttft=v["ttft"], itl=v.get("itl"),
                   throughput=v["throughput"], latency=v.get("latency"))

    @property
    def smallest_budget(self) -> dict:
        return min(self.real, key=lambda r: r["budget"])

    @property
    def largest_budget(self) -> dict:
        return max(self.real, key=lambda r: r["budget"])

    @property
    def smallest_pool(self) -> dict:
        return min(self.pressure, key=lambda r: r["pool_blocks"])

    @property
    def outputs_identical(self) -> bool:
        """Whether every pool size gave every request the same tokens."""
        return all(p["outputs"] == self.pressure[0]["outputs"] for p in self.pressure)

    @property
    def rounds(self) -> int:
        return len(self.real[0]["ttft_s"])


def _results(f: Findings) -> dict:
    """The contract's ``results``: counts, timings per round (and their medians), the simulated
    rows and the preemption study."""
    real, pressure = f.real, f.pressure
    return {
        "model": {"name": f.model_name},
        "tradeoff": {"budgets": [r["budget"] for r in real],
                     "ttft_steps": [r["ttft_steps"] for r in real],
                     "max_step_tokens": [r["max_step_tokens"] for r in real],
                     "repeats_identical": all(r["repeats_identical"] for r in real)},
        "tradeoff_timing": {"rounds": f.rounds,
                            **{k: [claims.as_inputs(r[k]) for r in real] for k in TIMED},
                            **{f"{k}_median": [float(np.median(r[k])) for r in real] for k in TIMED}},
        "tradeoff_sim": {"device": f.params["dc_device"], "model": f.params["dc_model"],
                         "rows": [{k: r[k] for k in ("budget", "ttft_s", "ttft_steps", "itl_p99_s",
                                                     "max_step_tokens")} for r in f.sim]},
        "preemption": {"outputs_identical": f.outputs_identical,
                       "repeats_identical": all(p["repeats_identical"] for p in pressure),
                       "rows": [{k: p[k] for k in ("pool_blocks", "steps", "num_preemptions",
                                                   "preempted_tokens", "preempted_requests",
                                                   "computed_tokens", "prefix_hit_tokens")}
                                for p in pressure]},
        "preemption_timing": [{"pool_blocks": p["pool_blocks"], **p["timing"]} for p in pressure],
    }


def _evidence(f: Findings) -> list[dict]:
    """The contract's ``evidence``: the step counts, the trade-off's claims, the simulated
    trade-off, the preemption counts and the pool's claims, in that order."""
    lo, hi = f.smallest_budget, f.largest_budget
    return [
        _ev(f"En {f.model_name}, con presupuesto de {lo['budget']} tokens el prompt largo tarda "
            f"{lo['ttft_steps']} pasos en dar su primer token; con {hi['budget']}, "
            f"{hi['ttft_steps']}.", lo["ttft_steps"], "pasos"),
        *[c.evidence("x") for c in (f.ttft, f.itl) if c is not None],
        _ev(sim_sentence(f.params, f.sim), f.sim[0]["ttft_s"], "s"),
        _ev(preemption_sentence(f.pressure) + " " + same_tokens_sentence(f.outputs_identical),
            f.smallest_pool["num_preemptions"], "expulsiones"),
        *[c.evidence("x") for c in (f.throughput, f.latency) if c is not None],
    ]


def _limitations(f: Findings) -> list[str]:
    return [
        f"El modelo medido ({f.model_name}) es pequeño: el coste de su prefill frente a un paso de "
        "decodificación no es el de un modelo grande (véase la simulación).",
        datasheet_sim_limitation(),
        "La expulsión es por recálculo; vLLM v0 también podía copiar bloques a la CPU (swap).",
        timing_limitation(f.rounds),
        threads_limitation(f.params.get("torch_threads", 0)),
    ]


def report(f: Findings) -> dict:
    """The contract's body from the lab's findings."""
    return {"environment": {"model": f.model_name}, "results": _results(f),
            "evidence": _evidence(f), "limitations": _limitations(f),
            "volatile_fields": ["results.tradeoff_timing", "results.preemption_timing"]}


def check_params(params: dict, config) -> None:
    """Spanish errors for parameters the model cannot serve."""
    if params["max_model_len"] > config.max_position_embeddings:
        raise LabParamError(f"max_model_len={params['max_model_len']} supera las "
                            f"{config.max_position_embeddings} posiciones de {config.name}")
    if params["long_prompt"] + 4 > params["max_model_len"]:
        raise LabParamError(f"long_prompt + 4 debe caber en max_model_len={params['max_model_len']}")


def run(seed: int, profile: str, params: dict, device: torch.device) -> dict:
    model = load_model(params["model"], seed, device,
                       dtype=served_dtype(params["model_dtype"], device))
    check_params(params, model.config)
    repeats = params["timing_repeats"]
    real = tradeoff_real(model, params, seed, repeats)
    sim = tradeoff_sim(params, seed)
    pressure = preemption_study(model, params, seed, repeats=repeats)
    return report(Findings.from_measurements(model.config.name, params, real, sim, pressure))


SPEC = LabSpec(
    kind="scheduler",
    title="El planificador",
    chapter=5,
    folder="labs/05-scheduler",
    ci_budget_s=150,
    run=run,
    params={
        "model": Param("tiny-es", str, "modelo servido", choices=SERVED_MODELS),
        "model_dtype": MODEL_DTYPE_PARAM,
        "max_model_len": Param(512, int, "tokens por petición como máximo", min=16, max=8192),
        "decoders": Param(8, int, "peticiones decodificando cuando llega el prompt largo", min=1,
                          max=1024, by_profile={"ci": 6}),
        "decoder_prompt": Param(16, int, "prompt de cada una de esas peticiones", min=1, max=4096),
        "decode_tokens": Param(64, int, "tokens que genera cada una", min=2, max=4096,
                               by_profile={"ci": 48}),
        "long_prompt": Param(448, int, "tokens del prompt largo", min=2, max=100_000,
                             by_profile={"ci": 384}),
        "warmup_steps": Param(4, int, "pasos antes de que llegue el prompt largo", min=1, max=1000),
        "timing_repeats": Param(5, int, "rondas intercaladas cronometradas (presupuestos y pools)",
                                min=1, max=100),
        "torch_threads": Param(0, int, "hilos de torch mientras se miden los tiempos (0: los que "
                               "elija torch)", min=0, max=256, by_profile={"ci": 1}),
        "budgets": Param([16, 32, 64, 128, 512], int, "presupuestos de tokens por paso", min=1,
                         max=100_000, is_list=True),
        "dc_device": Param("h100-sxm", str, "GPU simulada", choices=("h100-sxm", "h200", "a100-80gb", "l4")),
        "dc_model": Param("llama-3.1-8b", str, "modelo simulado",
                          choices=("llama-3.1-8b", "llama-2-7b", "mistral-7b-v0.3")),
        "dc_decoders": Param(32, int, "peticiones decodificando (simulado)", min=1, max=4096),
        "dc_long_prompt": Param(8192, int, "prompt largo simulado", min=2, max=131_072),
        "dc_budgets": Param([256, 512, 1024, 2048, 4096, 8208], int, "presupuestos simulados",
                            min=1, max=1_000_000, is_list=True),
        "pressure_requests": Param(32, int, "peticiones del estudio de expulsión", min=2,
                                   max=10_000, by_profile={"ci": 20}),
        "pressure_mean_output": Param(64, float, "media de salida del estudio de expulsión", min=1,
                                      max=10_000, by_profile={"ci": 40}),
        "pressure_max_num_seqs": Param(16, int, "ancho del lote del estudio de expulsión", min=1,
                                       max=1024),
        "pool_blocks": Param([256, 64, 40, 32], int, "tamaños del pool (bloques de 16)", min=1,
                             max=1_000_000, is_list=True, by_profile={"ci": [256, 32, 20]}),
    },
)
