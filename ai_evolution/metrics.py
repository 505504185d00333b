"""Serving metrics from the engine's per-request timing records.

Percentiles use numpy's default (linear interpolation between closest ranks), the convention of
vLLM's and most load generators' reports.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .engine.request import Request


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, linear interpolation; NaN if empty."""
    values = [v for v in values if v is not None]
    return float(np.percentile(values, q)) if values else float("nan")


def summarize(requests: Sequence[Request]) -> dict:
    """Throughput and latency of a set of finished requests.

    - ``throughput_tok_s``: generated tokens / (last finish - first arrival);
    - ``ttft_*``: arrival -> first token; ``tpot_*``: mean gap between a request's tokens after
      the first (requests with one token have none); ``e2e_*``: arrival -> finish.
    """
    done = [r for r in requests if r.finish_time is not None]
    if not done:
        raise ValueError("no finished requests to summarize")
    tokens = sum(len(r.output_token_ids) for r in done)
    span = max(r.finish_time for r in done) - min(r.arrival_time for r in done)
    ttft = [r.ttft for r in done]
    tpot = [r.tpot for r in done]
    e2e = [r.e2e_latency for r in done]
    return {
        "requests": len(done),
        "output_tokens": tokens,
        "duration_s": span,
        "throughput_tok_s": tokens / span if span > 0 else float("nan"),
        "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "tpot_p50_s": percentile(tpot, 50), "tpot_p99_s": percentile(tpot, 99),
        "e2e_p50_s": percentile(e2e, 50), "e2e_p99_s": percentile(e2e, 99),
    }
