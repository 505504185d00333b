"""Speculative decoding's economics on the roofline (chapter 9): what a draft-and-verify step
yields and costs, and from which batch size it stops paying.

A draft model proposes k tokens (k cheap decode steps), the target verifies them in one step
over k + 1 tokens per sequence; each drafted token is kept with probability alpha, and the
verification always adds one target token (Leviathan et al., 2023; Chen et al., 2023). The cost
of each step is ``cost_model.step_cost``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..hardware import get_device_spec
from ..model import ModelConfig
from ..model.presets import get_preset
from .cost_model import RooflineCostModel, decode_step_cost, step_cost


def _check_alpha(alpha: float) -> float:
    if isinstance(alpha, bool) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha (tasa de aceptación) debe estar entre 0 y 1; se recibió {alpha!r}")
    return float(alpha)


def _check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (tokens propuestos por paso) debe ser un entero >= 1; se recibió {k!r}")
    return k


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Mean tokens one speculative step yields when each of the k drafted tokens is kept with
    probability ``alpha`` independently, stopping at the first rejection, plus the target's
    own token (Leviathan et al., 2023, eq. 1):

        E = 1 + alpha + alpha^2 + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)

    1 at ``alpha = 0`` (only the target's token), ``k + 1`` at ``alpha = 1`` (the limit of the
    closed form). Computed as the sum, which stays exact near ``alpha = 1``.
    """
    alpha, k = _check_alpha(alpha), _check_k(k)
    return sum(alpha**i for i in range(k + 1))


def speculative_speedup(alpha: float, k: int, cost_ratio: float) -> float:
    """Leviathan et al.'s improvement factor when a draft step costs ``cost_ratio`` target
    steps and a verification costs one target step: ``E(alpha, k) / (1 + k * cost_ratio)``."""
    if not cost_ratio >= 0:
        raise ValueError(f"cost_ratio (coste de un paso del borrador / uno del objetivo) debe ser >= 0; "
                         f"se recibió {cost_ratio!r}")
    return expected_tokens_per_step(alpha, k) / (1 + k * cost_ratio)


def best_k(alpha: float, cost_ratio: float, k_max: int = 16) -> int:
    """The k in ``1..k_max`` with the largest ``speculative_speedup`` (the smallest on a tie)."""
    _check_k(k_max)
    return max(range(1, k_max + 1), key=lambda k: (speculative_speedup(alpha, k, cost_ratio), -k))


@dataclass(frozen=True)
class SpeculativeStep:
    """Predicted times of one speculative step of a batch against one plain decode step.

    ``target_step_s``: the target's plain decode step (one token per sequence). ``draft_s``: the
    draft's k decode steps together. ``verify_s``: the target's step over k + 1 tokens per
    sequence. ``verify_compute_bound``: whether that step sits on the compute roof.
    """

    alpha: float
    k: int
    batch_size: int
    context_len: int
    target_step_s: float
    draft_s: float
    verify_s: float
    verify_compute_bound: bool

    @property
    def tokens_per_step(self) -> float:
        """Expected tokens per sequence per speculative step, ``expected_tokens_per_step``."""
        return expected_tokens_per_step(self.alpha, self.k)

    @property
    def step_s(self) -> float:
        """One speculative step: k draft steps, then the verification."""
        return self.draft_s + self.verify_s

    @property
    def cost_ratio(self) -> float:
        """One draft step over one plain target step."""
        return self.draft_s / self.k / self.target_step_s

    @property
    def speedup(self) -> float:
        """Tokens per second with speculation over tokens per second without it."""
        return self.tokens_per_step * self.target_step_s / self.step_s


def speculative_step(cost_model: RooflineCostModel, target: ModelConfig, draft: ModelConfig,
                     alpha: float, k: int, batch_size: int = 1, context_len: int = 1024,
                     dtype: str | torch.dtype = "bf16",
                     kv_dtype: str | torch.dtype | None = None) -> SpeculativeStep:
    """Predict one speculative step with ``cost_model`` (``step_cost`` for every model step).

    Every one of the ``batch_size`` sequences holds ``context_len`` tokens in both caches. The
    draft then runs k decode steps (after ``context_len``, ``context_len + 1``, ... tokens); the
    target verifies k + 1 tokens per sequence after ``context_len``. The baseline is the
    target's decode step after ``context_len`` tokens. The draft must share the target's
    vocabulary.
    """
    alpha, k = _check_alpha(alpha), _check_k(k)
    if target.vocab_size != draft.vocab_size:
        raise ValueError(f"el borrador {draft.name!r} tiene un vocabulario de {draft.vocab_size} tokens y el "
                         f"objetivo {target.name!r} de {target.vocab_size}: deben compartir tokenizador")
    plain = decode_step_cost(target, batch_size, context_len, dtype, kv_dtype)
    draft_s = sum(cost_model.step_time_s(decode_step_cost(draft, batch_size, context_len + j, dtype, kv_dtype))
                  for j in range(k))
    verify = step_cost(target, [k + 1] * batch_size, [context_len + k + 1] * batch_size, dtype, kv_dtype)
    compute_bound = verify.flops / cost_model.peak_flops > verify.bytes / cost_model.bandwidth_bytes_per_s
    return SpeculativeStep(alpha=alpha, k=k, batch_size=batch_size, context_len=context_len,
                           target_step_s=cost_model.step_time_s(plain), draft_s=draft_s,
                           verify_s=cost_model.step_time_s(verify), verify_compute_bound=compute_bound)


def speculation_vs_batch(cost_model: RooflineCostModel, target: ModelConfig, draft: ModelConfig,
                         alpha: float, k: int, batch_sizes: Sequence[int], context_len: int = 1024,
                         dtype: str | torch.dtype = "bf16") -> list[SpeculativeStep]:
    """``speculative_step`` at each batch size: as the batch grows, the verification's k + 1
    tokens per sequence stop riding on one read of the weights (the step becomes compute-bound)
    and the speedup shrinks."""
    return [speculative_step(cost_model, target, draft, alpha, k, b, context_len, dtype) for b in batch_sizes]


def break_even_batch(steps: Sequence[SpeculativeStep]) -> int | None:
    """The first batch size (in the order given) whose predicted speedup is below 1, or None."""
    for s in steps:
        if s.speedup < 1:
            return s.batch_size
    return None


SPECULATION_TARGET = "llama-3.1-8b"
SPECULATION_DRAFT = "llama-3.2-1b"
SPECULATION_DEVICE = "h100-sxm"


def predict_speculation_h100(alpha: float, k: int,
                             batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
                             context_len: int = 1024) -> list[SpeculativeStep]:
    """The speculative step of Llama 3.1 8B with a Llama 3.2 1B draft on an H100 SXM (datasheet
    roofline, bf16, no overhead), at each batch size."""
    cost = RooflineCostModel.from_device_spec(get_device_spec(SPECULATION_DEVICE))
    return speculation_vs_batch(cost, get_preset(SPECULATION_TARGET), get_preset(SPECULATION_DRAFT),
                                alpha, k, batch_sizes, context_len)
