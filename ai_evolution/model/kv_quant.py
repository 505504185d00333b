"""An int8 KV cache: each token's key (and value) of each KV head is stored as int8 with one
scale, ``scale = max|x| / 127`` over its ``head_dim`` numbers (symmetric, per token and head).
Bytes per token: ``D`` int8 + one scale per head, against ``2 D`` in fp16/bf16 — about half.

``Int8KV`` stands where a float cache tensor ``[..., S, D]`` stood: writes (``scatter_`` along
the token dimension, or item assignment) quantize, reads (indexing, slicing) dequantize to the
model's dtype. So the attention steps (``cached_attention``, the engine's selective attention)
run unchanged over it; only the bytes at rest are int8.
"""

from __future__ import annotations

import torch
from torch import Tensor

KV_DTYPES = (None, "int8")


def check_kv_dtype(kv_dtype) -> None:
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype={kv_dtype!r} no está soportado; aceptados: None (el dtype del "
                         "modelo) o 'int8' (int8 con una escala por token y cabeza)")


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """``x`` ``[..., D]`` -> (int8 ``[..., D]``, scale ``[...]`` in ``x``'s dtype), symmetric."""
    amax = x.abs().amax(dim=-1).float()
    scale = (amax / 127).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round(x.float() / scale[..., None]).clamp_(-127, 127).to(torch.int8)
    return q, scale.to(x.dtype)


class Int8KV:
    """One layer's K or V: ``values`` int8 ``shape``, ``scales`` ``shape[:-1]`` in ``dtype``."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device) -> None:
        self.values = torch.zeros(shape, dtype=torch.int8, device=device)
        self.scales = torch.zeros(shape[:-1], dtype=dtype, device=device)
        self.dtype = dtype  # what reads return and what writes are expected in

    @classmethod
    def view(cls, values: Tensor, scales: Tensor) -> "Int8KV":
        """An ``Int8KV`` over existing storage (a layer of a larger cache); writes go through."""
        out = cls.__new__(cls)
        out.values, out.scales, out.dtype = values, scales, scales.dtype
        return out

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    @property
    def device(self) -> torch.device:
        return self.values.device

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + self.scales.nbytes

    def __getitem__(self, index) -> Tensor:
        """Dequantized ``[..., D]`` (the index must keep the last dimension whole)."""
        return self.values[index].to(self.dtype) * self.scales[index][..., None]

    def __setitem__(self, index, value: Tensor) -> None:
        q, s = quantize_rows(value.to(self.dtype))
        self.values[index] = q
        self.scales[index] = s

    def scatter_(self, dim: int, index: Tensor, src: Tensor) -> "Int8KV":
        """``Tensor.scatter_`` along a token dimension (not the last one): quantize ``src``."""
        if dim in (-1, self.values.dim() - 1):
            raise ValueError("Int8KV.scatter_ escribe tokens enteros: dim no puede ser la última")
        q, s = quantize_rows(src.to(self.dtype))
        self.values.scatter_(dim, index, q)
        self.scales.scatter_(dim, index[..., 0], s)
        return self

    def dequantize(self) -> Tensor:
        return self[...]
