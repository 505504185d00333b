"""Wall-clock measurements of generation and the fits that read them.

Timings on shared machines are noisy: every function here warms up first, repeats, and reports
medians. Numbers that come out of these functions are *measured* and are marked as timings in a
lab's contract.
"""

from __future__ import annotations

import time

import numpy as np

from .generation import generate
from .hardware import synchronize


def step_times(model, prompt_ids: list[int], max_new_tokens: int, *, cache: str | None,
               repeats: int = 3, warmup: int = 1) -> np.ndarray:
    """Seconds each generated token took, median over ``repeats`` runs: shape ``[max_new_tokens]``.

    Entry ``i`` is the time from token ``i-1`` (or the start) to token ``i``; entry 0 includes
    the prefill of the prompt. Greedy decoding, so every run does the same work.
    """
    device = next(model.parameters()).device
    runs = []
    for r in range(warmup + repeats):
        stamps: list[float] = []

        def on_token(step: int, tokens) -> None:
            synchronize(device)
            stamps.append(time.perf_counter())

        synchronize(device)
        start = time.perf_counter()
        generate(model, prompt_ids, max_new_tokens, cache=cache, on_token=on_token)
        if r >= warmup:
            runs.append(np.diff([start, *stamps]))
    return np.median(np.stack(runs), axis=0)


def fit_growth(n: np.ndarray, t: np.ndarray) -> dict[str, float]:
    """Least-squares fit ``t ~ c0 + c1*n + c2*n**2`` of a total time against tokens generated.

    Returns the coefficients and ``quadratic_share``: the fraction of the fitted time at the
    largest ``n`` that the ``n**2`` term accounts for (near 0: linear growth; near 1: quadratic).
    """
    n = np.asarray(n, dtype=np.float64)
    t = np.asarray(t, dtype=np.float64)
    if n.shape != t.shape or n.ndim != 1 or len(n) < 3:
        raise ValueError(f"n and t must be 1-D of the same length >= 3, got {n.shape} and {t.shape}")
    design = np.stack([np.ones_like(n), n, n**2], axis=1)
    (c0, c1, c2), *_ = np.linalg.lstsq(design, t, rcond=None)
    n_max = n.max()
    fitted = c0 + c1 * n_max + c2 * n_max**2
    return {"c0": float(c0), "c1": float(c1), "c2": float(c2),
            "quadratic_share": float(c2 * n_max**2 / fitted) if fitted > 0 else float("nan")}
