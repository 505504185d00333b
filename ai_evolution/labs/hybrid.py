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
the contract's body. A section on prefix caching with state checkpoints (the hit-rate cliff) is
the next part of this lab: see ``SECTIONS``.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass
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
from ..reference.hybrid import (reference_sequences_that_fit, reference_state_bytes,
                                reference_state_crossover)
from ..sim import RooflineCostModel, decode_step_cost, departure_batch
from ..timing import torch_threads
from .contract import evidence as _ev, met_criteria_sentence, threads_limitation, timing_limitation
from .registry import LabParamError, LabSpec, Param

MODELS = ("transformer", "hybrid")
LABELS = {"transformer": "transformer", "hybrid": "híbrido"}
GPU_PRESETS = ("qwen3.5-9b", "llama-3.1-8b")
# The lab's sections, in order. The prefix-cache section (checkpoints of the state, the
# hit-rate cliff) plugs in after "batching" with its own measure/verdict functions.
SECTIONS = ("memory", "context", "batching")


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
)
WANTED = {"context_transformer": claims.HIGHER, "context_growth": claims.HIGHER,
          "context_linear_flat": claims.PASSED}


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

    @classmethod
    def from_measurements(cls, params: dict, configs: dict, memory: dict, fits: list,
                          context: dict, batching_samples: dict, machine: dict) -> "Findings":
        batching = batching_findings(configs, batching_samples, machine, params)
        return cls(params, configs, memory, fits, context, batching, machine,
                   verdicts(context, batching, params))

    @property
    def criteria_met(self) -> dict[str, bool]:
        return {k: self.found[k].outcome == WANTED[k] for k, _ in CRITERIA}


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
    evidence.append(_ev(criteria_sentence(f.criteria_met), sum(f.criteria_met.values()),
                        "criterios", source="measured", volatile=True))
    return {
        "environment": {"models": {m: describe(c) for m, c in f.configs.items()},
                        "weights": "aleatorios con semilla (la memoria y el tiempo dependen de las "
                                   "formas, no de los valores)"},
        "results": {"memory": f.memory, "fits": f.fits, "context": f.context,
                    "batching": f.batching, "machine": f.machine,
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
            timing_limitation(p["steps"]),
            threads_limitation(p["torch_threads"]),
        ],
        "volatile_fields": ["results.context", "results.batching", "results.machine",
                            "results.chapter_criteria"],
    }


def check_params(params: dict) -> None:
    if params["hidden_size"] % 128:
        raise LabParamError(f"hidden_size ({params['hidden_size']}) debe ser múltiplo de 128 "
                            f"(cabezas de 64 dimensiones, la mitad de ellas de KV)")
    for name in ("contexts", "batch_sizes", "memory_contexts", "fit_contexts"):
        if params[name] != sorted(set(params[name])):
            raise LabParamError(f"{name} debe ir de menor a mayor y sin repetidos; se recibió "
                                f"{params[name]}")
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
    return report(Findings.from_measurements(params, configs, memory, fits, context, batching,
                                             machine))


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
        "probe_mib": Param(256, int, "MiB de la sonda de ancho de banda", min=16, max=8192,
                           by_profile={"gpu": 2048}),
        "probe_matmul": Param(1024, int, "n de la sonda de multiplicación n × n", min=128,
                              max=16384, by_profile={"gpu": 8192}),
        "torch_threads": Param(0, int, "hilos de torch durante el laboratorio (0: los que elija "
                               "torch)", min=0, max=256, by_profile={"ci": 1}),
    },
)
