"""Wall-clock measurements of generation and the fits that read them.

Timings on shared machines are noisy: every function here warms up first, repeats, and reports
medians (or every run, for a comparison that wants its spread). Numbers that come out of these
functions are *measured* and are marked as timings in a lab's contract.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Sequence

import numpy as np
import torch

from . import claims
from .generation import generate
from .hardware import synchronize


def _one_run(model, prompt_ids, max_new_tokens: int, cache: str | None) -> np.ndarray:
    """Seconds each generated token took in one greedy generation: shape ``[max_new_tokens]``."""
    device = next(model.parameters()).device
    stamps: list[float] = []

    def on_token(step: int, tokens) -> None:
        synchronize(device)
        stamps.append(time.perf_counter())

    synchronize(device)
    start = time.perf_counter()
    generate(model, prompt_ids, max_new_tokens, cache=cache, on_token=on_token)
    return np.diff([start, *stamps])


def step_times(model, prompt_ids: list[int], max_new_tokens: int, *, cache: str | None,
               repeats: int = 3, warmup: int = 1) -> np.ndarray:
    """Seconds each generated token took, median over ``repeats`` runs: shape ``[max_new_tokens]``.

    Entry ``i`` is the time from token ``i-1`` (or the start) to token ``i``; entry 0 includes
    the prefill of the prompt. Greedy decoding, so every run does the same work.
    """
    runs = []
    for r in range(warmup + repeats):
        t = _one_run(model, prompt_ids, max_new_tokens, cache)
        if r >= warmup:
            runs.append(t)
    return np.median(np.stack(runs), axis=0)


def interleaved_step_times(model, prompt_ids: list[int], max_new_tokens: int, *,
                           caches: Sequence[str | None] = ("contiguous", None), repeats: int = 3,
                           warmup: int = 1) -> list[np.ndarray]:
    """Per-token seconds of every run, the ``caches`` measured in turn (A, B, A, B, ...).

    Returns one array ``[repeats, max_new_tokens]`` per entry of ``caches``: row ``i`` of each
    was measured in the same round, side by side, so drift on a shared machine (another process
    taking a core for a while) hits both sides of a pair and a paired comparison cancels it.
    ``warmup`` rounds are run first and dropped.
    """
    runs: list[list[np.ndarray]] = [[] for _ in caches]
    for r in range(warmup + repeats):
        for k, cache in enumerate(caches):
            t = _one_run(model, prompt_ids, max_new_tokens, cache)
            if r >= warmup:
                runs[k].append(t)
    return [np.stack(r) for r in runs]


def fit_growth(n: np.ndarray, t: np.ndarray) -> dict[str, float]:
    """Fit ``t ~ c0 + c1*n + c2*n**2`` of a total time against tokens generated, with every
    coefficient >= 0 (a time cannot shrink as tokens are added). The one fit of the library:
    this is :func:`ai_evolution.claims.fit_growth`, the fit the growth claims read.

    Returns the coefficients and, at the largest ``n``: ``quadratic_share``, the fraction of the
    fitted time that the ``n**2`` term accounts for, in [0, 1] (0: linear growth; 1: all of it
    quadratic), and ``exponent``, the local growth exponent ``d ln t / d ln n`` of the fit, in
    [0, 2] (1: linear, 2: quadratic).
    """
    return claims.fit_growth(n, t)


@contextmanager
def torch_threads(n: int):
    """Run the block with ``n`` intra-op threads of torch (0: leave torch's choice). On a small
    shared CPU one thread is the robust choice for a tiny model: a second thread that has to wait
    for a busy core makes every step many times slower, and the wait is noise, not the model."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
