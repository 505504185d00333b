"""Memory arithmetic on a ModelConfig: weight bytes, KV-cache bytes and how many sequences fit.

All sizes are in bytes (GB = 1e9 bytes, GiB = 2**30 bytes; the names say which).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .config import ModelConfig

# Bytes per element. Quantized formats are listed by their nominal width (no scales/zeros).
_DTYPE_BYTES = {
    "float32": 4.0, "fp32": 4.0,
    "float16": 2.0, "fp16": 2.0, "half": 2.0,
    "bfloat16": 2.0, "bf16": 2.0,
    "float8": 1.0, "fp8": 1.0, "int8": 1.0,
    "int4": 0.5, "q4": 0.5,
}


def dtype_bytes(dtype: str | torch.dtype) -> float:
    """Bytes per element of ``dtype`` (a torch dtype or one of the names in ``_DTYPE_BYTES``)."""
    if isinstance(dtype, torch.dtype):
        return float(torch.empty((), dtype=dtype).element_size())
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; accepted: {', '.join(sorted(_DTYPE_BYTES))}")
    return _DTYPE_BYTES[key]


def param_count(config: ModelConfig) -> int:
    """Parameters of the decoder, counting a tied lm_head once."""
    h, hd = config.hidden_size, config.head_dim
    q, kv = config.num_heads * hd, config.num_kv_heads * hd
    attn = h * q + 2 * h * kv + q * h
    if config.attention_bias:
        attn += q + 2 * kv
    if config.o_proj_bias:
        attn += h
    if config.qk_norm:
        attn += 2 * hd
    mlp = 3 * h * config.intermediate_size
    layer = attn + mlp + 2 * h  # two RMSNorm weights
    embed = config.vocab_size * h
    head = 0 if config.tie_word_embeddings else config.vocab_size * h
    return config.num_layers * layer + embed + head + h  # + final norm


def weight_bytes(config: ModelConfig, dtype: str | torch.dtype = "bf16") -> float:
    """Bytes of all weights stored at ``dtype``."""
    return param_count(config) * dtype_bytes(dtype)


def kv_bytes_per_token(config: ModelConfig, dtype: str | torch.dtype = "bf16") -> float:
    """KV-cache bytes one token occupies: 2 (K and V) x layers x kv_heads x head_dim x bytes."""
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype_bytes(dtype)


def kv_bytes(config: ModelConfig, num_tokens: int, batch_size: int = 1,
             dtype: str | torch.dtype = "bf16") -> float:
    """KV-cache bytes of ``batch_size`` sequences of ``num_tokens`` tokens each."""
    return kv_bytes_per_token(config, dtype) * num_tokens * batch_size


@dataclass(frozen=True)
class MemoryBudget:
    """How much KV cache fits on one accelerator after the weights.

    ``static_slots``: sequences that fit when each reserves ``max_len`` tokens up front
    (contiguous reservation). ``on_demand_sequences``: sequences that fit when each holds only the
    ``typical_len`` tokens it really has (paged, on-demand allocation).
    """

    gpu_memory_bytes: float
    utilization: float
    weight_bytes: float
    kv_budget_bytes: float
    kv_bytes_per_token: float
    max_len: int
    typical_len: int
    static_slots: int
    on_demand_sequences: int
    max_tokens: int


def memory_budget(config: ModelConfig, gpu_memory_bytes: float, *, max_len: int,
                  typical_len: int | None = None, utilization: float = 1.0,
                  dtype: str | torch.dtype = "bf16", kv_dtype: str | torch.dtype | None = None,
                  weights_bytes: float | None = None) -> MemoryBudget:
    """Sequences that fit in ``utilization`` x ``gpu_memory_bytes`` once the weights are loaded.

    ``weights_bytes`` overrides the exact weight size computed from the config (for example the
    nominal "7B x 2 bytes = 14 GB" of a back-of-the-envelope estimate).
    """
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization must be in (0, 1], got {utilization}")
    if max_len < 1 or (typical_len is not None and typical_len < 1):
        raise ValueError(f"max_len and typical_len must be >= 1, got {max_len}, {typical_len}")
    typical_len = max_len if typical_len is None else typical_len
    w = weight_bytes(config, dtype) if weights_bytes is None else float(weights_bytes)
    budget = gpu_memory_bytes * utilization - w
    if budget <= 0:
        raise ValueError(
            f"the weights ({w / 1e9:.2f} GB) do not fit in {utilization:.2f} x "
            f"{gpu_memory_bytes / 1e9:.2f} GB: no room left for the KV cache"
        )
    per_token = kv_bytes_per_token(config, dtype if kv_dtype is None else kv_dtype)
    return MemoryBudget(
        gpu_memory_bytes=float(gpu_memory_bytes), utilization=utilization, weight_bytes=w,
        kv_budget_bytes=budget, kv_bytes_per_token=per_token, max_len=max_len,
        typical_len=typical_len,
        static_slots=math.floor(budget / (per_token * max_len)),
        on_demand_sequences=math.floor(budget / (per_token * typical_len)),
        max_tokens=math.floor(budget / per_token),
    )
