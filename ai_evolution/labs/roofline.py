"""Lab ``roofline`` (chapter 1): decode reads every weight per token, so bandwidth sets its pace.

Measured on the reader's device, in one run:
1. the machine: read bandwidth and matmul peak (probes), hence its ridge point;
2. prefill vs decode: tokens/s of a long prompt against tokens/s of batch-1 decode;
3. the bandwidth floor of a decode step (bytes it must read / measured bandwidth) and the
   efficiency floor / measured step;
4. the batching curve: decode step time for 1, 2, 4, ... sequences against the roofline
   prediction calibrated on the batch-1 step, and the first batch where they part.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ..fmt import es
from ..hardware import (default_dtype, get_device_spec, measure_bandwidth, measure_matmul,
                        synchronize)
from ..model import get_preset, load_pretrained, random_model
from ..model.attention import ContiguousKVCache
from ..sim import (RooflineCostModel, decode_step_cost, departure_batch, ridge_point, step_cost,
                   time_floor_s)
from ..timing import step_times
from .contract import evidence as _ev, timing_limitation
from .registry import LabParamError, LabSpec, Param

MODELS = ("cpu-200m", "smollm2-135m", "qwen3-0.6b", "qwen2.5-0.5b", "tiny-es")


def load_model(name: str, seed: int, dtype: torch.dtype, device: torch.device):
    if name == "tiny-es":
        return load_pretrained(name, dtype=dtype, device=device)
    return random_model(get_preset(name), seed=seed, dtype=dtype, device=device).eval()


def prefill_seconds(model, prompt: list[int], repeats: int) -> float:
    """Median time to run a prompt through the model into a fresh cache (logits of the last)."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt], device=device)
    times = []
    with torch.inference_mode():
        for r in range(repeats + 1):
            cache = ContiguousKVCache(model.config, 1, len(prompt),
                                      dtype=next(model.parameters()).dtype, device=device)
            synchronize(device)
            start = time.perf_counter()
            model.logits(model.hidden_states(ids, kv_cache=cache)[:, -1])
            synchronize(device)
            if r:  # the first run is a warm-up
                times.append(time.perf_counter() - start)
    return float(np.median(times))


def run(seed: int, profile: str, params: dict, device: torch.device) -> dict:
    dtype = default_dtype(device) if params["dtype"] == "auto" else getattr(torch, params["dtype"])
    dtype_name = str(dtype).removeprefix("torch.")
    reps = params["repeats"]
    # --- 1. the machine ------------------------------------------------------------------------
    bw = measure_bandwidth(device, kind="read", dtype=dtype, repeats=reps, progress=False)
    mm = measure_matmul(device, dtype=dtype, repeats=reps, progress=False)
    bw_bytes, peak = bw.median * 1e9, mm.median * 1e9
    # --- 2. the model, prefill vs decode -------------------------------------------------------
    model = load_model(params["model"], seed, dtype, device)
    cfg = model.config
    ctx, n_dec = params["context_len"], params["decode_tokens"]
    longest = max(params["prompt_len"], ctx + n_dec)
    if longest > cfg.max_position_embeddings:
        raise LabParamError(f"la secuencia más larga ({longest} tokens) supera las "
                            f"{cfg.max_position_embeddings} posiciones del modelo {cfg.name}")
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, cfg.vocab_size, (params["prompt_len"],), generator=gen).tolist()
    t_prefill = prefill_seconds(model, prompt, reps)
    # --- 3./4. decode step per batch size ------------------------------------------------------
    batches = params["batch_sizes"]
    measured = []
    for b in batches:
        prompts = torch.randint(3, cfg.vocab_size, (b, ctx), generator=gen).tolist()
        steps = step_times(model, prompts, n_dec, cache="contiguous", repeats=reps)
        measured.append(float(np.median(steps[1:])))  # step 0 holds the prefill
    mid_ctx = ctx + n_dec // 2
    costs = [decode_step_cost(cfg, b, mid_ctx, dtype) for b in batches]
    machine = RooflineCostModel(bw_bytes, peak, name="medida")
    fitted = machine.calibrated(costs[0], measured[0])
    predicted = [fitted.step_time_s(c) for c in costs]
    part = departure_batch(batches, measured, predicted, params["tolerance"])
    floor_b1 = time_floor_s(costs[0].bytes, bw_bytes)
    eff = floor_b1 / measured[0]
    prefill_tps = params["prompt_len"] / t_prefill
    decode_tps = 1 / measured[0]
    # --- datasheet comparison (computed from cited numbers) -----------------------------------
    h100 = get_device_spec("h100-sxm")
    l31 = decode_step_cost(get_preset("llama-3.1-8b"), 1, 0, "bf16")
    h100_floor_ms = time_floor_s(l31.bytes, h100.bandwidth_bytes_per_s) * 1e3
    h100_ridge = ridge_point(h100.peak_flops["bf16"], h100.bandwidth_bytes_per_s)
    prefill_cost = step_cost(cfg, [params["prompt_len"]], [params["prompt_len"]], dtype)

    results = {
        "machine": {"bandwidth_read_gbps": bw.median, "bandwidth_samples_gbps": list(bw.samples),
                    "matmul_gflops": mm.median, "ridge_flop_per_byte": peak / bw_bytes},
        "model": {"name": cfg.name, "dtype": dtype_name, "bytes_per_decode_step": costs[0].bytes,
                  "flops_per_decode_token": costs[0].flops,
                  "intensity_decode_b1": costs[0].intensity,
                  "intensity_prefill": prefill_cost.intensity},
        "prefill_decode": {"prompt_len": params["prompt_len"], "prefill_s": t_prefill,
                           "prefill_tokens_per_s": prefill_tps, "decode_tokens_per_s": decode_tps,
                           "ratio": prefill_tps / decode_tps},
        "floor": {"floor_b1_ms": floor_b1 * 1e3, "measured_b1_ms": measured[0] * 1e3,
                  "efficiency": eff, "fitted_overhead_ms": fitted.overhead_s * 1e3},
        "batching": {"batch_sizes": batches, "context_len": mid_ctx,
                     "measured_ms": [m * 1e3 for m in measured],
                     "predicted_ms": [p * 1e3 for p in predicted],
                     "tokens_per_s": [b / m for b, m in zip(batches, measured)],
                     "departure_batch": part, "tolerance": params["tolerance"]},
        "datasheet": {"h100_llama31_8b_bf16_floor_ms": h100_floor_ms,
                      "h100_bf16_ridge_flop_per_byte": h100_ridge},
    }
    evidence = [
        _ev(f"Ancho de banda de lectura medido: {es(bw.median, 1)} GB/s (mediana de {reps}); "
            f"matmul {dtype_name}: {es(mm.median, 0)} GFLOP/s; punto de cresta "
            f"{es(peak / bw_bytes, 1)} FLOP/byte.", bw.median, "GB/s", "measured", True),
        _ev(f"Un paso de decodificación de {cfg.name} en {dtype_name} lee "
            f"{es(costs[0].bytes / 1e6, 1)} MB y hace {es(costs[0].intensity, 2)} FLOP/byte.",
            costs[0].bytes, "B"),
        _ev(f"Suelo de ancho de banda: {es(floor_b1 * 1e3, 2)} ms por token; medido: "
            f"{es(measured[0] * 1e3, 2)} ms; eficiencia {es(100 * eff, 0)} %.", eff, "fracción",
            "measured", True),
        _ev(f"Prefill de {params['prompt_len']} tokens: {es(prefill_tps, 0)} tokens/s; "
            f"decodificación con lote 1: {es(decode_tps, 1)} tokens/s "
            f"({es(prefill_tps / decode_tps, 1)} veces menos).", prefill_tps / decode_tps, "x",
            "measured", True),
        _ev("La curva de lotes se separa de la predicción del roofline (más de "
            f"{es(100 * params['tolerance'], 0)} %) en el lote "
            f"{part if part is not None else 'ninguno de los medidos'}.",
            part if part is not None else "ninguno", "secuencias", "measured", True),
        _ev(f"Con la hoja de datos de la H100 SXM ({es(h100.bandwidth_bytes_per_s / 1e12, 2)} "
            f"TB/s), Llama-3.1-8B en bf16 tiene un suelo de {es(h100_floor_ms, 1)} ms por token; "
            f"su punto de cresta es {es(h100_ridge, 0)} FLOP/byte.", h100_floor_ms, "ms", "cited"),
    ]
    limitations = [
        f"Pesos aleatorios ({cfg.name}): el coste no depende de los valores, pero el texto generado "
        "no significa nada.",
        "El ancho de banda se mide con una reducción (torch.sum); un producto matriz-vector frío "
        "puede leer algo más lento, así que la eficiencia no llega al 100 % aunque no haya "
        "sobrecarga.",
        timing_limitation(reps),
        "La predicción usa el pico de una matmul cuadrada grande; las matmul con pocas filas de la "
        "decodificación no lo alcanzan, y eso es parte de lo que la curva muestra.",
    ]
    return {"environment": {"model": cfg.name, "dtype": dtype_name}, "results": results,
            "evidence": evidence, "limitations": limitations,
            "volatile_fields": ["results.machine", "results.prefill_decode", "results.floor",
                                "results.batching.measured_ms", "results.batching.predicted_ms",
                                "results.batching.tokens_per_s", "results.batching.departure_batch"]}


SPEC = LabSpec(
    kind="roofline",
    title="Prefill y decodificación",
    chapter=1,
    folder="labs/01-prefill-decode",
    run=run,
    params={
        "model": Param("cpu-200m", str, "modelo medido (pesos aleatorios salvo tiny-es)",
                       choices=MODELS, by_profile={"gpu": "qwen3-0.6b"}),
        "dtype": Param("auto", str, "dtype del modelo (auto: fp32 en CPU, bf16/fp16 en GPU)",
                       choices=("auto", "float32", "float16", "bfloat16")),
        "prompt_len": Param(512, int, "tokens del prompt de prefill", min=8, max=8192,
                            by_profile={"ci": 256, "gpu": 2048}),
        "context_len": Param(64, int, "tokens de contexto de cada secuencia en la curva de lotes",
                             min=1, max=8192),
        "decode_tokens": Param(24, int, "tokens generados por medición de decodificación",
                               min=3, max=1024, by_profile={"ci": 10, "gpu": 48}),
        "batch_sizes": Param([1, 2, 4, 8, 16, 32], int, "tamaños de lote de la curva", min=1,
                             max=1024, is_list=True,
                             by_profile={"ci": [1, 2, 4, 8, 16], "gpu": [1, 2, 4, 8, 16, 32, 64, 128]}),
        "repeats": Param(5, int, "repeticiones de cada medición", min=1, max=50,
                         by_profile={"ci": 2}),
        "tolerance": Param(0.25, float, "separación relativa que cuenta como «se separa»",
                           min=0.0, max=10.0),
    },
)
