"""Attention with and without a KV cache, and the contiguous cache itself.

``cached_attention`` is the reference for one attention step over a KV cache; its signature is
``AttentionFn``, so any function with the same contract (a student's, a paged one) can be passed
to ``Transformer.forward(..., attn_fn=...)`` and run inside the real model.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .config import ModelConfig
from .kv_quant import Int8KV, check_kv_dtype

AttentionFn = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
"""``attn_fn(q, k_new, v_new, k_cache, v_cache, positions) -> out``: the contract of
``cached_attention`` (read its docstring for the shapes and the exact semantics)."""


class ContiguousKVCache:
    """One preallocated K and V buffer per layer, with ``max_len`` slots per sequence.

    Row ``b`` of the batch owns slots ``[b, :, 0:max_len]``; the token at absolute position ``p``
    of that sequence lives in slot ``p``. Memory is reserved for ``max_len`` tokens per row up
    front, whether or not they are ever used: that waste is what paged caches remove.
    ``kv_dtype="int8"`` stores int8 with a scale per token and head (``model.kv_quant``): about
    half the bytes of fp16; ``layer(i)`` then gives ``Int8KV`` views that quantize on write and
    dequantize on read.
    """

    def __init__(self, config: ModelConfig, batch_size: int, max_len: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 kv_dtype: str | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size debe ser >= 1; se recibió {batch_size}")
        if max_len < 1:
            raise ValueError(f"max_len debe ser >= 1; se recibió {max_len}")
        check_kv_dtype(kv_dtype)
        self.config = config
        self.batch_size = batch_size
        self.max_len = max_len
        self.kv_dtype = kv_dtype
        # One entry per attention layer (all layers of a plain transformer; a hybrid's linear
        # layers keep a fixed state instead, ``linear_attention.LinearAttentionState``).
        shape = (config.num_attention_layers, batch_size, config.num_kv_heads, max_len,
                 config.head_dim)
        self.k, self.v = new_kv_storage(shape, dtype, device, kv_dtype)  # [L, B, Hkv, S, D] each

    def layer(self, i: int) -> tuple[Tensor, Tensor]:
        """Views ``(k, v)`` of layer ``i``, each ``[B, Hkv, max_len, D]``; writes go to the cache."""
        if not 0 <= i < self.config.num_attention_layers:
            raise IndexError(f"la capa {i} está fuera de rango; la caché tiene las capas "
                             f"0..{self.config.num_attention_layers - 1}")
        return layer_views(self.k, self.v, i)

    @property
    def nbytes(self) -> int:
        return kv_storage_nbytes(self.k, self.v)

    @property
    def dtype(self) -> torch.dtype:
        return self.k[1].dtype if isinstance(self.k, tuple) else self.k.dtype

    @property
    def device(self) -> torch.device:
        return self.k[0].device if isinstance(self.k, tuple) else self.k.device


def new_kv_storage(shape: tuple[int, ...], dtype: torch.dtype, device, kv_dtype: str | None):
    """K and V storage of ``shape`` (``[L, ..., D]``): two float tensors, or with
    ``kv_dtype="int8"`` two ``(int8 values, scales [L, ...])`` pairs."""
    if kv_dtype is None:
        return (torch.zeros(shape, dtype=dtype, device=device),
                torch.zeros(shape, dtype=dtype, device=device))
    return tuple((torch.zeros(shape, dtype=torch.int8, device=device),
                  torch.zeros(shape[:-1], dtype=dtype, device=device)) for _ in range(2))


def layer_views(k, v, i: int):
    """Layer ``i`` of storage made by ``new_kv_storage``: tensors, or ``Int8KV`` views."""
    if isinstance(k, tuple):
        return Int8KV.view(k[0][i], k[1][i]), Int8KV.view(v[0][i], v[1][i])
    return k[i], v[i]


def kv_storage_nbytes(k, v) -> int:
    return sum(t.nbytes for t in ((*k, *v) if isinstance(k, tuple) else (k, v)))


# Operations on one layer's block store, ``[num_blocks, Hkv, block_size, D]`` (the engine's
# ``BlockKVCache``), shared by its eager step and its decode graphs.

def write_slots(k_cache, v_cache, blocks: Tensor, offsets: Tensor, k_new: Tensor,
                v_new: Tensor) -> None:
    """Store the K/V ``[1, Hkv, N, D]`` of N new tokens in their slots: token ``t`` at block
    ``blocks[t]``, offset ``offsets[t]`` (the slot mapping)."""
    k_cache[blocks, :, offsets] = k_new[0].transpose(0, 1).to(k_cache.dtype)
    v_cache[blocks, :, offsets] = v_new[0].transpose(0, 1).to(v_cache.dtype)


def gather_blocks(cache, blocks: Tensor, length: int) -> Tensor:
    """Blocks ``[..., n]`` of a layer's block store as one sequence ``[..., Hkv, n * bs, D]``
    cut to ``length`` tokens."""
    if isinstance(cache, Tensor):  # one copy: gather along the blocks of a [Hkv, ...] view
        g = cache.transpose(0, 1)[:, blocks].movedim(0, -4)           # [..., Hkv, n, bs, D]
    else:                          # int8 views dequantize what they gather
        g = cache[blocks].transpose(-4, -3)                            # [..., Hkv, n, bs, D]
    return g.reshape(*g.shape[:-3], -1, g.shape[-1])[..., :length, :]


def decode_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """One query per row: ``q`` ``[1, H, n, D]`` (row ``i``'s query is token ``i``), keys and
    values ``[n, Hkv, L, D]``, ``mask`` ``[n, 1, 1, L]`` -> ``[1, H, n, D]``, through views."""
    qd = q[0].transpose(0, 1)[:, :, None]                              # [n, H, 1, D]
    od = F.scaled_dot_product_attention(qd, k, v, attn_mask=mask, enable_gqa=True)
    return od[:, :, 0].transpose(0, 1)[None]                           # [1, H, n, D]


def cached_attention(q: Tensor, k_new: Tensor, v_new: Tensor, k_cache: Tensor, v_cache: Tensor,
                     positions: Tensor) -> Tensor:
    """One attention step over a KV cache: store the new keys/values, then attend to the past.

    Shapes (B batch rows, T new tokens per row, H query heads, Hkv KV heads, D head_dim,
    S cache slots per row):

    - ``q``: ``[B, H, T, D]``, queries of the new tokens, RoPE already applied.
    - ``k_new``, ``v_new``: ``[B, Hkv, T, D]``, keys (RoPE applied) and values of the new tokens.
    - ``k_cache``, ``v_cache``: ``[B, Hkv, S, D]``, this layer's cache, **modified in place**.
    - ``positions``: integer ``[B, T]``; ``positions[b, t]`` is the absolute position of new token
      ``t`` in sequence ``b`` (rows may be at different positions). Positions within a row must
      be distinct and ``< S``.

    What it does:

    1. Write: ``k_cache[b, :, positions[b, t], :] = k_new[b, :, t, :]`` for every ``b, t``
       (the same for ``v``), i.e. a scatter along dim 2. Slots not named in ``positions`` keep
       what they held.
    2. Read: the query of token ``t`` of row ``b``, at position ``p = positions[b, t]``, attends
       to the cache slots ``0..p`` of row ``b`` only (mask ``key_pos <= query_pos``): it sees
       itself and everything before it, never a later position and never another row. Slots
       past ``positions.max()`` are not even read.
    3. Grouped-query attention: query head ``h`` uses KV head ``h // (H // Hkv)``.
       Scores are ``q . k / sqrt(D)``, softmax over the visible keys, weighted sum of values.

    Returns ``[B, H, T, D]``, in the order of ``q``.

    The caller guarantees the slots ``0..p`` of each row hold that row's earlier tokens (written
    by previous calls); what sits in later slots (stale data, padding) is masked out.
    """
    B, H, T, D = q.shape
    S = k_cache.shape[2]
    if positions.shape != (B, T):
        raise ValueError(f"positions tiene forma {tuple(positions.shape)}; se esperaba (B, T) = {(B, T)}")
    if H % k_cache.shape[1]:
        raise ValueError(f"{H} cabezas de consulta no se pueden agrupar sobre {k_cache.shape[1]} cabezas KV")
    max_pos = int(positions.max())
    if max_pos >= S:
        raise ValueError(f"la posición {max_pos} no cabe en una caché KV de longitud {S} "
                         f"(posiciones válidas: 0..{S - 1})")
    min_pos = int(positions.min())
    if min_pos < 0:
        raise ValueError(f"la posición {min_pos} es negativa; posiciones válidas: 0..{S - 1}")

    index = positions[:, None, :, None].expand(B, k_new.shape[1], T, D)  # [B, Hkv, T, D]
    k_cache.scatter_(2, index, k_new.to(k_cache.dtype))
    v_cache.scatter_(2, index, v_new.to(v_cache.dtype))

    L = max_pos + 1
    key_pos = torch.arange(L, device=q.device)                          # [L]
    mask = key_pos[None, None, :] <= positions[:, :, None]             # [B, T, L]
    return F.scaled_dot_product_attention(
        q, k_cache[:, :, :L], v_cache[:, :, :L], attn_mask=mask[:, None], enable_gqa=True,
    )                                                                   # [B, H, T, D]


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal self-attention over the T tokens given, no cache.

    ``q``: ``[B, H, T, D]``; ``k``, ``v``: ``[B, Hkv, T, D]``. Token ``t`` sees tokens ``0..t``
    of its own row. Returns ``[B, H, T, D]``.
    """
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
