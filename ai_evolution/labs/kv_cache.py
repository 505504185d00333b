"""Lab ``kv_cache`` (chapter 2): what the KV cache costs in bytes and what it saves in time.

1. Arithmetic (computed): KV bytes per token for real configurations, MHA vs GQA vs MQA, and
   how many sequences fit on a GPU after the weights (the worked examples of the chapter).
2. The shipped model (measured): the allocated cache has exactly the predicted bytes, and greedy
   decoding gives the same tokens with and without the cache.
3. Time (measured, volatile): per-token time as the sequence grows, with and without the cache,
   and a fit of the total time to c0 + c1*n + c2*n^2.
"""

from __future__ import annotations

import numpy as np
import torch

from ..fmt import es, es_bytes
from ..generation import generate
from ..model import (MemoryBudget, dtype_bytes, get_preset, kv_bytes, kv_bytes_per_token,
                     memory_budget, param_count)
from ..model.attention import ContiguousKVCache
from ..timing import fit_growth, step_times
from .contract import evidence as _ev, timing_limitation
from .roofline import load_model as roofline_load_model
from .registry import LabParamError, LabSpec, Param

ARITHMETIC_PRESETS = ("llama-2-7b", "llama-3.1-8b", "llama-3.1-70b", "mistral-7b-v0.3",
                      "qwen3-0.6b", "smollm2-135m")
TIMING_MODELS = ("tiny-es", "smollm2-135m", "cpu-200m")


def worked_examples() -> dict[str, MemoryBudget]:
    """The chapter's worked memory budgets; the chapter and the lab both read them from here."""
    llama2, llama31 = get_preset("llama-2-7b"), get_preset("llama-3.1-8b")
    gpu24 = 24e9                      # a 24 GB consumer GPU
    nominal_7b = 7e9 * dtype_bytes("fp16")  # the back-of-the-envelope "7B x 2 bytes"
    h100, h100_utilization = 85.5e9, 0.92   # memory the runtime sees; fraction the engine takes
    return {
        "gpu24_7b": memory_budget(llama2, gpu24, max_len=4096, typical_len=512, dtype="fp16",
                                  weights_bytes=nominal_7b),
        "gpu24_7b_8kv": memory_budget(llama2.replace(num_kv_heads=8), gpu24, max_len=4096,
                                      typical_len=512, dtype="fp16", weights_bytes=nominal_7b),
        "gpu24_7b_exact": memory_budget(llama2, gpu24, max_len=4096, typical_len=512,
                                        dtype="fp16"),
        "h100_llama31_8b": memory_budget(llama31, h100, max_len=4096,
                                         utilization=h100_utilization, dtype="bf16"),
    }


def load_timing_model(name: str, seed: int, device: torch.device):
    """The shipped model with its trained weights, or a preset with seeded random weights."""
    return roofline_load_model(name, seed, torch.float32, device)


def cached_vs_uncached_logits(model, prompt: list[int], n_steps: int) -> float:
    """Largest |logit| difference between cached decode steps and an uncached forward pass."""
    device = next(model.parameters()).device
    tokens = generate(model, prompt, n_steps, cache="contiguous")[0]
    seq = torch.tensor([prompt + tokens], device=device)
    with torch.inference_mode():
        full = model(seq)[0]  # [T, V], every position recomputed from scratch
        cache = ContiguousKVCache(model.config, 1, seq.shape[1], dtype=full.dtype, device=device)
        pos = torch.arange(len(prompt), device=device)[None]
        steps = [model(seq[:, : len(prompt)], positions=pos, kv_cache=cache)[0, -1]]
        for t in range(len(prompt), seq.shape[1] - 1):
            pos = torch.tensor([[t]], device=device)
            steps.append(model(seq[:, t : t + 1], positions=pos, kv_cache=cache)[0, -1])
    cached = torch.stack(steps)
    return float((cached - full[len(prompt) - 1 : -1]).abs().max())


def run(seed: int, profile: str, params: dict, device: torch.device) -> dict:
    dtype = params["dtype"]
    ctx = params["context_len"]
    # --- 1. arithmetic -------------------------------------------------------------------------
    per_token = {n: kv_bytes_per_token(get_preset(n), dtype) for n in ARITHMETIC_PRESETS}
    llama2 = get_preset("llama-2-7b")
    variants = {f"{h} cabezas KV": kv_bytes_per_token(llama2.replace(num_kv_heads=h), "fp16")
                for h in (32, 8, 1)}
    ex = worked_examples()
    ex24, ex24_gqa, ex_h100 = ex["gpu24_7b"], ex["gpu24_7b_8kv"], ex["h100_llama31_8b"]
    worked = {
        "gpu24_7b_fp16": {"kv_bytes_per_token": ex24.kv_bytes_per_token,
                          "kv_bytes_4096": kv_bytes(llama2, 4096, dtype="fp16"),
                          "kv_budget_bytes": ex24.kv_budget_bytes,
                          "static_slots_4096": ex24.static_slots,
                          "on_demand_512": ex24.on_demand_sequences,
                          "on_demand_512_8kv": ex24_gqa.on_demand_sequences,
                          "exact_weights_on_demand_512": ex["gpu24_7b_exact"].on_demand_sequences},
        "h100_llama31_8b_bf16": {"weight_bytes": ex_h100.weight_bytes,
                                 "kv_budget_bytes": ex_h100.kv_budget_bytes,
                                 "static_slots_4096": ex_h100.static_slots},
    }
    # --- 2. the shipped (or chosen) model ------------------------------------------------------
    model = load_timing_model(params["model"], seed, device)
    cfg = model.config
    max_len = params["prompt_len"] + params["max_new_tokens"]
    if max_len > cfg.max_position_embeddings:
        raise LabParamError(
            f"prompt_len + max_new_tokens = {max_len} supera las {cfg.max_position_embeddings} "
            f"posiciones del modelo {cfg.name}; reduzca max_new_tokens a "
            f"{cfg.max_position_embeddings - params['prompt_len']} o menos")
    model_dtype = next(model.parameters()).dtype
    dtype_name = str(model_dtype).removeprefix("torch.")
    cache = ContiguousKVCache(cfg, params["batch_size"], max_len, dtype=model_dtype, device=device)
    allocated = int(cache.nbytes)
    del cache
    predicted = kv_bytes(cfg, max_len, params["batch_size"], dtype=model_dtype)
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, cfg.vocab_size, (params["prompt_len"] + 3 * i,), generator=gen).tolist()
               for i in range(params["batch_size"])]
    n_check = params["exactness_tokens"]
    with_cache = generate(model, prompts, n_check, cache="contiguous")
    without_cache = [generate(model, p, n_check, cache=None)[0] for p in prompts]
    identical = with_cache == without_cache
    logit_diff = cached_vs_uncached_logits(model, prompts[0], min(n_check, 16))
    # --- 3. time per token ---------------------------------------------------------------------
    prompt = prompts[0][: params["prompt_len"]]
    reps = params["repeats"]
    t_cached = step_times(model, prompt, params["max_new_tokens"], cache="contiguous", repeats=reps)
    t_uncached = step_times(model, prompt, params["max_new_tokens"], cache=None, repeats=reps)
    n = np.arange(1, len(t_cached) + 1)
    fit_c = fit_growth(n, np.cumsum(t_cached))
    fit_u = fit_growth(n, np.cumsum(t_uncached))
    tail = max(1, len(n) // 8)  # average the last eighth of the steps: single steps are noisy
    last_c = float(np.mean(t_cached[-tail:])) * 1e3
    last_u = float(np.mean(t_uncached[-tail:])) * 1e3
    first_c = float(np.mean(t_cached[1 : 1 + tail])) * 1e3
    first_u = float(np.mean(t_uncached[1 : 1 + tail])) * 1e3

    results = {
        "kv_bytes_per_token": per_token,
        "mha_gqa_mqa_llama2_fp16": variants,
        "worked_examples": worked,
        "model": {"name": cfg.name, "parameters": param_count(cfg), "dtype": dtype_name,
                  "kv_bytes_per_token": kv_bytes_per_token(cfg, model_dtype),
                  "cache_bytes_predicted": predicted, "cache_bytes_allocated": allocated},
        "exactness": {"prompts": len(prompts), "tokens_per_prompt": n_check,
                      "identical_greedy_tokens": identical},
        "numerics": {"max_abs_logit_diff_cached_vs_uncached": logit_diff},
        "timing": {"prompt_len": len(prompt), "step_ms_cached": (t_cached * 1e3).tolist(),
                   "step_ms_uncached": (t_uncached * 1e3).tolist(),
                   "first_steps_ms": {"cached": first_c, "uncached": first_u},
                   "last_steps_ms": {"cached": last_c, "uncached": last_u},
                   "speedup_at_end": last_u / last_c,
                   "fit_total_cached": fit_c, "fit_total_uncached": fit_u},
    }
    h100 = worked["h100_llama31_8b_bf16"]
    l31 = get_preset("llama-3.1-8b")
    evidence = [
        _ev(f"Llama-3.1-8B guarda {es_bytes(per_token['llama-3.1-8b'])} de caché KV por token en "
            f"{dtype} (2 × {l31.num_layers} capas × {l31.num_kv_heads} cabezas KV × "
            f"{l31.head_dim} × bytes por elemento).", per_token["llama-3.1-8b"], "B"),
        _ev(f"Llama-2-7B en fp16 guarda {es_bytes(variants['32 cabezas KV'])} por token, y "
            f"{es_bytes(worked['gpu24_7b_fp16']['kv_bytes_4096'])} para 4096 tokens.",
            worked["gpu24_7b_fp16"]["kv_bytes_4096"], "B"),
        _ev(f"Con 8 cabezas KV (GQA) en vez de 32, la caché por token baja de "
            f"{es_bytes(variants['32 cabezas KV'])} a {es_bytes(variants['8 cabezas KV'])}; con "
            f"1 (MQA), a {es_bytes(variants['1 cabezas KV'])}.",
            variants["32 cabezas KV"] / variants["8 cabezas KV"], "x"),
        _ev(f"En una GPU de {es(ex24.gpu_memory_bytes / 1e9, 0)} GB con un modelo 7B en fp16 "
            f"({es(ex24.weight_bytes / 1e9, 0)} GB de pesos) caben "
            f"{ex24.static_slots} ranuras contiguas de 4096 tokens, pero "
            f"{ex24.on_demand_sequences} secuencias de 512 tokens asignadas bajo demanda "
            f"({ex24_gqa.on_demand_sequences} con 8 cabezas KV).", ex24.on_demand_sequences, "secuencias"),
        _ev(f"En una H100 ({es(ex_h100.gpu_memory_bytes / 1e9, 1)} GB × "
            f"{es(ex_h100.utilization)}) Llama-3.1-8B en bf16 deja "
            f"{es_bytes(h100['kv_budget_bytes'])} para la caché: {h100['static_slots_4096']} "
            f"peticiones de 4096 tokens.", h100["static_slots_4096"], "peticiones"),
        _ev(f"La caché asignada para {cfg.name} ({params['batch_size']} secuencias × {max_len} "
            f"tokens, {dtype_name}) ocupa {allocated} bytes, "
            f"igual a la predicción de la fórmula ({predicted:.0f}).",
            allocated, "B", source="measured"),
        _ev(f"Con y sin caché, la decodificación voraz produce "
            f"{'los mismos' if identical else 'distintos'} tokens en {len(prompts)} prompts × "
            f"{n_check} tokens.", identical, "booleano", source="measured"),
        _ev(f"Diferencia máxima de logits entre la decodificación con caché y el recálculo "
            f"completo: {logit_diff:.2e} (redondeo en coma flotante).", logit_diff, "logit",
            source="measured", volatile=True),
        _ev(f"Al final de {len(n)} tokens, cada token cuesta {es(last_u)} ms sin caché y "
            f"{es(last_c)} ms con caché ({es(last_u / last_c, 1)} veces más).", last_u / last_c,
            "x", source="measured", volatile=True),
        _ev(f"En el ajuste del tiempo total a c0 + c1·n + c2·n², el término cuadrático explica "
            f"el {es(100 * fit_u['quadratic_share'], 0)} % del tiempo sin caché y el "
            f"{es(100 * fit_c['quadratic_share'], 0)} % con caché.", fit_u["quadratic_share"],
            "fracción", source="measured", volatile=True),
    ]
    limitations = [
        f"Los tiempos se midieron con el modelo {cfg.name} ({es(param_count(cfg) / 1e6, 1)} M "
        "parámetros), cuyo paso está dominado por la sobrecarga por operación, no por el ancho de "
        "banda: las cifras absolutas no se trasladan a un modelo 7B en GPU.",
        timing_limitation(reps),
        "El presupuesto de memoria ignora activaciones, buffers del framework y fragmentación; la "
        "memoria utilizable y la fracción de utilización son supuestos de entrada.",
        "La igualdad de tokens con y sin caché se comprobó en decodificación voraz y en "
        f"{dtype_name}; en fp16/bf16 un empate casi exacto de logits puede cambiar un token.",
    ]
    return {
        "environment": {"model": cfg.name, "dtype": dtype_name},
        "results": results,
        "evidence": evidence,
        "limitations": limitations,
        "volatile_fields": ["results.timing", "results.numerics"],
    }


SPEC = LabSpec(
    kind="kv_cache",
    title="La caché KV",
    chapter=2,
    folder="labs/02-kv-cache",
    run=run,
    params={
        "model": Param("tiny-es", str, "modelo de las mediciones (tiny-es: pesos entrenados; "
                       "los demás, pesos aleatorios)", choices=TIMING_MODELS),
        "dtype": Param("bf16", str, "dtype de la aritmética de memoria",
                       choices=("fp32", "fp16", "bf16", "int8")),
        "context_len": Param(4096, int, "contexto de referencia para la aritmética", min=1),
        "prompt_len": Param(16, int, "tokens del prompt medido", min=1, max=256),
        "max_new_tokens": Param(448, int, "tokens generados en la medición de tiempos", min=8,
                                max=4096, by_profile={"ci": 160, "cpu": 448, "gpu": 480}),
        "repeats": Param(3, int, "repeticiones de cada medición", min=1, max=50,
                         by_profile={"ci": 2, "cpu": 3, "gpu": 5}),
        "batch_size": Param(3, int, "prompts de la prueba de exactitud", min=1, max=64),
        "exactness_tokens": Param(24, int, "tokens comparados con y sin caché", min=1, max=512,
                                  by_profile={"ci": 16}),
    },
)
