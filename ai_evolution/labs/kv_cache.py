"""Lab ``kv_cache`` (chapter 2): what the KV cache costs in bytes and what it saves in time.

1. Arithmetic (computed): KV bytes per token for real configurations, MHA vs GQA vs MQA, and
   how many sequences fit on a GPU after the weights (the worked examples of the chapter).
2. The shipped model (measured, :func:`measure_cache`): whether the allocated cache has the
   predicted bytes, whether greedy decoding gives the same tokens with and without the cache,
   and how far apart the logits of the two paths are.
3. Time (measured, volatile, :func:`measure_timing`): per-token time as the sequence grows, with
   and without the cache, in interleaved rounds.

:class:`Findings` holds those measurements, the arithmetic and every conclusion about this
machine, computed by :mod:`ai_evolution.claims` (:func:`verdicts`); :func:`report` turns the
findings into the contract's body. ``run`` = measure + findings + report (``run_lab``, the CLI,
the grader), and the notebook calls the same functions in its own cells, so a page and its
contract come from one run.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from .. import claims
from ..fmt import es, es_bytes
from ..generation import generate
from ..model import MemoryBudget, get_preset, kv_bytes, kv_bytes_per_token, param_count
from ..model.attention import ContiguousKVCache
from ..timing import fit_growth, interleaved_step_times, torch_threads
from .contract import evidence as _ev, met_criteria_sentence, timing_limitation
from .common import (GPU_TEXT_MODEL, load_served_model, MODEL_DTYPE_PARAM, served_dtype,
                     ServedModel, TEXT_MODELS, worked_examples)
from .registry import LabParamError, LabSpec, Param

ARITHMETIC_PRESETS = ("llama-2-7b", "llama-3.1-8b", "llama-3.1-70b", "mistral-7b-v0.3",
                      "qwen3-0.6b", "smollm2-135m")
# Largest |difference| between two float32 computations of the same numbers in a different
# order that still reads as rounding: a thousand times the float32 step of a value near 10
# (a logit). A wrong cache (a missing token, a shifted position) moves values by 1e-2 to 1.
ROUNDING_LIMIT = 1e-3
# Below this many parameters (tiny-es has about 5 M) a step's time is the fixed cost of each
# operation, not the bytes it reads; a real checkpoint (Qwen2.5-0.5B: about 500 M) is not assumed so.
SMALL_MODEL_PARAMETERS = 50e6


def check_params(params: dict, config) -> None:
    """The generated sequence must fit in the model's positions."""
    max_len = params["prompt_len"] + params["max_new_tokens"]
    if max_len > config.max_position_embeddings:
        raise LabParamError(
            f"prompt_len + max_new_tokens = {max_len} supera las {config.max_position_embeddings} "
            f"posiciones del modelo {config.name}; reduzca max_new_tokens a "
            f"{config.max_position_embeddings - params['prompt_len']} o menos")


def lab_prompts(config, params: dict, seed: int) -> list[list[int]]:
    """The seeded prompts of the lab: ``batch_size`` of them, lengths ``prompt_len + 3 i``.
    The first, cut to ``prompt_len``, is the prompt of the timings."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, config.vocab_size, (params["prompt_len"] + 3 * i,), generator=gen).tolist()
            for i in range(params["batch_size"])]


def cached_vs_uncached_logits(model, prompt: list[int], n_steps: int, attn_fn=None) -> dict:
    """Largest |logit| difference between cached decode steps and an uncached forward pass, and
    the largest |logit| (the scale of the rounding)."""
    device = next(model.parameters()).device
    tokens = generate(model, prompt, n_steps, cache="contiguous", attn_fn=attn_fn)[0]
    seq = torch.tensor([prompt + tokens], device=device)
    with torch.inference_mode():
        full = model(seq)[0]  # [T, V], every position recomputed from scratch
        cache = ContiguousKVCache(model.config, 1, seq.shape[1], dtype=full.dtype, device=device)
        pos = torch.arange(len(prompt), device=device)[None]
        steps = [model(seq[:, : len(prompt)], positions=pos, kv_cache=cache, attn_fn=attn_fn)[0, -1]]
        for t in range(len(prompt), seq.shape[1] - 1):
            pos = torch.tensor([[t]], device=device)
            steps.append(model(seq[:, t : t + 1], positions=pos, kv_cache=cache,
                               attn_fn=attn_fn)[0, -1])
    cached = torch.stack(steps)
    reference = full[len(prompt) - 1 : -1]
    return {"max_abs_diff": float((cached - reference).abs().max()),
            "max_abs_logit": float(reference.abs().max()), "steps": len(steps)}


# --- measurements ------------------------------------------------------------------------------
def measure_cache(model, params: dict, prompts: list[list[int]], attn_fn=None) -> dict:
    """The cache of the real model: bytes allocated against the formula, greedy tokens with and
    without it, and the logits of both paths. ``attn_fn`` replaces the library's attention step
    in the cached path (the notebook plugs in the student's)."""
    cfg = model.config
    max_len = params["prompt_len"] + params["max_new_tokens"]
    model_dtype = next(model.parameters()).dtype
    cache = ContiguousKVCache(cfg, params["batch_size"], max_len, dtype=model_dtype,
                              device=next(model.parameters()).device)
    allocated = int(cache.nbytes)
    del cache
    n_check = params["exactness_tokens"]
    with_cache = generate(model, prompts, n_check, cache="contiguous", attn_fn=attn_fn)
    without_cache = [generate(model, p, n_check, cache=None)[0] for p in prompts]
    logits = cached_vs_uncached_logits(model, prompts[0], min(n_check, 16), attn_fn=attn_fn)
    return {
        "model": {"name": cfg.name, "parameters": param_count(cfg),
                  "dtype": str(model_dtype).removeprefix("torch."),
                  "kv_bytes_per_token": kv_bytes_per_token(cfg, model_dtype),
                  "batch_size": params["batch_size"], "max_len": max_len,
                  "cache_bytes_predicted": kv_bytes(cfg, max_len, params["batch_size"],
                                                    dtype=model_dtype),
                  "cache_bytes_allocated": allocated},
        "exactness": {"prompts": len(prompts), "tokens_per_prompt": n_check,
                      "identical_greedy_tokens": with_cache == without_cache},
        "numerics": {"max_abs_logit_diff_cached_vs_uncached": logits["max_abs_diff"],
                     "max_abs_logit": logits["max_abs_logit"], "steps": logits["steps"]},
    }


def measure_timing(model, prompt: list[int], params: dict) -> dict:
    """Per-token milliseconds of every run with and without the cache, measured in interleaved
    rounds (cached, uncached, cached, ...) after one warm-up round."""
    with torch_threads(params["torch_threads"]):
        threads = torch.get_num_threads()
        cached, uncached = interleaved_step_times(model, prompt, params["max_new_tokens"],
                                                  caches=("contiguous", None),
                                                  repeats=params["repeats"])
    return {"prompt_len": len(prompt), "torch_threads": threads,
            "runs_ms_cached": (cached * 1e3).tolist(), "runs_ms_uncached": (uncached * 1e3).tolist()}


# --- what the measurements say -----------------------------------------------------------------
def tail_steps(n_new: int) -> int:
    """The last eighth of the steps: where the two paths differ most, several steps so that one
    slow step does not decide."""
    return max(1, n_new // 8)


def timing_summary(timing: dict) -> dict:
    """Medians over the runs of each step, the cumulative time the growth fits read, and each
    run's median step over the first and last eighth."""
    runs_c = np.asarray(timing["runs_ms_cached"], dtype=np.float64)
    runs_u = np.asarray(timing["runs_ms_uncached"], dtype=np.float64)
    n_new = runs_c.shape[1]
    tail = tail_steps(n_new)
    step_c, step_u = np.median(runs_c, axis=0), np.median(runs_u, axis=0)
    return {
        "n": np.arange(1, n_new + 1), "tail": tail, "step_ms_cached": step_c,
        "step_ms_uncached": step_u,
        "total_s_cached": np.cumsum(step_c) / 1e3, "total_s_uncached": np.cumsum(step_u) / 1e3,
        "last_ms_cached": np.median(runs_c[:, -tail:], axis=1),
        "last_ms_uncached": np.median(runs_u[:, -tail:], axis=1),
        "first_ms_cached": np.median(runs_c[:, 1 : 1 + tail], axis=1),
        "first_ms_uncached": np.median(runs_u[:, 1 : 1 + tail], axis=1),
    }


def rounding_claim(diff: float, what: str, limit: float = ROUNDING_LIMIT) -> claims.Claim:
    """Is a difference between two computations of the same numbers only floating-point rounding?"""
    return claims.threshold(
        diff, limit, what=what, scale=1e6, unit="millonésimas", decimals=2,
        passed=("es redondeo en coma flotante, no una diferencia de cálculo: los dos caminos hacen "
                "las mismas operaciones en distinto orden"),
        failed=("es mayor de lo que explica el redondeo en coma flotante: los dos caminos no "
                "calculan lo mismo"))


def cache_verdicts(facts: dict) -> dict[str, claims.Claim]:
    """The conclusion about the two paths' logits (:func:`measure_cache`)."""
    return {"logits": rounding_claim(
        facts["numerics"]["max_abs_logit_diff_cached_vs_uncached"],
        "diferencia máxima de logits entre la decodificación con caché y el recálculo completo")}


def timing_verdicts(timing: dict) -> dict[str, claims.Claim]:
    """The conclusions about time (:func:`measure_timing`): which path costs more per token at
    the end (paired rounds, bootstrap interval) and how each path's total time grows."""
    s = timing_summary(timing)
    n_new, tail = len(s["n"]), s["tail"]
    return {
        "speed": claims.compare(
            claims.as_inputs(s["last_ms_uncached"]), claims.as_inputs(s["last_ms_cached"]),
            what=(f"tiempo por token sin caché entre el tiempo con caché, en los últimos {tail} "
                  f"de {n_new} tokens"),
            higher="sin caché cada token cuesta más que con caché",
            lower="sin caché cada token cuesta menos que con caché: aquí la caché no ahorra tiempo"),
        "growth_uncached": claims.growth(
            s["n"], s["total_s_uncached"], what="tiempo total de generación sin caché",
            linear=("crece de forma casi lineal: en este rango de longitudes no se distingue el "
                    "recálculo de la secuencia del coste fijo de cada paso"),
            between=("crece algo más rápido que lineal, sin llegar a cuadrático: el recálculo de "
                     "la secuencia ya se nota, sin dominar el coste"),
            superlinear=("crece claramente más rápido que lineal: domina el recálculo de toda la "
                         "secuencia en cada paso")),
        "growth_cached": claims.growth(
            s["n"], s["total_s_cached"], what="tiempo total de generación con caché",
            linear="crece de forma casi lineal: cada paso cuesta casi lo mismo",
            between=("crece algo más rápido que lineal: el coste de cada paso con caché sube algo "
                     "con la longitud de la secuencia"),
            superlinear=("crece claramente más rápido que lineal: el coste de cada paso con caché "
                         "sube con la longitud de la secuencia")),
    }


def verdicts(facts: dict, timing: dict) -> dict[str, claims.Claim]:
    """Every conclusion the lab states about this machine, computed from its measurements."""
    return cache_verdicts(facts) | timing_verdicts(timing)


CRITERIA = (
    ("bytes", "la caché asignada ocupa los bytes de la fórmula"),
    ("tokens", "los tokens voraces coinciden con y sin caché"),
    ("logits", "los logits de los dos caminos difieren solo por redondeo"),
    ("speed", "el tiempo por token al final es mayor sin caché, con un intervalo que no contiene el 1"),
    ("growth_uncached", "el tiempo total sin caché crece más rápido que lineal"),
    ("growth_cached", "el tiempo total con caché crece de forma casi lineal"),
)


def criteria_sentence(met: dict[str, bool]) -> str:
    """The sentence that says which of the chapter's criteria a run meets, from the booleans."""
    return met_criteria_sentence(CRITERIA, met)


@dataclass(frozen=True)
class Arithmetic:
    """Part 1, computed from formulas: KV bytes per token of real configurations in the lab's
    ``dtype``, Llama-2-7B with 32, 8 and 1 KV heads, and the chapter's worked memory budgets."""

    dtype: str
    per_token: dict[str, int]
    variants: dict[str, int]
    worked: dict[str, dict]
    examples: dict[str, MemoryBudget]

    @classmethod
    def compute(cls, dtype: str) -> Arithmetic:
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
        return cls(dtype, per_token, variants, worked, ex)


@dataclass(frozen=True)
class Findings:
    """What the lab found, between its measurements and its report: the arithmetic, the
    measurements (:func:`measure_cache`'s ``facts``, :func:`measure_timing`'s ``timing``), the
    claims drawn from them by name, and how the model was loaded (``served``, whose fallback,
    if any, the limitations state)."""

    params: dict
    arithmetic: Arithmetic
    facts: dict
    timing: dict
    logits: claims.Claim
    speed: claims.Claim
    growth_uncached: claims.Claim
    growth_cached: claims.Claim
    served: ServedModel | None = None

    @classmethod
    def from_measurements(cls, params: dict, facts: dict, timing: dict,
                          found: dict[str, claims.Claim] | None = None,
                          served: ServedModel | None = None) -> Findings:
        """``found``: the claims of :func:`verdicts` the page already glued (computed here
        otherwise)."""
        found = verdicts(facts, timing) if found is None else found
        return cls(params, Arithmetic.compute(params["dtype"]), facts, timing,
                   logits=found["logits"], speed=found["speed"],
                   growth_uncached=found["growth_uncached"], growth_cached=found["growth_cached"],
                   served=served)

    @property
    def criteria_met(self) -> dict[str, bool]:
        """Which of the chapter's criteria (``CRITERIA``) this run meets."""
        m = self.facts["model"]
        return {
            "bytes": m["cache_bytes_allocated"] == m["cache_bytes_predicted"],
            "tokens": bool(self.facts["exactness"]["identical_greedy_tokens"]),
            "logits": self.logits.outcome == claims.PASSED,
            "speed": self.speed.outcome == claims.HIGHER,
            "growth_uncached": self.growth_uncached.outcome != claims.LINEAR,
            "growth_cached": self.growth_cached.outcome == claims.LINEAR,
        }

    @cached_property
    def summary(self) -> dict:
        return timing_summary(self.timing)

    @property
    def rounds(self) -> int:
        return len(self.timing["runs_ms_cached"])


def _timing_results(f: Findings) -> dict:
    """The contract's ``results.timing``: the median curves, the first and last steps, the growth
    fits and which of the chapter's criteria the run meets."""
    s = f.summary
    return {"prompt_len": f.timing["prompt_len"], "torch_threads": f.timing["torch_threads"],
            "runs": f.rounds, "tail_steps": s["tail"],
            "step_ms_cached": s["step_ms_cached"].tolist(),
            "step_ms_uncached": s["step_ms_uncached"].tolist(),
            "first_steps_ms": {"cached": float(np.median(s["first_ms_cached"])),
                               "uncached": float(np.median(s["first_ms_uncached"]))},
            "last_steps_ms": {"cached": float(np.median(s["last_ms_cached"])),
                              "uncached": float(np.median(s["last_ms_uncached"]))},
            "speedup_at_end": f.speed.value,
            "fit_total_cached": fit_growth(s["n"], s["total_s_cached"]),
            "fit_total_uncached": fit_growth(s["n"], s["total_s_uncached"]),
            "chapter_criteria": f.criteria_met}


def _results(f: Findings) -> dict:
    a, m = f.arithmetic, f.facts["model"]
    return {
        "kv_bytes_per_token": a.per_token,
        "mha_gqa_mqa_llama2_fp16": a.variants,
        "worked_examples": a.worked,
        "model": {k: m[k] for k in ("name", "parameters", "dtype", "kv_bytes_per_token",
                                    "cache_bytes_predicted", "cache_bytes_allocated")},
        "exactness": dict(f.facts["exactness"]),
        "numerics": dict(f.facts["numerics"]),
        "timing": _timing_results(f),
    }


def _arithmetic_evidence(a: Arithmetic) -> list[dict]:
    """The evidence of part 1: bytes per token, GQA and MQA, and the worked memory budgets."""
    per_token, variants, worked = a.per_token, a.variants, a.worked
    ex24, ex24_gqa, ex_h100 = a.examples["gpu24_7b"], a.examples["gpu24_7b_8kv"], a.examples["h100_llama31_8b"]
    h100 = worked["h100_llama31_8b_bf16"]
    l31 = get_preset("llama-3.1-8b")
    return [
        _ev(f"Llama-3.1-8B guarda {es_bytes(per_token['llama-3.1-8b'])} de caché KV por token en "
            f"{a.dtype} (2 × {l31.num_layers} capas × {l31.num_kv_heads} cabezas KV × "
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
    ]


def _evidence(f: Findings) -> list[dict]:
    """The arithmetic's evidence, then the model's bytes and tokens, then the claims."""
    m, ex_ = f.facts["model"], f.facts["exactness"]
    same_bytes = m["cache_bytes_allocated"] == m["cache_bytes_predicted"]
    identical = ex_["identical_greedy_tokens"]
    return [
        *_arithmetic_evidence(f.arithmetic),
        _ev(f"La caché asignada para {m['name']} ({m['batch_size']} secuencias × {m['max_len']} "
            f"tokens, {m['dtype']}) ocupa {es(m['cache_bytes_allocated'], 0)} bytes, "
            f"{'igual a' if same_bytes else 'distinta de'} la predicción de la fórmula "
            f"({es(m['cache_bytes_predicted'], 0)}).",
            m["cache_bytes_allocated"], "B", source="measured"),
        _ev(f"Con y sin caché, la decodificación voraz produce "
            f"{'los mismos' if identical else 'distintos'} tokens en {ex_['prompts']} prompts × "
            f"{ex_['tokens_per_prompt']} tokens.", identical, "booleano", source="measured"),
        f.logits.evidence("logit"),
        f.speed.evidence("x"),
        f.growth_uncached.evidence("exponente"),
        f.growth_cached.evidence("exponente"),
    ]


def _limitations(f: Findings) -> list[str]:
    m, reps, threads = f.facts["model"], f.rounds, f.timing["torch_threads"]
    small = m["parameters"] < SMALL_MODEL_PARAMETERS
    limitations = [
        f"Los tiempos se midieron con el modelo {m['name']} ({es(m['parameters'] / 1e6, 1)} M "
        "parámetros), " + ("cuyo paso está dominado por la sobrecarga por operación, no por el "
                           "ancho de banda: las cifras absolutas no se trasladan a un modelo 7B "
                           "en GPU." if small else
                           "en este dispositivo y este dtype: las cifras absolutas no se trasladan "
                           "a otro modelo ni a otra GPU."),
        timing_limitation(reps),
        f"Las {reps} rondas con y sin caché se midieron intercaladas, con "
        f"{threads} {'hilo' if threads == 1 else 'hilos'} de "
        "torch; la comparación de tiempos lleva un intervalo "
        "bootstrap del 95 % sobre esas rondas, y el ajuste del crecimiento, no (es una sola curva "
        "de medianas).",
        "El presupuesto de memoria ignora activaciones, buffers del framework y fragmentación; la "
        "memoria utilizable y la fracción de utilización son supuestos de entrada.",
        "La igualdad de tokens con y sin caché se comprobó en decodificación voraz y en "
        f"{m['dtype']}; en fp16/bf16 un empate casi exacto de logits puede cambiar un token.",
    ]
    return (f.served.limitations() if f.served is not None else []) + limitations


def report(f: Findings) -> dict:
    """The contract's body from the lab's findings."""
    m = f.facts["model"]
    environment = {"model": m["name"], "dtype": m["dtype"]}
    if f.served is not None:
        environment.update(f.served.environment())
    return {
        "environment": environment,
        "results": _results(f),
        "evidence": _evidence(f),
        "limitations": _limitations(f),
        "volatile_fields": ["results.timing", "results.numerics"],
    }


def run(seed: int, profile: str, params: dict, device: torch.device) -> dict:
    served = load_served_model(params["model"], seed, device,
                               dtype=served_dtype(params["model_dtype"], device))
    model = served.model
    check_params(params, model.config)
    prompts = lab_prompts(model.config, params, seed)
    facts = measure_cache(model, params, prompts)
    timing = measure_timing(model, prompts[0][: params["prompt_len"]], params)
    return report(Findings.from_measurements(params, facts, timing, served=served))


SPEC = LabSpec(
    kind="kv_cache",
    title="La caché KV",
    chapter=2,
    folder="labs/02-kv-cache",
    ci_budget_s=70,
    run=run,
    params={
        "model": Param("tiny-es", str, "modelo de las mediciones (tiny-es y los de Qwen: pesos "
                       "entrenados, los de Qwen se descargan del Hub de Hugging Face; los demás, "
                       "pesos aleatorios)", choices=TEXT_MODELS, by_profile={"gpu": GPU_TEXT_MODEL}),
        "model_dtype": MODEL_DTYPE_PARAM,
        "dtype": Param("bf16", str, "dtype de la aritmética de memoria",
                       choices=("fp32", "fp16", "bf16", "int8")),
        "context_len": Param(4096, int, "contexto de referencia para la aritmética", min=1),
        "prompt_len": Param(16, int, "tokens del prompt medido", min=1, max=256),
        "max_new_tokens": Param(448, int, "tokens generados en la medición de tiempos", min=8,
                                max=4096, by_profile={"ci": 160, "cpu": 448, "gpu": 480}),
        "repeats": Param(3, int, "rondas intercaladas (con caché, sin caché) de la medición de "
                         "tiempos", min=1, max=50, by_profile={"ci": 5, "cpu": 5, "gpu": 5}),
        "torch_threads": Param(0, int, "hilos de torch mientras se miden los tiempos (0: los que "
                               "elija torch)", min=0, max=256, by_profile={"ci": 1}),
        "batch_size": Param(3, int, "prompts de la prueba de exactitud", min=1, max=64),
        "exactness_tokens": Param(24, int, "tokens comparados con y sin caché", min=1, max=512,
                                  by_profile={"ci": 16}),
    },
)
