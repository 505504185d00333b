"""Lab ``flash_attention`` (chapter 8): attention by tiles, exact, with the bytes counted.

1. Exactness (measured, :func:`measure_exactness`): the tiled attention (the student's in the
   notebook, ``model.flash.flash_attention`` in ``run``) against float64 softmax attention on
   seeded inputs, in fp32 and fp16, with unit-scale scores and with scores of about ``±1e4``,
   beside the naive version (stable and textbook) and torch's fused
   ``scaled_dot_product_attention`` (SDPA).
2. The real model (measured, :func:`measure_model`): greedy tokens with the tiled ``attn_fn``
   against the library's attention, and the largest logit difference in fp32 and fp16.
3. Memory (measured, :func:`measure_memory`): the allocator's peak during one causal prefill of
   ``N`` tokens, naive vs tiled vs SDPA, as ``N`` grows (CPU: allocations and frees that
   ``torch.profiler`` records; CUDA: ``torch.cuda.max_memory_allocated``).
4. Time (measured, volatile, :func:`measure_timing`): the three variants interleaved call by
   call. A Python loop of tiles moves FlashAttention's bytes but is not a fused kernel.
5. The SDPA backends this machine runs (:func:`sdpa_backends`, read at run time) and the IO
   model (computed in :class:`Findings`, ``sim.attention_io``): bytes moved between slow and fast
   memory by naive and tiled attention as a function of ``N``, the tiles and the fast memory.

:class:`Findings` holds the measurements and every conclusion about this machine, each a
:mod:`ai_evolution.claims` claim; :func:`report` turns the findings into the contract's body.
``run`` = measure + findings + report (``run_lab``, the CLI, the grader), and the notebook calls
the same functions with the student's attention plugged in.
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .. import claims
from ..fmt import es, es_bytes, es_sig
from ..generation import generate
from ..hardware import synchronize
from ..model import load_model
from ..model.attention import ContiguousKVCache
from ..model.flash import (flash_attention, flash_cached_attention, naive_attention,
                           peak_memory_bytes, quiet_native_stderr, random_qkv)
from ..sim.attention_io import (best_tiles, flash_io, flash_io_for_memory, naive_io,
                                tile_candidates, working_set_bytes)
from ..timing import torch_threads
from .common import SERVED_MODELS
from .contract import (claims_starting, evidence as _ev, met_criteria_sentence,
                       threads_limitation, timing_limitation)
from .registry import LabParamError, LabSpec, Param

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
VARIANTS = ("naive", "tiled", "sdpa")
VARIANT_NAMES = {"naive": "ingenua", "tiled": "por bloques", "sdpa": "SDPA"}

# Largest |output - float64 reference| that still reads as rounding. fp32 outputs of unit-scale
# values carry ~1e-7 relative error; 1e-4 leaves room for sums over a few thousand keys. fp16
# keeps 11 significant bits: outputs of magnitude up to ~4 have a step of 2**-9 ~ 2e-3, and
# 1e-2 is a few of those steps. A wrong mask or a missing rescale moves outputs by 0.1 to 1.
EXACT_LIMITS = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 5e-2}
# Logits of the real model with the tiled attention vs the library's (same dtype): fp32 adds
# a few ulps per layer; in fp16 the reference itself is ~1.4e-2 away from fp32 at |logit| ~ 13,
# and 5e-2 is ~6 fp16 steps there.
LOGIT_LIMITS = {"fp32": 1e-4, "fp16": 5e-2}
# How a difference is printed: fp32 rounding in millionths, fp16 rounding in thousandths.
UNITS = {"fp32": (1e6, "millonésimas"), "fp16": (1e3, "milésimas"), "bf16": (1e3, "milésimas")}
MEASURES = {"cpu": ("el pico de la suma, en orden de tiempo, de las reservas y liberaciones de "
                    "memoria que registra torch.profiler (profile_memory=True) durante la llamada"),
            "cuda": ("torch.cuda.max_memory_allocated durante la llamada, menos lo reservado "
                     "antes de empezar")}


# --- small helpers -------------------------------------------------------------------------------

def measured_peak(fn: Callable[[], object], device) -> tuple[object, int]:
    """``model.flash.peak_memory_bytes`` without the profiler's lines on stderr."""
    with quiet_native_stderr():
        return peak_memory_bytes(fn, device)


def lab_qkv(params: dict, n: int, seed: int, dtype: torch.dtype, device,
            scores_around: float | None = None):
    """The lab's seeded q, k, v for one causal prefill of ``n`` tokens (batch 1)."""
    return random_qkv(1, params["heads"], params["kv_heads"], n, n, params["head_dim"], seed=seed,
                      dtype=dtype, scores_around=scores_around, device=device)


def sdpa(q, k, v):
    """torch's fused attention, causal prefill (T = S, so top-left and bottom-right agree)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def _max_diff(out: torch.Tensor, truth: torch.Tensor) -> tuple[float | None, float]:
    """(max |out - truth| over the outputs, or None when some are not finite; the share of
    outputs that are not finite)."""
    finite = torch.isfinite(out)
    bad = float((~finite).float().mean())
    if bad:
        return None, bad
    return float((out.double() - truth).abs().max()), 0.0


# --- 1. exactness ----------------------------------------------------------------------------------

def exactness_cases(params: dict) -> list[dict]:
    """(dtype, scale of the scores): unit scale and ``extreme_scores``, in fp32 and fp16."""
    return [{"dtype": dt, "scores_around": s} for dt in ("fp32", "fp16")
            for s in (None, params["extreme_scores"])]


def measure_exactness(params: dict, seed: int, tiled: Callable = flash_attention,
                      device="cpu") -> list[dict]:
    """Each variant against float64 softmax attention on the same seeded causal prefill:
    ``max_abs_diff`` (None when an output is not finite) and the share of non-finite outputs.
    ``tiled(q, k, v, causal=, block_q=, block_k=)`` is the tiled attention under test. Also the
    largest raw ``|q . k|`` (before the scale), which decides whether fp16 can hold the scores."""
    n, block = params["exactness_n"], params["block"]
    out = []
    for i, case in enumerate(exactness_cases(params)):
        dtype = DTYPES[case["dtype"]]
        q, k, v = lab_qkv(params, n, seed + i, dtype, device, case["scores_around"])
        truth = naive_attention(q.double(), k.double(), v.double(), causal=True)
        g = params["heads"] // params["kv_heads"]
        raw = float((q.double() @ k.double().repeat_interleave(g, 1).transpose(-1, -2)).abs().max())
        runs = {
            "tiled": lambda: tiled(q, k, v, causal=True, block_q=block, block_k=block),
            "naive": lambda: naive_attention(q, k, v, causal=True),
            "textbook": lambda: naive_attention(q, k, v, causal=True, stable=False),
            "sdpa": lambda: sdpa(q, k, v),
        }
        diffs, nonfinite = {}, {}
        with torch.inference_mode():
            for name, fn in runs.items():
                diffs[name], nonfinite[name] = _max_diff(fn(), truth)
        out.append({**case, "n": n, "max_abs_diff": diffs, "nonfinite_share": nonfinite,
                    "max_raw_score": raw, "max_scaled_score": raw / math.sqrt(q.shape[-1]),
                    "max_abs_v": float(v.double().abs().max()),
                    "dtype_max": float(torch.finfo(dtype).max)})
    return out


def exact_limit(case: dict) -> float:
    """The largest |tiled - float64| that reads as rounding for one case: the output rounding
    of its dtype (``EXACT_LIMITS``) plus what one float32 rounding step of the largest scaled
    score can move the softmax, ``2 eps32 max|s| max|v|`` (the scores are computed in float32;
    with scores of 1e4 one step is ~1e-3, as large as the gap between two near-tied keys)."""
    eps = float(torch.finfo(torch.float32).eps)
    return EXACT_LIMITS[case["dtype"]] + 2 * eps * case["max_scaled_score"] * case["max_abs_v"]


def case_label(case: dict) -> str:
    scale = ("escala unidad" if case["scores_around"] is None
             else f"puntuaciones de ±{es_sig(case['scores_around'])}")
    return f"{case['dtype']}, {scale}"


def exactness_claim(case: dict) -> claims.Claim:
    """Is the tiled attention exact (up to rounding) in this case?"""
    bad = case["nonfinite_share"]["tiled"]
    if bad:
        return claims.threshold(
            bad, 0.0, what=f"salidas no finitas de la atención por bloques ({case_label(case)})",
            passed="", failed=("la atención por bloques produce valores no finitos: desborda en "
                               "algún paso, así que no es exacta"))
    scale, unit = UNITS[case["dtype"]]
    return claims.threshold(
        case["max_abs_diff"]["tiled"], exact_limit(case), scale=scale, unit=unit, decimals=2,
        what=(f"diferencia máxima entre la atención por bloques y la atención en float64 "
              f"({case_label(case)}, {es(case['n'], 0)} tokens)"),
        passed="es redondeo: la atención por bloques calcula el mismo softmax",
        failed="es mayor que el redondeo: la atención por bloques no calcula el mismo softmax")


def exactness_key(case: dict) -> str:
    return f"exact_{case['dtype']}" + ("" if case["scores_around"] is None else "_extreme")


def exactness_verdicts(cases: list[dict]) -> dict[str, claims.Claim]:
    return {exactness_key(c): exactness_claim(c) for c in cases}


# --- 2. the real model -----------------------------------------------------------------------------

def lab_prompts(config, params: dict, seed: int) -> list[list[int]]:
    """Seeded prompts whose lengths are not multiples of the model tile."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [params["prompt_len"] + 7 * i for i in range(params["prompts"])]
    return [torch.randint(3, config.vocab_size, (n,), generator=gen).tolist() for n in lengths]


def _logits(model, ids: list[int], attn_fn=None) -> torch.Tensor:
    device = next(model.parameters()).device
    seq = torch.tensor([ids], device=device)
    dtype = next(model.parameters()).dtype
    with torch.inference_mode():
        cache = ContiguousKVCache(model.config, 1, len(ids), dtype=dtype, device=device)
        return model(seq, kv_cache=cache, attn_fn=attn_fn)[0].float()


def measure_model(model, params: dict, seed: int, attn_fn: Callable, model_fp16=None) -> dict:
    """Greedy tokens with ``attn_fn`` against the library's attention (same prompts), and the
    largest logit difference of a prefill in the model's dtype and, with ``model_fp16`` (the
    same weights in fp16), in fp16."""
    prompts = lab_prompts(model.config, params, seed)
    n_new = params["exactness_tokens"]
    reference = generate(model, prompts, n_new, cache="contiguous")
    mine = generate(model, prompts, n_new, cache="contiguous", attn_fn=attn_fn)
    ids = prompts[-1] + reference[-1]
    logits = {}
    for m in (model, model_fp16):
        if m is None:
            continue
        name = {torch.float32: "fp32", torch.float16: "fp16"}.get(next(m.parameters()).dtype)
        if name is None:
            continue
        ref, got = _logits(m, ids), _logits(m, ids, attn_fn)
        logits[name] = {"max_abs_diff": float((got - ref).abs().max()),
                        "max_abs_logit": float(ref.abs().max()), "positions": len(ids)}
    first_diff = next(([p, j] for p, (a, b) in enumerate(zip(reference, mine))
                       for j in range(len(a)) if j >= len(b) or a[j] != b[j]), None)
    return {"name": model.config.name, "prompt_lens": [len(p) for p in prompts],
            "tokens_per_prompt": n_new, "identical_greedy_tokens": reference == mine,
            "first_difference": first_diff, "logits": logits}


def logit_verdicts(facts: dict) -> dict[str, claims.Claim]:
    out = {}
    for dt, f in facts["logits"].items():
        scale, unit = UNITS[dt]
        out[f"logits_{dt}"] = claims.threshold(
            f["max_abs_diff"], LOGIT_LIMITS[dt], scale=scale, unit=unit, decimals=2,
            what=(f"diferencia máxima de logits en {dt} entre el modelo con la atención por "
                  f"bloques y con la de la biblioteca ({f['positions']} posiciones)"),
            passed="es redondeo: los dos caminos calculan lo mismo en otro orden",
            failed="es mayor que el redondeo: los dos caminos no calculan lo mismo")
    return out


# --- 3. memory, 4. time ----------------------------------------------------------------------------

def variant_fns(params: dict, tiled: Callable = flash_attention) -> dict[str, Callable]:
    block = params["block"]
    return {"naive": lambda q, k, v: naive_attention(q, k, v, causal=True),
            "tiled": lambda q, k, v: tiled(q, k, v, causal=True, block_q=block, block_k=block),
            "sdpa": sdpa}


def measure_memory(params: dict, seed: int, tiled: Callable = flash_attention, device="cpu") -> dict:
    """Peak bytes the allocator holds during one causal prefill of each size, per variant, and
    the bytes of one N x N score matrix for every head (what the naive version must write)."""
    device = torch.device(device)
    dtype = DTYPES[params["dtype"]]
    fns = variant_fns(params, tiled)
    peaks = {name: [] for name in fns}
    elem = torch.tensor([], dtype=dtype).element_size()
    for n in params["sizes"]:
        q, k, v = lab_qkv(params, n, seed + n, dtype, device)
        for name, fn in fns.items():
            with torch.inference_mode():
                _, peak = measured_peak(lambda: fn(q, k, v), device)
            peaks[name].append(int(peak))
    return {"sizes": list(params["sizes"]), "dtype": params["dtype"], "device": device.type,
            "measure": MEASURES.get(device.type, MEASURES["cpu"]), "block": params["block"],
            "heads": params["heads"], "kv_heads": params["kv_heads"], "head_dim": params["head_dim"],
            "peak_bytes": peaks,
            "score_matrix_bytes": [params["heads"] * n * n * elem for n in params["sizes"]],
            "output_bytes": [params["heads"] * n * params["head_dim"] * elem for n in params["sizes"]]}


def measure_timing(params: dict, seed: int, tiled: Callable = flash_attention, device="cpu") -> dict:
    """Milliseconds per call of each variant at each size, interleaved call by call (naive,
    tiled, SDPA, naive, ...) after one warm-up round."""
    device = torch.device(device)
    dtype = DTYPES[params["dtype"]]
    fns = variant_fns(params, tiled)
    ms = {name: [] for name in fns}
    with torch_threads(params["torch_threads"]):
        threads = torch.get_num_threads()
        for n in params["sizes"]:
            q, k, v = lab_qkv(params, n, seed + n, dtype, device)
            rows = {name: [] for name in fns}
            with torch.inference_mode():
                for r in range(params["repeats"] + 1):
                    for name, fn in fns.items():
                        synchronize(device)
                        t = time.perf_counter()
                        fn(q, k, v)
                        synchronize(device)
                        if r:
                            rows[name].append(1e3 * (time.perf_counter() - t))
            for name in fns:
                ms[name].append(rows[name])
    return {"sizes": list(params["sizes"]), "dtype": params["dtype"], "torch_threads": threads,
            "repeats": params["repeats"], "block": params["block"], "ms": ms}


FITTED = "de la memoria ajustada"


def memory_verdicts(memory: dict) -> dict[str, claims.Claim]:
    """How each variant's peak memory grows with N (1: linear, 2: quadratic)."""
    n, p = memory["sizes"], memory["peak_bytes"]
    return {
        "memory_naive": claims.growth(
            n, p["naive"], what="memoria pico de la atención ingenua frente a N", fitted=FITTED,
            linear="crece de forma casi lineal: aquí no se ve el muro de N²",
            between="crece más rápido que lineal, sin llegar a cuadrático",
            superlinear="crece como N²: guarda matrices de N × N puntuaciones"),
        "memory_tiled": claims.growth(
            n, p["tiled"], what="memoria pico de la atención por bloques frente a N", fitted=FITTED,
            linear="crece de forma casi lineal: solo guarda la salida y un bloque a la vez",
            between="crece algo más rápido que lineal",
            superlinear="crece claramente más rápido que lineal: guarda algo de tamaño N × N"),
        "memory_sdpa": claims.growth(
            n, p["sdpa"], what="memoria pico de SDPA frente a N", fitted=FITTED,
            linear="crece de forma casi lineal", between="crece algo más rápido que lineal",
            superlinear="crece claramente más rápido que lineal"),
    }


def timing_verdicts(timing: dict) -> dict[str, claims.Claim]:
    """At the largest N: the Python loop against SDPA, and the naive version against the loop
    (paired calls, bootstrap interval of the ratio of medians)."""
    ms, n = timing["ms"], timing["sizes"][-1]
    return {
        "time_tiled_sdpa": claims.compare(
            ms["tiled"][-1], ms["sdpa"][-1],
            what=f"tiempo del bucle de bloques en Python entre el de SDPA, N = {es(n, 0)}",
            higher="el bucle de bloques en Python tarda más que el núcleo fusionado de SDPA",
            lower="el bucle de bloques en Python tarda menos que SDPA"),
        "time_naive_tiled": claims.compare(
            ms["naive"][-1], ms["tiled"][-1],
            what=f"tiempo de la atención ingenua entre el del bucle de bloques, N = {es(n, 0)}",
            higher="la atención ingenua tarda más que el bucle de bloques",
            lower="la atención ingenua tarda menos que el bucle de bloques"),
    }


# --- 5. the SDPA backends --------------------------------------------------------------------------

BACKEND_OPS = {
    "aten::_scaled_dot_product_flash_attention_for_cpu":
        "FLASH_ATTENTION (núcleo por bloques de PyTorch para CPU)",
    "aten::_scaled_dot_product_flash_attention": "FLASH_ATTENTION (FlashAttention-2)",
    "aten::_scaled_dot_product_efficient_attention": "EFFICIENT_ATTENTION (memory-efficient, de xFormers)",
    "aten::_scaled_dot_product_cudnn_attention": "CUDNN_ATTENTION (cuDNN)",
    "aten::_scaled_dot_product_attention_math": "MATH (implementación de referencia en C++)",
}
BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")


def sdpa_backends(params: dict, device="cpu") -> dict:
    """Which SDPA backends accept the lab's tensors on this device (each tried alone with
    ``torch.nn.attention.sdpa_kernel``), which one a plain call runs (the operator the
    profiler records), and, on CUDA, the compute capability and torch's backend switches."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(device)
    dtype = DTYPES[params["dtype"]]
    q, k, v = lab_qkv(params, params["sizes"][0], 0, dtype, device)
    accepts = {}
    for name in BACKENDS:
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            accepts[name] = False
            continue
        try:
            with sdpa_kernel([backend]), torch.inference_mode(), warnings.catch_warnings():
                warnings.simplefilter("ignore")        # "... kernel not used because ..."
                sdpa(q, k, v)
            synchronize(device)
            accepts[name] = True
        except RuntimeError:
            accepts[name] = False
    with quiet_native_stderr(), torch.inference_mode():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            sdpa(q, k, v)
            synchronize(device)
    ops = {e.key for e in prof.key_averages()}
    ran = sorted(op for op in ops if op in BACKEND_OPS)
    info = {"device": device.type, "dtype": params["dtype"], "accepts": accepts,
            "default_ops": ran, "default": [BACKEND_OPS[op] for op in ran]}
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        info["compute_capability"] = f"{major}.{minor}"
        info["device_name"] = torch.cuda.get_device_name(device)
        info["switches"] = {"flash": torch.backends.cuda.flash_sdp_enabled(),
                            "efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                            "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
                            "math": torch.backends.cuda.math_sdp_enabled()}
    return info


def backends_sentence(info: dict) -> str:
    """What the plain SDPA call ran here, and which backends accept the lab's tensors."""
    where = (f"la GPU {info['device_name']} (capacidad de cómputo {info['compute_capability']})"
             if info["device"] == "cuda" else "la CPU")
    ran = " y ".join(f"`{op.removeprefix('aten::')}`" for op in info["default_ops"]) or \
        "ningún operador conocido de SDPA"
    kinds = " y ".join(info["default"]) or "un camino sin nombre conocido"
    yes = [b for b, ok in info["accepts"].items() if ok]
    no = [b for b, ok in info["accepts"].items() if not ok]
    text = (f"En {where}, con tensores {info['dtype']}, una llamada a SDPA sin restricciones "
            f"ejecutó {ran}: {kinds}. Probados uno a uno, aceptan estos tensores "
            f"{', '.join(yes) or 'ninguno'}")
    text += f"; no los aceptan {', '.join(no)}." if no else "."
    if info["device"] == "cuda" and not info["accepts"].get("FLASH_ATTENTION", False):
        text += (" Sin FLASH_ATTENTION, SDPA recurre a otro núcleo fusionado (el primero que "
                 "acepte los tensores) o, si ninguno los acepta, a MATH, que materializa las "
                 "puntuaciones.")
    return text


# --- the IO model ----------------------------------------------------------------------------------

def io_model(params: dict) -> dict:
    """The IO model for one head (``sim.attention_io``): naive vs tiled bytes as N grows (the
    tiles ``best_tiles`` picks for the fast memory), the sweep of the query tile at one N, and
    the best tiles for several fast memories. Causal prefill, ``io_elem_bytes`` per element."""
    d, e, m = params["io_head_dim"], params["io_elem_bytes"], params["fast_memory_kib"] * 1024
    sizes = params["io_sizes"]
    tiled = [flash_io_for_memory(n, d, m, e, causal=True) for n in sizes]
    n_sweep = params["io_sweep_n"]
    bk = params["io_sweep_block_k"]
    sweep = [{"block_q": bq, "block_k": bk,
              "bytes": flash_io(n_sweep, d, bq, bk, e, causal=True).hbm_bytes,
              "working_set_bytes": working_set_bytes(bq, bk, d, e),
              "fits": working_set_bytes(bq, bk, d, e) <= m}
             for bq in tile_candidates(n_sweep)]
    by_memory = []
    for kib in params["memories_kib"]:
        bq, bk_ = best_tiles(n_sweep, d, kib * 1024, e, causal=True)
        io = flash_io(n_sweep, d, bq, bk_, e, causal=True)
        by_memory.append({"fast_memory_kib": kib, "block_q": bq, "block_k": bk_,
                          "bytes": io.hbm_bytes, "working_set_bytes": working_set_bytes(bq, bk_, d, e)})
    return {"head_dim": d, "elem_bytes": e, "fast_memory_bytes": m, "sizes": list(sizes),
            "naive_bytes": [naive_io(n, d, e).hbm_bytes for n in sizes],
            "tiled_bytes": [io.hbm_bytes for io in tiled],
            "tiles": [[io.block_q, io.block_k] for io in tiled],
            "naive_flops": [naive_io(n, d, e).flops for n in sizes],
            "tiled_flops": [io.flops for io in tiled],
            "sweep_n": n_sweep, "sweep": sweep, "by_memory": by_memory,
            "decode_n": sizes[-1],
            "decode_naive_bytes": naive_io(sizes[-1], d, e, n_queries=1).hbm_bytes,
            "decode_tiled_bytes": flash_io(sizes[-1], d, 1, params["io_sweep_block_k"], e,
                                           causal=True, n_queries=1).hbm_bytes}


# --- the report ------------------------------------------------------------------------------------

def verdicts(exactness: list[dict], model_facts: dict, memory: dict,
             timing: dict) -> dict[str, claims.Claim]:
    """Every conclusion the lab states about this machine, computed from its measurements."""
    return (exactness_verdicts(exactness) | logit_verdicts(model_facts) | memory_verdicts(memory)
            | timing_verdicts(timing))


def extreme_case(exactness: list[dict], dtype: str = "fp16") -> dict:
    return next(c for c in exactness if c["dtype"] == dtype and c["scores_around"] is not None)


def overflow_sentence(exactness: list[dict]) -> str:
    """What the naive versions do with extreme scores in fp16, and why (the raw q . k)."""
    c = extreme_case(exactness)
    share = c["nonfinite_share"]
    raw, top = c["max_raw_score"], c["dtype_max"]
    parts = []
    for name, label in (("naive", "la ingenua estable (restando el máximo)"),
                        ("textbook", "la de libro de texto (sin restar el máximo)"),
                        ("tiled", "la atención por bloques"), ("sdpa", "SDPA")):
        parts.append(f"{label}, {es(100 * share[name], 1)}\u00a0% de salidas no finitas")
    why = (f"El mayor |q · k| antes de escalar es {es_sig(raw, 3)} y fp16 no representa nada por "
           f"encima de {es(top, 0)}: " + ("el producto desborda antes de que el softmax pueda "
                                          "restar nada." if raw > top else
                                          "el producto cabe en fp16."))
    return (f"Con puntuaciones de ±{es_sig(c['scores_around'])} en fp16 ({es(c['n'], 0)} tokens): "
            + "; ".join(parts) + ". " + why)


CRITERIA = (
    ("exact_fp32", "la atención por bloques en fp32 coincide con la de float64 hasta el redondeo"),
    ("exact_fp16", "la atención por bloques en fp16 es finita y exacta hasta el redondeo, también "
                   "con puntuaciones extremas"),
    ("naive_overflows", "la atención ingenua en fp16 desborda con puntuaciones extremas"),
    ("tokens", "el modelo genera los mismos tokens voraces con la atención por bloques"),
    ("logits", "los logits del modelo difieren solo por redondeo, en fp32 y en fp16"),
    ("memory_naive", "la memoria pico de la atención ingenua crece como N²"),
    ("memory_tiled", "la memoria pico de la atención por bloques crece de forma casi lineal"),
)


@dataclass(frozen=True)
class Findings:
    """What the lab found, between its measurements and its report: the measurements
    (:func:`measure_exactness`, :func:`measure_model`, :func:`measure_memory`,
    :func:`measure_timing`, :func:`sdpa_backends`), the IO model, and the claims drawn from them
    by name (``exact`` and ``logits`` hold one claim per case, by their keys in
    :func:`verdicts`)."""

    params: dict
    exactness: list[dict]
    model_facts: dict
    memory: dict
    timing: dict
    backends: dict
    io: dict
    exact: dict[str, claims.Claim]
    logits: dict[str, claims.Claim]
    memory_naive: claims.Claim
    memory_tiled: claims.Claim
    memory_sdpa: claims.Claim
    time_tiled_sdpa: claims.Claim
    time_naive_tiled: claims.Claim

    @classmethod
    def from_measurements(cls, params: dict, exactness: list[dict], model_facts: dict,
                          memory: dict, timing: dict, backends: dict,
                          found: dict[str, claims.Claim] | None = None) -> Findings:
        """``found``: the claims of :func:`verdicts` the page already glued (computed here
        otherwise)."""
        found = verdicts(exactness, model_facts, memory, timing) if found is None else found
        return cls(params, exactness, model_facts, memory, timing, backends, io_model(params),
                   exact=claims_starting(found, "exact_"), logits=claims_starting(found, "logits_"),
                   memory_naive=found["memory_naive"], memory_tiled=found["memory_tiled"],
                   memory_sdpa=found["memory_sdpa"], time_tiled_sdpa=found["time_tiled_sdpa"],
                   time_naive_tiled=found["time_naive_tiled"])

    @property
    def criteria_met(self) -> dict[str, bool]:
        """Which of the chapter's criteria (``CRITERIA``) this run meets. Time is not one: a
        Python loop of tiles is not the kernel FlashAttention's bytes are meant for."""
        def all_passed(group: dict[str, claims.Claim], prefix: str = "") -> bool:
            return all(c.outcome == claims.PASSED for k, c in group.items() if k.startswith(prefix))
        return {
            "exact_fp32": all_passed(self.exact, "exact_fp32"),
            "exact_fp16": all_passed(self.exact, "exact_fp16"),
            "naive_overflows": extreme_case(self.exactness)["nonfinite_share"]["naive"] > 0,
            "tokens": bool(self.model_facts["identical_greedy_tokens"]),
            "logits": bool(self.logits) and all_passed(self.logits),
            "memory_naive": self.memory_naive.outcome == claims.SUPERLINEAR,
            "memory_tiled": self.memory_tiled.outcome == claims.LINEAR,
        }

    @property
    def largest(self) -> int:
        """The index of the largest N of the memory and time measurements."""
        return len(self.memory["sizes"]) - 1

    @property
    def naive_peak_in_score_matrices(self) -> float:
        """The naive version's peak memory at the largest N, in N × N score matrices."""
        last = self.largest
        return self.memory["peak_bytes"]["naive"][last] / self.memory["score_matrix_bytes"][last]


def criteria_sentence(met: dict[str, bool]) -> str:
    """The sentence that says which of the chapter's criteria a run meets, from the booleans."""
    return met_criteria_sentence(CRITERIA, met)


def _median_ms(rows: list[list[float]]) -> list[float]:
    return [float(np.median(r)) for r in rows]


def _results(f: Findings) -> dict:
    return {
        "exactness": f.exactness,
        "model": f.model_facts,
        "memory": f.memory | {"naive_peak_in_score_matrices": f.naive_peak_in_score_matrices},
        "timing": f.timing | {"median_ms": {k: _median_ms(v) for k, v in f.timing["ms"].items()},
                              "tiled_over_sdpa": f.time_tiled_sdpa.value,
                              "naive_over_tiled": f.time_naive_tiled.value},
        "sdpa_backends": f.backends,
        "io_model": f.io,
        "chapter_criteria": f.criteria_met,
    }


def _io_evidence(io: dict) -> list[dict]:
    """The IO model's bytes: a long causal prefill, then one decode step."""
    big = len(io["sizes"]) - 1
    bq, bk = io["tiles"][big]
    return [
        _ev(f"Modelo de E/S, una cabeza de d = {io['head_dim']} en un prefill causal de "
            f"{es(io['sizes'][big], 0)} tokens ({io['elem_bytes']} bytes por elemento): la atención "
            f"ingenua mueve {es_bytes(io['naive_bytes'][big])} entre la memoria lenta y la rápida; la "
            f"atención por bloques, con bloques de {bq} × {bk} que caben en "
            f"{es_bytes(io['fast_memory_bytes'])} de memoria "
            f"rápida, {es_bytes(io['tiled_bytes'][big])}: "
            f"{es(io['naive_bytes'][big] / io['tiled_bytes'][big], 1)} "
            "veces menos.", io["naive_bytes"][big] / io["tiled_bytes"][big], "x"),
        _ev(f"Modelo de E/S, un paso de decodificación contra {es(io['decode_n'], 0)} claves: la "
            f"atención ingenua mueve {es_bytes(io['decode_naive_bytes'])} y la por bloques "
            f"{es_bytes(io['decode_tiled_bytes'])}: con una sola fila de consulta, S y P son "
            "pequeñas frente a K y V.", io["decode_naive_bytes"] / io["decode_tiled_bytes"], "x"),
    ]


def _evidence(f: Findings) -> list[dict]:
    model_facts, memory = f.model_facts, f.memory
    peaks, live, last = memory["peak_bytes"], f.naive_peak_in_score_matrices, f.largest
    return [
        *_io_evidence(f.io),
        *(c.evidence("valor absoluto") for c in f.exact.values()),
        _ev(overflow_sentence(f.exactness), extreme_case(f.exactness)["nonfinite_share"]["naive"],
            "fracción", source="measured"),
        _ev(f"Con la atención por bloques, el modelo {model_facts['name']} genera "
            f"{'los mismos' if model_facts['identical_greedy_tokens'] else 'distintos'} tokens "
            f"voraces que con la atención de la biblioteca ({len(model_facts['prompt_lens'])} "
            f"prompts × {model_facts['tokens_per_prompt']} tokens).",
            bool(model_facts["identical_greedy_tokens"]), "booleano", source="measured"),
        *(c.evidence("logit") for c in f.logits.values()),
        _ev(f"En N = {es(memory['sizes'][last], 0)}, la memoria pico de la atención ingenua equivale a "
            f"{es(live, 1)} matrices de N × N puntuaciones por cabeza ({memory['dtype']}); la de la "
            f"atención por bloques es {es_bytes(peaks['tiled'][last])} y la de SDPA "
            f"{es_bytes(peaks['sdpa'][last])} (medida: {memory['measure']}).",
            live, "matrices N×N", source="measured", volatile=True),
        f.memory_naive.evidence("exponente"),
        f.memory_tiled.evidence("exponente"),
        f.memory_sdpa.evidence("exponente"),
        f.time_tiled_sdpa.evidence("x"),
        f.time_naive_tiled.evidence("x"),
        _ev(backends_sentence(f.backends), ", ".join(f.backends["default_ops"]) or "ninguno",
            "operador", source="measured"),
    ]


def _limitations(f: Findings) -> list[str]:
    return [
        "El bucle de bloques está escrito en Python y PyTorch: mueve los bytes de FlashAttention, "
        "pero cada bloque cuesta varias llamadas del intérprete y multiplicaciones pequeñas; sus "
        "tiempos no son los de un núcleo fusionado y no dicen nada de la velocidad de "
        "FlashAttention en una GPU.",
        "La memoria rápida del modelo de E/S es un parámetro, no una medida: en la CPU no hay una "
        "SRAM que el programa controle, y los bytes que mueve de verdad dependen de las cachés "
        "del procesador.",
        f"La memoria pico se mide con {f.memory['measure']}; cuenta lo que reserva el asignador de "
        "PyTorch durante la llamada, no la memoria del proceso ni los búferes internos de otras "
        "bibliotecas.",
        timing_limitation(f.timing["repeats"]),
        threads_limitation(f.timing["torch_threads"]),
        f"La igualdad de tokens se comprobó en decodificación voraz con el modelo "
        f"{f.model_facts['name']}; en fp16 un empate casi exacto de logits podría cambiar un token.",
    ]


def report(f: Findings) -> dict:
    """The contract's body from the lab's findings."""
    return {
        "environment": {"model": f.model_facts["name"], "dtype": f.memory["dtype"]},
        "results": _results(f),
        "evidence": _evidence(f),
        "limitations": _limitations(f),
        "volatile_fields": ["results.exactness", "results.model.logits", "results.memory",
                            "results.timing"],
    }


def check_params(params: dict) -> None:
    if params["heads"] % params["kv_heads"]:
        raise LabParamError(f"heads = {params['heads']} no es múltiplo de kv_heads = "
                            f"{params['kv_heads']}: cada cabeza KV debe servir a un grupo entero "
                            "de cabezas de consulta")
    if len(params["sizes"]) < 3 or sorted(set(params["sizes"])) != list(params["sizes"]):
        raise LabParamError(f"sizes debe tener al menos 3 longitudes distintas en orden creciente "
                            f"(el ajuste del crecimiento necesita 3); se recibió {params['sizes']}")
    if len(params["io_sizes"]) < 2 or sorted(set(params["io_sizes"])) != list(params["io_sizes"]):
        raise LabParamError(f"io_sizes debe tener al menos 2 longitudes distintas en orden "
                            f"creciente; se recibió {params['io_sizes']}")
    need = working_set_bytes(1, 1, params["io_head_dim"], params["io_elem_bytes"])
    if params["fast_memory_kib"] * 1024 < need or min(params["memories_kib"]) * 1024 < need:
        raise LabParamError(f"una memoria rápida de menos de {need} bytes no guarda ni un bloque de "
                            f"1 × 1 con d = {params['io_head_dim']}")


def model_attention(params: dict) -> Callable:
    """The library's tiled ``attn_fn`` with the lab's model tile."""
    return functools.partial(flash_cached_attention, block_q=params["model_block"],
                             block_k=params["model_block"])


def run(seed: int, profile: str, params: dict, device: torch.device) -> dict:
    check_params(params)
    with torch_threads(params["torch_threads"]):
        model = load_model(params["model"], seed, device)
        model16 = load_model(params["model"], seed, device, dtype=torch.float16)
        exactness = measure_exactness(params, seed, flash_attention, device)
        model_facts = measure_model(model, params, seed, model_attention(params), model16)
        memory = measure_memory(params, seed, flash_attention, device)
        timing = measure_timing(params, seed, flash_attention, device)
        backends = sdpa_backends(params, device)
    return report(Findings.from_measurements(params, exactness, model_facts, memory, timing,
                                             backends))


SPEC = LabSpec(
    kind="flash_attention",
    title="FlashAttention",
    chapter=8,
    folder="labs/08-flash-attention",
    ci_budget_s=25,
    run=run,
    params={
        "model": Param("tiny-es", str, "modelo de la prueba de generación", choices=SERVED_MODELS),
        "heads": Param(4, int, "cabezas de consulta de las mediciones", min=1, max=128,
                       by_profile={"gpu": 8}),
        "kv_heads": Param(2, int, "cabezas KV de las mediciones (GQA)", min=1, max=128),
        "head_dim": Param(64, int, "dimensión de cabeza de las mediciones", min=4, max=256),
        "dtype": Param("fp32", str, "dtype de las mediciones de memoria y tiempo",
                       choices=tuple(DTYPES), by_profile={"gpu": "fp16"}),
        "block": Param(64, int, "filas de consulta y claves por bloque del bucle", min=1,
                       max=4096, by_profile={"gpu": 128}),
        "sizes": Param([256, 512, 1024, 2048], int, "longitudes N de las mediciones de memoria y "
                       "tiempo", min=16, max=65536, is_list=True,
                       by_profile={"ci": [128, 256, 512, 1024],
                                   "gpu": [512, 1024, 2048, 4096, 8192]}),
        "repeats": Param(5, int, "rondas intercaladas de la medición de tiempos", min=1, max=50),
        "torch_threads": Param(0, int, "hilos de torch durante el laboratorio (0: los que elija "
                               "torch)", min=0, max=256, by_profile={"ci": 1}),
        "exactness_n": Param(256, int, "tokens de las pruebas de exactitud", min=2, max=8192,
                             by_profile={"ci": 128}),
        "extreme_scores": Param(1e4, float, "desviación típica de las puntuaciones extremas",
                                min=1.0, max=1e6),
        "model_block": Param(16, int, "bloque de la atención dentro del modelo", min=1, max=512),
        "prompt_len": Param(21, int, "tokens del primer prompt de la prueba de generación", min=1,
                            max=256),
        "prompts": Param(3, int, "prompts de la prueba de generación", min=1, max=16),
        "exactness_tokens": Param(16, int, "tokens voraces comparados por prompt", min=1, max=256,
                                  by_profile={"ci": 12}),
        "io_head_dim": Param(64, int, "d del modelo de E/S", min=1, max=1024),
        "io_elem_bytes": Param(2, int, "bytes por elemento del modelo de E/S (fp16: 2)", min=1,
                               max=8),
        "fast_memory_kib": Param(100, int, "memoria rápida del modelo de E/S (KiB)", min=1,
                                 max=1 << 20),
        "memories_kib": Param([32, 64, 100, 192], int, "memorias rápidas de la tabla de bloques "
                              "(KiB)", min=1, max=1 << 20, is_list=True),
        "io_sizes": Param([512, 1024, 2048, 4096, 8192, 16384, 32768], int, "longitudes N del "
                          "modelo de E/S", min=2, max=1 << 22, is_list=True),
        "io_sweep_n": Param(4096, int, "N del barrido de bloques del modelo de E/S", min=2,
                            max=1 << 22),
        "io_sweep_block_k": Param(64, int, "bloque de claves del barrido", min=1, max=1 << 16),
        "challenge_n": Param(2048, int, "N del reto", min=1024, max=1 << 16),
        "challenge_head_dim": Param(64, int, "d del reto", min=16, max=256),
        "challenge_fast_memory_kib": Param(48, int, "memoria rápida del reto (KiB)", min=1,
                                           max=1 << 20),
    },
)
