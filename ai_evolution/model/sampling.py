"""Choosing the next token from logits: greedy, temperature, top-k and top-p, as vLLM does.

Shared by chapter 1's generator (``ai_evolution.generation``) and the engine's runner.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Temperatures below this are greedy (as in vLLM): dividing logits by a smaller one overflows.
SAMPLING_EPS = 1e-5


def pick_tokens(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None,
          generator: torch.Generator | None) -> Tensor:
    """One token per row from float32 logits ``[B, V]`` -> ``[B]`` (greedy below
    ``SAMPLING_EPS``: a smaller temperature would overflow the division)."""
    if temperature < SAMPLING_EPS:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]                        # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token once the more likely ones already reach top_p; the first always stays.
        drop = probs.cumsum(dim=-1) - probs >= top_p
        drop[:, 0] = False  # however small top_p is (even below float32's resolution)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
