"""Choosing the next token from logits: greedy, temperature, top-k and top-p, as vLLM does.

Shared by chapter 1's generator (``ai_evolution.generation``), the engine's runner and
speculative decoding (``ai_evolution.speculative``, which needs ``token_probs``).
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
    probs = token_probs(logits, temperature, top_k, top_p)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def token_probs(logits: Tensor, temperature: float, top_k: int | None = None,
                top_p: float | None = None) -> Tensor:
    """The distribution ``pick_tokens`` samples from, ``[..., V]`` -> ``[..., V]``: softmax of
    ``logits / temperature`` restricted to the ``top_k`` most likely tokens and to the smallest
    set whose probability reaches ``top_p``. Below ``SAMPLING_EPS`` it is the one-hot of the
    argmax (greedy as a distribution; speculative sampling verification needs the
    distributions themselves, not only a token)."""
    if temperature < SAMPLING_EPS:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(logits.dtype)
    shape = logits.shape
    logits = logits.reshape(-1, shape[-1]) / temperature
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
    return logits.softmax(dim=-1).reshape(shape)
