"""Reference answers of the quantization lab (chapter 7): int4 with group scales, and the
predicted seconds of a batch-1 decode step from the bytes it reads."""

from __future__ import annotations

import torch

from ..model.quant import quantize_int4
from ..sim import decode_step_cost, time_floor_s


def reference_quantize_int4_groups(w: torch.Tensor,
                                   group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int4 with one scale per ``group_size`` consecutive inputs of each row:
    ``scale = max|group| / 7``, ``q = round(w / scale)`` clipped to [-8, 7] and stored as
    ``q + 8`` (0..15), two per byte, column ``2j`` in the high nibble of byte ``j`` and
    ``2j + 1`` in the low one. Returns ``(packed uint8 [N, K / 2], scale [N, K / group_size])``;
    ValueError when ``group_size`` does not divide ``K``."""
    packed, scale, _ = quantize_int4(w, group_size, symmetric=True)
    return packed, scale


def reference_predict_step_s(config, weight_format: str | None, dtype: str, context_len: int,
                             bandwidth_bytes_per_s: float, overhead_s: float) -> float:
    """Exercise 3: the seconds of one batch-1 decode step after ``context_len`` tokens, from the
    bytes it reads (chapter 1's roofline without the compute term, which batch 1 never reaches):
    ``bytes / bandwidth + overhead``. The bytes: every linear weight in ``weight_format`` (its
    integers and, per group, a scale and, asymmetric, a zero at ``dtype``; ``None``: at
    ``dtype``), the other parameters at ``dtype`` (norms, biases, one embedding row) and the KV
    cache of ``context_len + 1`` tokens at ``dtype``."""
    cost = decode_step_cost(config, 1, context_len, dtype, weight_format=weight_format)
    return time_floor_s(cost.bytes, bandwidth_bytes_per_s) + overhead_s

