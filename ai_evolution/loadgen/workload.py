"""Seeded workloads for the engine and the simulator.

The batching chapter uses Anyscale's experiment (Daniel et al., 2023): prompts of one length and
output lengths drawn from an exponential distribution, capped. A low cap makes nearly every
output hit it (little spread); a high cap lets the long tail through (much spread), which is
what static batching pays for.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..engine.request import SamplingParams


class WorkItem(NamedTuple):
    """One request of a workload: when it arrives (s, relative), its prompt and parameters, and
    its scheduling tags (``{"priority": p, "tenant": name}``, or None: priority 0, no tenant)."""

    arrival_time: float
    prompt_token_ids: list[int]
    params: SamplingParams
    tags: dict | None = None


def capped_exponential_lengths(n: int, mean: float, cap: int, seed: int) -> list[int]:
    """``n`` output lengths ``min(cap, ceil(Exponential(mean)))``, each >= 1, seeded."""
    if n < 1 or mean <= 0 or cap < 1:
        raise ValueError(f"se necesita n >= 1, mean > 0 y cap >= 1; se recibió n={n}, mean={mean}, "
                         f"cap={cap}")
    rng = np.random.default_rng(seed)
    draws = np.ceil(rng.exponential(mean, n)).astype(int)
    return np.clip(draws, 1, cap).tolist()


def fixed_prompt_workload(num_requests: int, prompt_len: int, output_lens: list[int],
                          vocab_size: int, seed: int, first_token: int = 3) -> list[WorkItem]:
    """``num_requests`` random prompts of ``prompt_len`` tokens, all arriving at t = 0, each
    generating exactly its ``output_lens[i]`` tokens (``ignore_eos``), greedy.

    Token ids below ``first_token`` are left out so that no prompt holds a special token.
    """
    if len(output_lens) != num_requests:
        raise ValueError(f"{num_requests} peticiones pero {len(output_lens)} longitudes de salida: "
                         "hace falta una por petición")
    rng = np.random.default_rng(seed)
    prompts = rng.integers(first_token, vocab_size, (num_requests, prompt_len)).tolist()
    return [WorkItem(0.0, p, SamplingParams(max_tokens=int(n), ignore_eos=True))
            for p, n in zip(prompts, output_lens)]


def varied_workload(num_requests: int, prompt_len: int, mean_output: float, cap: int,
                    vocab_size: int, seed: int, min_prompt: int = 4) -> list[WorkItem]:
    """Prompts of ``min_prompt``..``prompt_len`` tokens and capped exponential outputs, all at
    t = 0: final lengths that vary (what paged KV and the scheduler's memory pressure need)."""
    rng = np.random.default_rng(seed)
    outs = capped_exponential_lengths(num_requests, mean_output, cap, seed)
    lens = rng.integers(min_prompt, prompt_len + 1, num_requests)
    return [WorkItem(0.0, rng.integers(3, vocab_size, int(n)).tolist(),
                     SamplingParams(max_tokens=int(o), ignore_eos=True)) for n, o in zip(lens, outs)]
