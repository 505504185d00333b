"""Lab ``roofline`` (chapter 1): decode reads every weight per token, so bandwidth sets its pace.

One interleaved run on the reader's device (``measure``), repetition by repetition:

1. two floors of a decode step: what the memory streams (a ``torch.sum`` probe) and what the
   kernels decode runs stream (a cold matrix-vector product over a working set beyond the
   last-level cache), plus a square-matmul probe for the peak (hence the ridge point);
2. the prefill of a prompt (tokens/s) and decode steps of 1, 2, 4, ... sequences (seconds).

Then pure functions turn those samples into typed findings, numbers and claims
(``analyse_step`` -> ``StepFindings``, ``analyse_batching`` + ``with_departure`` ->
``BatchingFindings``), gathered in ``Findings``, and into the contract's body (``report``). The
notebook calls the same functions with the student's ``decode_roofline``, ``predict_step`` and
``departure_batch`` plugged in; ``run`` (``run_lab``, the CLI, the grader) uses the library's.
Every conclusion about the machine is a :mod:`ai_evolution.claims` claim: which floor binds,
how much of the step reading the weights explains, prefill vs decode, where each phase sits
against the ridge point, what batching gains and where the curve leaves its prediction.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .. import claims
from ..fmt import es, es_bytes, es_count
from ..hardware import (default_dtype, get_device_spec, measure_matmul,
                        measure_stream_bandwidths, synchronize)
from ..model import ModelConfig, get_preset, load_model
from ..model.attention import ContiguousKVCache
from ..reference.roofline import reference_decode_roofline, reference_predict_step
from ..sim import decode_step_cost, departure_batch, ridge_point, step_cost, time_floor_s
from ..timing import torch_threads
from .contract import evidence as _ev, timing_limitation
from .registry import LabParamError, LabSpec, Param

MODELS = ("cpu-200m", "smollm2-135m", "qwen3-0.6b", "qwen2.5-0.5b", "tiny-es")

# The second model of the batching curve: tiny enough that its weights sit in the processor's cache
# and its step is mostly per-step work (Python, kernel launches), so its curve departs from the
# weight-read arithmetic that the measured model is the control for.
CONTRAST_MODEL = "tiny-es"

# Reading the weights at the kernels' rate explains "most of the step" above this share.
STEP_SHARE = 0.5


# --- measuring -----------------------------------------------------------------------------------
def prefill_once_s(model, prompt: list[int]) -> float:
    """Seconds to run a prompt through the model into a fresh cache (logits of the last token)."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt], device=device)
    with torch.inference_mode():
        cache = ContiguousKVCache(model.config, 1, len(prompt),
                                  dtype=next(model.parameters()).dtype, device=device)
        synchronize(device)
        start = time.perf_counter()
        model.logits(model.hidden_states(ids, kv_cache=cache)[:, -1])
        synchronize(device)
    return time.perf_counter() - start


class DecodeBatch:
    """``batch_size`` sequences parked at ``context_len`` tokens, ready to time decode steps.

    The cache is filled with random keys and values instead of a prefill: a step's work does not
    depend on what the cache holds, only on how many positions it attends to. Every call of
    :meth:`step_s` decodes the same positions ``context_len .. context_len + steps - 1``
    (overwriting the slots it wrote before), so repeated samples do identical work, greedily,
    as ``generate`` does (model, logits, argmax, next token).
    """

    def __init__(self, model, batch_size: int, context_len: int, steps: int,
                 generator: torch.Generator):
        self.model, self.steps, self.context_len = model, steps, context_len
        param = next(model.parameters())
        self.device = param.device
        cfg = model.config
        self.cache = ContiguousKVCache(cfg, batch_size, context_len + steps, dtype=param.dtype,
                                       device=param.device)
        fill = torch.Generator(device=param.device).manual_seed(
            int(torch.randint(2**31 - 1, (1,), generator=generator)))
        with torch.inference_mode():
            for buf in (self.cache.k, self.cache.v):
                buf.normal_(generator=fill)  # on the device: no host-sized temporary
        self.first = torch.randint(3, cfg.vocab_size, (batch_size, 1), generator=generator
                                   ).to(param.device)

    def step_s(self, steps: int | None = None) -> float:
        """Median seconds of one decode step over ``steps`` (default: all) consecutive steps."""
        tokens = self.first
        rows = tokens.shape[0]
        times = []
        with torch.inference_mode():
            for i in range(self.steps if steps is None else steps):
                positions = torch.full((rows, 1), self.context_len + i, device=self.device)
                synchronize(self.device)
                start = time.perf_counter()
                hidden = self.model.hidden_states(tokens, positions, kv_cache=self.cache)
                tokens = self.model.logits(hidden[:, -1]).argmax(dim=-1, keepdim=True)
                synchronize(self.device)
                times.append(time.perf_counter() - start)
        return float(np.median(times))


def check_params(params: dict, max_positions: int, model_name: str) -> None:
    batches = params["batch_sizes"]
    if batches[0] != 1 or any(b >= c for b, c in zip(batches, batches[1:])):
        raise LabParamError(f"batch_sizes={batches} debe empezar en 1 (la predicción se calibra "
                            "con el paso de una secuencia) y crecer sin repetir valores, p. ej. "
                            "1,2,4,8")
    longest = max(params["prompt_len"], params["context_len"] + params["decode_tokens"])
    if longest > max_positions:
        raise LabParamError(f"la secuencia más larga ({longest} tokens) supera las "
                            f"{max_positions} posiciones del modelo {model_name}")


def measure(model, params: dict, seed: int, progress: bool | None = False) -> dict:
    """Every timing of the lab in one interleaved run: per repetition, one sample of the read
    probe, the cold-GEMV probe, the matmul probe, the prefill and a decode step per batch size,
    all with ``params["torch_threads"]`` threads.

    Returns plain lists (one value per repetition) plus what the probes measured."""
    with torch_threads(params["torch_threads"]):
        return _measure(model, params, seed, progress)


def measure_curve(model, params: dict, seed: int) -> dict:
    """Only the batching curve of ``model`` (the contrast model): per round, one decode step
    sample per batch size, with the lab's context, steps, rounds and threads. The keys are those
    of :func:`measure` that :func:`analyse_batching` reads."""
    cfg = model.config
    check_params(params, cfg.max_position_embeddings, cfg.name)
    batches = list(params["batch_sizes"])
    with torch_threads(params["torch_threads"]):
        gen = torch.Generator().manual_seed(seed)
        decoders = {b: DecodeBatch(model, b, params["context_len"], params["decode_tokens"], gen)
                    for b in batches}
        for d in decoders.values():  # warm-up
            d.step_s(1)
        decode = {b: [] for b in batches}
        for _ in range(params["repeats"]):
            for b, d in decoders.items():
                decode[b].append(d.step_s())
    return {"model": cfg.name, "repeats": params["repeats"],
            "context_len": params["context_len"], "decode_tokens": params["decode_tokens"],
            "batch_sizes": batches, "decode_step_s": [decode[b] for b in batches]}


def _measure(model, params: dict, seed: int, progress: bool | None) -> dict:
    cfg = model.config
    param = next(model.parameters())
    device, dtype = param.device, param.dtype
    check_params(params, cfg.max_position_embeddings, cfg.name)
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, cfg.vocab_size, (params["prompt_len"],), generator=gen).tolist()
    batches = list(params["batch_sizes"])
    decoders = {b: DecodeBatch(model, b, params["context_len"], params["decode_tokens"], gen)
                for b in batches}
    prefill_once_s(model, prompt)  # warm-up: first calls allocate and choose kernels
    for d in decoders.values():
        d.step_s(1)
    matmul, prefill, decode = [], [], {b: [] for b in batches}
    matmul_n = []

    def model_samples(rep: int) -> None:
        mm = measure_matmul(device, dtype=dtype, repeats=1, warmup=1, progress=False)
        matmul.append(mm.median)
        matmul_n.append(mm.params["n"])
        prefill.append(prefill_once_s(model, prompt))
        for b, d in decoders.items():
            decode[b].append(d.step_s())

    probes = measure_stream_bandwidths(device, dtype=dtype, repeats=params["repeats"],
                                       between=model_samples, progress=progress)
    read, gemv = probes["read"], probes["gemv"]
    return {
        "repeats": params["repeats"], "prompt_len": params["prompt_len"],
        "context_len": params["context_len"], "decode_tokens": params["decode_tokens"],
        "batch_sizes": batches,
        "bandwidth_read_gbps": list(read.samples), "gemv_gbps": list(gemv.samples),
        "matmul_gflops": matmul, "prefill_s": prefill,
        "decode_step_s": [decode[b] for b in batches],
        "probes": {"read_bytes": read.params["size_bytes"],
                   "gemv_working_set_bytes": gemv.params["working_set_bytes"],
                   "gemv_shape": [gemv.params["n"], gemv.params["k"]],
                   "matmul_n": matmul_n[0], "torch_threads": torch.get_num_threads()},
    }


# --- analysing -----------------------------------------------------------------------------------
def _median(x) -> float:
    return float(np.median(np.asarray(x, dtype=np.float64)))


def mid_context(measured: dict) -> int:
    """The average context of the timed decode steps."""
    return measured["context_len"] + measured["decode_tokens"] // 2


@dataclass(frozen=True)
class StepFindings:
    """What :func:`analyse_step` finds: the machine (medians of the probes, the ridge point with
    its interval), the batch-1 step against its two floors, prefill against decode, and the
    claims by name (``floors``, ``share``, ``phases``, ``decode_regime``, ``prefill_regime``)."""

    bandwidth_bytes_per_s: float
    gemv_bytes_per_s: float
    peak_flops: float
    ridge: float
    ridge_interval: list[float]
    b1: dict
    prefill_intensity: float
    floor_read_s: float
    floor_gemv_s: float
    step_s: float
    efficiency_read: float
    efficiency_gemv: float
    efficiency_read_interval: list[float]
    efficiency_gemv_interval: list[float]
    prefill_s: float
    prefill_tps: float
    decode_tps: float
    floors: claims.Claim
    share: claims.Claim
    phases: claims.Claim
    decode_regime: claims.Claim
    prefill_regime: claims.Claim

    @property
    def verdicts(self) -> dict[str, claims.Claim]:
        """The claims by key, in the order the contract lists them."""
        return {"floors": self.floors, "share": self.share, "phases": self.phases,
                "decode_regime": self.decode_regime, "prefill_regime": self.prefill_regime}


def _floor_claims(measured: dict, eff_gemv: claims.Estimate) -> tuple[claims.Claim, claims.Claim]:
    """Which floor binds (the cold GEMV against the read probe) and whether reading the weights
    at the GEMV's rate explains most of the batch-1 step (``eff_gemv``: floor / step)."""
    floors = claims.compare(
        measured["gemv_gbps"], measured["bandwidth_read_gbps"],
        what="lo que lee un producto matriz-vector frío / lo que lee la sonda de la memoria "
             "(GB/s)",
        higher="los kernels de la decodificación leen al menos tan deprisa como la sonda: aquí "
               "manda el suelo de la memoria (la sonda lo subestima)",
        lower="los kernels de la decodificación leen más despacio que la memoria: en esta "
              "máquina manda el suelo de los kernels, no el de la memoria",
        inconclusive="con este ruido los dos ritmos no se distinguen: ninguno de los dos suelos "
                     "manda con claridad sobre el otro")
    share = claims.threshold(
        eff_gemv.median, STEP_SHARE, below=False, interval=eff_gemv,
        what="eficiencia del paso con lote 1 frente al suelo de los kernels (suelo GEMV / paso "
             "medido)",
        passed="leer los pesos al ritmo de la GEMV explica más de la mitad del paso: lo que lo "
               "limita es esa lectura",
        failed="leer los pesos al ritmo de la GEMV no llega a la mitad del paso: pesa más todo "
               "lo demás (Python, normalizaciones, atención, lanzar kernels)",
        inconclusive="con este ruido no se puede decir si la lectura de los pesos explica más o "
                     "menos de la mitad del paso")
    return floors, share


def _regime_claims(decode_intensity: float, prefill_intensity: float, ridge: claims.Estimate,
                   prompt_len: int) -> tuple[claims.Claim, claims.Claim]:
    """Where batch-1 decode and the prefill sit against the measured ridge point."""
    def regime(intensity: float, phase: str, left: str, right: str, below: bool):
        return claims.threshold(
            intensity / ridge.median, 1.0, below=below, scale=1, unit="veces", decimals=2,
            interval=(intensity / ridge.high, intensity / ridge.low), coverage=ridge.coverage,
            n=ridge.n, method=ridge.method,
            what=f"intensidad {phase} / punto de cresta medido", passed=left if below else right,
            failed=right if below else left)

    decode_regime = regime(
        decode_intensity, "de un paso de decodificación con lote 1",
        "queda a la izquierda de la cresta: en esta máquina la decodificación con lote 1 está "
        "limitada por la memoria",
        "queda a la derecha de la cresta: en esta máquina la decodificación con lote 1 está "
        "limitada por el cálculo", below=True)
    prefill_regime = regime(
        prefill_intensity, f"del prefill de {prompt_len} tokens",
        "queda a la izquierda de la cresta: en esta máquina el prefill está limitado por la "
        "memoria",
        "queda a la derecha de la cresta: en esta máquina el prefill está limitado por el "
        "cálculo", below=False)
    return decode_regime, prefill_regime


def analyse_step(measured: dict, config, dtype_name: str,
                 roofline_fn: Callable = reference_decode_roofline) -> StepFindings:
    """The machine, prefill vs decode and the batch-1 step against its two floors.

    ``roofline_fn(config, dtype, batch_size, context_len, bandwidth)`` is exercise 1's
    function (the library's by default). The floors: bytes of the step / what the memory
    streams (read probe) and / what a cold GEMV streams; each per repetition, so the efficiency
    floor / step has a paired interval."""
    read = np.asarray(measured["bandwidth_read_gbps"]) * 1e9
    gemv = np.asarray(measured["gemv_gbps"]) * 1e9
    peak = np.asarray(measured["matmul_gflops"]) * 1e9
    step = np.asarray(measured["decode_step_s"][0])  # batch_sizes[0] == 1
    prefill = np.asarray(measured["prefill_s"])
    bw, gemv_bw, peak_med = _median(read), _median(gemv), _median(peak)
    b1 = roofline_fn(config, dtype_name, 1, mid_context(measured), bw)
    floor_read, floor_gemv = b1["bytes"] / read, b1["bytes"] / gemv
    eff_read = claims.ratio_estimate(floor_read, step)
    eff_gemv = claims.ratio_estimate(floor_gemv, step)
    ridge = claims.ratio_estimate(peak, read)
    prompt_len = measured["prompt_len"]
    prefill_cost = step_cost(config, [prompt_len], [prompt_len], dtype_name)
    prefill_tps, decode_tps = prompt_len / prefill, 1 / step

    floors, share = _floor_claims(measured, eff_gemv)
    phases = claims.compare(
        claims.as_inputs(prefill_tps), claims.as_inputs(decode_tps),
        what=f"tokens/s del prefill de {prompt_len} tokens / tokens/s de la decodificación con "
             "lote 1",
        higher="el prefill procesa más tokens por segundo que la decodificación",
        lower="el prefill procesa menos tokens por segundo que la decodificación")
    decode_regime, prefill_regime = _regime_claims(b1["intensity"], prefill_cost.intensity,
                                                   ridge, prompt_len)
    return StepFindings(
        bandwidth_bytes_per_s=bw, gemv_bytes_per_s=gemv_bw, peak_flops=peak_med,
        ridge=ridge.median, ridge_interval=[ridge.low, ridge.high],
        b1=b1, prefill_intensity=prefill_cost.intensity,
        floor_read_s=_median(floor_read), floor_gemv_s=_median(floor_gemv),
        step_s=_median(step), efficiency_read=eff_read.median,
        efficiency_gemv=eff_gemv.median,
        efficiency_read_interval=[eff_read.low, eff_read.high],
        efficiency_gemv_interval=[eff_gemv.low, eff_gemv.high],
        prefill_s=_median(prefill), prefill_tps=_median(prefill_tps),
        decode_tps=_median(decode_tps),
        floors=floors, share=share, phases=phases, decode_regime=decode_regime,
        prefill_regime=prefill_regime)


@dataclass(frozen=True)
class BatchingFindings:
    """What :func:`analyse_batching` finds: the measured curve (medians and samples) against its
    calibrated prediction, ``round_ratios`` (per batch size, each round's step over the
    prediction calibrated on that round) and the claim ``gain``
    (None with one batch size); :func:`with_departure` adds where the curve leaves its
    prediction (``departure_batch``, ``tolerance`` and the claim ``departure``)."""

    batch_sizes: list[int]
    measured_s: list[float]
    measured_samples_s: list[list[float]]
    predicted_s: list[float]
    rooflines: list[dict]
    overhead_s: float
    round_ratios: list[list[float]]
    tokens_per_s: list[float]
    gain: claims.Claim | None = None
    departure_batch: int | None = None
    tolerance: float | None = None
    departure: claims.Claim | None = None

    @property
    def verdicts(self) -> dict[str, claims.Claim]:
        """The claims that exist, by key: ``gain`` and ``departure``."""
        return {k: c for k, c in (("gain", self.gain), ("departure", self.departure))
                if c is not None}


def analyse_batching(measured: dict, config, dtype_name: str, step: StepFindings,
                     roofline_fn: Callable = reference_decode_roofline,
                     predict_fn: Callable = reference_predict_step) -> BatchingFindings:
    """The batching curve against the roofline prediction calibrated on the batch-1 step.

    ``predict_fn(bytes, flops, bandwidth, peak, overhead)`` is exercise 2's function (its
    ``time_s``; a bare number of seconds is accepted too). The
    overhead is what the measured batch-1 step (median) takes beyond the roofline; the
    prediction uses the read probe's bandwidth and the matmul probe's peak."""
    batches = measured["batch_sizes"]
    samples = np.asarray(measured["decode_step_s"], dtype=np.float64)  # [batch, round]
    bw, peak = step.bandwidth_bytes_per_s, step.peak_flops
    rooflines = [roofline_fn(config, dtype_name, b, mid_context(measured), bw) for b in batches]
    def seconds(r, overhead: float) -> float:
        out = predict_fn(r["bytes"], r["flops"], bw, peak, overhead)
        return float(out["time_s"] if isinstance(out, dict) else out)

    base = seconds(rooflines[0], 0.0)

    def predict(medians: np.ndarray) -> tuple[float, list[float]]:
        overhead = max(0.0, float(medians[0]) - base)
        return overhead, [seconds(r, overhead) for r in rooflines]

    medians = np.median(samples, axis=1)
    overhead, predicted = predict(medians)
    # Each round against the prediction calibrated on that same round's batch-1 step: a slow
    # round slows every batch size of the round, and its calibration with them, so it cancels.
    round_ratios = np.array([samples[:, k] / np.asarray(predict(samples[:, k])[1])
                             for k in range(samples.shape[1])]).T  # [batch, round]
    gain = None
    if len(batches) > 1:
        top = batches[-1]
        gain = claims.compare(
            claims.as_inputs(top / samples[-1]), claims.as_inputs(1 / samples[0]),
            what=f"tokens/s con lote {top} / tokens/s con lote 1",
            higher=f"agrupar {top} secuencias da más tokens por segundo que una sola: una lectura "
                   "de los pesos sirve a todo el lote",
            lower=f"agrupar {top} secuencias da menos tokens por segundo que una sola")
    return BatchingFindings(
        batch_sizes=list(batches), measured_s=medians.tolist(),
        measured_samples_s=samples.tolist(), predicted_s=predicted, rooflines=rooflines,
        overhead_s=overhead, round_ratios=round_ratios.tolist(),
        tokens_per_s=[b / m for b, m in zip(batches, medians)], gain=gain)


def with_departure(curve: BatchingFindings, part: int | None,
                   tolerance: float, subject: str | None = None) -> BatchingFindings:
    """``curve`` plus where the measured curve leaves its prediction: ``part`` is exercise 3's
    answer on the medians (first batch whose step exceeds the prediction by more than
    ``tolerance``; ``subject``: a second model's name, written into its sentences). The claim
    takes that batch (the largest one when none departs): the same
    step / prediction against ``1 + tolerance``: the median of the rounds' ratios
    (``round_ratios``) with its order-statistic interval."""
    curve = dataclasses.replace(curve, departure_batch=part, tolerance=tolerance)
    batches = curve.batch_sizes
    if len(batches) < 2:
        return curve
    i = batches.index(part) if part is not None else len(batches) - 1
    b, tol = batches[i], es(100 * tolerance, 0)
    # The median of the rounds' ratios with its exact order-statistic interval: noise that
    # straddles the criterion, or too few rounds, reads as inconclusive.
    est = claims.estimate(curve.round_ratios[i])
    if part is not None:
        what = f"lote {b}, el primero cuya mediana supera la predicción: paso medido / predicción"
        passed = f"el lote {b} queda dentro de la tolerancia del {tol} %"
        failed = (f"la curva medida se separa de la predicción del roofline en el lote {b}: los "
                  f"lotes anteriores quedan dentro de la tolerancia del {tol} %")
        inconclusive = (f"con este ruido no se puede afirmar que la curva se separe ya en el lote "
                        f"{b}, aunque su mediana supere la tolerancia del {tol} %")
    else:
        what = f"lote {b}, el mayor medido: paso medido / predicción"
        passed = (f"ningún lote medido se separa de la predicción del roofline más que la "
                  f"tolerancia del {tol} %")
        failed = f"el lote {b} se separa de la predicción"
        inconclusive = (f"ningún lote medido supera la tolerancia del {tol} % por su mediana, "
                        f"pero con este ruido no se puede descartar que el lote {b} ya se separe")
    if subject is not None:  # a second model's curve: every sentence names it
        what = f"{what} ({subject})"
        passed, failed, inconclusive = (f"con {subject}, {t}" for t in (passed, failed,
                                                                         inconclusive))
    return dataclasses.replace(curve, departure=claims.threshold(
        est.median, 1 + tolerance, below=True, scale=1, unit="veces", decimals=2,
        interval=est if est.n >= 2 else None, what=what, passed=passed, failed=failed,
        inconclusive=inconclusive))


def control_lesson(curve: BatchingFindings, contrast: BatchingFindings) -> str:
    """What the control (the lab's model, whose step is mostly reading weights) says about the
    method, from its departure claim: only a control that follows the prediction lets the
    contrast model's departure be read as the model's own cost."""
    if curve.departure is None or contrast.departure is None:
        return ""
    b = curve.departure_batch
    outcome = curve.departure.outcome
    if outcome == claims.PASSED:
        return ("El control sigue la predicción en todos los lotes medidos: el método vale en "
                "esta máquina, y lo que el otro modelo se aparte es coste suyo.")
    if outcome == claims.FAILED and b is not None and b == curve.batch_sizes[1]:
        return (f"El control ya se separa de la predicción en el lote {b}, el primero después "
                f"del 1: en esta máquina el método no queda validado para ningún lote, y lo que "
                f"aparta ambas curvas es la máquina (sus kernels de pocas filas), no solo el "
                f"modelo.")
    if outcome == claims.FAILED and b is not None:
        return (f"El control ya se separa de la predicción en el lote {b}: en esta máquina el "
                f"método solo queda validado por debajo de ese lote, y por encima lo que aparta "
                f"ambas curvas es la máquina (sus kernels de pocas filas), no solo el modelo.")
    return ("Con este ruido no se puede decidir si el control sigue la predicción, así que "
            "tampoco se puede atribuir al otro modelo lo que su curva se aparte.")


# The chapter's criteria: (key of the claim, what it should say, the criterion in words).
CRITERIA = (
    ("phases", claims.HIGHER, "un prefill con más tokens por segundo que la decodificación"),
    ("decode_regime", claims.PASSED,
     "una decodificación con lote 1 a la izquierda del punto de cresta"),
    ("gain", claims.HIGHER, "más tokens por segundo con el lote mayor que con una secuencia"),
)


def supports_chapter(step: StepFindings, curve: BatchingFindings) -> str:
    """Which of the chapter's criteria (``CRITERIA``) this run's claims meet, which are
    inconclusive and which are missed (a sentence; ``gain`` counts only with two batch sizes)."""
    found = {**step.verdicts, **curve.verdicts}
    rows = [(text, found[key], want) for key, want, text in CRITERIA if key in found]
    met = [text for text, c, want in rows if c.outcome == want]
    open_ = [text for text, c, want in rows if c.outcome == claims.INCONCLUSIVE]
    missed = [text for text, c, want in rows if c.outcome not in (want, claims.INCONCLUSIVE)]
    parts = [f"Esta ejecución cumple {len(met)} de las {len(rows)} expectativas"]
    for label, items in (("Se cumple", met), ("No es concluyente", open_),
                         ("No se cumple", missed)):
        if items:
            parts.append(f"{label}: " + "; ".join(items))
    return ". ".join(parts) + "."


# --- the contract ------------------------------------------------------------------------------
def _ms(seconds) -> list[float]:
    return [1e3 * float(s) for s in seconds]


@dataclass(frozen=True)
class Findings:
    """What the lab found, between its measurements and its report: the model and dtype
    measured, the samples (:func:`measure`) and what :func:`analyse_step` and
    :func:`analyse_batching` (+ :func:`with_departure`) found in them."""

    config: ModelConfig
    dtype_name: str
    params: dict
    measured: dict
    step: StepFindings
    curve: BatchingFindings
    contrast: BatchingFindings | None = None  # CONTRAST_MODEL's curve (measure_curve)
    contrast_model: str | None = None

    @property
    def verdicts(self) -> dict[str, claims.Claim]:
        """Every claim of the lab, by key (the contrast model's as ``contrast_<key>``)."""
        extra = {} if self.contrast is None else {
            f"contrast_{k}": c for k, c in self.contrast.verdicts.items() if k == "departure"}
        return {**self.step.verdicts, **self.curve.verdicts, **extra}


def _h100() -> tuple:
    """The datasheet H100 SXM, Llama-3.1-8B's bf16 floor per token (ms) and the bf16 ridge."""
    h100 = get_device_spec("h100-sxm")
    l31 = decode_step_cost(get_preset("llama-3.1-8b"), 1, 0, "bf16")
    return (h100, time_floor_s(l31.bytes, h100.bandwidth_bytes_per_s) * 1e3,
            ridge_point(h100.peak_flops["bf16"], h100.bandwidth_bytes_per_s))


def _curve_results(curve: BatchingFindings, params: dict, **extra) -> dict:
    """A batching curve as the contract stores it (the measured model's and the contrast's)."""
    return {**extra, "batch_sizes": curve.batch_sizes,
            "measured_ms": _ms(curve.measured_s),
            "measured_samples_ms": [_ms(s) for s in curve.measured_samples_s],
            "predicted_ms": _ms(curve.predicted_s),
            "overhead_ms": 1e3 * curve.overhead_s,
            "tokens_per_s": curve.tokens_per_s,
            "departure_batch": curve.departure_batch,
            "tolerance": curve.tolerance if curve.tolerance is not None else params["tolerance"]}


def _results(f: Findings) -> dict:
    measured, step, curve, b1 = f.measured, f.step, f.curve, f.step.b1
    _, h100_floor_ms, h100_ridge = _h100()
    return {
        "machine": {"repeats": measured["repeats"],
                    "bandwidth_read_gbps": step.bandwidth_bytes_per_s / 1e9,
                    "bandwidth_samples_gbps": measured["bandwidth_read_gbps"],
                    "gemv_gbps": step.gemv_bytes_per_s / 1e9,
                    "gemv_samples_gbps": measured["gemv_gbps"],
                    "matmul_gflops": step.peak_flops / 1e9,
                    "matmul_samples_gflops": measured["matmul_gflops"],
                    "ridge_flop_per_byte": step.ridge, "probes": measured["probes"]},
        "model": {"name": f.config.name, "dtype": f.dtype_name, "bytes_per_decode_step": b1["bytes"],
                  "flops_per_decode_token": b1["flops"], "intensity_decode_b1": b1["intensity"],
                  "intensity_prefill": step.prefill_intensity},
        "prefill_decode": {"prompt_len": measured["prompt_len"], "prefill_s": step.prefill_s,
                           "prefill_samples_s": measured["prefill_s"],
                           "prefill_tokens_per_s": step.prefill_tps,
                           "decode_tokens_per_s": step.decode_tps,
                           "ratio": step.phases.value},
        "floor": {"floor_b1_ms": 1e3 * step.floor_read_s,
                  "gemv_floor_b1_ms": 1e3 * step.floor_gemv_s,
                  "measured_b1_ms": 1e3 * step.step_s,
                  "measured_b1_samples_ms": _ms(measured["decode_step_s"][0]),
                  "efficiency": step.efficiency_read, "gemv_efficiency": step.efficiency_gemv,
                  "fitted_overhead_ms": 1e3 * curve.overhead_s},
        "batching": {"context_len": mid_context(measured), **_curve_results(curve, f.params)},
        **({} if f.contrast is None else {"batching_contrast": _curve_results(
            f.contrast, f.params, model=f.contrast_model)}),
        "verdicts": {k: v.outcome for k, v in f.verdicts.items()},
        "datasheet": {"h100_llama31_8b_bf16_floor_ms": h100_floor_ms,
                      "h100_bf16_ridge_flop_per_byte": h100_ridge},
    }


def _evidence(f: Findings) -> list[dict]:
    step, probes, b1 = f.step, f.measured["probes"], f.step.b1
    h100, h100_floor_ms, h100_ridge = _h100()
    return [
        _ev(f"Sondas intercaladas ({f.measured['repeats']} rondas, medianas): la memoria lee "
            f"{es(step.bandwidth_bytes_per_s / 1e9, 1)} GB/s (torch.sum sobre "
            f"{es_bytes(probes['read_bytes'])}); un producto matriz-vector frío lee "
            f"{es(step.gemv_bytes_per_s / 1e9, 1)} GB/s (ciclo de "
            f"{es_bytes(probes['gemv_working_set_bytes'])} de pesos); matmul {f.dtype_name}: "
            f"{es(step.peak_flops / 1e9, 0)} GFLOP/s; punto de cresta "
            f"{es(step.ridge, 1)} FLOP/byte.", step.bandwidth_bytes_per_s / 1e9, "GB/s",
            "measured", True),
        step.floors.evidence("x"),
        _ev(f"Un paso de decodificación de {f.config.name} en {f.dtype_name} lee "
            f"{es(b1['bytes'] / 1e6, 1)} MB y hace {es(b1['intensity'], 2)} FLOP/byte.",
            b1["bytes"], "B"),
        _ev(f"Paso con lote 1: {es(1e3 * step.step_s, 2)} ms medidos; suelo de la memoria "
            f"{es(1e3 * step.floor_read_s, 2)} ms (eficiencia "
            f"{es(100 * step.efficiency_read, 0)} %); "
            f"suelo de los kernels {es(1e3 * step.floor_gemv_s, 2)} ms (eficiencia "
            f"{es(100 * step.efficiency_gemv, 0)} %).", step.efficiency_read, "fracción",
            "measured", True),
        step.share.evidence("fracción"),
        step.phases.evidence("x"),
        step.decode_regime.evidence("x"),
        step.prefill_regime.evidence("x"),
        *(c.evidence("x") for c in f.curve.verdicts.values()),
        *(c.evidence("x") for k, c in f.verdicts.items() if k.startswith("contrast_")),
        _ev(f"Con la hoja de datos de la H100 SXM ({es(h100.bandwidth_bytes_per_s / 1e12, 2)} "
            f"TB/s), Llama-3.1-8B en bf16 tiene un suelo de {es(h100_floor_ms, 1)} ms por token; "
            f"su punto de cresta es {es(h100_ridge, 0)} FLOP/byte.", h100_floor_ms, "ms", "cited"),
    ]


def _limitations(f: Findings) -> list[str]:
    probes = f.measured["probes"]
    limitations = [
        f"Pesos aleatorios ({f.config.name}): el coste no depende de los valores, pero el texto "
        "generado no significa nada.",
        "Dos suelos, dos sondas: la memoria se mide con una reducción (torch.sum) y los kernels "
        f"con un producto matriz-vector de forma fija ({probes['gemv_shape'][0]} × "
        f"{probes['gemv_shape'][1]}); las matrices del modelo tienen otras formas y su GEMV puede "
        "leer algo más deprisa o más despacio.",
        timing_limitation(f.measured["repeats"]),
        "La predicción de la curva usa el pico de una multiplicación de matrices cuadrada grande; "
        "las multiplicaciones con pocas filas de la decodificación no lo alcanzan, y eso es "
        "parte de lo que la curva muestra.",
        "Los pasos se miden con la caché llena de valores aleatorios en lugar de un prefill: el "
        "trabajo de un paso depende de cuántas posiciones atiende, no de lo que contienen.",
    ]
    if f.params["torch_threads"]:
        limitations.append(
            f"Todo se midió con {es_count(probes['torch_threads'], 'hilo')} de torch (parámetro "
            "torch_threads): con otro número de hilos la máquina lee y calcula a otro ritmo.")
    return limitations


def report(f: Findings) -> dict:
    """The contract's body from the lab's findings. Everything timed is volatile."""
    return {"environment": {"model": f.config.name, "dtype": f.dtype_name},
            "results": _results(f), "evidence": _evidence(f), "limitations": _limitations(f),
            "volatile_fields": ["results.machine", "results.prefill_decode", "results.floor",
                                "results.batching.measured_ms",
                                "results.batching.measured_samples_ms",
                                "results.batching.predicted_ms", "results.batching.tokens_per_s",
                                "results.batching.overhead_ms",
                                "results.batching.departure_batch", "results.verdicts"]
            + (["results.batching_contrast"] if f.contrast is not None else [])}


def run(seed: int, profile: str, params: dict, device: torch.device) -> dict:
    dtype = default_dtype(device) if params["dtype"] == "auto" else getattr(torch, params["dtype"])
    dtype_name = str(dtype).removeprefix("torch.")
    model = load_model(params["model"], seed, device, dtype=dtype)
    measured = measure(model, params, seed)
    step = analyse_step(measured, model.config, dtype_name)
    curve = analyse_batching(measured, model.config, dtype_name, step)
    part = departure_batch(curve.batch_sizes, curve.measured_s, curve.predicted_s,
                           params["tolerance"])
    curve = with_departure(curve, part, params["tolerance"])
    contrast = None
    if params["model"] != CONTRAST_MODEL:  # measuring the contrast model against itself says nothing
        contrast = contrast_curve(load_model(CONTRAST_MODEL, seed, device, dtype=dtype), params,
                                  seed, dtype_name, step)
    return report(Findings(model.config, dtype_name, params, measured, step, curve, contrast,
                           CONTRAST_MODEL if contrast is not None else None))


def contrast_curve(model, params: dict, seed: int, dtype_name: str, step: StepFindings,
                   roofline_fn: Callable = reference_decode_roofline,
                   predict_fn: Callable = reference_predict_step,
                   departure_fn: Callable | None = None) -> BatchingFindings:
    """The contrast model's batching curve (:func:`measure_curve`) against its prediction, made
    with the machine measured for the lab's model (``step``) and calibrated on its own batch-1
    step, with where it departs (``departure_fn``: exercise 3's function, called with the
    medians, the predictions' step costs, the bandwidth, the peak and the tolerance)."""
    measured = measure_curve(model, params, seed)
    curve = analyse_batching(measured, model.config, dtype_name, step, roofline_fn=roofline_fn,
                             predict_fn=predict_fn)
    if departure_fn is None:
        part = departure_batch(curve.batch_sizes, curve.measured_s, curve.predicted_s,
                               params["tolerance"])
    else:
        part = departure_fn(curve.batch_sizes, curve.measured_s, curve.rooflines,
                            step.bandwidth_bytes_per_s, step.peak_flops, params["tolerance"])
    return with_departure(curve, part, params["tolerance"], subject=model.config.name)


SPEC = LabSpec(
    kind="roofline",
    title="Prefill y decodificación",
    chapter=1,
    folder="labs/01-prefill-decode",
    ci_budget_s=115,
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
        "decode_tokens": Param(24, int, "pasos de decodificación cronometrados por muestra",
                               min=3, max=1024, by_profile={"ci": 8, "gpu": 48}),
        "batch_sizes": Param([1, 2, 4, 8, 16, 32], int, "tamaños de lote de la curva (el "
                             "primero, 1)", min=1, max=1024, is_list=True,
                             by_profile={"ci": [1, 2, 4, 8, 16],
                                         "gpu": [1, 2, 4, 8, 16, 32, 64, 128]}),
        "repeats": Param(5, int, "rondas intercaladas de mediciones", min=1, max=50),
        "tolerance": Param(0.25, float, "separación relativa que cuenta como «se separa»",
                           min=0.0, max=10.0),
        "torch_threads": Param(0, int, "hilos de torch durante las mediciones (0: los que torch "
                               "elija)", min=0, max=1024, by_profile={"ci": 1}),
    },
)
