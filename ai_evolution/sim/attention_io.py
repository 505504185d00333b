"""The IO model of attention: elements moved between slow memory (HBM) and fast memory (SRAM) by
standard attention and by the tiled loop of ``model.flash``, plus the FLOPs, for one head.

Dao et al. (2022), Theorem 2: standard attention makes Theta(N d + N^2) HBM accesses,
FlashAttention Theta(N^2 d^2 / M) for a fast memory of M bytes (d <= M <= N d). The functions
here give the exact counts behind those orders, for ``n`` keys (sequence length), ``d`` (head
dim) and ``n_queries`` query rows (``n`` for a prefill, 1 for a decode step), for ONE head of ONE
sequence (multiply by batch x heads for a layer):

- ``naive_io``: the paper's standard attention (its Algorithm 0). Read Q, K, compute S, write S;
  read S, write P = softmax(S); read P, V, write O. S and P are ``n_queries x n`` each, written
  once and read once: ``4 n_q n`` of the total, whatever the fast memory.
- ``flash_io``: exactly what ``model.flash.flash_attention`` loads and stores for given tile
  sizes (``model.flash.IOCounter`` counts the same fields while it runs): query tiles outside,
  key tiles inside (FlashAttention-2's order), so Q is read once and O written once, and K and V
  are read once per query tile: ``2 ceil(n_q / block_q) n d``. Causal: a key tile that starts
  after a query tile's last position is skipped (query ``i`` sits at position ``n - n_q + i``).
  The running max and sum stay in fast memory (inference: nothing is saved for a backward pass).
- ``working_set_bytes``: what one step of the loop must hold in fast memory; ``best_tiles``: the
  tile sizes that fit a fast memory of ``M`` bytes and move the fewest bytes. With query tiles of
  about ``M / (2 d e)`` rows, K and V are read ``n_q / block_q`` times: bytes ~ ``4 n^2 d^2 e^2 / M``.

Lives next to the roofline cost model: pure arithmetic on sizes, no tensors, so the chapter's
figures and the lab's check can call it for sizes no machine here could run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NAIVE_SOFTMAX_OPS = 5
"""Per score of standard attention: row max, subtract, exp, row sum, divide."""
TILED_SOFTMAX_OPS = 4
"""Per score computed by the tiled loop: tile max, subtract, exp, tile sum (the divide is done
once per output element, the rescale once per row and tile)."""


@dataclass(frozen=True)
class AttentionIO:
    """Elements read from and written to slow memory by one head's attention, and its work.

    ``q_read`` ... ``o_write``: elements of Q, K, V read and of O written; ``s_write`` ...
    ``p_read``: of the score matrix S and the probabilities P (zero for the tiled loop);
    ``score_elements``: scores computed (what the two matmuls scale with); ``softmax_ops``:
    elementwise operations of the softmax; ``elem_bytes``: bytes per element; ``block_q``,
    ``block_k``: the tiles (``None`` for the naive count)."""

    q_read: int
    k_read: int
    v_read: int
    o_write: int
    s_write: int
    s_read: int
    p_write: int
    p_read: int
    score_elements: int
    softmax_ops: int
    head_dim: int
    elem_bytes: int
    block_q: int | None = None
    block_k: int | None = None

    @property
    def elements(self) -> int:
        """Every element moved between slow and fast memory."""
        return (self.q_read + self.k_read + self.v_read + self.o_write
                + self.s_write + self.s_read + self.p_write + self.p_read)

    @property
    def hbm_bytes(self) -> int:
        return self.elements * self.elem_bytes

    @property
    def matmul_flops(self) -> int:
        """``Q K^T`` and ``P V``: 2 FLOPs per multiply-add, ``d`` of each per score."""
        return 4 * self.score_elements * self.head_dim

    @property
    def flops(self) -> int:
        return self.matmul_flops + self.softmax_ops

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.hbm_bytes


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} debe ser un entero >= 1; se recibió {value!r}")
    return value


def _queries(n: int, n_queries: int | None) -> int:
    n_q = n if n_queries is None else _positive_int("n_queries", n_queries)
    if n_q > n:
        raise ValueError(f"n_queries ({n_q}) no puede superar el número de claves n ({n})")
    return n_q


def naive_io(n: int, d: int, elem_bytes: int = 2, *, n_queries: int | None = None) -> AttentionIO:
    """Standard attention for one head: ``n_q`` queries against ``n`` keys of dimension ``d``.

    S and P (``n_q x n`` each) go to slow memory and back: with ``n_q = n`` the total is
    ``4 n d + 4 n^2`` elements, Theta(N d + N^2), independent of the fast memory's size. A causal
    mask changes nothing here: the whole matrix is written and then masked.
    """
    n, d = _positive_int("n", n), _positive_int("d", d)
    elem_bytes = _positive_int("elem_bytes", elem_bytes)
    n_q = _queries(n, n_queries)
    scores = n_q * n
    return AttentionIO(q_read=n_q * d, k_read=n * d, v_read=n * d, o_write=n_q * d,
                       s_write=scores, s_read=scores, p_write=scores, p_read=scores,
                       score_elements=scores, softmax_ops=NAIVE_SOFTMAX_OPS * scores,
                       head_dim=d, elem_bytes=elem_bytes)


def flash_io(n: int, d: int, block_q: int, block_k: int, elem_bytes: int = 2, *,
             causal: bool = False, n_queries: int | None = None) -> AttentionIO:
    """What ``model.flash.flash_attention`` moves for one head, tile by tile (exact counts).

    For each of the ``ceil(n_q / block_q)`` query tiles: its rows of Q read once, every key tile
    it visits read (K and V, ``block_k`` rows each, the last one shorter), its rows of O written
    once. Non-causal, every query tile visits all ``n`` keys. Causal, query ``i`` sits at position
    ``n - n_q + i`` and a key tile starting after the tile's last position is not visited.
    """
    n, d = _positive_int("n", n), _positive_int("d", d)
    block_q, block_k = _positive_int("block_q", block_q), _positive_int("block_k", block_k)
    elem_bytes = _positive_int("elem_bytes", elem_bytes)
    n_q = _queries(n, n_queries)
    if not causal:
        keys_read, scores, tile_rows = -(-n_q // block_q) * n, n_q * n, n_q * -(-n // block_k)
    else:
        keys_read = scores = tile_rows = 0            # tile_rows: (query row, key tile) pairs
    for r0 in range(0, n_q if causal else 0, block_q):
        rows = min(block_q, n_q - r0)
        last_visible = n - n_q + r0 + rows - 1 if causal else n - 1
        visible_keys = min(n, (last_visible // block_k + 1) * block_k)   # whole tiles visited
        keys_read += visible_keys
        scores += rows * visible_keys
        tile_rows += rows * -(-visible_keys // block_k)
    # Per tile and row: exp of the rescale factor, l * alpha, o * alpha (d); once per output: o / l.
    softmax = TILED_SOFTMAX_OPS * scores + tile_rows * (2 + d) + n_q * d
    return AttentionIO(q_read=n_q * d, k_read=keys_read * d, v_read=keys_read * d, o_write=n_q * d,
                       s_write=0, s_read=0, p_write=0, p_read=0, score_elements=scores,
                       softmax_ops=softmax, head_dim=d, elem_bytes=elem_bytes,
                       block_q=block_q, block_k=block_k)


def working_set_bytes(block_q: int, block_k: int, d: int, elem_bytes: int = 2,
                      acc_bytes: int = 4) -> int:
    """Fast memory one step of the loop holds: the Q tile and the K and V tiles (``elem_bytes``
    each), and in ``acc_bytes`` (float32) the output accumulator (``block_q x d``), the scores /
    probabilities of the tile (``block_q x block_k``) and the running max and sum (``block_q``)."""
    block_q, block_k = _positive_int("block_q", block_q), _positive_int("block_k", block_k)
    d = _positive_int("d", d)
    return (elem_bytes * (block_q * d + 2 * block_k * d)
            + acc_bytes * (block_q * d + block_q * block_k + 2 * block_q))


def tile_candidates(n: int) -> list[int]:
    """Powers of two from 1 up to the first one >= ``n`` (a larger tile changes nothing)."""
    n = _positive_int("n", n)
    return [2 ** i for i in range(math.ceil(math.log2(n)) + 1)]


def best_tiles(n: int, d: int, fast_memory_bytes: int, elem_bytes: int = 2, *,
               causal: bool = False, n_queries: int | None = None,
               acc_bytes: int = 4) -> tuple[int, int]:
    """``(block_q, block_k)``, powers of two, whose ``working_set_bytes`` fits
    ``fast_memory_bytes`` and that move the fewest bytes in ``flash_io``; among equals, the larger
    ``block_k`` and then the larger ``block_q`` (fewer, bigger tiles). Non-causal traffic depends
    on ``block_q`` only, so the winner is the largest query tile that fits."""
    fast_memory_bytes = _positive_int("fast_memory_bytes", fast_memory_bytes)
    best = None
    for bq in tile_candidates(n):
        for bk in tile_candidates(n):
            if working_set_bytes(bq, bk, d, elem_bytes, acc_bytes) > fast_memory_bytes:
                continue
            cost = flash_io(n, d, bq, bk, elem_bytes, causal=causal, n_queries=n_queries).hbm_bytes
            key = (cost, -bk, -bq)
            if best is None or key < best[0]:
                best = (key, (bq, bk))
    if best is None:
        raise ValueError(f"ningún bloque cabe en {fast_memory_bytes} bytes de memoria rápida con d = {d}: "
                         f"hacen falta al menos {working_set_bytes(1, 1, d, elem_bytes, acc_bytes)}")
    return best[1]


def flash_io_for_memory(n: int, d: int, fast_memory_bytes: int, elem_bytes: int = 2, *,
                        causal: bool = False, n_queries: int | None = None) -> AttentionIO:
    """``flash_io`` with the tiles ``best_tiles`` picks for a fast memory of that size."""
    bq, bk = best_tiles(n, d, fast_memory_bytes, elem_bytes, causal=causal, n_queries=n_queries)
    return flash_io(n, d, bq, bk, elem_bytes, causal=causal, n_queries=n_queries)


def theorem2_orders(n: int, d: int, fast_memory: float) -> dict[str, float]:
    """The orders of Dao et al. (2022), Theorem 2, without constants: ``naive = N d + N^2`` and
    ``flash = N^2 d^2 / M``, in elements when ``fast_memory`` (M) is in elements."""
    return {"naive": float(n * d + n * n), "flash": n * n * d * d / fast_memory}
