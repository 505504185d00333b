"""Batch-invariant kernels (chapter 10): one request's logits do not depend on the batch around it.

Floating-point addition is not associative, so a sum depends on the order of its terms; a kernel
picks that order from the *shapes* it is given, and in a serving engine the shapes are the batch's.
On this project's CPU (torch 2.13, measured in ``tests/test_batch_invariant.py``) a ``[M, K] @ W.T``
takes another path for one row (GEMV) than for several (GEMM) and row 0 of the result changes in
fp32 once ``M >= 2``; attention reads as many keys as the longest request of the step, and a
prefill attends with a kernel of its own while a decode attends with another. None of this is
randomness: the same batch gives the same bits every time; another batch gives other bits.

``BatchInvariantKernels`` gives every operation whose reduction order depends on the batch an
order that does not:

- **Linears** (``F.linear`` and the quantized matmuls): the rows go through the kernel in tiles of
  exactly ``tile_rows`` rows, the last tile padded with zeros, so the kernel always sees the same
  shape and each row is reduced the same way wherever it sits (measured: fixed tiles of 4 to 32
  rows are invariant here; one row at a time is too, and slower).
- **Attention**: each query is computed alone by the same algorithm whatever the step (prefill,
  chunked prefill, decode, prefix hit, speculative verification): scores as a reduction over the
  head dimension, keys padded to a multiple of a fixed split of ``split_keys`` keys; each split
  summed alone, the splits added one after another in order; padded keys weigh exactly 0, and
  ``x + 0 == x``, so the number of padded splits never changes a bit.
- **RMSNorm**: torch's CPU kernel reduces each row whole, in one thread: it is already invariant
  (measured); it is kept.
- **Sampling**: the runner samples each request alone from its own row with its own seeded
  generator, so it is already invariant once the logits are.

The kernels are a seam: the engine's config selects them (``EngineConfig.batch_invariant``), the
runner receives them, and ``linear=`` accepts another row-wise matmul (a student's, in chapter
10's lab) that the engine then runs for every linear layer.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from ..model.attention import gather_blocks, write_slots

TILE_ROWS = 8
"""Rows per linear tile. Measured on this CPU: tiles of 4, 8, 16 and 32 rows keep a row's bits
wherever it sits; 8 pads a single decode row to a shape the GEMM handles well."""

SPLIT_KEYS = 32
"""Keys per attention split (a fixed split size, as the split-KV kernels need to be invariant);
also a multiple of every vector width, so no element falls in a kernel's scalar tail."""

SUPPORTED_DEVICES = ("cpu", "cuda")

LinearFn = Callable[[Tensor, Tensor, Tensor | None], Tensor]
"""``linear(x [M, K], weight [N, K], bias [N] | None) -> [M, N]``: ``F.linear``'s contract."""


def tiled_rows(fn: Callable[..., Tensor], x: Tensor, *args, tile_rows: int = TILE_ROWS) -> Tensor:
    """``fn(x, *args)`` computed on tiles of exactly ``tile_rows`` rows of ``x`` (``[..., K]``),
    the last one padded with zero rows: the kernel sees one shape whatever the number of rows."""
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    pad = -m % tile_rows
    if pad:
        x2 = torch.cat((x2, x2.new_zeros(pad, k)))
    y = torch.cat([fn(x2[i:i + tile_rows], *args) for i in range(0, x2.shape[0], tile_rows)])
    return y[:m].reshape(*lead, y.shape[-1])


def whole_rows(fn: Callable[..., Tensor], x: Tensor, *args) -> Tensor:
    """``fn(x, *args)`` on ``x`` (``[..., K]``) flattened to ``[M, K]``: every row in one call."""
    lead, k = x.shape[:-1], x.shape[-1]
    y = fn(x.reshape(-1, k), *args)
    return y.reshape(*lead, y.shape[-1])


def tiled_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, *,
                 tile_rows: int = TILE_ROWS) -> Tensor:
    """``F.linear`` with a fixed number of rows per call (see ``tiled_rows``)."""
    return tiled_rows(F.linear, x, weight, bias, tile_rows=tile_rows)


def split_attention(q: Tensor, k: Tensor, v: Tensor, positions: Tensor,
                    split_keys: int = SPLIT_KEYS) -> Tensor:
    """Attention of each query over the keys at positions ``<=`` its own, batch-invariant.

    ``q`` ``[B, H, T, D]``, ``k``/``v`` ``[B, Hkv, L, D]`` (key ``l`` at position ``l``),
    ``positions`` ``[B, T]`` -> ``[B, H, T, D]`` in ``q``'s dtype. Computed in float32; a query's
    result depends only on its own query and keys: not on ``B``, ``T``, ``L`` nor on the others."""
    B, H, T, D = q.shape
    dtype = q.dtype
    Hkv, L = k.shape[1], k.shape[2]
    group = H // Hkv
    splits = max(1, -(-L // split_keys))
    Lp = splits * split_keys
    k = F.pad(k.float(), (0, 0, 0, Lp - L))[:, :, None, None]                # [B, Hkv, 1, 1, Lp, D]
    vt = F.pad(v.float(), (0, 0, 0, Lp - L)).transpose(-1, -2).reshape(
        B, Hkv, 1, 1, D, splits, split_keys)
    q = q.float().reshape(B, Hkv, group, T, D)   # query head h reads KV head h // group
    keep = torch.arange(Lp, device=q.device)[None, None] <= positions[..., None]  # [B, T, Lp]
    # Bounded memory: the queries are independent, so chunking them changes no bit.
    step = max(1, (1 << 22) // max(1, B * H * Lp * D))
    outs = []
    for t0 in range(0, T, step):
        qc = q[:, :, :, t0:t0 + step]                                       # [B, Hkv, g, t, D]
        scores = _row_sums(qc[..., None, :] * k) / math.sqrt(D)              # [B, Hkv, g, t, Lp]
        scores = scores.masked_fill(~keep[:, None, None, t0:t0 + step], float("-inf"))
        weights = (scores - scores.amax(-1, keepdim=True)).exp()            # max: exact
        w = weights.view(*weights.shape[:-1], splits, split_keys)           # [..., t, splits, S]
        num = _row_sums(w[..., None, :, :] * vt)                           # [..., t, D, splits]
        den = _row_sums(w)                                                   # [..., t, splits]
        total_num, total_den = num[..., 0], den[..., 0]
        for j in range(1, splits):  # the splits, one after another, in order
            total_num = total_num + num[..., j]
            total_den = total_den + den[..., j]
        outs.append((total_num / total_den[..., None]).reshape(B, H, -1, D))
    return torch.cat(outs, dim=2).to(dtype)


def _row_sums(x: Tensor) -> Tensor:
    """Sums over the last dimension, each row reduced alone in the same order. A broadcast
    product may come out with its last dimension not innermost in memory (torch lays the output
    out after its inputs' strides), and then the reduction would take another path whose order
    depends on the other dimensions: make it contiguous first."""
    return x.contiguous().sum(-1)


class _RowTiling(TorchFunctionMode):
    """While active, every row-wise matmul (``F.linear`` and the quantized weight kernels) runs
    on fixed tiles of rows. (Inside ``__torch_function__`` the mode is off, so the tiles call the
    plain kernel.)"""

    def __init__(self, linear: LinearFn, tile_rows: int) -> None:
        super().__init__()
        self.linear, self.tile_rows = linear, tile_rows
        self.quantized = {getattr(torch, n) for n in ("_weight_int8pack_mm", "_weight_int4pack_mm",
                                                       "_weight_int4pack_mm_for_cpu") if hasattr(torch, n)}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight, *rest = args
            bias = rest[0] if rest else kwargs.get("bias")
            if self.tile_rows is None:  # the linear gets every row at once: its own invariance
                return whole_rows(self.linear, x, weight, bias)
            return tiled_rows(self.linear, x, weight, bias, tile_rows=self.tile_rows)
        if func in self.quantized:
            return tiled_rows(func, args[0], *args[1:], tile_rows=self.tile_rows or TILE_ROWS)
        return func(*args, **kwargs)


class DefaultKernels:
    """The engine's usual kernels: the fastest shape for each step (batch-dependent bits)."""

    batch_invariant = False

    def active(self):
        """Context in which the model's forward pass runs: nothing to change."""
        return _Nothing()


class BatchInvariantKernels(DefaultKernels):
    """Kernels whose results for one row do not depend on the other rows (see the module).

    ``linear``: the row-wise matmul run on each tile (default ``F.linear``; a student's function
    with the same contract can stand in). ``tile_rows`` and ``split_keys`` are the fixed shapes;
    ``tile_rows=None`` hands ``linear`` every row of the step at once, so that the linear must be
    batch-invariant by itself (chapter 10's exercise: the engine then adds nothing)."""

    batch_invariant = True

    def __init__(self, linear: LinearFn | None = None, tile_rows: int = TILE_ROWS,
                 split_keys: int = SPLIT_KEYS) -> None:
        for name, value in (("tile_rows", tile_rows), ("split_keys", split_keys)):
            if name == "tile_rows" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} debe ser un entero >= 1"
                                 f"{' o None' if name == 'tile_rows' else ''}; se recibió {value!r}")
        if linear is not None and not callable(linear):
            raise ValueError("linear debe ser una función linear(x, weight, bias) -> y; se "
                             f"recibió {type(linear).__name__}")
        self.linear = linear or F.linear
        self.tile_rows, self.split_keys = tile_rows, split_keys

    def active(self):
        return _RowTiling(self.linear, self.tile_rows)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, positions: Tensor) -> Tensor:
        return split_attention(q, k, v, positions, self.split_keys)


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def check_device(device: torch.device | str) -> None:
    """Refuse (Spanish ``ValueError``) a device this mode has not been made for."""
    kind = torch.device(device).type
    if kind not in SUPPORTED_DEVICES:
        raise ValueError(f"el modo invariante al lote (batch_invariant=True) no está disponible en "
                         f"el dispositivo {kind!r}; dispositivos aceptados: "
                         f"{', '.join(SUPPORTED_DEVICES)}")


class InvariantAttention:
    """``attn_fn`` of a step in batch-invariant mode: writes the step's K/V into the block cache
    and attends each request's queries over its own blocks with ``kernels.attention``. Decodes
    share one call (their keys padded to the longest: padding weighs exactly 0), each prefill or
    chunk has its own; the result of a query is the same either way."""

    def __init__(self, kernels: BatchInvariantKernels, out, block_of_token: Tensor,
                 offset_of_token: Tensor, block_size: int) -> None:
        self.kernels, self.block_size = kernels, block_size
        self.block_of_token, self.offset_of_token = block_of_token, offset_of_token
        dev = block_of_token.device
        self.decode, self.prefills = None, []
        decodes, n = [], 0
        for s in out.scheduled:
            blocks = torch.tensor(s.block_ids[:-(-s.context_len // block_size)], device=dev)
            if s.num_tokens == 1:
                decodes.append((n, s, blocks))
            else:
                positions = torch.arange(s.start, s.context_len, device=dev)[None]
                self.prefills.append((n, n + s.num_tokens, blocks, s.context_len, positions))
            n += s.num_tokens
        if decodes:
            longest = max(len(b) for _, _, b in decodes)
            table = torch.stack([torch.cat((b, b[:1].expand(longest - len(b)))) for _, _, b in decodes])
            idx = torch.tensor([a for a, _, _ in decodes], device=dev)
            positions = torch.tensor([[s.start] for _, s, _ in decodes], device=dev)
            # the longest context of the step, not whole blocks (a contiguous row is one block)
            self.decode = (idx, table, max(s.context_len for _, s, _ in decodes), positions)

    def __call__(self, q: Tensor, k_new: Tensor, v_new: Tensor, k_cache: Tensor, v_cache: Tensor,
                 positions: Tensor) -> Tensor:
        write_slots(k_cache, v_cache, self.block_of_token, self.offset_of_token, k_new, v_new)
        out = torch.empty_like(q)
        if self.decode is not None:
            idx, table, length, pos = self.decode
            kd, vd = gather_blocks(k_cache, table, length), gather_blocks(v_cache, table, length)
            qd = q[0, :, idx].transpose(0, 1)[:, :, None]                   # [n, H, 1, D]
            od = self.kernels.attention(qd, kd, vd, pos)
            out[0, :, idx] = od[:, :, 0].transpose(0, 1)
        for a, b, blocks, length, pos in self.prefills:
            kc = gather_blocks(k_cache, blocks, length)[None]
            vc = gather_blocks(v_cache, blocks, length)[None]
            out[:, :, a:b] = self.kernels.attention(q[:, :, a:b], kc, vc, pos)
        return out


def generate_with_logits(llm, prompts, sampling_params=None) -> list[tuple[list[int], Tensor]]:
    """``llm.generate(prompts, sampling_params)`` (an ``LLM`` on the real runner), keeping what
    each request's steps computed: per prompt, ``(token ids, float32 logits [n, V])``, the rows
    its tokens were chosen from (one per step; ``1 + k`` per step with ``k`` draft tokens)."""
    runner = llm.engine.executor
    kept: dict[str, list[Tensor]] = {}
    runner.on_logits = lambda request_id, logits: kept.setdefault(request_id, []).append(logits.clone())
    try:
        outs = llm.generate(prompts, sampling_params)
    finally:
        runner.on_logits = None
    return [(list(o.token_ids), torch.cat(kept[o.request_id]) if o.request_id in kept else
             torch.empty(0)) for o in outs]


__all__ = ["BatchInvariantKernels", "DefaultKernels", "InvariantAttention", "LinearFn",
           "SPLIT_KEYS", "SUPPORTED_DEVICES", "TILE_ROWS", "check_device", "generate_with_logits", "split_attention",
           "tiled_linear", "tiled_rows", "whole_rows"]
