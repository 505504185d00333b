"""Reference answers of the FlashAttention lab (chapter 8): exact softmax attention (and the
variants a mistake would compute), and the bytes the tiled loop moves."""

from __future__ import annotations

import math

import torch

from ..sim.attention_io import flash_io


def exact_attention(q, k, v, causal, q_positions=None, *, offset=0, top_left=False,
                    gqa="interleave", scale=None):
    """Softmax attention in float64 with the variants a mistake would compute: the mask
    ``key <= pos + offset``, queries aligned at position 0 (``top_left``), another head mapping."""
    B, H, T, D = q.shape
    S, Hkv = k.shape[2], k.shape[1]
    G = H // Hkv
    q, k, v = q.double(), k.double(), v.double()
    if gqa == "interleave":
        k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    else:
        k, v = k.repeat(1, G, 1, 1), v.repeat(1, G, 1, 1)
    scores = q @ k.transpose(-1, -2) * ((1 / math.sqrt(D)) if scale is None else scale)
    if causal:
        if q_positions is None:
            pos = torch.arange(T) if top_left else torch.arange(S - T, S)
            pos = pos.expand(B, T)
        else:
            pos = torch.as_tensor(q_positions).expand(B, T)
        visible = torch.arange(S)[None, None, :] <= pos[:, :, None] + offset
        scores = scores.masked_fill(~visible[:, None], -math.inf)
    p = torch.softmax(scores, dim=-1)
    return torch.nan_to_num(p) @ v


def reference_tiled_bytes(n: int, d: int, block_q: int, block_k: int, elem_bytes: int = 2,
                          causal: bool = False) -> int:
    """Bytes one head's tiled attention (a prefill of ``n`` tokens, head dim ``d``) moves
    between slow and fast memory: Q read once, O written once, and for each query tile the K
    and V tiles it visits (with ``causal``, whole tiles up to the one holding the tile's last
    query position). ``sim.attention_io.flash_io(...).hbm_bytes``."""
    return flash_io(n, d, block_q, block_k, elem_bytes, causal=causal).hbm_bytes

