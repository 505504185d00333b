"""RMSNorm, the normalization every layer of the decoder uses (its own module so that the decoder
and the linear-attention layers share it)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """``x / rms(x) * scale``, over the last dimension.

    ``zero_centered=False`` (Llama, Qwen2/3): ``scale = weight``, identity at ``weight = 1``.
    ``zero_centered=True`` (Qwen3.5): ``scale = 1 + weight``, identity at ``weight = 0``, computed
    in float32 and rounded once at the end, as Hugging Face's ``Qwen3_5RMSNorm``.
    ``identity`` is the weight value that makes the norm a plain normalization.
    """

    def __init__(self, dim: int, eps: float, zero_centered: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        self.identity = 0.0 if zero_centered else 1.0
        self.weight = nn.Parameter(torch.full((dim,), self.identity))

    def forward(self, x: Tensor) -> Tensor:
        if self.zero_centered:
            y = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
            return (y * (1.0 + self.weight.float())).to(x.dtype)
        if x.dtype == torch.float32 == self.weight.dtype:  # one kernel, scale included
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        # Normalize in float32 and round back before scaling, as Hugging Face does, so that
        # bf16/fp16 outputs round the same way as theirs.
        y = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)
        return self.weight * y
