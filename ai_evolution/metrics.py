"""Serving metrics from the engine's per-request timing records.

Percentiles use numpy's default (linear interpolation between closest ranks), the convention of
vLLM's and most load generators' reports.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from .engine.request import FinishReason, Request
from .loadgen.arrivals import realized_rate


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, linear interpolation; NaN if empty."""
    values = [v for v in values if v is not None]
    return float(np.percentile(values, q)) if values else float("nan")


def summarize(requests: Sequence[Request], percentile_fn: Callable = percentile) -> dict:
    """Throughput and latency of a set of finished requests.

    - ``throughput_tok_s``: generated tokens / (last finish - first arrival); ``throughput_req_s``:
      finished requests over the same span;
    - ``ttft_*``: arrival -> first token; ``tpot_*``: mean gap between a request's tokens after
      the first (requests with one token have none); ``itl_*``: every gap between consecutive
      tokens of every request, pooled; ``e2e_*``: arrival -> finish;
    - ``*_p50_s``, ``*_p90_s``, ``*_p99_s``: percentiles by ``percentile_fn(values, q)`` (default
      ``percentile``; a lab passes the student's), never called on an empty list (NaN instead);
    - ``realized_rate``: the arrival rate the run offered, ``(n - 1) / (last - first arrival)``
      (``loadgen.realized_rate``), NaN when undefined (one request, or all arriving at once).
    """
    done = [r for r in requests if r.finish_time is not None]
    if not done:
        raise ValueError("no finished requests to summarize")
    tokens = sum(len(r.output_token_ids) for r in done)
    span = max(r.finish_time for r in done) - min(r.arrival_time for r in done)
    out = {
        "requests": len(done),
        "output_tokens": tokens,
        "duration_s": span,
        "throughput_tok_s": tokens / span if span > 0 else float("nan"),
        "throughput_req_s": len(done) / span if span > 0 else float("nan"),
    }
    samples = latency_samples(done)
    for name in ("ttft", "tpot", "itl", "e2e"):
        for q in (50, 90, 99):
            values = samples[name]
            out[f"{name}_p{q}_s"] = float(percentile_fn(values, q)) if values else float("nan")
    out["realized_rate"] = _arrival_rate([r.arrival_time for r in done])
    return out


def latency_samples(requests: Sequence[Request]) -> dict[str, list[float]]:
    """The per-request latencies of the finished requests, seconds, without missing values:
    ``ttft``, ``tpot`` (requests with two tokens or more), ``e2e``, and ``itl`` (every gap
    between consecutive tokens, pooled over the requests)."""
    done = [r for r in requests if r.finish_time is not None]
    return {"ttft": [r.ttft for r in done if r.ttft is not None],
            "tpot": [r.tpot for r in done if r.tpot is not None],
            "itl": [g for r in done for g in r.itls],
            "e2e": [r.e2e_latency for r in done if r.e2e_latency is not None]}


def records(requests: Sequence[Request], **tags) -> list[dict]:
    """One tidy record (a flat dict) per request: ``tags`` (e.g. ``rate=2.0, run=1``) first,
    then the request's id (an HTTP record's index), arrival (s, the client's clock), prompt and
    output tokens, TTFT, TPOT, largest inter-token gap and end-to-end latency (s; None where a
    request never got there). A list of these is what a data-frame library reads directly."""
    out = []
    for r in requests:
        itls = r.itls
        reason = r.finish_reason
        out.append({**tags, "request_id": getattr(r, "request_id", getattr(r, "index", None)),
                    "arrival_s": r.arrival_time, "prompt_tokens": r.num_prompt_tokens,
                    "output_tokens": len(r.output_token_ids), "ttft_s": r.ttft, "tpot_s": r.tpot,
                    "itl_max_s": max(itls) if itls else None, "e2e_s": r.e2e_latency,
                    "finish_reason": getattr(reason, "value", reason)})
    return out


def _arrival_rate(times: Sequence[float]) -> float:
    """``realized_rate``, but NaN where it is undefined (one request, or all at one instant),
    so that a summary table stays readable."""
    if len(times) < 2:
        return float("nan")
    rate = realized_rate(times)
    return rate if math.isfinite(rate) else float("nan")


def bootstrap_ci(values: Sequence[float], stat: Callable | None = None, q: float | None = None,
                 n_boot: int = 1000, alpha: float = 0.05, seed: int | None = 0
                 ) -> tuple[float, float]:
    """Percentile-bootstrap ``(low, high)`` interval of a statistic of ``values``, at confidence
    ``1 - alpha``.

    The statistic is the ``q``-th percentile (``q`` in 0..100, same convention as
    ``percentile``) when ``q`` is given, ``stat`` when it is a callable (``np.mean``,
    ``np.median``...; called as ``stat(matrix, axis=1)`` when it accepts ``axis``, else row by
    row), and the mean when neither is given. ``n_boot`` resamples of ``len(values)`` draws with
    replacement, taken at once as a matrix of indices from ``np.random.default_rng(seed)`` (in
    chunks, to bound memory); the interval is the ``alpha / 2`` and ``1 - alpha / 2`` quantiles
    of the resampled statistics. Same seed, same interval.

    ``None`` values are dropped (as in ``percentile``); an empty input, a NaN/infinite value,
    both ``stat`` and ``q``, or bad ``n_boot``/``alpha`` raise ``ValueError``.

    NOTE: a p99 from a few hundred requests rests on its few largest values; its interval is wide
    and, below ~100 / (100 - q) samples, the bootstrap cannot see beyond the sample maximum.
    """
    x = np.asarray([v for v in values if v is not None], dtype=float)
    if x.size == 0:
        raise ValueError("bootstrap_ci necesita al menos un valor; se recibió una secuencia vacía")
    if not np.all(np.isfinite(x)):
        raise ValueError("bootstrap_ci: los valores deben ser números finitos (sin NaN ni inf)")
    if stat is not None and q is not None:
        raise ValueError("pase stat (una función) o q (un percentil 0..100), no ambos")
    if q is not None and not 0 <= q <= 100:
        raise ValueError(f"q debe ser un percentil entre 0 y 100; se recibió {q!r}")
    if stat is not None and not callable(stat):
        raise ValueError(f"stat debe ser una función (p. ej. np.mean); se recibió {stat!r}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 1:
        raise ValueError(f"n_boot debe ser un entero >= 1; se recibió {n_boot!r}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha debe estar entre 0 y 1 (0.05 = intervalo del 95 %); "
                         f"se recibió {alpha!r}")
    if q is not None:
        rows = lambda m: np.percentile(m, q, axis=1)  # noqa: E731
    elif stat is None:
        rows = lambda m: m.mean(axis=1)  # noqa: E731
    else:
        def rows(m: np.ndarray) -> np.ndarray:
            try:
                out = np.asarray(stat(m, axis=1), dtype=float)
                if out.shape == (m.shape[0],):
                    return out
            except TypeError:
                pass
            return np.array([float(stat(row)) for row in m])
    rng = np.random.default_rng(seed)
    n = x.size
    chunk = max(1, min(int(n_boot), 4_000_000 // n))
    stats = []
    for start in range(0, int(n_boot), chunk):
        k = min(chunk, int(n_boot) - start)
        stats.append(rows(x[rng.integers(0, n, (k, n))]))
    boot = np.concatenate(stats)
    low, high = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def goodput(requests: Sequence[Request], ttft_slo_s: float | None = None,
            tpot_slo_s: float | None = None) -> float:
    """Requests per second that met every given SLO (service-level objective).

    A request is *good* when it finished with at least one token (not aborted or rejected), its TTFT is <= ``ttft_slo_s``
    (if given) and its TPOT is <= ``tpot_slo_s`` (if given; a one-token request has no TPOT and
    meets any TPOT SLO). Goodput = good requests / the run's span, from the first arrival to the
    last finish of the finished requests (the same span as ``summarize``'s throughput), so with
    no SLO it is the completed-request rate, and it can only drop as SLOs tighten. Unfinished
    requests count as not good. No finished request raises ``ValueError``; a zero span gives NaN.

    Throughput alone hides a server that is fast on average but misses its latency targets;
    goodput (DistServe, Zhong et al., 2024) counts only the requests a user was happy with.
    """
    for name, slo in (("ttft_slo_s", ttft_slo_s), ("tpot_slo_s", tpot_slo_s)):
        if slo is not None and (isinstance(slo, bool) or not isinstance(slo, (int, float))
                                or not slo >= 0):
            raise ValueError(f"{name} debe ser un número >= 0 (segundos) o None; se recibió {slo!r}")
    done = [r for r in requests if r.finish_time is not None]
    if not done:
        raise ValueError("no hay peticiones terminadas para calcular el goodput")
    span = max(r.finish_time for r in done) - min(r.arrival_time for r in done)

    def good(r: Request) -> bool:
        if r.first_token_time is None or r.finish_reason in (FinishReason.ABORT,
                                                             FinishReason.REJECTED):
            return False
        if ttft_slo_s is not None and not r.ttft <= ttft_slo_s:
            return False
        tpot = r.tpot
        return tpot_slo_s is None or tpot is None or tpot <= tpot_slo_s

    n_good = sum(good(r) for r in done)
    return n_good / span if span > 0 else float("nan")


def load_test_summary(requests: Sequence[Request], *, ttft_slo_s: float | None = None,
                      tpot_slo_s: float | None = None, percentile_fn: Callable = percentile,
                      ci_fn: Callable = bootstrap_ci, n_boot: int = 1000, alpha: float = 0.05,
                      seed: int | None = 0) -> dict:
    """One row of a load-test report: ``summarize`` (with ``percentile_fn``), plus

    - ``{ttft,tpot,e2e}_{p50,p99}_ci_s``: ``(low, high)`` bootstrap intervals at ``1 - alpha``,
      from ``ci_fn(values, q=..., n_boot=..., alpha=..., seed=...)`` (``bootstrap_ci``, or a
      student's function with that signature);
    - ``goodput_req_s`` (``goodput`` under the SLOs given) and ``slo_attainment``, the share of
      finished requests that met them (1.0 without SLOs).

    The intervals treat the requests as independent draws. In a queue they are not (a request
    that waited behind a slow one is followed by others that waited too), so the interval of one
    run is narrower than the spread between repeated runs: compare runs, not only intervals.
    """
    row = summarize(requests, percentile_fn=percentile_fn)
    samples = latency_samples(requests)
    for name in ("ttft", "tpot", "e2e"):
        for q in (50, 99):
            values = samples[name]
            row[f"{name}_p{q}_ci_s"] = (tuple(float(v) for v in ci_fn(values, q=q, n_boot=n_boot,
                                                                       alpha=alpha, seed=seed))
                                        if values else (float("nan"), float("nan")))
    good = goodput(requests, ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s)
    row["goodput_req_s"] = good
    row["slo_attainment"] = good / row["throughput_req_s"] if row["throughput_req_s"] > 0 else float("nan")
    return row
