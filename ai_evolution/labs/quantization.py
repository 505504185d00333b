"""Lab ``quantization`` (chapter 7): fewer bytes per weight, measured, and what they cost.

1. Speed (measured, volatile, :func:`measure_speed`): the batch-1 decode step of the same
   weights in fp32, 16 bits (bf16; fp16 on a GPU without bf16), int8 and int4 on the reader's
   device, interleaved round by round with a read-bandwidth probe, against the bytes each step
   reads (``sim.decode_step_cost`` with ``weight_format``) and the floor they set.
2. Quality (measured, :func:`measure_quality`): the shipped ``tiny-es`` on the CPU in each
   format: perplexity on the validation split its training never saw
   (``model.shipped_models.held_out_tokens``), top-1 agreement with the fp32 model on that text,
   greedy continuations that stay identical, and the error of every quantized weight matrix.
3. The KV cache in int8 (a scale per token and head): how many more sequences fit in chapter 2's
   budgets (computed, :func:`kv_budgets`), what it costs ``tiny-es`` on the same held-out text
   (measured, :func:`measure_kv`), and from which batch size the cache, read once per sequence,
   outweighs the weights, read once per step (computed, :func:`weights_vs_kv`).

:func:`analyse_speed`, :func:`analyse_quality` and :func:`analyse_kv` turn the samples into
typed findings (numbers and :mod:`ai_evolution.claims` claims, their ``verdicts``);
:class:`Findings` gathers them, and :func:`report` turns the findings into the contract's body.
``run`` (``run_lab``, the CLI, the grader) is measure + analyse + report with the library's functions;
the notebook calls the same functions in its own cells with the student's ``predict_step_s``
plugged in, so a page and its contract come from one run.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .. import claims
from ..fmt import es, es_bytes, es_count
from ..generation import generate
from ..hardware import default_dtype, measure_stream_bandwidths
from ..model import (get_preset, kv_bytes_per_token, load_model, load_tokenizer, memory_budget,
                     param_count)
from ..model.attention import ContiguousKVCache
from ..model.memory import (dtype_bytes, linear_shapes, parse_weight_format,
                            quantized_weight_bytes, weight_bytes)
from ..model.quant import QuantizedLinear, kernels, model_bytes, quant_error, quantize_model
from ..model.shipped_models import held_out_tokens
from ..reference.quantization import reference_predict_step_s
from ..sim import decode_step_cost, weight_bytes_read
from ..timing import step_times, torch_threads
from .common import GPU_TEXT_MODEL, load_served_model, worked_examples
from .contract import evidence as _ev, timing_limitation
from .registry import LabParamError, LabSpec, Param

SPEED_MODELS = ("cpu-200m", "smollm2-135m", "qwen3-0.6b", "qwen2.5-0.5b", "tiny-es")
QUALITY_FORMATS = ("int8", "int4-g64", "int4-g32", "int4-asym-g64", "int4-asym-g32")
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
# A halving of the bytes "shows in the step" when the step drops by at least this share of what
# the bytes drop (time ratio / bytes ratio >= HALVING).
HALVING = 0.8
# The challenge: the cheapest format whose perplexity stays within this fraction of bf16's.
CHALLENGE_TOLERANCE = 0.02


def half_dtype(device: torch.device | str) -> torch.dtype:
    """The 16-bit dtype the speed ladder uses: bf16 on the CPU and where a GPU has it, fp16 on
    a GPU without bf16 (a T4)."""
    device = torch.device(device)
    return torch.bfloat16 if device.type != "cuda" else default_dtype(device)


def check_params(params: dict, config) -> None:
    """The timed sequence fits the model, and the int4 groups divide every linear layer."""
    longest = params["prompt_len"] + params["decode_tokens"] + 1
    if longest > config.max_position_embeddings:
        raise LabParamError(f"prompt_len + decode_tokens = {longest - 1} supera las "
                            f"{config.max_position_embeddings} posiciones de {config.name}")
    try:
        quantized_weight_bytes(config, f"int4-g{params['group_size']}")
    except ValueError as err:
        raise LabParamError(f"group_size={params['group_size']} no sirve para {config.name}: "
                            f"{err}") from None


# --- measuring: speed ---------------------------------------------------------------------------
def step_s(model, prompt: list[int], new_tokens: int) -> float:
    """Median seconds of the decode steps of one greedy generation of ``new_tokens`` tokens
    (the first token, which includes the prefill, left out)."""
    return float(np.median(step_times(model, prompt, new_tokens, cache="contiguous", repeats=1,
                                      warmup=0)[1:]))


def speed_ladder(fp32_model, device, group_size: int) -> list[dict]:
    """The same weights four ways: fp32, 16 bits, and the 16-bit model quantized to int8 and to
    int4 (groups of ``group_size``), each a dict with its ``label``, ``model``, ``dtype`` (the
    name of its floating dtype: activations, scales, embedding) and ``weight_format``."""
    hd = half_dtype(device)
    hn = DTYPE_NAMES[hd]
    half = copy.deepcopy(fp32_model).to(hd)
    int4 = f"int4-g{group_size}"
    return [{"label": "fp32", "model": fp32_model, "dtype": "fp32", "weight_format": None},
            {"label": hn, "model": half, "dtype": hn, "weight_format": None},
            {"label": "int8", "model": quantize_model(half, "int8"), "dtype": hn,
             "weight_format": "int8"},
            {"label": int4, "model": quantize_model(half, int4), "dtype": hn,
             "weight_format": int4}]


def measure_speed(params: dict, seed: int, device: torch.device | str) -> dict:
    """Every timing of the lab in one interleaved run, with ``params["torch_threads"]`` threads
    (the models are built before, with torch's own): per round, one sample of the read probe
    and one median decode step of each rung of :func:`speed_ladder`. Plain lists, one value
    per round."""
    device = torch.device(device)
    fp32 = load_model(params["speed_model"], seed, device, dtype=torch.float32).eval()
    check_params(params, fp32.config)
    ladder = speed_ladder(fp32, device, params["group_size"])  # built with torch's own threads
    with torch_threads(params["torch_threads"]):
        return _measure_speed(params, seed, device, ladder)


def _measure_speed(params: dict, seed: int, device: torch.device, ladder: list[dict]) -> dict:
    cfg = ladder[0]["model"].config
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, cfg.vocab_size, (params["prompt_len"],), generator=gen).tolist()
    n = params["decode_tokens"]
    context = params["prompt_len"] + n // 2  # the average context of the timed steps
    for rung in ladder:  # warm-up: first calls allocate, choose kernels, repack int4 weights
        step_s(rung["model"], prompt, 3)
    samples: dict[str, list[float]] = {r["label"]: [] for r in ladder}

    def rounds(rep: int) -> None:
        for rung in ladder:
            samples[rung["label"]].append(step_s(rung["model"], prompt, n))

    probes = measure_stream_bandwidths(device, repeats=params["repeats"], between=rounds,
                                       working_set_bytes=params["probe_mib"] * 2**20,
                                       size_bytes=params["probe_mib"] * 2**20, progress=False)
    read = probes["read"]
    rows = []
    for rung in ladder:
        model, fmt = rung["model"], rung["weight_format"]
        used = (kernels(model, next(model.parameters()).dtype) if fmt else {"F.linear": len(
            [m for m in model.modules() if isinstance(m, nn.Linear)])})
        rows.append({"label": rung["label"], "dtype": rung["dtype"], "weight_format": fmt,
                     "kernels": used,
                     "bytes_per_step": decode_step_cost(cfg, 1, context, rung["dtype"],
                                                        weight_format=fmt).bytes,
                     "model_bytes": model_bytes(model),
                     "step_s": samples[rung["label"]]})
    return {"model": cfg.name, "parameters": param_count(cfg), "device": device.type,
            "prompt_len": params["prompt_len"], "decode_tokens": n, "context_len": context,
            "repeats": params["repeats"], "torch_threads": torch.get_num_threads(),
            "read_bytes": read.params["size_bytes"],
            "bandwidth_read_gbps": list(read.samples), "formats": rows}


# --- measuring: quality -------------------------------------------------------------------------
def chunk_losses(model, chunks: list[list[int]]) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
    """One forward pass per chunk: the summed next-token negative log-likelihood of each chunk
    (nats), its number of predicted tokens, and the top-1 prediction at each of its positions."""
    device = next(model.parameters()).device
    nll, counts, top1 = [], [], []
    with torch.inference_mode():
        for c in chunks:
            ids = torch.tensor([c], device=device)
            logits = model(ids[:, :-1])[0].float()
            nll.append(float(F.cross_entropy(logits, ids[0, 1:], reduction="sum")))
            counts.append(len(c) - 1)
            top1.append(logits.argmax(-1).tolist())
    return np.asarray(nll), np.asarray(counts, dtype=np.float64), top1


def layer_errors(reference: nn.Module, model: nn.Module) -> dict[str, float]:
    """Per linear layer (module order), the relative error ||W - W_hat|| / ||W|| of ``model``'s
    weight (dequantized if quantized) against ``reference``'s."""
    ref = dict(reference.named_modules())
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, QuantizedLinear):
            w_hat = m.dequantize(torch.float32)
        elif isinstance(m, nn.Linear):
            w_hat = m.weight.detach().float()
        else:
            continue
        out[name] = quant_error(ref[name].weight.detach().float(), w_hat).rel
    return out


def quality_ladder(fp32_model, formats: tuple[str, ...] | list[str]) -> list[dict]:
    """tiny-es in fp32, bf16 and each of ``formats`` (quantized from the bf16 model)."""
    half = copy.deepcopy(fp32_model).to(torch.bfloat16)
    return ([{"label": "fp32", "model": fp32_model, "dtype": "fp32", "weight_format": None},
             {"label": "bf16", "model": half, "dtype": "bf16", "weight_format": None}]
            + [{"label": parse_weight_format(f).name, "model": quantize_model(half, f),
                "dtype": "bf16", "weight_format": parse_weight_format(f).name} for f in formats])


# The quality measurements' models: the shipped trained model, and (the `gpu` profile) the real
# checkpoint that labs 2 and 6 serve, with their fallback to tiny-es when it cannot be had.
QUALITY_MODELS = ("tiny-es", GPU_TEXT_MODEL)


def quality_text(name: str) -> tuple[nn.Module, list[list[int]], dict]:
    """The fp32 model (CPU) whose quality the lab measures, the held-out text in its tokens, and
    what was served. tiny-es reads its own validation split; a Hub checkpoint reads the same
    text, decoded from tiny-es's tokens and encoded with its own tokenizer, so both models are
    scored on one text (their perplexities are not comparable: the tokens differ)."""
    if name == "tiny-es":
        served = {"model": name, "model_requested": name, "model_fallback_reason": None}
        return load_model(name, 0, "cpu").eval(), held_out_tokens(name), served
    got = load_served_model(name, 0, "cpu", dtype=torch.float32)
    chunks = held_out_tokens("tiny-es")
    if not got.fell_back:
        shipped = load_tokenizer("tiny-es")
        chunks = [got.tokenizer.encode(shipped.decode(c)) for c in chunks]
    return got.model.eval(), chunks, got.environment()


def _scored(quality: dict) -> str:
    """The model whose perplexity is quoted; a Hub model is scored on tiny-es's held-out text."""
    name = quality["model"]
    return name if name == "tiny-es" else f"{name} (en el texto reservado de tiny-es)"


def _with_model(quality: dict) -> str:
    return "" if quality["model"] == "tiny-es" else f", con {quality['model']}"


def measure_quality(params: dict) -> dict:
    """tiny-es on the CPU in every rung of :func:`quality_ladder`: per chunk of the held-out
    text, the summed NLL, the tokens and the top-1 agreement with fp32; greedy continuations of
    held-out prompts against fp32's; per-layer weight errors against the fp32 weights."""
    with torch_threads(params["torch_threads"]):
        return _measure_quality(params)


def _measure_quality(params: dict) -> dict:
    fp32, chunks, served = quality_text(params["quality_model"])
    cfg = fp32.config
    ladder = quality_ladder(fp32, params["quality_formats"])
    _, _, ref_top1 = chunk_losses(fp32, chunks)
    k = params["agreement_prompt_tokens"]
    prompts = [c[:k] for c in chunks if len(c) >= k][:params["agreement_prompts"]]
    ref_cont = generate(fp32, prompts, params["agreement_tokens"])
    n_linear = sum(o * i for _, o, i in linear_shapes(cfg))
    rows = []
    for rung in ladder:
        model, fmt = rung["model"], rung["weight_format"]
        nll, counts, top1 = chunk_losses(model, chunks)
        same = sum(int(a == b) for x, y in zip(top1, ref_top1) for a, b in zip(x, y))
        cont = generate(model, prompts, params["agreement_tokens"])
        prefix = [next((j for j, (a, b) in enumerate(zip(x, y)) if a != b), len(x))
                  for x, y in zip(cont, ref_cont)]
        linear_bytes = (quantized_weight_bytes(cfg, fmt, "bf16") if fmt
                        else n_linear * dtype_bytes(rung["dtype"]))
        rows.append({"label": rung["label"], "weight_format": fmt, "dtype": rung["dtype"],
                     "bytes_per_weight": linear_bytes / n_linear,
                     "model_bytes": model_bytes(model),
                     "model_bytes_predicted": weight_bytes(cfg, rung["dtype"], weight_format=fmt),
                     "chunk_nll": nll.tolist(),
                     "perplexity": float(np.exp(nll.sum() / counts.sum())),
                     "top1_agreement": same / counts.sum(),
                     "identical_continuations": sum(p == len(x) for p, x in zip(prefix, cont)),
                     "tokens_before_divergence": prefix,
                     "layer_errors": layer_errors(fp32, model)})
    return {"model": served["model"], "served": served, "parameters": param_count(cfg),
            "linear_weights": n_linear,
            "chunks": len(chunks), "chunk_tokens": [len(c) - 1 for c in chunks],
            "held_out_tokens": sum(len(c) for c in chunks),
            "agreement_prompts": len(prompts), "agreement_prompt_tokens": k,
            "agreement_tokens": params["agreement_tokens"], "formats": rows}


# --- the KV cache in int8 ----------------------------------------------------------------------
# Chapter 2's worked budgets and the model and dtype each one serves.
BUDGET_MODELS = {"gpu24_7b": ("llama-2-7b", "fp16"), "h100_llama31_8b": ("llama-3.1-8b", "bf16")}


def kv_budgets() -> dict[str, dict]:
    """Chapter 2's worked budgets (``labs.common.worked_examples``) with the cache in its float
    dtype and in int8 with a scale per token and head in that dtype: same memory, same weights."""
    out = {}
    examples = worked_examples()
    for key, (name, dtype) in BUDGET_MODELS.items():
        base, cfg = examples[key], get_preset(name)
        assert base.kv_bytes_per_token == kv_bytes_per_token(cfg, dtype)
        int8 = memory_budget(cfg, base.gpu_memory_bytes, max_len=base.max_len,
                             typical_len=base.typical_len, utilization=base.utilization,
                             dtype=dtype, weights_bytes=base.weight_bytes, kv_dtype="int8",
                             kv_scale_dtype=dtype)
        out[key] = {"model": name, "dtype": dtype, "gpu_memory_bytes": base.gpu_memory_bytes,
                    "max_len": base.max_len, "typical_len": base.typical_len,
                    **{field: {dtype: getattr(base, field), "int8": getattr(int8, field)}
                       for field in ("kv_bytes_per_token", "static_slots",
                                     "on_demand_sequences", "max_tokens")}}
    return out


def weights_vs_kv(model: str = "llama-3.1-8b", context_len: int = 4096, dtype: str = "bf16",
                  weight_format: str = "int4-g128",
                  batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)) -> dict:
    """Bytes one decode step reads at each batch size, weights (read once per step) and KV cache
    (read once per sequence, ``context_len + 1`` tokens each), with weights in ``dtype`` or
    ``weight_format`` and the cache in ``dtype`` or int8 (scales in ``dtype``); and the batch
    size at which the cache outweighs the weights in each case."""
    cfg = get_preset(model)
    weights = {dtype: weight_bytes_read(cfg, dtype, 1),
               weight_format: weight_bytes_read(cfg, dtype, 1, weight_format=weight_format)}
    per_seq = {dtype: kv_bytes_per_token(cfg, dtype) * (context_len + 1),
               "int8": kv_bytes_per_token(cfg, "int8", scale_dtype=dtype) * (context_len + 1)}
    cases = {f"pesos {w}, caché {k}": (w, k) for w in weights for k in per_seq}
    return {"model": model, "context_len": context_len, "batches": list(batches),
            "weight_bytes": weights, "kv_bytes_per_sequence": per_seq,
            "crossing_batch": {label: weights[w] / per_seq[k] for label, (w, k) in cases.items()},
            "step_bytes": {label: [weights[w] + b * per_seq[k] for b in batches]
                           for label, (w, k) in cases.items()}}


def cached_logits(model, ids: list[int], kv_dtype: str | None) -> torch.Tensor:
    """Logits of a prefill of ``ids[:-1]`` into a fresh contiguous cache (float or int8): every
    position attends over keys and values read back from that cache."""
    device = next(model.parameters()).device
    x = torch.tensor([ids[:-1]], device=device)
    cache = ContiguousKVCache(model.config, 1, x.shape[1], dtype=next(model.parameters()).dtype,
                              device=device, kv_dtype=kv_dtype)
    with torch.inference_mode():
        return model(x, positions=torch.arange(x.shape[1], device=device)[None],
                     kv_cache=cache)[0].float()


def measure_kv(params: dict) -> dict:
    """tiny-es (fp32, CPU) on the held-out text with its KV cache in fp32 and in int8 (fp32
    scales): per chunk the summed NLL of each, the largest |logit| difference, top-1 agreement;
    greedy continuations of held-out prompts with each cache."""
    with torch_threads(params["torch_threads"]):
        model, chunks, served = quality_text(params["quality_model"])
        out: dict = {"float": {"chunk_nll": []}, "int8": {"chunk_nll": []}}
        diff = top = same = 0.0
        for c in chunks:
            target = torch.tensor(c[1:])
            logits = {k: cached_logits(model, c, None if k == "float" else "int8") for k in out}
            for k, lg in logits.items():
                out[k]["chunk_nll"].append(float(F.cross_entropy(lg, target, reduction="sum")))
            diff = max(diff, float((logits["int8"] - logits["float"]).abs().max()))
            top = max(top, float(logits["float"].abs().max()))
            same += int((logits["int8"].argmax(-1) == logits["float"].argmax(-1)).sum())
        k = params["agreement_prompt_tokens"]
        prompts = [c[:k] for c in chunks if len(c) >= k][:params["agreement_prompts"]]
        ref = generate(model, prompts, params["agreement_tokens"])
        got = generate(model, prompts, params["agreement_tokens"], kv_dtype="int8")
        counts = [len(c) - 1 for c in chunks]
        cfg = model.config
        return {"model": served["model"], "dtype": "fp32", "chunk_tokens": counts,
                "held_out_tokens": sum(len(c) for c in chunks),
                "kv_bytes_per_token": {"fp32": kv_bytes_per_token(cfg, "fp32"),
                                       "int8": kv_bytes_per_token(cfg, "int8", scale_dtype="fp32")},
                "cache_nbytes": {"fp32": ContiguousKVCache(cfg, 1, 100).nbytes,
                                 "int8": ContiguousKVCache(cfg, 1, 100, kv_dtype="int8").nbytes},
                "chunk_nll": {k: v["chunk_nll"] for k, v in out.items()},
                "max_abs_logit_diff": diff, "max_abs_logit": top,
                "top1_agreement": same / sum(counts),
                "identical_continuations": sum(a == b for a, b in zip(ref, got)),
                "agreement_prompts": len(prompts)}


@dataclass(frozen=True)
class KVFindings:
    """What :func:`analyse_kv` finds in :func:`measure_kv`'s samples: the perplexity with each
    cache, the increase with its chunk-bootstrap interval, and the claim ``kv_quality`` (does
    the int8 cache raise the perplexity?)."""

    perplexity: dict[str, float]
    increase: float
    increase_interval: list[float]
    kv_quality: claims.Claim

    @property
    def verdicts(self) -> dict[str, claims.Claim]:
        return {"kv_quality": self.kv_quality}


def analyse_kv(kv: dict) -> KVFindings:
    """:func:`measure_kv`'s samples as :class:`KVFindings`."""
    counts = kv["chunk_tokens"]
    nll = kv["chunk_nll"]
    est = increase_estimate(nll["int8"], nll["float"], counts)
    ppl = {k: float(np.exp(sum(v) / sum(counts))) for k, v in nll.items()}
    claim = claims.threshold(
        est.median, 0.0, below=True, scale=100, unit="%", decimals=2, interval=est,
        what=(f"aumento de la perplejidad de {kv['model']} con la caché KV en int8 frente a la "
              f"caché en fp32 ({es(ppl['float'], 1)}), en el mismo texto reservado"),
        passed="no es mayor que con la caché en fp32",
        failed="la perplejidad sube con la caché en int8",
        inconclusive=("su intervalo contiene el 0: en este texto la diferencia no se distingue "
                      "de la que da elegir otros fragmentos"))
    return KVFindings(ppl, est.median, [est.low, est.high], claim)


# --- what the measurements say: speed -----------------------------------------------------------
def _median(x) -> float:
    return float(np.median(np.asarray(x, dtype=np.float64)))


def halving_verdicts(rows: list[dict]) -> dict[str, claims.Claim]:
    """For each rung up the ladder, ``halving_<format>``: does the step drop in the proportion of
    the bytes (at least ``HALVING`` of it), step ratio over bytes ratio with a paired interval?"""
    found = {}
    for prev, cur in zip(rows, rows[1:]):
        bytes_ratio = prev["bytes_per_step"] / cur["bytes_per_step"]
        est = claims.ratio_estimate(prev["step_s"], cur["step_s"])
        found[f"halving_{cur['label']}"] = claims.threshold(
            est.median / bytes_ratio, HALVING, below=False, scale=100, unit="%", decimals=0,
            interval=(est.low / bytes_ratio, est.high / bytes_ratio), coverage=est.coverage,
            n=est.n, method=est.method,
            what=(f"de {prev['label']} a {cur['label']} los bytes por paso bajan "
                  f"{es(bytes_ratio, 2)} veces y el paso, {es(est.median, 2)} veces: lo que baja "
                  f"el paso / lo que bajan los bytes"),
            passed=("el paso baja al menos en la proporción del criterio: su tiempo sigue a los "
                    "bytes que lee, aunque los lea más despacio que la sonda (la eficiencia de "
                    "cada formato lo dice)"),
            failed=("el paso baja bastante menos que los bytes: pesa algo más que su lectura "
                    + ("(el resto del paso, desempaquetar los enteros o un kernel que no satura "
                       "la memoria)" if cur["weight_format"] else
                       "(el resto del paso, que no cambia con el tipo, o un kernel de "
                       f"{cur['label']} que no satura la memoria)")),
            inconclusive=("con este ruido no se puede decir si el paso baja en la proporción de "
                          "los bytes"))
    return found


@dataclass(frozen=True)
class SpeedFindings:
    """What :func:`analyse_speed` finds in :func:`measure_speed`'s samples: the read rate, the
    overhead calibrated on the 16-bit rung, one row per rung (its floor, step, efficiency and
    prediction) and the claims by key (``faster_<format>``, ``prediction_<format>``,
    ``halving_<format>``)."""

    bandwidth_bytes_per_s: float
    overhead_s: float
    rows: list[dict]
    verdicts: dict[str, claims.Claim]


def analyse_speed(speed: dict, config,
                  predict_fn: Callable = reference_predict_step_s) -> SpeedFindings:
    """Per rung: the floor (bytes / the read probe, per round), the efficiency floor / step with
    its paired interval, and the prediction of ``predict_fn`` (exercise 3) with the overhead
    calibrated on the 16-bit rung (its median step minus its bandwidth-only prediction). Claims:
    each quantized rung against the 16-bit one, and each halving of the bytes up the ladder."""
    bw = np.asarray(speed["bandwidth_read_gbps"], dtype=np.float64) * 1e9
    bw_med = float(np.median(bw))
    rows = speed["formats"]
    half = rows[1]
    ctx = speed["context_len"]

    def predict(row, overhead: float) -> float:
        return float(predict_fn(config, row["weight_format"], row["dtype"], ctx, bw_med, overhead))

    overhead = max(0.0, _median(half["step_s"]) - predict(half, 0.0))
    out = []
    for row in rows:
        steps = np.asarray(row["step_s"], dtype=np.float64)
        floors = row["bytes_per_step"] / bw
        eff = claims.ratio_estimate(floors, steps)
        out.append({"label": row["label"], "bytes_per_step": row["bytes_per_step"],
                    "floor_s": _median(floors), "step_s": _median(steps),
                    "step_range_s": [float(steps.min()), float(steps.max())],
                    "efficiency": eff.median, "efficiency_interval": [eff.low, eff.high],
                    "predicted_s": predict(row, overhead),
                    "bandwidth_only_s": predict(row, 0.0)})
    found: dict[str, claims.Claim] = {}
    hn = half["label"]
    for row, o in zip(rows[2:], out[2:]):
        found[f"faster_{row['label']}"] = claims.compare(
            claims.as_inputs(half["step_s"]), claims.as_inputs(row["step_s"]),
            what=f"paso de decodificación en {hn} / paso en {row['label']}",
            higher=f"{row['label']} decodifica más deprisa que {hn} en esta máquina",
            lower=f"{row['label']} decodifica más despacio que {hn} en esta máquina")
        # the same prediction, round by round (each round's read rate, the same overhead)
        o["predicted_rounds_s"] = [o["predicted_s"] - o["bandwidth_only_s"]
                                   + o["bandwidth_only_s"] * bw_med / float(b) for b in bw]
        found[f"prediction_{row['label']}"] = claims.compare(
            claims.as_inputs(row["step_s"]), claims.as_inputs(o["predicted_rounds_s"]),
            what=(f"paso medido en {row['label']} / predicción (suelo + la sobrecarga de "
                  f"{hn}, {es(1e3 * overhead, 1)} ms)"),
            higher=(f"el paso en {row['label']} tarda más de lo que predicen sus bytes con la "
                    f"sobrecarga de {hn}: el formato añade trabajo que no es leer"),
            lower=(f"el paso en {row['label']} tarda menos de lo que predicen sus bytes con la "
                   f"sobrecarga de {hn}: esa sobrecarga no es fija, y parte de ella crece con "
                   "los bytes (un kernel que lee más despacio que la memoria)"),
            inconclusive=(f"con este ruido el paso en {row['label']} no se distingue de la "
                          "predicción"))
    found |= halving_verdicts(rows)
    return SpeedFindings(bw_med, overhead, out, found)


# --- what the measurements say: quality --------------------------------------------------------
def increase_estimate(nll: list[float], nll_ref: list[float], counts: list[float],
                      n_boot: int = claims.N_BOOT, seed: int = 0,
                      level: float = claims.LEVEL) -> claims.Estimate:
    """Perplexity of ``nll`` over perplexity of ``nll_ref`` minus 1 (both per chunk, summed
    nats, over the same ``counts`` tokens), with a bootstrap interval that resamples chunks
    (paired: a chunk's two losses stay together). A pooled perplexity has no order-statistic
    interval, so the bootstrap's level is stated as approximate, and only from
    ``claims.BOOT_MIN_N`` chunks on; with fewer it is a range that decides nothing."""
    a, b = np.asarray(nll, float), np.asarray(nll_ref, float)
    n = np.asarray(counts, float)
    value = float(np.expm1((a.sum() - b.sum()) / n.sum()))
    if len(n) < 2:
        return claims.Estimate(value, value, value, len(n))
    idx = np.random.default_rng(seed).integers(0, len(n), size=(n_boot, len(n)))
    boot = np.expm1((a[idx].sum(1) - b[idx].sum(1)) / n[idx].sum(1))
    tail = 100 * (1 - level) / 2
    return claims.Estimate(value, float(np.percentile(boot, tail)),
                           float(np.percentile(boot, 100 - tail)), len(n),
                           level if len(n) >= claims.BOOT_MIN_N else 0.0, claims.BOOTSTRAP)


def pareto_front(rows: list[dict]) -> list[str]:
    """The labels no other row beats on both bytes per weight and perplexity (ascending bytes)."""
    front = [r for r in rows if not any(
        o["bytes_per_weight"] <= r["bytes_per_weight"] and o["perplexity"] <= r["perplexity"]
        and (o["bytes_per_weight"], o["perplexity"]) != (r["bytes_per_weight"], r["perplexity"])
        for o in rows)]
    return [r["label"] for r in sorted(front, key=lambda r: r["bytes_per_weight"])]


@dataclass(frozen=True)
class QualityFindings:
    """What :func:`analyse_quality` finds in :func:`measure_quality`'s samples: one row per rung,
    the Pareto front and one claim per quantized format (``quality_<format>``)."""

    rows: list[dict]
    pareto: list[str]
    verdicts: dict[str, claims.Claim]


def analyse_quality(quality: dict) -> QualityFindings:
    """Per rung: perplexity, its increase over bf16 with a chunk-bootstrap interval, agreement
    with fp32; the Pareto front; one claim per quantized format (does its perplexity exceed
    bf16's?)."""
    rows = quality["formats"]
    base = next(r for r in rows if r["label"] == "bf16")
    counts = quality["chunk_tokens"]
    out, found = [], {}
    for r in rows:
        est = increase_estimate(r["chunk_nll"], base["chunk_nll"], counts)
        errs = list(r["layer_errors"].values())
        worst = max(r["layer_errors"], key=r["layer_errors"].get)
        out.append({"label": r["label"], "bytes_per_weight": r["bytes_per_weight"],
                    "perplexity": r["perplexity"], "increase_vs_bf16": est.median,
                    "increase_interval": [est.low, est.high],
                    "top1_agreement": r["top1_agreement"],
                    "identical_continuations": r["identical_continuations"],
                    "mean_tokens_before_divergence": float(np.mean(r["tokens_before_divergence"])),
                    "layer_error_mean": float(np.mean(errs)), "layer_error_max": max(errs),
                    "worst_layer": worst})
        if r["weight_format"]:
            found[f"quality_{r['label']}"] = claims.threshold(
                est.median, 0.0, below=True, scale=100, unit="%", decimals=2, interval=est,
                what=(f"aumento de la perplejidad de {r['label']} frente a bf16 en el texto "
                      f"reservado de tiny-es{_with_model(quality)} "
                      f"({es(base['perplexity'], 1)} en bf16)"),
                passed="no es mayor que la de bf16",
                failed="la perplejidad sube frente a bf16",
                inconclusive=("su intervalo contiene el 0: en este texto la diferencia no se "
                              "distingue de la que da elegir otros fragmentos"))
    found |= group_verdicts(quality)
    return QualityFindings(out, pareto_front(out), found)


def group_verdicts(quality: dict) -> dict[str, claims.Claim]:
    """``group_<a>_<b>``: for each pair of int4 formats that differ only in their group size
    (say g32 and g64), does the smaller group predict the held-out text better? The same
    chunk-paired interval as the quality claims, so "indistinguishable" is a branch: a model
    this small on a text this short may not show what smaller groups gain."""
    rows = {r["label"]: r for r in quality["formats"]}
    found = {}
    for label, r in rows.items():
        small, _, size = label.rpartition("-g")
        other = next((o for o in rows if o.startswith(small + "-g") and o != label
                      and int(o.rpartition("-g")[2]) > int(size)), None) if small else None
        if other is None:
            continue
        est = increase_estimate(r["chunk_nll"], rows[other]["chunk_nll"], quality["chunk_tokens"])
        found[f"group_{label}"] = claims.threshold(
            est.median, 0.0, below=True, scale=100, unit="%", decimals=2, interval=est,
            what=f"perplejidad de {label} frente a {other}, en el mismo texto reservado",
            passed=(f"los grupos de {size} siguen mejor los pesos que los de "
                    f"{other.rpartition('-g')[2]}: predicen el texto algo mejor"),
            failed=(f"aquí los grupos de {size} predicen peor que los de "
                    f"{other.rpartition('-g')[2]}, contra lo que se espera de grupos más "
                    "pequeños: en un modelo tan pequeño, qué pesos caen en qué grupo pesa más "
                    "que el tamaño del grupo"),
            inconclusive=(f"la diferencia entre grupos de {size} y de "
                          f"{other.rpartition('-g')[2]} no se distingue de la que da elegir otros "
                          "fragmentos: este modelo y este texto no bastan para ver lo que ganan "
                          "los grupos más pequeños"))
    return found


def cheapest_within(rows: list[dict], tolerance: float = CHALLENGE_TOLERANCE) -> dict:
    """The challenge's rule, for the tests and the hidden check: among the quantized rows and
    bf16, the one with the fewest bytes per weight whose perplexity increase over bf16 stays
    within ``tolerance`` at the upper end of its interval (bf16 itself always does)."""
    ok = [r for r in rows if r["label"] != "fp32" and r["increase_interval"][1] <= tolerance]
    return min(ok, key=lambda r: (r["bytes_per_weight"], r["perplexity"]))


# --- the contract -------------------------------------------------------------------------------
def _ms(seconds) -> list[float]:
    return [1e3 * float(s) for s in seconds]


CRITERIA = (
    ("faster_int8", "int8 decodifica más deprisa que 16 bits"),
    ("faster_int4", "int4 decodifica más deprisa que 16 bits"),
    ("quality_int8", "la perplejidad de int8 no sube de forma distinguible frente a bf16"),
)


def criteria_sentence(met: dict[str, bool]) -> str:
    """The sentence that says which of the chapter's criteria (``CRITERIA``) a run meets."""
    missed = [text for key, text in CRITERIA if not met[key]]
    if not missed:
        return f"Esta ejecución cumple las {len(CRITERIA)} expectativas del capítulo."
    return (f"Esta ejecución no cumple {len(missed)} de las {len(CRITERIA)} expectativas del "
            f"capítulo: " + "; ".join(f"«{t}»" for t in missed) + ".")


@dataclass(frozen=True)
class Findings:
    """What the lab found, between its measurements and its report: the three measurements
    (:func:`measure_speed`, :func:`measure_quality`, :func:`measure_kv`) and what
    :func:`analyse_speed`, :func:`analyse_quality` and :func:`analyse_kv` found in them."""

    params: dict
    speed: dict
    speed_found: SpeedFindings
    quality: dict
    quality_found: QualityFindings
    kv: dict
    kv_found: KVFindings

    @property
    def verdicts(self) -> dict[str, claims.Claim]:
        """Every claim of the lab, by key."""
        return self.speed_found.verdicts | self.quality_found.verdicts | self.kv_found.verdicts

    @property
    def criteria_met(self) -> dict[str, bool]:
        """Which of the chapter's criteria (``CRITERIA``) this run meets: a quantized rung faster
        than the 16-bit one, and int8's perplexity not above bf16's beyond the noise."""
        def first(prefix: str) -> claims.Claim:  # int4's key carries its group: faster_int4-g128
            return next(c for k, c in self.verdicts.items() if k.startswith(prefix))
        return {"faster_int8": first("faster_int8").outcome == claims.HIGHER,
                "faster_int4": first("faster_int4").outcome == claims.HIGHER,
                "quality_int8": first("quality_int8").outcome != claims.FAILED}


def _speed_results(f: Findings) -> dict:
    speed, sf = f.speed, f.speed_found
    return {"model": speed["model"], "parameters": speed["parameters"],
            "device": speed["device"], "context_len": speed["context_len"],
            "decode_tokens": speed["decode_tokens"], "repeats": speed["repeats"],
            "torch_threads": speed["torch_threads"],
            "bandwidth_read_gbps": sf.bandwidth_bytes_per_s / 1e9,
            "bandwidth_samples_gbps": speed["bandwidth_read_gbps"],
            "overhead_ms": 1e3 * sf.overhead_s,
            "formats": [{"label": r["label"], "kernels": m["kernels"],
                         "step_ms": 1e3 * r["step_s"], "step_samples_ms": _ms(m["step_s"]),
                         "floor_ms": 1e3 * r["floor_s"], "efficiency": r["efficiency"],
                         "efficiency_interval": r["efficiency_interval"],
                         "predicted_ms": 1e3 * r["predicted_s"]}
                        for r, m in zip(sf.rows, speed["formats"])],
            "verdicts": {k: c.outcome for k, c in sf.verdicts.items()},
            "expectations": f.criteria_met}


def _bytes_results(f: Findings) -> dict:
    speed, quality = f.speed, f.quality
    return {"speed_model": speed["model"],
            "per_step": {r["label"]: r["bytes_per_step"] for r in speed["formats"]},
            "held_by_model": {r["label"]: r["model_bytes"] for r in speed["formats"]},
            "quality_model": quality["model"],
            "per_weight": {r["label"]: r["bytes_per_weight"] for r in quality["formats"]},
            "quality_model_bytes": {r["label"]: r["model_bytes"] for r in quality["formats"]},
            "quality_model_bytes_predicted": {r["label"]: r["model_bytes_predicted"]
                                              for r in quality["formats"]}}


def _results(f: Findings) -> dict:
    quality, qf, kv, kf = f.quality, f.quality_found, f.kv, f.kv_found
    return {
        "speed": _speed_results(f),
        "bytes": _bytes_results(f),
        "quality": {"model": quality["model"], "held_out_tokens": quality["held_out_tokens"],
                    "chunks": quality["chunks"], "agreement_prompts": quality["agreement_prompts"],
                    "agreement_tokens": quality["agreement_tokens"],
                    "formats": qf.rows, "pareto": qf.pareto,
                    "verdicts": {k: c.outcome for k, c in qf.verdicts.items()}},
        "kv": {"budgets": kv_budgets(), "weights_vs_kv": weights_vs_kv(),
               "measured": {"model": kv["model"], "dtype": kv["dtype"],
                            "kv_bytes_per_token": kv["kv_bytes_per_token"],
                            "cache_nbytes_100_tokens": kv["cache_nbytes"],
                            "perplexity": kf.perplexity,
                            "increase": kf.increase,
                            "increase_interval": kf.increase_interval,
                            "max_abs_logit_diff": kv["max_abs_logit_diff"],
                            "max_abs_logit": kv["max_abs_logit"],
                            "top1_agreement": kv["top1_agreement"],
                            "identical_continuations": kv["identical_continuations"],
                            "agreement_prompts": kv["agreement_prompts"],
                            "verdict": kf.kv_quality.outcome}},
    }


def _speed_evidence(f: Findings) -> list[dict]:
    """Bytes per step, the bytes the quantized models hold, the floors and steps, and the speed
    claims (faster, halving, prediction)."""
    speed, quality, sf = f.speed, f.quality, f.speed_found
    srows = sf.rows
    q8 = next(r for r in srows if r["label"] == "int8")
    q4 = srows[3]
    exact = all(r["model_bytes"] == r["model_bytes_predicted"] for r in quality["formats"])
    return [
        _ev(f"Un paso de decodificación con lote 1 de {speed['model']} lee "
            f"{es_bytes(srows[0]['bytes_per_step'])} en fp32, "
            f"{es_bytes(srows[1]['bytes_per_step'])} en {srows[1]['label']}, "
            f"{es_bytes(q8['bytes_per_step'])} en int8 y {es_bytes(q4['bytes_per_step'])} en "
            f"{q4['label']} (pesos con sus escalas, una fila de la tabla de embeddings y la caché "
            f"de {speed['context_len']} tokens).", q4["bytes_per_step"], "B"),
        _ev(f"Los modelos de {quality['model']} cuantizados ocupan "
            f"{'exactamente' if exact else 'no exactamente'} los bytes que predice "
            f"weight_bytes(weight_format=...): "
            + "; ".join(f"{r['label']} {es(r['model_bytes'], 0)}" for r in quality["formats"])
            + " bytes.", exact, "booleano", source="measured", volatile=True),
        _ev(f"Lectura de la memoria medida en {speed['repeats']} rondas: "
            f"{es(sf.bandwidth_bytes_per_s / 1e9, 1)} GB/s; suelo y paso medido por "
            "formato: " + "; ".join(f"{r['label']} {es(1e3 * r['floor_s'], 1)} y "
                                    f"{es(1e3 * r['step_s'], 1)} ms"
                                    for r in srows) + ".",
            sf.bandwidth_bytes_per_s / 1e9, "GB/s", "measured", True),
        *(c.evidence("x") for k, c in sf.verdicts.items() if k.startswith("faster_")),
        *(c.evidence("fracción") for k, c in sf.verdicts.items() if k.startswith("halving_")),
        *(c.evidence("x") for k, c in sf.verdicts.items() if k.startswith("prediction_")),
    ]


def _quality_evidence(f: Findings) -> list[dict]:
    quality, qf = f.quality, f.quality_found
    qrows = qf.rows
    return [
        _ev(f"Perplejidad de {_scored(quality)} en {quality['held_out_tokens']} tokens de texto "
            "que su entrenamiento no vio: " + "; ".join(
                f"{r['label']} {es(r['perplexity'], 1)}" for r in qrows)
            + ". Frente de Pareto (bytes por peso, perplejidad): "
            + ", ".join(qf.pareto) + ".",
            qrows[1]["perplexity"], "perplejidad", "measured", True),
        _ev("Coincidencia del token más probable con fp32 en ese texto: " + "; ".join(
            f"{r['label']} {es(100 * r['top1_agreement'], 1)} %" for r in qrows) + ".",
            qrows[-1]["top1_agreement"], "fracción", "measured", True),
        *(c.evidence("fracción") for c in qf.verdicts.values()),
    ]


def _kv_evidence(f: Findings) -> list[dict]:
    """The int8 cache: the budgets it frees, where the cache outweighs the weights, and what it
    costs ``tiny-es``."""
    kv = f.kv
    h100, roof = kv_budgets()["h100_llama31_8b"], weights_vs_kv()
    w_label = next(k for k in roof["weight_bytes"] if k != "bf16")
    return [
        _ev(f"Con la caché KV en int8 (una escala bf16 por token y cabeza), un token de "
            f"Llama-3.1-8B ocupa {es_bytes(h100['kv_bytes_per_token']['int8'])} en lugar de "
            f"{es_bytes(h100['kv_bytes_per_token']['bf16'])}, y en la H100 del capítulo 2 caben "
            f"{h100['static_slots']['int8']} peticiones de {h100['max_len']} tokens en lugar de "
            f"{h100['static_slots']['bf16']}.", h100["static_slots"]["int8"], "peticiones"),
        _ev(f"Con {roof['context_len']} tokens de contexto, la caché de un lote de Llama-3.1-8B "
            f"lee más bytes que sus pesos a partir de "
            + "; ".join(f"{es(v, 1)} secuencias con {k}" for k, v in roof["crossing_batch"].items())
            + ".", roof["crossing_batch"][f"pesos {w_label}, caché bf16"], "secuencias"),
        _ev(f"Caché KV de {kv['model']} en int8 frente a fp32, en el texto reservado: la mayor "
            f"diferencia de logits es {es(kv['max_abs_logit_diff'], 3)} (logits de hasta "
            f"{es(kv['max_abs_logit'], 1)}); el token más probable coincide en el "
            f"{es(100 * kv['top1_agreement'], 1)} % de las posiciones, y "
            f"{kv['identical_continuations']} de {kv['agreement_prompts']} continuaciones "
            "voraces salen idénticas.", kv["max_abs_logit_diff"], "logit", "measured", True),
        f.kv_found.kv_quality.evidence("fracción"),
    ]


def _limitations(f: Findings) -> list[str]:
    speed, quality = f.speed, f.quality
    limitations = [
        f"Los tiempos son de {speed['model']} con pesos aleatorios en {speed['device']}: el coste "
        "de un paso no depende de los valores, pero su texto no significa nada; la calidad se "
        f"mide aparte, con {quality['model']}, un modelo de {es(quality['parameters'] / 1e6, 1)} M "
        "de parámetros que no predice la calidad de un modelo grande cuantizado.",
        timing_limitation(speed["repeats"]),
        f"La perplejidad se mide en {quality['held_out_tokens']} tokens: su intervalo remuestrea "
        f"los {quality['chunks']} fragmentos, y un texto más largo o de otro dominio daría otros "
        "números.",
        "La cuantización es de redondeo al más cercano (por canal o por grupos), sin calibración "
        "con datos ni corrección del error (GPTQ, AWQ): los métodos de producción pierden menos "
        "calidad a igual número de bits.",
        f"La caché KV en int8 se mide en {f.kv['model']} con un solo prompt por fragmento; su "
        "efecto en la velocidad no se mide aquí (la atención la descuantiza entera en cada paso), solo en "
        "los bytes y en la calidad.",
        "Los kernels int8/int4 son los que trae torch para este dispositivo y dtype "
        "(QuantizedLinear.kernel); otro motor, con otros kernels, convierte de otra manera los "
        "bytes ahorrados en tiempo.",
    ]
    if f.params["torch_threads"]:
        limitations.append(f"Todo se midió con {es_count(speed['torch_threads'], 'hilo')} de "
                           "torch (parámetro torch_threads).")
    reason = quality.get("served", {}).get("model_fallback_reason")
    if reason:
        limitations.append(f"La calidad se pidió en {quality['served']['model_requested']} y se "
                           f"midió en {quality['model']} (motivo: {reason}).")
    return limitations


def report(f: Findings) -> dict:
    """The contract's body from the lab's findings. Timings and perplexities are volatile;
    bytes, budgets and the weights-vs-cache arithmetic are computed."""
    return {"environment": {"model": f.speed["model"], "dtype": f.speed_found.rows[1]["label"]},
            "results": _results(f),
            "evidence": _speed_evidence(f) + _quality_evidence(f) + _kv_evidence(f),
            "limitations": _limitations(f),
            "volatile_fields": ["results.speed", "results.quality", "results.kv.measured"]}


def run(seed: int, profile: str, params: dict, device: torch.device) -> dict:
    speed = measure_speed(params, seed, device)
    speed_found = analyse_speed(speed, get_preset(params["speed_model"]))
    quality, kv = measure_quality(params), measure_kv(params)
    return report(Findings(params, speed, speed_found, quality, analyse_quality(quality), kv,
                           analyse_kv(kv)))


SPEC = LabSpec(
    kind="quantization",
    title="Cuantización",
    chapter=7,
    folder="labs/07-quantization",
    ci_budget_s=70,
    run=run,
    params={
        "speed_model": Param("cpu-200m", str, "modelo de las mediciones de velocidad (pesos "
                             "aleatorios salvo tiny-es, que necesita group_size 32 o 64)",
                             choices=SPEED_MODELS, by_profile={"gpu": "qwen2.5-0.5b"}),
        "group_size": Param(128, int, "tamaño de grupo de int4 en las mediciones de velocidad",
                            choices=(32, 64, 128)),
        "prompt_len": Param(32, int, "tokens del prompt de las mediciones de velocidad", min=1,
                            max=4096),
        "decode_tokens": Param(16, int, "tokens generados en cada muestra de velocidad", min=3,
                               max=1024, by_profile={"ci": 6, "gpu": 32}),
        "repeats": Param(5, int, "rondas intercaladas de las mediciones de velocidad", min=1,
                         max=50),
        "probe_mib": Param(512, int, "MiB de la sonda de lectura de la memoria", min=64,
                           max=8192, by_profile={"ci": 256, "gpu": 1024}),
        "torch_threads": Param(0, int, "hilos de torch durante las mediciones (0: los que elija "
                               "torch)", min=0, max=1024, by_profile={"ci": 1}),
        "quality_model": Param("tiny-es", str, "modelo de las mediciones de calidad (pesos "
                               "entrenados; el del Hub, si no se puede obtener, cede su sitio a "
                               "tiny-es y el contrato lo dice)", choices=QUALITY_MODELS,
                               by_profile={"gpu": GPU_TEXT_MODEL}),
        "quality_formats": Param(list(QUALITY_FORMATS), str, "formatos cuantizados cuya calidad "
                                 "se mide", is_list=True,
                                 choices=("int8", "int4-g32", "int4-g64", "int4-asym-g32",
                                          "int4-asym-g64")),
        "agreement_prompts": Param(8, int, "prompts del texto reservado para comparar "
                                   "continuaciones voraces", min=1, max=24,
                                   by_profile={"ci": 6}),
        "agreement_prompt_tokens": Param(16, int, "tokens de cada uno de esos prompts", min=1,
                                         max=48),
        "agreement_tokens": Param(24, int, "tokens de cada continuación voraz comparada", min=1,
                                  max=256, by_profile={"ci": 12}),
    },
)
