"""Decode steps through static buffers, captured as CUDA graphs (as vLLM and nano-vllm do).

On a GPU a small model's decode step is a few hundred short kernels, and launching them from
Python costs more than running them: the step is bound by launches, not by memory, and a batching
curve measured that way is flat for the wrong reason. A CUDA graph records the step's kernels once
and replays them with one launch. A graph replays fixed shapes on fixed memory, so the decode step
is rewritten for that:

- the batch is padded to the next captured size (1, 2, 4, 8, 16, 24, 32, ... up to the cap);
- inputs are copied into static buffers (token ids, positions, slot mapping, block tables);
- attention reads each request's whole block table (``max_model_len`` tokens) and masks the keys
  past its position, instead of cutting at the longest request of the step (a shape that changes);
- padding entries write their K/V into a scratch block that no request owns, and attend to it.

Prefill, chunked and speculative steps stay eager (their shapes vary with the prompts). The same
static step runs without capture with ``backend="eager"``: that is how the CPU checks the padding,
the scratch block and the masks against the eager runner, since CUDA graphs need a GPU.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from ..model.attention import decode_attention, gather_blocks, write_slots

GRAPH_BACKENDS = ("cuda", "eager")
MAX_GRAPH_BATCH = 32
"""Largest captured batch: above it a step reads enough weights and KV that launches matter
little, and reading whole block tables (see the module docstring) would cost more than it saves."""


def graph_batch_sizes(max_batch: int) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, 8, then every 8 up to ``max_batch`` (which is included)."""
    if max_batch < 1:
        raise ValueError(f"max_batch debe ser >= 1; se recibió {max_batch}")
    sizes = {b for b in (1, 2, 4) if b < max_batch} | set(range(8, max_batch, 8)) | {max_batch}
    return sorted(sizes)


class DecodeGraphs:
    """Pure decode steps of up to ``max_batch`` requests, run on static buffers at a padded batch
    size. ``backend="cuda"``: every size is captured as a CUDA graph when the engine starts
    (``capture_all``) and replayed after; ``"eager"``: the same static step, run without capture
    (for the CPU).

    ``cache`` must have one block more than the KV manager hands out: the last one is the scratch
    block of the padding entries.
    """

    def __init__(self, model, cache, max_batch: int, max_model_len: int, backend: str = "cuda") -> None:
        if backend not in GRAPH_BACKENDS:
            raise ValueError(f"backend {backend!r} desconocido; aceptados: {', '.join(GRAPH_BACKENDS)}")
        param = next(model.parameters())
        if backend == "cuda" and param.device.type != "cuda":
            raise ValueError("los grafos CUDA necesitan el modelo en una GPU; el modelo está en "
                             f"{param.device}. Use backend='eager' o desactívelos")
        self.model, self.cache, self.backend = model, cache, backend
        self.sizes = graph_batch_sizes(min(max_batch, MAX_GRAPH_BATCH))
        self.block_size = cache.block_size
        self.max_blocks = -(-max_model_len // cache.block_size)
        self.scratch = cache.num_blocks - 1
        dev, n = param.device, self.sizes[-1]
        long = dict(dtype=torch.long, device=dev)
        self.ids = torch.zeros(1, n, **long)
        self.pos = torch.zeros(1, n, **long)
        self.block = torch.full((n,), self.scratch, **long)      # slot mapping: block ...
        self.offset = torch.zeros(n, **long)                        # ... and offset of each token
        self.tables = torch.full((n, self.max_blocks), self.scratch, **long)
        model.model.rotary_emb.reserve(max_model_len, dev)         # no table growth inside a graph
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self.pool = None
        self.steps = 0  # decode steps run through the static buffers
        self.disabled: str | None = None  # why capture failed (the engine then runs eager)
        if backend == "cuda":
            self.capture_all()

    def capture_all(self) -> None:
        """Capture every size now, on dummy entries (token 0 at position 0 in the scratch block), as
        vLLM and nano-vllm do when the engine starts: no step that is being timed pays for a
        capture. Largest first, so the smaller graphs reuse the pool's memory."""
        try:
            for size in reversed(self.sizes):
                self._capture(size)
        except Exception as err:  # noqa: BLE001 - a capture bug must not stop the serving
            self._disable(err)

    def _disable(self, err: Exception) -> None:
        self.disabled = f"{type(err).__name__}: {err}"
        warnings.warn("no se pudo capturar el paso de decodificación como grafo CUDA "
                      f"({self.disabled}); el motor sigue sin grafos (más lento, mismos tokens)",
                      RuntimeWarning, stacklevel=3)

    def covers(self, out) -> bool:
        """Whether the step is a pure decode step these buffers can take."""
        return (self.disabled is None and 0 < len(out.scheduled) <= self.sizes[-1]
                and all(s.num_tokens == 1 and not s.draft_token_ids for s in out.scheduled))

    def hidden_states(self, out) -> Tensor:
        """Final hidden states ``[n, hidden]`` of the step's ``n`` decode tokens, in order."""
        n = len(out.scheduled)
        size = next(b for b in self.sizes if b >= n)
        bs = self.block_size
        ids, pos, block, offset, tables = [], [], [], [], []
        for s in out.scheduled:
            ids.append(s.token_ids[0])
            pos.append(s.start)
            block.append(s.block_ids[s.start // bs])
            offset.append(s.start % bs)
            table = list(s.block_ids[:self.max_blocks])
            tables.append(table + [self.scratch] * (self.max_blocks - len(table)))
        dev = self.ids.device
        self.ids.zero_()
        self.pos.zero_()
        self.block.fill_(self.scratch)
        self.offset.zero_()
        self.tables.fill_(self.scratch)
        self.ids[0, :n] = torch.tensor(ids, device=dev)
        self.pos[0, :n] = torch.tensor(pos, device=dev)
        self.block[:n] = torch.tensor(block, device=dev)
        self.offset[:n] = torch.tensor(offset, device=dev)
        self.tables[:n] = torch.tensor(tables, device=dev)
        self.steps += 1
        if self.backend == "eager":
            return self._forward(size)[0, :n]
        graph, hidden = self.graphs[size]  # every size was captured when the engine started
        graph.replay()
        return hidden[0, :n]

    def _forward(self, size: int) -> Tensor:
        attn = _StaticDecodeAttention(self.block[:size], self.offset[:size], self.tables[:size],
                                      self.pos[0, :size], self.max_blocks * self.block_size)
        return self.model.hidden_states(self.ids[:, :size], self.pos[:, :size], kv_cache=self.cache,
                                        attn_fn=attn)

    def _capture(self, size: int) -> None:
        # One eager run first (on the dummy entries: it writes only the scratch block), so that
        # lazy initialisations happen outside the capture.
        self._forward(size)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            hidden = self._forward(size)
        if self.pool is None:
            self.pool = graph.pool()  # every size shares one memory pool
        self.graphs[size] = (graph, hidden)


class _StaticDecodeAttention:
    """``attn_fn`` of the static decode step: one token per entry, every entry reading its whole block
    table (``length`` keys) with the keys past its position masked. Shapes never depend on the
    values in the buffers."""

    def __init__(self, block: Tensor, offset: Tensor, tables: Tensor, pos: Tensor, length: int) -> None:
        self.block, self.offset, self.tables, self.length = block, offset, tables, length
        self.mask = (torch.arange(length, device=pos.device)[None] <= pos[:, None])[:, None, None]

    def __call__(self, q: Tensor, k_new: Tensor, v_new: Tensor, k_cache: Tensor, v_cache: Tensor,
                 positions: Tensor) -> Tensor:
        # q [1, H, B, D]; k_new, v_new [1, Hkv, B, D]; caches [num_blocks, Hkv, block_size, D]
        write_slots(k_cache, v_cache, self.block, self.offset, k_new, v_new)
        return decode_attention(q, gather_blocks(k_cache, self.tables, self.length),
                                gather_blocks(v_cache, self.tables, self.length), self.mask)
