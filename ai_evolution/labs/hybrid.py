"""Lab ``hybrid`` (chapter 11): a fixed state per sequence beside the KV cache.

Two small decoders of the same shape (hidden size, heads, layers, MLP) with seeded random
weights: a transformer (every layer full attention) and a Qwen3.5-style hybrid (``layer_types``:
``full_every - 1`` Gated DeltaNet layers, then one full-attention layer). Random weights are
enough: memory and time depend on the shapes, not on what the weights say.

1. Memory (computed, :func:`memory_rows`, :func:`fit_table`): KV cache plus state per sequence
   against context for both, the context where the hybrid's KV overtakes its state
   (``reference_state_crossover``) and where the hybrid starts to take less than the
   transformer; and, for the Qwen3.5-9B and Llama-3.1-8B presets, the sequences that fit on GPUs
   of ``gpu_gb`` at a few contexts.
2. Decode step against context (measured, :func:`measure_context`): one sequence, each model
   prefilled to each of ``contexts`` tokens, decode steps timed round by round (every round
   visits every context and both models, interleaved: one round = one pair), with the time inside
   the hybrid's linear layers apart (forward hooks).
3. The batching curve (measured, :func:`measure_batching`): decode steps of 1..N sequences of
   ``batch_context`` tokens, both models interleaved, against a roofline prediction calibrated on
   one sequence (probed bandwidth and matmul peak; ``sim.decode_step_cost`` counts the state read
   and written each step); where each curve leaves its prediction.

:func:`verdicts` turns the samples into :mod:`ai_evolution.claims` claims; :func:`report` into
the contract's body.
4. Prefix caching with state checkpoints (measured counts, :func:`measure_prefix_cache`): the
   real engine (paged KV, prefix caching on) serves, per shared-prefix length, one request that
   fills the cache and ``prefix_requests`` more with the same prefix and another suffix; the
   prefix-cache hits are read from ``engine.kv_usage()``, for the transformer and for the hybrid
   with each of ``checkpoint_intervals``. Counts, not timings: deterministic. Beside them, the
   time to the first token saved by a hit (:func:`measure_prefix_ttft`, interleaved pairs).
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass, replace
from typing import Callable

import torch

from .. import claims
from ..fmt import es, es_bytes
from ..hardware import measure_bandwidth, measure_matmul, synchronize
from ..model import ModelConfig, get_preset
from ..model.attention import ContiguousKVCache
from ..model.checkpoint import random_model
from ..model.linear_attention import LinearAttentionState
from ..model.memory import kv_bytes_per_token, state_bytes_per_sequence, weight_bytes
from ..reference.hybrid import (reference_reusable_tokens, reference_sequences_that_fit,
                                reference_state_bytes, reference_state_crossover)
from ..sim import RooflineCostModel, decode_step_cost, departure_batch
from ..timing import torch_threads
from .contract import evidence as _ev, met_criteria_sentence, threads_limitation, timing_limitation
from .registry import LabParamError, LabSpec, Param

MODELS = ("transformer", "hybrid")
LABELS = {"transformer": "transformer", "hybrid": "híbrido"}
GPU_PRESETS = ("qwen3.5-9b", "llama-3.1-8b")
# The lab's sections, in order.
SECTIONS = ("memory", "context", "batching", "prefix_cache")


# --- the two models ------------------------------------------------------------------------------
def lab_configs(params: dict) -> dict[str, ModelConfig]:
    """The transformer and the hybrid of the lab: the same shape, Qwen3.5's attention (gated
    output, q/k norms, partial rotation) and, in the hybrid, every ``full_every``-th layer full
    attention and the others Gated DeltaNet."""
    n, every = params["num_layers"], params["full_every"]
    if n % every:
        raise LabParamError(f"num_layers ({n}) debe ser múltiplo de full_every ({every}): el "
                            f"patrón de capas (lineales y una de atención completa) se repite "
                            f"entero; valores aceptados para full_every: divisores de {n}")
    h = params["hidden_size"]
    base = dict(model_type="qwen3_5_text", num_layers=n, hidden_size=h, num_heads=h // 64,
                num_kv_heads=max(1, h // 128), head_dim=64, intermediate_size=11 * h // 4,
                vocab_size=params["vocab_size"], qk_norm=True, attn_output_gate=True,
                zero_centered_norm=True, partial_rotary_factor=0.25, rope_theta=10000.0,
                rms_norm_eps=1e-6, max_position_embeddings=1 << 17,
                linear_num_key_heads=max(1, h // 128), linear_num_value_heads=max(1, h // 64),
                linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4)
    kinds = tuple("full_attention" if (i + 1) % every == 0 else "linear_attention"
                  for i in range(n))
    return {"transformer": ModelConfig(name="transformer-lab", layer_types=("full_attention",) * n,
                                       **base),
            "hybrid": ModelConfig(name="hybrid-lab", layer_types=kinds, **base)}


def describe(config: ModelConfig) -> dict:
    """Layers by kind, parameters and per-sequence memory of one of the lab's models."""
    from ..model.memory import param_count
    return {"layers": config.num_layers, "attention_layers": config.num_attention_layers,
            "linear_layers": config.num_linear_layers, "parameters": param_count(config)}


# --- 1. memory (computed) ------------------------------------------------------------------------
def memory_rows(config: ModelConfig, contexts: list[int], kv_dtype: str = "fp32",
                state_fn: Callable = reference_state_bytes) -> list[dict]:
    """Per context: one sequence's KV bytes, its fixed state (``state_fn(config, 4.0)``: float32,
    the student's exercise 1 in the notebook) and their sum."""
    per_token = kv_bytes_per_token(config, kv_dtype)
    state = float(state_fn(config, 4.0))
    return [{"context": c, "kv_bytes": per_token * c, "state_bytes": state,
             "total_bytes": per_token * c + state} for c in contexts]


def break_even(transformer: ModelConfig, hybrid: ModelConfig, kv_dtype: str = "fp32") -> int:
    """The shortest context at which one hybrid sequence takes less memory than one transformer
    sequence (state included)."""
    t, h = kv_bytes_per_token(transformer, kv_dtype), kv_bytes_per_token(hybrid, kv_dtype)
    state = state_bytes_per_sequence(hybrid)
    if t <= h:
        raise ValueError("el híbrido no guarda menos KV por token que el transformer: no hay "
                         "contexto a partir del cual ocupe menos")
    return math.floor(state / (t - h)) + 1


def memory_findings(configs: dict[str, ModelConfig], params: dict,
                    state_fn: Callable = reference_state_bytes) -> dict:
    """Section 1's numbers: the curves, the crossover and the break-even context."""
    kv_dtype = params["kv_dtype"]
    hybrid = configs["hybrid"]
    per_token = kv_bytes_per_token(hybrid, kv_dtype)
    return {"curves": {m: memory_rows(c, params["memory_contexts"], kv_dtype, state_fn)
                       for m, c in configs.items()},
            "kv_bytes_per_token": {m: kv_bytes_per_token(c, kv_dtype) for m, c in configs.items()},
            "state_bytes": state_fn(hybrid, 4.0),
            "crossover": reference_state_crossover(hybrid, per_token),
            "break_even": break_even(configs["transformer"], hybrid, kv_dtype)}


def fit_table(params: dict, fit_fn: Callable = reference_sequences_that_fit) -> list[dict]:
    """Sequences that fit, per preset, GPU and context (bf16 weights and KV, float32 state):
    ``fit_fn(config, gpu_bytes, context, utilization)`` (the student's exercise 3 in the
    notebook)."""
    rows = []
    for name in GPU_PRESETS:
        config = get_preset(name)
        for gb in params["gpu_gb"]:
            for ctx in params["fit_contexts"]:
                rows.append({"model": name, "gpu_gb": gb, "context": ctx,
                             "sequences": int(fit_fn(config, gb * 1e9, ctx,
                                                     params["utilization"])),
                             "kv_bytes_per_token": kv_bytes_per_token(config, "bf16"),
                             "state_bytes": state_bytes_per_sequence(config),
                             "weight_bytes": weight_bytes(config, "bf16")})
    return rows


# --- timing helpers ----------------------------------------------------------------------------
class MixerTimer:
    """Seconds spent inside a model's linear-attention mixers (forward hooks): ``linear_s``
    accumulates until ``reset``. The device is synchronized around each mixer, so the time is
    the mixer's own."""

    def __init__(self, model, device: torch.device) -> None:
        self.device, self.linear_s, self._t0 = device, 0.0, 0.0
        self.handles = []
        for layer in model.model.layers:
            if layer.is_linear:
                self.handles.append(layer.linear_attn.register_forward_pre_hook(self._start))
                self.handles.append(layer.linear_attn.register_forward_hook(self._stop))

    def _start(self, *_):
        synchronize(self.device)
        self._t0 = time.perf_counter()

    def _stop(self, *_):
        synchronize(self.device)
        self.linear_s += time.perf_counter() - self._t0

    def reset(self) -> None:
        self.linear_s = 0.0

    def close(self) -> None:
        for h in self.handles:
            h.remove()


class Sequences:
    """``batch`` sequences of one model prefilled to ``context`` random tokens, ready to decode
    ``room`` more: its KV cache, its state (hybrid) and the next position."""

    def __init__(self, model, batch: int, context: int, room: int, seed: int,
                 chunk: int = 512) -> None:
        self.model, self.config = model, model.config
        p = next(model.parameters())
        self.device = p.device
        self.kv = ContiguousKVCache(self.config, batch, context + room, dtype=p.dtype,
                                    device=p.device)
        self.state = (LinearAttentionState(self.config, batch, device=p.device)
                      if self.config.is_hybrid else None)
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(3, self.config.vocab_size, (batch, context), generator=g).to(p.device)
        with torch.inference_mode():
            for start in range(0, context, chunk):  # chunked prefill: the state carries over
                part = ids[:, start:start + chunk]
                pos = torch.arange(start, start + part.shape[1], device=p.device).expand_as(part)
                logits = model(part, pos, kv_cache=self.kv, state=self.state)
        self.next_ids = logits[:, -1].argmax(-1, keepdim=True)
        self.position = context
        self.capacity = context + room

    def step_s(self) -> float:
        """One timed decode step of every sequence (greedy)."""
        if self.position >= self.capacity:
            raise RuntimeError("no queda sitio en la caché para otro paso de decodificación")
        pos = torch.full_like(self.next_ids, self.position)
        with torch.inference_mode():
            synchronize(self.device)
            start = time.perf_counter()
            logits = self.model(self.next_ids, pos, kv_cache=self.kv, state=self.state)
            self.next_ids = logits[:, -1].argmax(-1, keepdim=True)
            synchronize(self.device)
        self.position += 1
        return time.perf_counter() - start


def build_models(configs: dict[str, ModelConfig], seed: int, device) -> dict:
    """Seeded random weights (float32) for both models."""
    return {m: random_model(c, seed=seed, device=device) for m, c in configs.items()}


# --- 2. decode step against context (measured) ----------------------------------------------------
def visiting_order(live: dict, rng: random.Random) -> list:
    """The keys of ``live`` in a seeded random order, drawn anew for every step: what runs just
    before a measurement (and what it left in the caches) is not always the same one."""
    keys = list(live)
    rng.shuffle(keys)
    return keys


def measure_context(models: dict, params: dict, seed: int) -> dict:
    """Per model and context: per round, the median decode step (s) over ``steps`` steps, and for
    the hybrid the time inside its linear layers at every step (``rounds x steps`` values; the
    same step of every context is one pair: a few milliseconds apart). Rounds interleave every
    context and both models, so the machine's drift hits them alike. Measured time: volatile."""
    contexts, steps, rounds = params["contexts"], params["steps"], params["rounds"]
    room = (rounds + 1) * (steps + 1)
    live = {(m, c): Sequences(models[m], 1, c, room, seed + c) for m in MODELS for c in contexts}
    order = random.Random(seed)
    timers = {m: MixerTimer(models[m], live[(m, contexts[0])].device) for m in MODELS
              if models[m].config.is_hybrid}
    out = {m: {str(c): {"step_s": [], "linear_s": []} for c in contexts} for m in MODELS}
    try:
        for s in live.values():  # warm-up step
            s.step_s()
        for _ in range(rounds):
            times = {key: [] for key in live}
            linear = {key: [] for key in live}
            for _ in range(steps):  # every step visits every context and model
                for key in visiting_order(live, order):
                    seq, timer = live[key], timers.get(key[0])
                    if timer:
                        timer.reset()
                    times[key].append(seq.step_s())
                    if timer:
                        linear[key].append(timer.linear_s)
            for (m, c), t in times.items():
                out[m][str(c)]["step_s"].append(statistics.median(t))
                out[m][str(c)]["linear_s"] += linear[(m, c)]  # every step: a pair per step
    finally:
        for t in timers.values():
            t.close()
    return out


def context_verdicts(context: dict, contexts: list[int],
                     flat_tolerance: float) -> dict[str, claims.Claim]:
    """Does the transformer's step grow from the shortest to the longest context, does the
    hybrid's grow less, and do the hybrid's linear layers stay flat?"""
    short, long = str(contexts[0]), str(contexts[-1])
    t, h = context["transformer"], context["hybrid"]
    t_growth = [a / b for a, b in zip(t[long]["step_s"], t[short]["step_s"])]
    h_growth = [a / b for a, b in zip(h[long]["step_s"], h[short]["step_s"])]
    flat = claims.ratio_estimate(h[long]["linear_s"], h[short]["linear_s"])
    tol = es(100 * flat_tolerance, 0)
    return {
        "context_transformer": claims.compare(
            t[long]["step_s"], t[short]["step_s"],
            what=f"paso de decodificación del transformer con {long} tokens de contexto / con "
                 f"{short}",
            higher="el paso del transformer crece con el contexto: cada paso lee toda su caché KV",
            lower="el paso del transformer es más corto con más contexto",
            inconclusive="el paso del transformer no cambia de forma distinguible con el contexto "
                         "en esta máquina"),
        "context_growth": claims.compare(
            t_growth, h_growth,
            what=f"crecimiento del paso del transformer ({long} / {short} tokens) / crecimiento del "
                 f"paso del híbrido",
            higher="el paso del híbrido crece menos con el contexto que el del transformer: solo "
                   "sus capas de atención completa leen una caché que crece",
            lower="el paso del híbrido crece más con el contexto que el del transformer",
            inconclusive="los dos pasos crecen lo mismo con el contexto, dentro del ruido"),
        "context_linear_flat": claims.threshold(
            flat.median, 1 + flat_tolerance, scale=1, unit="veces", decimals=2,
            interval=flat if flat.n >= 2 else None,
            what=f"tiempo dentro de las capas lineales del híbrido con {long} tokens / con {short}, "
                 f"paso a paso",
            passed=f"plano: las capas lineales tardan lo mismo con {long} tokens que con {short} "
                   f"(tolerancia del {tol} %), porque su estado no crece",
            failed=f"las capas lineales tardan más de un {tol} % más con más contexto",
            inconclusive="con este ruido no se puede decir si las capas lineales quedan dentro de "
                         f"la tolerancia del {tol} %"),
    }


# --- 3. the batching curve (measured) ----------------------------------------------------------
def measure_batching(models: dict, params: dict, seed: int) -> dict:
    """Per model and batch size, per round, the median decode step (s) of ``batch`` sequences of
    ``batch_context`` tokens. Rounds interleave every batch size and both models."""
    sizes, steps, rounds = params["batch_sizes"], params["steps"], params["rounds"]
    room = (rounds + 1) * (steps + 1)
    live = {(m, b): Sequences(models[m], b, params["batch_context"], room, seed + b)
            for m in MODELS for b in sizes}
    for s in live.values():
        s.step_s()
    order = random.Random(seed)
    out = {m: {str(b): [] for b in sizes} for m in MODELS}
    for _ in range(rounds):
        times = {key: [] for key in live}
        for _ in range(steps):  # every step visits every batch size and model
            for key in visiting_order(live, order):
                times[key].append(live[key].step_s())
        for (m, b), t in times.items():
            out[m][str(b)].append(statistics.median(t))
    return out


def probe_machine(device, params: dict) -> dict:
    """The roofline's two numbers on this device: read bandwidth (bytes/s) and fp32 matmul peak
    (FLOP/s), medians of small probes."""
    bw = measure_bandwidth(device, size_bytes=params["probe_mib"] << 20, repeats=3,
                           progress=False)
    mm = measure_matmul(device, n=params["probe_matmul"], repeats=3, progress=False)
    return {"bandwidth_bytes_per_s": bw.median * 1e9, "peak_flops": mm.median * 1e9}


def predicted_curve(config: ModelConfig, sizes: list[int], context: int, measured_first: float,
                    machine: dict) -> list[float]:
    """The roofline prediction of each batch size's step, its fixed overhead calibrated so that
    the first (smallest) batch, one sequence in the lab's profiles, takes ``measured_first``:
    weights read once, each sequence's KV and (hybrid) its state read and written, at fp32."""
    model = RooflineCostModel(machine["bandwidth_bytes_per_s"], machine["peak_flops"])
    model = model.calibrated(decode_step_cost(config, sizes[0], context, "fp32"), measured_first)
    return [model.step_time_s(decode_step_cost(config, b, context, "fp32")) for b in sizes]


def batching_findings(configs: dict[str, ModelConfig], batching: dict, machine: dict,
                      params: dict) -> dict:
    """Per model: medians, the prediction calibrated on the median one-sequence step, each
    round's ratio to the prediction calibrated on that round, the first batch that departs by
    more than ``tolerance``, and the extra milliseconds per added sequence (measured and
    predicted, from one sequence to the largest batch)."""
    sizes, ctx = params["batch_sizes"], params["batch_context"]
    out = {}
    for m, config in configs.items():
        samples = [batching[m][str(b)] for b in sizes]
        medians = [statistics.median(s) for s in samples]
        predicted = predicted_curve(config, sizes, ctx, medians[0], machine)
        rounds = len(samples[0])
        ratios = [[samples[i][k] / predicted_curve(config, sizes, ctx, samples[0][k], machine)[i]
                   for k in range(rounds)] for i in range(len(sizes))]
        span = sizes[-1] - sizes[0]
        out[m] = {"batch_sizes": sizes, "measured_s": medians, "predicted_s": predicted,
                  "round_ratios": ratios,
                  "growth_per_round": [a / b for a, b in zip(samples[-1], samples[0])],
                  "departure_batch": departure_batch(sizes, medians, predicted,
                                                     params["tolerance"]),
                  "ms_per_extra_seq": 1e3 * (medians[-1] - medians[0]) / span if span else 0.0,
                  "predicted_ms_per_extra_seq": (1e3 * (predicted[-1] - predicted[0]) / span
                                                 if span else 0.0)}
    return out


def batching_verdicts(found: dict, tolerance: float) -> dict[str, claims.Claim]:
    """Per model, whether its curve leaves the calibrated roofline (the first departing batch,
    or the largest), and whether the hybrid's step grows more with the batch than the
    transformer's."""
    out = {}
    tol = es(100 * tolerance, 0)
    for m, f in found.items():
        sizes = f["batch_sizes"]
        if len(sizes) < 2:
            continue
        part = f["departure_batch"]
        i = sizes.index(part) if part is not None else len(sizes) - 1
        est = claims.estimate(f["round_ratios"][i])
        name = LABELS[m]
        if part is not None:
            what = (f"{name}, lote {sizes[i]}, el primero cuya mediana supera la predicción: paso "
                    f"medido / predicción")
            passed = f"el lote {sizes[i]} del {name} queda dentro de la tolerancia del {tol} %"
            failed = (f"la curva del {name} se separa de la predicción del roofline en el lote "
                      f"{sizes[i]}")
        else:
            what = f"{name}, lote {sizes[i]}, el mayor medido: paso medido / predicción"
            passed = (f"la curva del {name} no se separa de la predicción del roofline más que la "
                      f"tolerancia del {tol} %")
            failed = f"el lote {sizes[i]} del {name} se separa de la predicción"
        out[f"batching_{m}"] = claims.threshold(
            est.median, 1 + tolerance, scale=1, unit="veces", decimals=2,
            interval=est if est.n >= 2 else None, what=what, passed=passed, failed=failed,
            inconclusive=f"con este ruido no se puede decir si el lote {sizes[i]} del {name} se "
                         f"separa ya de la predicción")
    if all(len(f["batch_sizes"]) >= 2 for f in found.values()):
        top = found["hybrid"]["batch_sizes"][-1]
        out["batching_growth"] = claims.compare(
            found["hybrid"]["growth_per_round"], found["transformer"]["growth_per_round"],
            what=f"crecimiento del paso del híbrido de 1 a {top} secuencias / del transformer",
            higher="cada secuencia añadida cuesta más, en proporción, en el híbrido que en el "
                   "transformer",
            lower="cada secuencia añadida cuesta menos, en proporción, en el híbrido que en el "
                  "transformer",
            inconclusive="los dos pasos crecen lo mismo con el lote, dentro del ruido")
    return out


# --- 4. prefix caching with state checkpoints (measured counts) ---------------------------------
def cache_setups(params: dict) -> list[tuple[str, str, int | None]]:
    """``(label, model, checkpoint interval)`` of every engine of section 4: the transformer
    (its hits reach every full block), then the hybrid with each of ``checkpoint_intervals``."""
    return [("transformer", "transformer", None)] + [
        (f"hybrid-{i}", "hybrid", i) for i in params["checkpoint_intervals"]]


def setup_label(label: str) -> str:
    """A setup's name in Spanish prose."""
    if label == "transformer":
        return "transformer"
    return f"híbrido, intervalo {label.split('-')[1]}"


def prefix_engine(model, params: dict, interval: int | None, max_model_len: int):
    """The real engine on ``model``: paged KV of ``cache_block_size``-token blocks, prefix
    caching on, one request at a time (the counts depend on the cache, not on batching) and,
    for the hybrid, state checkpoints every ``interval`` tokens."""
    from ..engine.config import build_engine
    return build_engine(model, kv_layout="paged", block_size=params["cache_block_size"],
                        enable_prefix_caching=True, max_num_seqs=1,
                        max_model_len=max_model_len, decode_graphs=None,
                        state_checkpoint_interval=interval)


def serve_first_token(engine, prompt: list[int], request_id: str) -> float:
    """Serve one request up to its first token (``max_tokens=1``: the prefill and one sample)
    alone on ``engine``; returns the wall seconds it took, its time to first token."""
    from ..engine import SamplingParams
    start = time.perf_counter()
    engine.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True),
                       request_id=request_id)
    while engine.has_unfinished_requests():
        engine.step(outputs=False)
    return time.perf_counter() - start


def random_tokens(n: int, vocab_size: int, rng: random.Random, first: int | None = None) -> list[int]:
    """``n`` seeded random token ids (3.. vocab-1; ``first`` fixes the first one, so that two
    prefixes with different ``first`` share no block)."""
    ids = [rng.randrange(3, vocab_size) for _ in range(n)]
    if first is not None and ids:
        ids[0] = 3 + first % (vocab_size - 3)
    return ids


def _usage_delta(after: dict, before: dict, key: str) -> int:
    return int(after.get(key, 0) - before.get(key, 0))


def measure_prefix_cache(models: dict, params: dict, seed: int,
                         reuse_fn: Callable = reference_reusable_tokens) -> dict:
    """Per setup (:func:`cache_setups`) and shared-prefix length L: one request of L shared
    tokens plus ``suffix_len`` of its own fills the cache, then ``prefix_requests`` more with
    the same prefix and other suffixes; their prompt tokens looked up, served from the cache and
    cut for lack of a checkpoint (``engine.kv_usage()``, differences over those requests) and
    the state copies saved (the first request included); beside them, the tokens
    ``reuse_fn(shared_len, prompt_len, interval)`` expects (the student's exercise 4 in the
    notebook). Prefixes of different lengths share no block. Counts: the same seed gives the
    same numbers."""
    lengths, n, suffix = params["prefix_lengths"], params["prefix_requests"], params["suffix_len"]
    vocab = params["vocab_size"]
    out = {}
    for label, m, interval in cache_setups(params):
        engine = prefix_engine(models[m], params, interval, lengths[-1] + suffix + 1)
        rng = random.Random(seed)
        rows = []
        for j, length in enumerate(lengths):
            prefix = random_tokens(length, vocab, rng, first=j)
            start = engine.kv_usage()
            serve_first_token(engine, prefix + random_tokens(suffix, vocab, rng), f"{length}-fill")
            before = engine.kv_usage()
            for r in range(n):
                serve_first_token(engine, prefix + random_tokens(suffix, vocab, rng),
                                  f"{length}-{r}")
            after = engine.kv_usage()
            rows.append({"prefix_len": length, "prompt_len": length + suffix, "requests": n,
                         "hit_tokens": _usage_delta(after, before, "prefix_hit_tokens"),
                         "queried_tokens": _usage_delta(after, before, "prefix_queried_tokens"),
                         "truncated_tokens": _usage_delta(after, before,
                                                          "prefix_truncated_tokens"),
                         "checkpoint_saves": _usage_delta(after, start,
                                                          "state_checkpoint_saves"),
                         "expected_hit_tokens": n * int(reuse_fn(
                             length, length + suffix, interval or params["cache_block_size"]))})
        usage = engine.kv_usage()
        out[label] = {"model": m, "interval": interval or params["cache_block_size"],
                      "checkpoint_bytes": (usage.get("state_checkpoint_capacity_bytes", 0)
                                           / max(1, usage.get("state_checkpoint_capacity", 1))),
                      "rows": rows}
    return out


def hit_rate(row: dict) -> float:
    """Fraction of the looked-up prompt tokens served from the prefix cache."""
    return row["hit_tokens"] / row["queried_tokens"] if row["queried_tokens"] else 0.0


def measure_prefix_ttft(models: dict, params: dict, seed: int) -> dict:
    """Time to first token of the hybrid (checkpoints every block) without and with a prefix
    hit, side by side: each pair is a fresh prefix of ``ttft_prefix`` tokens served once (no
    hit: the whole prefill) and again right after with another suffix (a hit: only the
    suffix is computed, from the restored state). ``ttft_pairs`` pairs; measured: volatile."""
    suffix, vocab, length = params["suffix_len"], params["vocab_size"], params["ttft_prefix"]
    engine = prefix_engine(models["hybrid"], params, None, length + suffix + 1)
    rng = random.Random(seed + 1)
    serve_first_token(engine, random_tokens(length + suffix, vocab, rng, first=0), "warm-up")
    cold, warm, hits = [], [], []
    for k in range(params["ttft_pairs"]):
        prefix = random_tokens(length, vocab, rng, first=k + 1)
        cold.append(serve_first_token(engine, prefix + random_tokens(suffix, vocab, rng),
                                      f"cold-{k}"))
        before = engine.kv_usage()["prefix_hit_tokens"]
        warm.append(serve_first_token(engine, prefix + random_tokens(suffix, vocab, rng),
                                      f"hit-{k}"))
        hits.append(engine.kv_usage()["prefix_hit_tokens"] - before)
    return {"prefix_len": length, "prompt_len": length + suffix, "cold_s": cold, "hit_s": warm,
            "hit_tokens": hits}


def prefix_verdicts(cache: dict, ttft: dict, params: dict) -> dict[str, claims.Claim]:
    """The cliff (the hybrid with the largest interval reuses nothing of the prefixes shorter
    than it), the transformer on those same prefixes, whether every count follows
    :func:`~ai_evolution.reference.hybrid.reference_reusable_tokens`, and the time to first token a hit saves."""
    top = params["checkpoint_intervals"][-1]
    short = [L for L in params["prefix_lengths"] if L < top]
    out = {}
    if short:
        lens = ", ".join(str(L) for L in short)
        for key, label in (("prefix_cliff", f"hybrid-{top}"), ("prefix_transformer", "transformer")):
            rows = [r for r in cache[label]["rows"] if r["prefix_len"] < top]
            hit = sum(r["hit_tokens"] for r in rows)
            total = sum(r["requests"] * r["prefix_len"] for r in rows)
            what = (f"prefijo compartido servido desde la caché, {setup_label(label)}, prefijos "
                    f"de {lens} tokens ({hit} de {total} tokens)")
            if key == "prefix_cliff":
                out[key] = claims.threshold(
                    hit / total, 0.0, below=True, decimals=0, what=what,
                    passed=f"por debajo de {top} tokens el híbrido no acierta nunca: su primer "
                           f"punto de control del estado llega después del prefijo",
                    failed=f"el híbrido acierta con prefijos de menos de {top} tokens")
            else:
                out[key] = claims.threshold(
                    hit / total, 0.5, below=False, decimals=0, what=what,
                    passed="el transformer, con los mismos prefijos, reutiliza cada bloque "
                           "completo: acierta desde el primero",
                    failed="el transformer reutiliza menos de la mitad de esos prefijos")
    rows = [(label, r) for label, s in cache.items() for r in s["rows"]]
    wrong = [(label, r["prefix_len"]) for label, r in rows
             if r["hit_tokens"] != r["expected_hit_tokens"]]
    out["prefix_rule"] = claims.threshold(
        len(wrong), 0, below=True, scale=1, unit="casos", decimals=0,
        what=f"casos (de {len(rows)}) en que los tokens servidos desde la caché no son el prefijo "
             f"compartido redondeado hacia abajo a un múltiplo del intervalo",
        passed="el motor reutiliza exactamente hasta el último punto de control dentro del "
               "prefijo, en cada configuración y longitud",
        failed="el motor se aparta de la regla en " + ", ".join(
            f"{setup_label(label)} con {L} tokens" for label, L in wrong[:3]))
    out["prefix_ttft"] = claims.compare(
        ttft["cold_s"], ttft["hit_s"],
        what=f"tiempo hasta el primer token del híbrido sin acierto / con acierto, prefijo de "
             f"{ttft['prefix_len']} tokens",
        higher="un acierto ahorra tiempo hasta el primer token: el motor restaura el estado del "
               "punto de control y solo calcula el sufijo",
        lower="con acierto el primer token tarda más que sin él",
        inconclusive="con este ruido no se distingue el tiempo con acierto del tiempo sin él")
    return out


def prefix_sentences(cache: dict, ttft: dict) -> list[str]:
    """Section 4 in words: the state copies each interval saved and the time a hit saved."""
    saves = {label: sum(r["checkpoint_saves"] for r in s["rows"]) for label, s in cache.items()
             if s["model"] == "hybrid"}
    copies = "; ".join(f"con intervalo {cache[label]['interval']}, {n}" for label, n in
                       saves.items())
    some = next(iter(cache[label] for label in saves))
    saved = statistics.median([a - b for a, b in zip(ttft["cold_s"], ttft["hit_s"])])
    return [
        (f"Copias del estado guardadas como puntos de control en toda la carga ({copies}), de "
         f"{es_bytes(some['checkpoint_bytes'])} cada una: un intervalo más fino acierta con "
         f"prefijos más cortos a cambio de más copias en memoria."),
        (f"Con un prefijo de {ttft['prefix_len']} tokens en caché, el primer token llega "
         f"{es(1e3 * abs(saved), 1)} ms {'antes' if saved >= 0 else 'después'} (mediana de "
         f"{len(ttft['hit_s'])} pares)."),
    ]


# --- exercise 2 in the model: a student's step in place of the library's recurrence --------------
class use_delta_step:
    """Within the block, every one-token step of the model's linear layers (decode) runs
    ``step_fn(state, q, k, v, g, beta) -> (output, new_state)`` (``reference_delta_step``'s
    contract) instead of the library's recurrence: the student's function inside the model."""

    def __init__(self, step_fn: Callable) -> None:
        self.step_fn = step_fn

    def recurrent(self, q, k, v, g, beta, initial_state=None):
        B, T, H, Dk = k.shape
        S = (torch.zeros(B, H, Dk, v.shape[-1], device=v.device) if initial_state is None
             else initial_state.float())
        outs = []
        for t in range(T):
            o, S = self.step_fn(S, q[:, t].float(), k[:, t].float(), v[:, t].float(),
                                g[:, t].float(), beta[:, t].float())
            outs.append(o.float())
        return torch.stack(outs, dim=1), S.float()

    def __enter__(self):
        from ..model import linear_attention
        self._saved = linear_attention.gated_delta_recurrent
        linear_attention.gated_delta_recurrent = self.recurrent
        return self

    def __exit__(self, *exc):
        from ..model import linear_attention
        linear_attention.gated_delta_recurrent = self._saved
        return False


def greedy_logits(model, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    """Greedy decoding of ``steps`` tokens after ``prompt`` (one sequence): the prompt runs the
    chunked form, each new token the recurrent one (what ``use_delta_step`` replaces). Returns
    the tokens and the logits each was chosen from, ``[steps, vocab]`` float32."""
    config, p = model.config, next(model.parameters())
    kv = ContiguousKVCache(config, 1, len(prompt) + steps, dtype=p.dtype, device=p.device)
    state = LinearAttentionState(config, 1, device=p.device) if config.is_hybrid else None
    ids = torch.tensor([prompt], device=p.device)
    tokens, rows = [], []
    with torch.inference_mode():
        logits = model(ids, kv_cache=kv, state=state)[:, -1]
        for i in range(steps):
            rows.append(logits[0].float())
            tokens.append(int(logits[0].argmax()))
            if i + 1 < steps:
                pos = torch.tensor([[len(prompt) + i]], device=p.device)
                logits = model(torch.tensor([[tokens[-1]]], device=p.device), pos, kv_cache=kv,
                               state=state)[:, -1]
    return tokens, torch.stack(rows)


# --- findings ------------------------------------------------------------------------------------
def verdicts(context: dict, batching: dict, params: dict) -> dict[str, claims.Claim]:
    """Every claim of the page, by key."""
    return (context_verdicts(context, params["contexts"], params["flat_tolerance"])
            | batching_verdicts(batching, params["tolerance"]))


CRITERIA = (
    ("context_transformer", "el paso del transformer crece con el contexto"),
    ("context_growth", "el paso del híbrido crece menos con el contexto que el del transformer"),
    ("context_linear_flat", "las capas lineales del híbrido tardan lo mismo con poco y con mucho "
                            "contexto"),
    ("prefix_cliff", "con puntos de control espaciados, el híbrido no acierta en la caché de "
                     "prefijos con prefijos más cortos que el intervalo"),
    ("prefix_rule", "un acierto del híbrido llega hasta el último punto de control dentro del "
                    "prefijo compartido"),
)
WANTED = {"context_transformer": claims.HIGHER, "context_growth": claims.HIGHER,
          "context_linear_flat": claims.PASSED, "prefix_cliff": claims.PASSED,
          "prefix_rule": claims.PASSED}


@dataclass(frozen=True)
class Findings:
    """The lab's numbers (computed memory, measured samples) and the claims drawn from them."""

    params: dict
    configs: dict
    memory: dict
    fits: list
    context: dict
    batching: dict
    machine: dict
    found: dict
    cache: dict | None = None
    ttft: dict | None = None

    @classmethod
    def from_measurements(cls, params: dict, configs: dict, memory: dict, fits: list,
                          context: dict, batching_samples: dict, machine: dict) -> "Findings":
        """Sections 1 to 3 (the notebook adds section 4 with :meth:`with_prefix_cache`)."""
        batching = batching_findings(configs, batching_samples, machine, params)
        return cls(params, configs, memory, fits, context, batching, machine,
                   verdicts(context, batching, params))

    def with_prefix_cache(self, cache: dict, ttft: dict) -> "Findings":
        """These findings plus section 4's counts and times and their claims."""
        found = self.found | prefix_verdicts(cache, ttft, self.params)
        return replace(self, cache=cache, ttft=ttft, found=found)

    @property
    def criteria_met(self) -> dict[str, bool]:
        """Per chapter criterion, whether its claim took the wanted branch (False while its
        section has not been measured)."""
        return {k: k in self.found and self.found[k].outcome == WANTED[k] for k, _ in CRITERIA}


def criteria_sentence(met: dict[str, bool]) -> str:
    return met_criteria_sentence(CRITERIA, met)


def memory_sentences(memory: dict) -> list[str]:
    """Section 1 in words: the state against the KV of one token, the crossover, the break-even."""
    per_token = memory["kv_bytes_per_token"]
    return [
        (f"Una secuencia del híbrido guarda {es_bytes(memory['state_bytes'])} de estado fijo y "
         f"{es_bytes(per_token['hybrid'])} de KV por token; el transformer, "
         f"{es_bytes(per_token['transformer'])} por token y ningún estado."),
        (f"Con menos de {memory['crossover']} tokens de contexto el estado pesa más que la caché "
         f"KV del híbrido; desde ahí domina la caché."),
        (f"Desde {memory['break_even']} tokens de contexto una secuencia del híbrido ocupa menos "
         f"memoria que una del transformer."),
    ]


def fit_sentence(fits: list, gb: float, ctx: int) -> str:
    """Sequences that fit for both presets on one GPU at one context."""
    row = {r["model"]: r["sequences"] for r in fits if r["gpu_gb"] == gb and r["context"] == ctx}
    return (f"En una GPU de {es(gb, 0)} GB, con {ctx} tokens por secuencia, caben "
            f"{row['qwen3.5-9b']} secuencias de Qwen3.5-9B y {row['llama-3.1-8b']} de "
            f"Llama-3.1-8B.")


def batching_sentence(m: str, f: dict) -> str:
    """Where one model's batching curve departs, and its cost per added sequence."""
    where = ("no se separa de la predicción en los lotes medidos" if f["departure_batch"] is None
             else f"se separa de la predicción en el lote {f['departure_batch']}")
    return (f"La curva del {LABELS[m]} {where}; cada secuencia añadida cuesta "
            f"{es(f['ms_per_extra_seq'], 2)} ms medidos frente a "
            f"{es(f['predicted_ms_per_extra_seq'], 2)} ms predichos.")


def report(f: Findings) -> dict:
    p = f.params
    evidence = [_ev(s, v, "B", source="computed") for s, v in zip(
        memory_sentences(f.memory),
        (f.memory["state_bytes"], f.memory["crossover"], f.memory["break_even"]))]
    evidence[1]["unit"] = evidence[2]["unit"] = "tokens"
    for gb in p["gpu_gb"]:
        for ctx in p["fit_contexts"]:
            evidence.append(_ev(fit_sentence(f.fits, gb, ctx),
                                next(r["sequences"] for r in f.fits if r["gpu_gb"] == gb
                                     and r["context"] == ctx and r["model"] == "qwen3.5-9b"),
                                "secuencias", source="computed"))
    evidence += [f.found[k].evidence("veces") for k in ("context_transformer", "context_growth",
                                                          "context_linear_flat")]
    for m in MODELS:
        if f"batching_{m}" in f.found:
            evidence.append(f.found[f"batching_{m}"].evidence("veces"))
        evidence.append(_ev(batching_sentence(m, f.batching[m]), f.batching[m]["ms_per_extra_seq"],
                            "ms", source="measured", volatile=True))
    if "batching_growth" in f.found:
        evidence.append(f.found["batching_growth"].evidence("veces"))
    if f.cache is None or f.ttft is None:
        raise ValueError("faltan las mediciones de la caché de prefijos (sección 4): use "
                         "Findings.with_prefix_cache(cache, ttft) antes de report")
    for key in ("prefix_cliff", "prefix_transformer", "prefix_rule"):
        if key in f.found:
            evidence.append(f.found[key].evidence(
                "casos" if key == "prefix_rule" else "%", source="computed", volatile=False))
    copies, saved = prefix_sentences(f.cache, f.ttft)
    evidence.append(_ev(copies, sum(r["checkpoint_saves"] for s in f.cache.values()
                                    for r in s["rows"]), "copias", source="computed"))
    evidence.append(f.found["prefix_ttft"].evidence("veces"))
    evidence.append(_ev(saved, 1e3 * statistics.median(
        [a - b for a, b in zip(f.ttft["cold_s"], f.ttft["hit_s"])]), "ms", source="measured",
        volatile=True))
    evidence.append(_ev(criteria_sentence(f.criteria_met), sum(f.criteria_met.values()),
                        "criterios", source="measured", volatile=True))
    return {
        "environment": {"models": {m: describe(c) for m, c in f.configs.items()},
                        "weights": "aleatorios con semilla (la memoria y el tiempo dependen de las "
                                   "formas, no de los valores)"},
        "results": {"memory": f.memory, "fits": f.fits, "context": f.context,
                    "batching": f.batching, "machine": f.machine,
                    "prefix_cache": f.cache, "prefix_ttft": f.ttft,
                    "chapter_criteria": f.criteria_met},
        "evidence": evidence,
        "limitations": [
            "Los dos modelos son pequeños y con pesos aleatorios: en esta máquina su paso lo "
            "dominan Python y los kernels pequeños, no la memoria; en una GPU con un modelo de "
            "miles de millones de parámetros las proporciones son otras, aunque las causas (la "
            "caché que crece, el estado que no) sean las mismas.",
            "Las capas lineales del libro calculan la recurrencia con operaciones de PyTorch, sin "
            "los kernels fusionados de flash-linear-attention que usan vLLM y llama.cpp.",
            "Los pasos se miden sobre el modelo, sin el planificador del motor: el coste por "
            "secuencia de un servidor real (copiar el estado de cada petición a su ranura, "
            "preparar el lote) no entra.",
            "Las cifras de GPU son aritmética de memoria (pesos, KV y estado), sin la memoria de "
            "activaciones ni la fragmentación de un motor real.",
            "Los aciertos de la caché de prefijos se cuentan con una petición a la vez y una caché "
            "que no se llena: con muchas peticiones y memoria escasa, los bloques y los puntos de "
            "control expulsados bajan la tasa de aciertos por debajo de la regla.",
            timing_limitation(p["steps"]),
            threads_limitation(p["torch_threads"]),
        ],
        "volatile_fields": ["results.context", "results.batching", "results.machine",
                            "results.prefix_ttft", "results.chapter_criteria"],
    }


def check_params(params: dict) -> None:
    if params["hidden_size"] % 128:
        raise LabParamError(f"hidden_size ({params['hidden_size']}) debe ser múltiplo de 128 "
                            f"(cabezas de 64 dimensiones, la mitad de ellas de KV)")
    for name in ("contexts", "batch_sizes", "memory_contexts", "fit_contexts"):
        if params[name] != sorted(set(params[name])):
            raise LabParamError(f"{name} debe ir de menor a mayor y sin repetidos; se recibió "
                                f"{params[name]}")
    for name in ("checkpoint_intervals", "prefix_lengths"):
        if params[name] != sorted(set(params[name])):
            raise LabParamError(f"{name} debe ir de menor a mayor y sin repetidos; se recibió "
                                f"{params[name]}")
    block = params["cache_block_size"]
    bad = [i for i in params["checkpoint_intervals"] if i % block]
    if bad:
        raise LabParamError(f"checkpoint_intervals debe contener múltiplos de cache_block_size "
                            f"({block}): un punto de control cae en un límite de bloque; no lo "
                            f"son {bad}")
    if not any(L < params["checkpoint_intervals"][-1] for L in params["prefix_lengths"]):
        raise LabParamError(f"prefix_lengths necesita al menos un prefijo más corto que el mayor "
                            f"intervalo ({params['checkpoint_intervals'][-1]}) para mostrar el "
                            f"precipicio; se recibió {params['prefix_lengths']}")
    if len(params["contexts"]) < 2:
        raise LabParamError(f"contexts necesita al menos dos contextos (el menor y el mayor se "
                            f"comparan); se recibió {params['contexts']}")


def run(seed: int, profile: str, params: dict, device: torch.device) -> dict:
    check_params(params)
    configs = lab_configs(params)
    with torch_threads(params["torch_threads"]):
        torch.manual_seed(seed)
        models = build_models(configs, seed, device)
        memory = memory_findings(configs, params)
        fits = fit_table(params)
        context = measure_context(models, params, seed)
        batching = measure_batching(models, params, seed)
        machine = probe_machine(device, params)
        cache = measure_prefix_cache(models, params, seed)
        ttft = measure_prefix_ttft(models, params, seed)
    findings = Findings.from_measurements(params, configs, memory, fits, context, batching,
                                          machine)
    return report(findings.with_prefix_cache(cache, ttft))


SPEC = LabSpec(
    kind="hybrid",
    title="Modelos híbridos",
    chapter=11,
    folder="labs/11-hybrid",
    ci_budget_s=60,
    run=run,
    params={
        "hidden_size": Param(256, int, "tamaño oculto de los dos modelos", min=128, max=4096),
        "num_layers": Param(8, int, "capas de los dos modelos", min=2, max=64),
        "full_every": Param(4, int, "una capa de atención completa cada tantas (las demás, "
                            "lineales)", min=2, max=16),
        "vocab_size": Param(1024, int, "vocabulario de los modelos aleatorios", min=16,
                            max=262144),
        "kv_dtype": Param("fp32", str, "dtype de la caché KV en la aritmética de memoria de los "
                          "modelos pequeños", choices=("fp32", "bf16", "fp16")),
        "memory_contexts": Param([16, 64, 256, 1024, 4096, 16384], int, "contextos de la curva "
                                 "de memoria", min=1, max=1 << 20, is_list=True),
        "gpu_gb": Param([24.0, 80.0], float, "memorias de GPU (GB) de la tabla de secuencias que "
                        "caben", min=1.0, max=1024.0, is_list=True),
        "fit_contexts": Param([1024, 4096, 32768], int, "contextos de la tabla de secuencias que "
                              "caben", min=1, max=1 << 20, is_list=True),
        "utilization": Param(0.9, float, "fracción de la memoria de la GPU para pesos y cachés",
                             min=0.05, max=1.0),
        "contexts": Param([32, 1024, 4096], int, "contextos en los que se mide el paso", min=1,
                          max=1 << 17, is_list=True,
                          by_profile={"ci": [32, 4096], "gpu": [32, 4096, 32768]}),
        "batch_sizes": Param([1, 2, 4, 8, 16, 32], int, "lotes de la curva de batching", min=1,
                             max=1024, is_list=True,
                             by_profile={"ci": [1, 4, 16], "gpu": [1, 4, 16, 64, 256]}),
        "batch_context": Param(256, int, "tokens de contexto de cada secuencia del lote", min=1,
                               max=1 << 16, by_profile={"ci": 128}),
        "steps": Param(9, int, "pasos de decodificación por medición (se toma la mediana)",
                       min=1, max=100, by_profile={"ci": 5}),
        "rounds": Param(15, int, "rondas intercaladas (pares de cada comparación)", min=2,
                        max=100),
        "flat_tolerance": Param(0.25, float, "cuánto puede crecer el tiempo de las capas "
                                "lineales y seguir siendo plano", min=0.0, max=10.0),
        "tolerance": Param(0.25, float, "cuánto puede superar un paso su predicción antes de "
                           "separarse de ella", min=0.0, max=10.0),
        "cache_block_size": Param(16, int, "tokens por bloque de la caché KV paginada en la "
                                  "sección de la caché de prefijos", min=1, max=1024),
        "checkpoint_intervals": Param([16, 64, 256], int, "intervalos (tokens) entre puntos de "
                                      "control del estado del híbrido", min=1, max=1 << 16,
                                      is_list=True),
        "prefix_lengths": Param([8, 16, 32, 64, 128, 256, 384, 512], int, "longitudes del "
                                "prefijo compartido", min=1, max=1 << 16, is_list=True),
        "prefix_requests": Param(3, int, "peticiones que repiten cada prefijo tras la que lo "
                                 "guarda", min=1, max=100),
        "suffix_len": Param(8, int, "tokens propios de cada petición tras el prefijo", min=1,
                            max=4096),
        "ttft_prefix": Param(512, int, "tokens del prefijo con y sin acierto al medir el tiempo "
                             "hasta el primer token", min=1, max=1 << 16,
                             by_profile={"ci": 256, "gpu": 4096}),
        "ttft_pairs": Param(9, int, "pares intercalados sin y con acierto", min=2, max=100,
                            by_profile={"ci": 7}),
        "probe_mib": Param(256, int, "MiB de la sonda de ancho de banda", min=16, max=8192,
                           by_profile={"gpu": 2048}),
        "probe_matmul": Param(1024, int, "n de la sonda de multiplicación n × n", min=128,
                              max=16384, by_profile={"gpu": 8192}),
        "torch_threads": Param(0, int, "hilos de torch durante el laboratorio (0: los que elija "
                               "torch)", min=0, max=256, by_profile={"ci": 1}),
    },
)
