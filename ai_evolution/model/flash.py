"""FlashAttention's algorithm in plain PyTorch: exact attention by tiles, never the N x N matrix.

Standard ("naive") attention writes the scores ``S = Q K^T / sqrt(d)`` and the probabilities
``P = softmax(S)`` for every query/key pair, then reads them back for ``O = P V``. FlashAttention
(Dao et al., 2022) walks over tiles instead: a tile of queries against a tile of keys at a time,
keeping per query row a running maximum ``m``, a running sum ``l`` of ``exp(s - m)`` and an
unnormalised output ``o = sum exp(s - m) v``. When a new tile raises the maximum, what was summed
so far is rescaled by ``exp(m_old - m_new)``; at the end ``out = o / l``. The result is the same
softmax attention, exact up to rounding (this module keeps ``o`` unnormalised and divides once at
the end, as FlashAttention-2 does; the 2022 paper renormalises after every tile).

What is here, all in plain PyTorch (a Python loop of tiles, not a fused kernel: the point is
which bytes move, not speed):

- ``online_softmax_update``: the one-tile update, a pure function (``merge_states`` is the same
  algebra for two partial results over disjoint keys).
- ``flash_attention``: the tiled loop, query tiles outside, key/value tiles inside (the
  FlashAttention-2 order), causal or not, grouped-query attention, tile sizes as arguments.
- ``split_k_attention`` / ``combine_partials``: decode against a long cache the "flash-decoding"
  way: split the keys into chunks, one partial ``(m, l, o)`` per chunk, then combine.
- ``gather_paged_kv`` / ``paged_flash_attention``: keys and values read block by block through a
  block table from a ``[num_blocks, Hkv, block_size, D]`` layer cache (the engine's
  ``BlockKVCache`` layout): each key tile is one block.
- ``flash_cached_attention``: the ``AttentionFn`` plug-in (``model.attention.cached_attention``'s
  contract), so the real model generates with it.
- ``naive_attention``: the baseline that materialises ``S`` and ``P``; ``stable=False`` is the
  textbook ``exp(S) / sum exp(S)`` whose ``exp`` overflows on large scores.
- ``IOCounter``: what the loop loads and stores, element by element (``sim.attention_io`` predicts
  the same counts without running anything); ``peak_memory_bytes``: the allocator's peak of a call.

Scores, the running statistics and the accumulator are float32 for float16/bfloat16/float32
inputs (what a GPU kernel keeps in registers; float64 inputs keep float64); the output is cast
back to the query's dtype.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

import torch
from torch import Tensor

from .attention import gather_blocks

BLOCK_Q = 64
"""Default query rows per tile."""
BLOCK_K = 64
"""Default keys per tile."""

State = tuple[Tensor, Tensor, Tensor]
"""``(m, l, o)``: running max ``[..., R]``, running sum ``[..., R]`` and unnormalised output
``[..., R, D]``, float32, for ``R`` query rows."""


@dataclass
class IOCounter:
    """Elements the tiled loop moves between slow memory (the tensors it is given) and the tile it
    works on (fast memory): each query tile read once, each visited key and value tile read, each
    output tile written once. ``score_elements`` counts the scores computed (masked ones within a
    visited tile included), ``key_tiles`` the key tiles visited. Counted over every batch row and
    head the call covers: key/value tiles once per KV head (one load serves its whole group)."""

    q_read: int = 0
    k_read: int = 0
    v_read: int = 0
    o_write: int = 0
    score_elements: int = 0
    key_tiles: int = 0

    @property
    def elements(self) -> int:
        return self.q_read + self.k_read + self.v_read + self.o_write


# --- checks --------------------------------------------------------------------------------------

def _check_tile(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} debe ser un entero >= 1 (filas o claves por bloque); se recibió {value!r}")
    return value


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> tuple[int, int, int, int, int, int]:
    """``q`` ``[B, H, T, D]``, ``k``/``v`` ``[B, Hkv, S, D]`` -> ``(B, H, T, D, Hkv, S)``."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} debe tener 4 dimensiones [B, cabezas, tokens, D]; "
                             f"tiene forma {tuple(t.shape)}")
    B, H, T, D = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k y v deben tener la misma forma; k es {tuple(k.shape)} y v es {tuple(v.shape)}")
    if k.shape[0] != B:
        raise ValueError(f"q tiene {B} filas de lote y k tiene {k.shape[0]}; deben coincidir")
    if k.shape[3] != D:
        raise ValueError(f"la dimensión de cabeza de q ({D}) no coincide con la de k y v ({k.shape[3]})")
    Hkv, S = k.shape[1], k.shape[2]
    if Hkv < 1 or H % Hkv:
        raise ValueError(f"{H} cabezas de consulta no se pueden agrupar sobre {Hkv} cabezas KV "
                         f"(H debe ser múltiplo de Hkv)")
    return B, H, T, D, Hkv, S


def _query_positions(q_positions, B: int, T: int, S: int, device) -> Tensor:
    """``[B, T]`` absolute positions of the queries; default: the last ``T`` of ``S`` keys."""
    if q_positions is None:
        return torch.arange(S - T, S, device=device).expand(B, T)
    q_positions = torch.as_tensor(q_positions, device=device)
    if q_positions.dim() == 1:
        q_positions = q_positions.expand(B, -1)
    if q_positions.shape != (B, T):
        raise ValueError(f"q_positions tiene forma {tuple(q_positions.shape)}; "
                         f"se esperaba (B, T) = {(B, T)} o (T,)")
    return q_positions


def _scale(scale: float | None, D: int) -> float:
    return 1.0 / math.sqrt(D) if scale is None else float(scale)


# --- the online softmax ---------------------------------------------------------------------------

def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for float16/bfloat16/float32 inputs, float64 for float64 ones."""
    return torch.promote_types(dtype, torch.float32)


def init_state(rows: Sequence[int], head_dim: int, device=None,
               dtype: torch.dtype = torch.float32) -> State:
    """The empty state for query rows of shape ``rows``: ``m = -inf``, ``l = 0``, ``o = 0``."""
    rows = tuple(rows)
    return (torch.full(rows, -math.inf, device=device, dtype=dtype),
            torch.zeros(rows, device=device, dtype=dtype),
            torch.zeros((*rows, head_dim), device=device, dtype=dtype))


def online_softmax_update(m: Tensor, l: Tensor, o: Tensor, scores: Tensor, v: Tensor) -> State:
    """Fold one tile of keys into the running softmax state of some query rows.

    ``m``, ``l``: ``[..., R]``; ``o``: ``[..., R, D]`` (the state so far, float32 or float64);
    ``scores``: ``[..., R, C]``, the scaled scores ``q . k / sqrt(d)`` of those rows against the
    tile's ``C`` keys, ``-inf`` where a key is masked; ``v``: ``[..., C, D]``, the tile's values.
    Returns the new ``(m, l, o)``:

        m_new = max(m, max_c scores)
        l_new = exp(m - m_new) * l + sum_c exp(scores - m_new)
        o_new = exp(m - m_new) * o + exp(scores - m_new) @ v

    A row that has seen no visible key yet keeps ``m = -inf``; the exponent is then taken
    against 0 instead, so no ``-inf - (-inf) = nan`` appears. ``finish_state`` gives ``o / l``.
    """
    scores = scores.to(accumulator_dtype(scores.dtype))
    m_new = torch.maximum(m, scores.amax(dim=-1))
    safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
    alpha = torch.exp(m - safe)                                   # rescales what was summed so far
    p = torch.exp(scores - safe[..., None])                       # [..., R, C]
    l_new = alpha * l + p.sum(dim=-1)
    o_new = alpha[..., None] * o + p @ v.to(p.dtype)
    return m_new, l_new, o_new


def merge_states(a: State, b: State) -> State:
    """Combine two partial states over disjoint sets of keys (the split-K combine): the state of
    their union. Same algebra as ``online_softmax_update``, with the second state as the tile."""
    (ma, la, oa), (mb, lb, ob) = a, b
    m = torch.maximum(ma, mb)
    safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    wa, wb = torch.exp(ma - safe), torch.exp(mb - safe)
    return m, wa * la + wb * lb, wa[..., None] * oa + wb[..., None] * ob


def finish_state(m: Tensor, l: Tensor, o: Tensor) -> Tensor:
    """``o / l``; a row that saw no visible key (``l = 0``, hence ``o = 0``) gives zeros."""
    return o / torch.where(l == 0, torch.ones_like(l), l)[..., None]


# --- the tiled loop -------------------------------------------------------------------------------

KVFetch = Callable[[int, int], tuple[Tensor, Tensor]]
"""``fetch(j0, j1) -> (k_tile, v_tile)``, each ``[B, Hkv, j1 - j0, D]``: keys ``j0..j1-1``."""


def _tiled_states(q: Tensor, fetch: KVFetch, S: int, Hkv: int, q_pos: Tensor, kv_len: Tensor | None,
                  causal: bool, block_q: int, block_k: int, scale: float, io: IOCounter | None,
                  key_start: int = 0) -> Iterator[tuple[int, int, State]]:
    """The loop: for each query tile, every key tile it can see (keys ``key_start..S-1``).

    Yields ``(r0, r1, state)`` per query tile as soon as it is done (the state shaped
    ``[B, Hkv, G, r1 - r0]``), so only one tile's accumulator lives at a time.
    Causal: a key tile that starts after the tile's last query position is never read.
    """
    B, H, T, D = q.shape
    G = H // Hkv
    acc = accumulator_dtype(q.dtype)
    for r0 in range(0, T, block_q):
        r1 = min(r0 + block_q, T)
        q_tile = q[:, :, r0:r1].to(acc).reshape(B, Hkv, G, r1 - r0, D)  # one read of the tile
        pos = q_pos[:, r0:r1]                                            # [B, R]
        state = init_state((B, Hkv, G, r1 - r0), D, q.device, acc)
        last_visible = int(pos.max()) if causal else S - 1
        if io is not None:
            io.q_read += q_tile.numel()
        for j0 in range(key_start, S, block_k):
            if j0 > last_visible:
                break                                                    # above the diagonal
            j1 = min(j0 + block_k, S)
            k_tile, v_tile = fetch(j0, j1)                               # [B, Hkv, C, D]
            scores = (q_tile @ k_tile.to(acc)[:, :, None].transpose(-1, -2)) * scale  # [B,Hkv,G,R,C]
            key_pos = torch.arange(j0, j1, device=q.device)
            visible = None
            if causal:
                visible = key_pos[None, None, :] <= pos[:, :, None]      # [B, R, C]
            if kv_len is not None:
                inside = (key_pos[None, :] < kv_len[:, None])[:, None, :]
                visible = inside if visible is None else visible & inside
            if visible is not None:
                scores = scores.masked_fill(~visible[:, None, None], -math.inf)
            state = online_softmax_update(*state, scores, v_tile[:, :, None])
            if io is not None:
                io.k_read += k_tile.numel()
                io.v_read += v_tile.numel()
                io.score_elements += B * H * (r1 - r0) * (j1 - j0)
                io.key_tiles += 1
        yield r0, r1, state


def _assemble(q: Tensor, tiles: Iterable[tuple[int, int, State]], io: IOCounter | None) -> Tensor:
    B, H, T, D = q.shape
    out = torch.empty(B, H, T, D, dtype=q.dtype, device=q.device)
    for r0, r1, state in tiles:
        out[:, :, r0:r1] = finish_state(*state).reshape(B, H, r1 - r0, D).to(q.dtype)  # one write
        if io is not None:
            io.o_write += B * H * (r1 - r0) * D
    return out


def flash_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False,
                    q_positions: Tensor | None = None, block_q: int = BLOCK_Q,
                    block_k: int = BLOCK_K, scale: float | None = None,
                    io: IOCounter | None = None) -> Tensor:
    """Softmax attention by tiles with the online softmax; exact up to rounding.

    ``q``: ``[B, H, T, D]``; ``k``, ``v``: ``[B, Hkv, S, D]`` (grouped-query attention: query head
    ``h`` uses KV head ``h // (H // Hkv)``). Keys sit at positions ``0..S-1``; ``q_positions``
    (``[B, T]`` or ``[T]``, default the last ``T`` positions ``S-T..S-1``, i.e. a prefill when
    ``T = S`` and a decode row when ``T = 1``) only matter when ``causal``: a query at position
    ``p`` sees keys ``0..p``. ``block_q`` query rows and ``block_k`` keys per tile (any sizes, they
    need not divide ``T`` or ``S``). ``io`` counts what the loop reads and writes. Returns
    ``[B, H, T, D]`` in ``q``'s dtype.
    """
    B, H, T, D, Hkv, S = _check_qkv(q, k, v)
    block_q, block_k = _check_tile("block_q", block_q), _check_tile("block_k", block_k)
    q_pos = _query_positions(q_positions, B, T, S, q.device)
    tiles = _tiled_states(q, lambda j0, j1: (k[:, :, j0:j1], v[:, :, j0:j1]), S, Hkv, q_pos, None,
                          causal, block_q, block_k, _scale(scale, D), io)
    return _assemble(q, tiles, io)


# --- split-K (flash-decoding) ---------------------------------------------------------------------

def partial_attention(q: Tensor, k: Tensor, v: Tensor, key_start: int, key_end: int, *,
                      causal: bool = False, q_positions: Tensor | None = None,
                      block_k: int = BLOCK_K, scale: float | None = None) -> State:
    """The state ``(m, l, o)`` of every query row over keys ``key_start..key_end-1`` only, shaped
    ``[B, H, T]`` / ``[B, H, T, D]``: one chunk's share of a split-K pass (its keys walked in
    ``block_k`` tiles). ``combine_partials`` of the chunks' states is the full attention."""
    B, H, T, D, Hkv, S = _check_qkv(q, k, v)
    block_k = _check_tile("block_k", block_k)
    if not 0 <= key_start <= key_end <= S:
        raise ValueError(f"el trozo de claves {key_start}..{key_end} no está dentro de 0..{S}")
    q_pos = _query_positions(q_positions, B, T, S, q.device)
    [(_, _, (m, l, o))] = _tiled_states(q, lambda j0, j1: (k[:, :, j0:j1], v[:, :, j0:j1]), key_end,
                                        Hkv, q_pos, None, causal, max(T, 1), block_k,
                                        _scale(scale, D), None, key_start=key_start)
    return m.reshape(B, H, T), l.reshape(B, H, T), o.reshape(B, H, T, D)


def combine_partials(partials: Sequence[State]) -> Tensor:
    """Combine the chunks' states (any order) and normalise: ``[B, H, T, D]`` in the states' dtype."""
    if not partials:
        raise ValueError("combine_partials necesita al menos un estado parcial")
    state = partials[0]
    for other in partials[1:]:
        state = merge_states(state, other)
    return finish_state(*state)


def split_k_attention(q: Tensor, k: Tensor, v: Tensor, *, num_splits: int, causal: bool = False,
                      q_positions: Tensor | None = None, block_k: int = BLOCK_K,
                      scale: float | None = None) -> Tensor:
    """Attention computed as ``num_splits`` independent chunks of keys, then combined.

    The flash-decoding view of a decode step (``T = 1`` against ``S`` cached keys): one query row
    gives a GPU too little work for one tile loop, so the keys are split into chunks that run in
    parallel, each producing its partial ``(m, l, o)``; a last step rescales each partial by
    ``exp(m_chunk - m_max)`` and adds them. Here the chunks run one after the other; the result
    equals one pass (``flash_attention``) up to rounding. Returns ``[B, H, T, D]`` in ``q``'s dtype.
    """
    B, H, T, D, Hkv, S = _check_qkv(q, k, v)
    num_splits = _check_tile("num_splits", num_splits)
    chunk = -(-S // num_splits)
    partials = [partial_attention(q, k, v, a, min(a + chunk, S), causal=causal,
                                  q_positions=q_positions, block_k=block_k, scale=scale)
                for a in range(0, S, chunk)]
    return combine_partials(partials).to(q.dtype)


# --- paged KV -------------------------------------------------------------------------------------

def _check_paged(k_cache: Tensor, v_cache: Tensor, block_tables: Tensor) -> None:
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"las cachés por bloques deben ser [num_blocks, Hkv, block_size, D] e iguales; "
                         f"k_cache es {tuple(k_cache.shape)} y v_cache {tuple(v_cache.shape)}")
    if block_tables.dim() != 2:
        raise ValueError(f"block_tables debe ser [B, bloques]; tiene forma {tuple(block_tables.shape)}")
    if block_tables.numel() and (int(block_tables.min()) < 0 or int(block_tables.max()) >= k_cache.shape[0]):
        raise ValueError(f"block_tables nombra bloques fuera de 0..{k_cache.shape[0] - 1}")


def gather_paged_kv(cache: Tensor, block_tables: Tensor, length: int) -> Tensor:
    """Blocks of a layer cache ``[num_blocks, Hkv, block_size, D]`` read through
    ``block_tables`` ``[B, n]`` as contiguous sequences ``[B, Hkv, length, D]`` (the first
    ``length`` slots of blocks ``block_tables[b, 0], block_tables[b, 1], ...``)."""
    bs = cache.shape[2]
    if length > block_tables.shape[1] * bs:
        raise ValueError(f"{length} tokens no caben en {block_tables.shape[1]} bloques de {bs}")
    return gather_blocks(cache, block_tables, length)        # the engine's own read


def paged_flash_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor,
                          seq_lens: Tensor, *, causal: bool = True,
                          q_positions: Tensor | None = None, block_q: int = BLOCK_Q,
                          scale: float | None = None, io: IOCounter | None = None) -> Tensor:
    """Tiled attention whose key tiles are the blocks of a paged KV cache.

    ``q``: ``[B, H, T, D]``; ``k_cache``, ``v_cache``: ``[num_blocks, Hkv, block_size, D]`` (one
    layer of the engine's ``BlockKVCache``); ``block_tables``: integer ``[B, n]``, row ``b``'s
    blocks in order (rows with fewer blocks pad with any valid block id: those slots are masked);
    ``seq_lens``: ``[B]``, tokens held by each row. Key tile ``j`` of row ``b`` is block
    ``block_tables[b, j]``, read whole; keys at or past ``seq_lens[b]`` are masked, and with
    ``causal`` a query at position ``p`` (default: the last ``T`` positions of its row) sees keys
    ``0..p``. Returns ``[B, H, T, D]`` in ``q``'s dtype.
    """
    _check_paged(k_cache, v_cache, block_tables)
    B, H, T, D = q.shape
    Hkv, bs = k_cache.shape[1], k_cache.shape[2]
    _check_qkv(q, k_cache[:1].expand(B, -1, -1, -1), v_cache[:1].expand(B, -1, -1, -1))
    block_q = _check_tile("block_q", block_q)
    seq_lens = torch.as_tensor(seq_lens, device=q.device).reshape(-1)
    if seq_lens.shape != (B,) or int(seq_lens.min()) < 1:
        raise ValueError(f"seq_lens debe dar un número de tokens >= 1 por fila ({B} filas); "
                         f"se recibió {seq_lens.tolist()}")
    S = int(seq_lens.max())
    if S > block_tables.shape[1] * bs:
        raise ValueError(f"{S} tokens no caben en {block_tables.shape[1]} bloques de {bs}")
    if q_positions is None:
        q_pos = seq_lens[:, None] - T + torch.arange(T, device=q.device)
    else:
        q_pos = _query_positions(q_positions, B, T, S, q.device)

    def fetch(j0: int, j1: int) -> tuple[Tensor, Tensor]:
        ids = block_tables[:, j0 // bs]                                  # [B]: one block per row
        return k_cache[ids][:, :, : j1 - j0], v_cache[ids][:, :, : j1 - j0]

    tiles = _tiled_states(q, fetch, S, Hkv, q_pos, seq_lens, causal, block_q, bs, _scale(scale, D), io)
    return _assemble(q, tiles, io)


# --- the model's plug-in --------------------------------------------------------------------------

def flash_cached_attention(q: Tensor, k_new: Tensor, v_new: Tensor, k_cache: Tensor,
                           v_cache: Tensor, positions: Tensor, *, block_q: int = BLOCK_Q,
                           block_k: int = BLOCK_K) -> Tensor:
    """``cached_attention``'s contract (an ``AttentionFn``), attending tile by tile.

    Writes ``k_new``/``v_new`` ``[B, Hkv, T, D]`` into ``k_cache``/``v_cache`` ``[B, Hkv, S, D]``
    at ``positions`` ``[B, T]`` (in place), then the query at position ``p`` attends to slots
    ``0..p`` of its row with ``flash_attention``'s loop; slots past ``positions.max()`` are never
    read. Other tile sizes: ``functools.partial(flash_cached_attention, block_q=.., block_k=..)``.
    """
    B, H, T, D = q.shape
    if k_cache.dim() != 4 or k_cache.shape[0] != B:
        raise ValueError(f"k_cache debe ser [B, Hkv, S, D] con B = {B}; tiene forma {tuple(k_cache.shape)}")
    S = k_cache.shape[2]
    if positions.shape != (B, T):
        raise ValueError(f"positions tiene forma {tuple(positions.shape)}; se esperaba (B, T) = {(B, T)}")
    _check_qkv(q, k_cache, v_cache)
    expected = (B, k_cache.shape[1], T, k_cache.shape[3])
    if k_new.shape != expected or v_new.shape != expected:
        raise ValueError(f"k_new y v_new deben ser [B, Hkv, T, D] = {expected}; "
                         f"se recibió {tuple(k_new.shape)} y {tuple(v_new.shape)}")
    max_pos, min_pos = int(positions.max()), int(positions.min())
    if max_pos >= S:
        raise ValueError(f"la posición {max_pos} no cabe en una caché KV de longitud {S} "
                         f"(posiciones válidas: 0..{S - 1})")
    if min_pos < 0:
        raise ValueError(f"la posición {min_pos} es negativa; posiciones válidas: 0..{S - 1}")
    index = positions[:, None, :, None].expand(B, k_new.shape[1], T, D)
    k_cache.scatter_(2, index, k_new.to(k_cache.dtype))
    v_cache.scatter_(2, index, v_new.to(v_cache.dtype))
    L = max_pos + 1
    return flash_attention(q, k_cache[:, :, :L], v_cache[:, :, :L], causal=True,
                           q_positions=positions, block_q=block_q, block_k=block_k)


# --- the baseline ---------------------------------------------------------------------------------

def naive_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False,
                    q_positions: Tensor | None = None, stable: bool = True,
                    scale: float | None = None) -> Tensor:
    """Standard attention: the whole ``S = Q K^T * scale`` (``[B, H, T, S]``) and ``P = softmax(S)``
    materialised, in the inputs' dtype, then ``P V``. Same shapes and masking as
    ``flash_attention``. ``stable=True`` subtracts each row's maximum before ``exp`` (what every
    library does); ``stable=False`` is the textbook ``exp(S) / sum exp(S)``, whose ``exp``
    overflows as soon as a score passes ~11 in float16 (~88 in float32)."""
    B, H, T, D, Hkv, S = _check_qkv(q, k, v)
    G = H // Hkv
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)   # head h -> KV head h // G
    scores = (q @ k.transpose(-1, -2)) * _scale(scale, D)                  # [B, H, T, S]
    if causal:
        q_pos = _query_positions(q_positions, B, T, S, q.device)
        visible = torch.arange(S, device=q.device)[None, None, :] <= q_pos[:, :, None]
        scores = scores.masked_fill(~visible[:, None], -math.inf)
    if stable:
        scores = scores - scores.amax(dim=-1, keepdim=True)
    e = torch.exp(scores)
    p = e / e.sum(dim=-1, keepdim=True)                                    # [B, H, T, S]
    return p @ v


# --- measuring memory -----------------------------------------------------------------------------

def peak_memory_bytes(fn: Callable[[], object], device: str | torch.device = "cpu") -> tuple[object, int]:
    """Run ``fn()`` and return ``(its result, the allocator's peak bytes above what was allocated
    when it started)``.

    CUDA: ``torch.cuda.max_memory_allocated`` after a reset. CPU: every allocation and free the
    profiler records (``torch.profiler`` with ``profile_memory=True``), summed in time order; the
    peak of that running sum. Both count the intermediates a call materialises (``S`` and ``P``
    for naive attention, one tile's worth for the tiled loop), not memory held before the call.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()
        torch.cuda.synchronize(device)
        return result, torch.cuda.max_memory_allocated(device) - base
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
    running = peak = 0
    for _, nbytes in events:
        running += nbytes
        peak = max(peak, running)
    return result, peak


@contextlib.contextmanager
def quiet_native_stderr():
    """Silence what native code writes on file descriptor 2 (torch.profiler's kineto prints a
    ``profiler_start``/``profiler_stop`` line per session there, which a notebook would show)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):       # no real descriptor 2: nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)



def random_qkv(batch: int, heads: int, kv_heads: int, n_queries: int, n_keys: int, head_dim: int,
               *, seed: int = 0, dtype: torch.dtype = torch.float32, scores_around: float | None = None,
               device: str | torch.device = "cpu") -> tuple[Tensor, Tensor, Tensor]:
    """Seeded ``q`` ``[B, H, T, D]``, ``k``, ``v`` ``[B, Hkv, S, D]`` with standard normal entries.
    ``scores_around=x`` scales ``q`` and ``k`` by ``sqrt(x)`` so that the scaled scores have a
    standard deviation of about ``x`` (``1e4`` gives the extreme logits of chapter 8)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, n_queries, head_dim, generator=g)
    k = torch.randn(batch, kv_heads, n_keys, head_dim, generator=g)
    v = torch.randn(batch, kv_heads, n_keys, head_dim, generator=g)
    if scores_around is not None:
        q, k = q * math.sqrt(scores_around), k * math.sqrt(scores_around)
    return q.to(device, dtype), k.to(device, dtype), v.to(device, dtype)
