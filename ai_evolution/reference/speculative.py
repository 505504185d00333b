"""Reference answers of the speculative-decoding lab (chapter 9): the rejection-sampling pieces
and the expected speedup per number of draft tokens."""

from __future__ import annotations

import torch

from ..sim.cost_model import best_k, speculative_speedup
from ..speculative import acceptance_probs, residual_distribution


def reference_speedup_table(alpha: float, cost_ratio: float, k_max: int) -> dict:
    """``{"speedup": [S(1), .., S(k_max)], "best_k": k}``: Leviathan et al.'s improvement factor
    ``E(alpha, k) / (1 + k * cost_ratio)`` for each k, and the k with the largest one (the
    smallest k on a tie)."""
    return {"speedup": [speculative_speedup(alpha, k, cost_ratio) for k in range(1, k_max + 1)],
            "best_k": best_k(alpha, cost_ratio, k_max)}


def reference_acceptance_and_residual(p: torch.Tensor,
                                      q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(min(1, p/q), norm(max(0, p - q)))``: the probability of keeping each drafted token and
    the distribution to resample from after a rejection."""
    return acceptance_probs(p, q), residual_distribution(p, q)

