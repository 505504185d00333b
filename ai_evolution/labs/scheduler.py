"""Lab ``scheduler`` (chapter 5): the token budget, chunked prefill and preemption.

1. The chunked-prefill trade-off (Sarathi-Serve): requests are decoding when a long prompt
   arrives; for each token budget, the long request's TTFT against the inter-token latency of
   the others, on the real engine and in the simulator at H100 scale.
2. Preemption by recompute: the same workload with a KV pool shrunk step by step; throughput,
   preemptions, recomputed tokens, and who pays (the latency of the preempted requests).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ..engine import LLMEngine, SamplingParams, Scheduler, build_engine
from ..fmt import es
from ..hardware import get_device_spec
from ..metrics import percentile, summarize
from ..model import get_preset
from ..sim import RooflineCostModel, SimExecutor
from .contract import datasheet_sim_limitation, evidence as _ev, timing_limitation
from .continuous_batching import MODELS, load_model
from .paged_attention import varied_workload
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
        engine.step()
    first_step = len(engine.history)
    long = engine.add_request(rng.integers(3, vocab_size, long_prompt).tolist(),
                              SamplingParams(max_tokens=4, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
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


def tradeoff_real(model, params: dict, seed: int) -> list[dict]:
    cfg, out = model.config, []
    for budget in params["budgets"]:
        engine = build_engine(model, max_num_seqs=params["decoders"] + 1,
                              max_model_len=params["max_model_len"], kv_layout="paged",
                              max_num_batched_tokens=budget, enable_chunked_prefill=True,
                              enable_prefix_caching=False)
        row = long_prompt_arrival(engine, cfg.vocab_size, params["decoders"], params["decoder_prompt"],
                                  params["decode_tokens"], params["long_prompt"], params["warmup_steps"],
                                  seed)
        out.append({"budget": budget, **row})
    return out


def tradeoff_sim(params: dict, seed: int) -> list[dict]:
    gpu, cfg = get_device_spec(params["dc_device"]), get_preset(params["dc_model"])
    cost = RooflineCostModel.from_device_spec(gpu, "bf16" if "bf16" in gpu.peak_flops else "fp16")
    max_len = params["dc_long_prompt"] + 16
    out = []
    for budget in params["dc_budgets"]:
        engine = LLMEngine(Scheduler(params["dc_decoders"] + 1, max_len, "continuous",
                                     max_num_batched_tokens=budget, enable_chunked_prefill=True),
                           SimExecutor(cfg, cost, "bf16"), cfg.vocab_size)
        row = long_prompt_arrival(engine, cfg.vocab_size, params["dc_decoders"], 512, 256,
                                  params["dc_long_prompt"], 4, seed)
        out.append({"budget": budget, **row})
    return out


def preemption_study(model, params: dict, seed: int, victim_fn=None) -> list[dict]:
    cfg, bs = model.config, 16
    items = varied_workload(params["pressure_requests"], 48, params["pressure_mean_output"],
                            params["max_model_len"] - 48, cfg.vocab_size, seed)
    longest = max(len(i.prompt_token_ids) + i.params.max_tokens for i in items)
    rows = []
    for blocks in params["pool_blocks"]:
        if blocks * bs < longest:
            raise LabParamError(f"un pool de {blocks} bloques ({blocks * bs} tokens) no cabe la "
                                f"petición más larga ({longest} tokens); use pool_blocks >= "
                                f"{-(-longest // bs)}")
        engine = build_engine(model, max_num_seqs=params["pressure_max_num_seqs"],
                              max_model_len=params["max_model_len"], kv_layout="paged",
                              block_size=bs, num_blocks=blocks, max_num_batched_tokens=128,
                              enable_chunked_prefill=True, victim_fn=victim_fn)
        start = time.perf_counter()
        reqs = engine.run([(0.0, i.prompt_token_ids, i.params) for i in items])
        wall = time.perf_counter() - start
        hit = [r for r in reqs if r.num_preemptions]
        spared = [r for r in reqs if not r.num_preemptions]
        rows.append({
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
    return rows


def run(seed: int, profile: str, params: dict, device: torch.device) -> dict:
    model = load_model(params["model"], seed, device)
    cfg = model.config
    if params["max_model_len"] > cfg.max_position_embeddings:
        raise LabParamError(f"max_model_len={params['max_model_len']} supera las "
                            f"{cfg.max_position_embeddings} posiciones de {cfg.name}")
    if params["long_prompt"] + 4 > params["max_model_len"]:
        raise LabParamError(f"long_prompt + 4 debe caber en max_model_len={params['max_model_len']}")
    real = tradeoff_real(model, params, seed)
    sim = tradeoff_sim(params, seed)
    pressure = preemption_study(model, params, seed)
    exact = all(p["outputs"] == pressure[0]["outputs"] for p in pressure)
    results = {
        "model": {"name": cfg.name},
        "tradeoff": {"budgets": params["budgets"],
                     "ttft_steps": [r["ttft_steps"] for r in real],
                     "max_step_tokens": [r["max_step_tokens"] for r in real]},
        "tradeoff_timing": {k: [r[k] for r in real] for k in ("ttft_s", "itl_p50_s", "itl_p99_s", "itl_max_s")},
        "tradeoff_sim": {"device": params["dc_device"], "model": params["dc_model"],
                         "rows": [{k: r[k] for k in ("budget", "ttft_s", "ttft_steps", "itl_p99_s",
                                                     "max_step_tokens")} for r in sim]},
        "preemption": {"outputs_identical": exact,
                       "rows": [{k: p[k] for k in ("pool_blocks", "steps", "num_preemptions",
                                                   "preempted_tokens", "preempted_requests",
                                                   "computed_tokens", "prefix_hit_tokens")}
                                for p in pressure]},
        "preemption_timing": [{"pool_blocks": p["pool_blocks"], **p["timing"]} for p in pressure],
    }
    lo, hi = sim[0], sim[-1]
    tight = pressure[-1]
    evidence = [
        _ev(f"En {cfg.name}, con presupuesto de {real[0]['budget']} tokens el prompt largo tarda "
            f"{real[0]['ttft_steps']} pasos en dar su primer token; con {real[-1]['budget']}, "
            f"{real[-1]['ttft_steps']}.", real[0]["ttft_steps"], "pasos"),
        _ev(f"Medido: TTFT del prompt largo {es(1e3 * real[0]['ttft_s'], 1)} ms con presupuesto "
            f"{real[0]['budget']} y {es(1e3 * real[-1]['ttft_s'], 1)} ms con {real[-1]['budget']}; "
            f"ITL p99 de las demás {es(1e3 * real[0]['itl_p99_s'], 1)} ms y "
            f"{es(1e3 * real[-1]['itl_p99_s'], 1)} ms.", real[-1]["itl_p99_s"], "s", "measured", True),
        _ev(f"Simulado ({params['dc_model']} en {params['dc_device']}): con presupuesto {lo['budget']} "
            f"el TTFT del prompt de {params['dc_long_prompt']} tokens es {es(1e3 * lo['ttft_s'], 1)} ms "
            f"y el ITL p99 {es(1e3 * lo['itl_p99_s'], 1)} ms; con {hi['budget']}, "
            f"{es(1e3 * hi['ttft_s'], 1)} ms y {es(1e3 * hi['itl_p99_s'], 1)} ms.", lo["ttft_s"], "s"),
        _ev(f"Con {tight['pool_blocks']} bloques hubo {tight['num_preemptions']} expulsiones y "
            f"{tight['preempted_tokens']} tokens recalculados; todas las peticiones terminaron con "
            f"los mismos tokens que con el pool mayor: {'sí' if exact else 'no'}.",
            tight["num_preemptions"], "expulsiones"),
    ]
    limitations = [
        f"El modelo medido ({cfg.name}) es pequeño: su prefill de {params['long_prompt']} tokens "
        "cuesta pocos pasos de decodificación; en un modelo grande la diferencia es mayor.",
        datasheet_sim_limitation(),
        "La expulsión es por recálculo; vLLM v0 también podía copiar bloques a la CPU (swap).",
        timing_limitation(1),
    ]
    return {"environment": {"model": cfg.name}, "results": results, "evidence": evidence,
            "limitations": limitations,
            "volatile_fields": ["results.tradeoff_timing", "results.preemption_timing"]}


SPEC = LabSpec(
    kind="scheduler",
    title="El planificador",
    chapter=5,
    folder="labs/05-scheduler",
    run=run,
    params={
        "model": Param("tiny-es", str, "modelo servido", choices=MODELS),
        "max_model_len": Param(512, int, "tokens por petición como máximo", min=16, max=8192),
        "decoders": Param(8, int, "peticiones decodificando cuando llega el prompt largo", min=1,
                          max=1024, by_profile={"ci": 6}),
        "decoder_prompt": Param(16, int, "prompt de cada una de esas peticiones", min=1, max=4096),
        "decode_tokens": Param(64, int, "tokens que genera cada una", min=2, max=4096,
                               by_profile={"ci": 48}),
        "long_prompt": Param(448, int, "tokens del prompt largo", min=2, max=100_000,
                             by_profile={"ci": 384}),
        "warmup_steps": Param(4, int, "pasos antes de que llegue el prompt largo", min=1, max=1000),
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
                                      max=10_000),
        "pressure_max_num_seqs": Param(16, int, "ancho del lote del estudio de expulsión", min=1,
                                       max=1024),
        "pool_blocks": Param([256, 64, 40, 32], int, "tamaños del pool (bloques de 16)", min=1,
                             max=1_000_000, is_list=True, by_profile={"ci": [256, 48, 32]}),
    },
)
