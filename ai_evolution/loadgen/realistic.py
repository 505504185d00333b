"""Realistic load (chapter 12): heavy-tailed lengths from a production trace, and tenant mixes.

A load test whose requests all have the same prompt and output length (chapter 6's 32/16
tokens) measures a server that nobody runs: real prompts and answers are heavy-tailed, and the
tail (a 4 000-token prompt among 200-token ones, a 600-token answer among 100-token ones) is
what sets the p99 of TTFT and TPOT. The lengths here follow the **Azure LLM inference trace
2023** (Patel et al., "Splitwise", ISCA'24; published under CC-BY): its conversation service
(19 366 requests) and its coding service (8 819). ``TRACES`` holds each one's empirical
quantiles at ``QUANTILE_GRID`` (recomputed from the CSV files by ``scripts/trace_quantiles.py``);
``trace_lengths`` draws from the inverse CDF, interpolating log-linearly between quantiles, so
the median, the tail and the mean of the trace are kept.

A small model cannot hold 14 000-token prompts: ``scale`` divides every length (the shape of the
distribution, its ratios of tail to median, is kept) and ``max_model_len`` caps what remains.

``uniform_workload`` is the benchmark "de secuencias uniformes": the same arrivals and the same
*mean* lengths (so the same offered tokens/s) with no spread. ``tenant_mix`` merges several
tenants' workloads, each a ``WorkItem`` tagged with its tenant (a polite tenant and a flooder).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np

from .arrivals import open_loop_workload
from .workload import WorkItem

QUANTILE_GRID = (0.0, 0.01, 0.02, 0.05, 0.10, 0.20, 0.30, 0.40, 0.50, 0.60, 0.70, 0.80, 0.90,
                 0.95, 0.98, 0.99, 0.999, 1.0)


class TraceLengths(NamedTuple):
    """One service's length distribution: quantiles of prompt (context) and output (generated)
    tokens at ``QUANTILE_GRID``, the trace's means, its size and its source."""

    name: str
    requests: int
    mean_prompt: float
    mean_output: float
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    source: str


_AZURE = ("Azure LLM inference trace 2023 (Patel et al., Splitwise, ISCA 2024), "
          "data/AzureLLMInferenceTrace_{}.csv, CC-BY")

TRACES: dict[str, TraceLengths] = {
    "conversation": TraceLengths(
        "conversation", 19366, 1154.7, 211.1,
        (2, 29, 91, 181, 207, 387, 403, 703, 1020, 1071, 1130, 1315, 2735, 4083, 4098, 4142,
         6212, 14050),
        (7, 16, 24, 41, 54, 77, 91, 103, 129, 177, 384, 400, 424, 451, 540, 601, 954, 1000),
        _AZURE.format("conv")),
    "code": TraceLengths(
        "code", 8819, 2047.8, 27.9,
        (3, 17, 35, 75, 147, 385, 770, 1075, 1469, 1909, 2433, 3193, 5194, 7315, 7436, 7436,
         7437, 7437),
        (6, 6, 6, 6, 7, 8, 9, 11, 13, 16, 20, 29, 55, 90, 172, 252, 831, 1899),
        _AZURE.format("code")),
}


def _trace(name: str) -> TraceLengths:
    if name not in TRACES:
        raise ValueError(f"traza {name!r} desconocida; aceptadas: {', '.join(TRACES)}")
    return TRACES[name]


def quantile_lengths(quantiles: Sequence[float], u: np.ndarray) -> np.ndarray:
    """The inverse CDF through ``(QUANTILE_GRID, quantiles)`` at probabilities ``u``,
    log-linear between grid points (heavy tails stay heavy)."""
    logq = np.log(np.asarray(quantiles, dtype=float))
    return np.exp(np.interp(u, QUANTILE_GRID, logq))


def trace_lengths(trace: str, n: int, seed: int, scale: float = 1.0,
                  max_model_len: int | None = None) -> tuple[list[int], list[int]]:
    """``n`` (prompt, output) length pairs drawn from ``trace`` (independently: the trace's
    published marginals), divided by ``scale``, each >= 1; with ``max_model_len`` the output is
    capped to leave room for one prompt token and the prompt to leave room for the output."""
    t = _trace(trace)
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale debe ser un número > 0; se recibió {scale!r}")
    rng = np.random.default_rng(seed)
    prompt = np.maximum(1, np.round(quantile_lengths(t.prompt, rng.random(n)) / scale)).astype(int)
    output = np.maximum(1, np.round(quantile_lengths(t.output, rng.random(n)) / scale)).astype(int)
    if max_model_len is not None:
        if max_model_len < 3:
            raise ValueError(f"max_model_len debe ser >= 3; se recibió {max_model_len!r}")
        output = np.minimum(output, max_model_len // 2)
        prompt = np.minimum(prompt, max_model_len - 1 - output)
    return prompt.tolist(), output.tolist()


def realistic_workload(n: int, rate: float, vocab_size: int, seed: int, trace: str = "conversation",
                       scale: float = 1.0, max_model_len: int | None = None,
                       tenant: str | None = None) -> list[WorkItem]:
    """``n`` Poisson arrivals at ``rate`` requests/s with lengths from ``trace`` (see
    ``trace_lengths``), tagged with ``tenant``."""
    prompt, output = trace_lengths(trace, n, seed, scale, max_model_len)
    items = open_loop_workload(n, rate, lambda k: prompt, lambda k: output, vocab_size, seed)
    return [it._replace(tags={"tenant": tenant}) if tenant is not None else it for it in items]


def uniform_workload(like: Sequence[WorkItem], vocab_size: int, seed: int) -> list[WorkItem]:
    """``like``'s arrivals (and tags) with every prompt and output at ``like``'s mean lengths
    (rounded): the same offered tokens/s, no spread."""
    n = len(like)
    prompt = round(sum(len(w.prompt_token_ids) for w in like) / n)
    output = round(sum(w.params.max_tokens for w in like) / n)
    times = [w.arrival_time for w in like]
    items = open_loop_workload(n, 1.0, prompt, output, vocab_size, seed,
                               arrivals_fn=lambda k, rate, s: times)
    return [it._replace(tags=w.tags) for it, w in zip(items, like)]


def tenant_mix(*workloads: Sequence[WorkItem]) -> list[WorkItem]:
    """Several tenants' workloads as one, in arrival order (ties keep the order given)."""
    merged = [w for wl in workloads for w in wl]
    return sorted(merged, key=lambda w: w.arrival_time)


def flood_mix(n_polite: int, polite_rate: float, flood_factor: float, vocab_size: int, seed: int,
              trace: str = "conversation", scale: float = 1.0,
              max_model_len: int | None = None) -> list[WorkItem]:
    """A polite tenant (``n_polite`` requests at ``polite_rate``/s) and a flooder sending
    ``flood_factor`` times as many requests at ``flood_factor`` times the rate, over the same
    span, both with ``trace``'s lengths."""
    if not flood_factor >= 1:
        raise ValueError(f"flood_factor debe ser >= 1; se recibió {flood_factor!r}")
    polite = realistic_workload(n_polite, polite_rate, vocab_size, seed, trace, scale,
                                max_model_len, tenant="polite")
    n_flood = max(1, round(n_polite * flood_factor))
    flood = realistic_workload(n_flood, polite_rate * flood_factor, vocab_size, seed + 1, trace,
                               scale, max_model_len, tenant="flood")
    return tenant_mix(polite, flood)


__all__ = ["QUANTILE_GRID", "TRACES", "TraceLengths", "flood_mix",
           "quantile_lengths", "realistic_workload", "tenant_mix", "trace_lengths",
           "uniform_workload"]
