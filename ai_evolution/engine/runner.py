"""The model runner: executes one ``SchedulerOutput`` on the real model.

Every scheduled request contributes its new tokens to a single flat batch of ``N`` tokens, so the
linear layers (QKV, MLP, lm_head) run once over all of them: that is where batching pays, because
the weights are read once per step for everybody. Attention cannot be shared that way (each
request has its own past), so it is split per request, which is Orca's *selective batching*:

- decode tokens (one per request) attend in one batched call;
- each prefill attends causally over its own prompt (and its cached prefix, if any).

The KV cache is a ``BlockKVCache``: per layer, ``num_blocks`` blocks of ``block_size`` token
slots (``[num_blocks, Hkv, block_size, D]`` for K and for V). A request's block table says which
blocks hold its tokens: token ``p`` is written in the slot at block ``table[p // block_size]``,
offset ``p % block_size`` (the *slot mapping*), and read back by gathering the table's blocks in
order (PagedAttention's reference algorithm, in plain PyTorch). The contiguous layout is the case
of one block of ``max_model_len`` tokens per request (its row), read through views without any
copy.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import Tensor

from ..hardware import synchronize
from ..model.config import ModelConfig
from ..model.attention import (decode_attention, gather_blocks, kv_storage_nbytes, layer_views,
                               new_kv_storage, write_slots)
from ..model.decoder import Transformer
from ..model.kv_quant import check_kv_dtype
from ..model.linear_attention import LinearAttentionState, SlotState
from ..model.sampling import pick_tokens, token_probs
from .batch_invariant import DefaultKernels, InvariantAttention, check_device
from .graphs import GRAPH_BACKENDS, DecodeGraphs
from .step import ScheduledRequest, SchedulerOutput, StepResult


class BlockKVCache:
    """The engine's KV store, the same for every layout: per layer, K and V of ``num_blocks``
    blocks of ``block_size`` token slots, ``[L, num_blocks, Hkv, block_size, D]``. Which request
    owns which block is the scheduler's ``KVManager``'s business; the runner's attention writes
    and reads through the block tables it is given. ``layer(i)`` is what the decoder calls."""

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 kv_dtype: str | None = None) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks y block_size deben ser >= 1; se recibió {num_blocks}, {block_size}")
        check_kv_dtype(kv_dtype)
        self.num_blocks, self.block_size, self.kv_dtype = num_blocks, block_size, kv_dtype
        # attention layers only: a hybrid's linear layers keep a state per request instead
        shape = (config.num_attention_layers, num_blocks, config.num_kv_heads, block_size,
                 config.head_dim)
        self.k, self.v = new_kv_storage(shape, dtype, device, kv_dtype)

    def layer(self, i: int) -> tuple[Tensor, Tensor]:
        """Views ``(k, v)`` of layer ``i``, each ``[num_blocks, Hkv, block_size, D]`` (``Int8KV``
        views with ``kv_dtype="int8"``)."""
        return layer_views(self.k, self.v, i)

    @property
    def nbytes(self) -> int:
        return kv_storage_nbytes(self.k, self.v)


class ModelRunner:
    """Runs scheduled batches on ``model`` over a block cache; wall-clock timing.

    ``ModelRunner(model, num_blocks, block_size)``; for the contiguous layout of chapter 3 that is
    ``(model, max_num_seqs, max_model_len)``: one block per request. ``for_kv(model, kv)``
    sizes it from the scheduler's KV manager. ``kernels``: the kernel set of the forward pass
    (``DefaultKernels``, or ``BatchInvariantKernels`` for chapter 10's batch-invariant mode, which
    runs every step eagerly). ``on_logits(request_id, logits)``, when set, receives the float32
    logits each step computed for each sampling request (``[1 + k, V]``): how tests and chapter
    10's lab compare them bit for bit.

    A hybrid model (linear-attention layers) also gets ``state``: one fixed state per request
    slot, ``max_num_seqs`` slots (``engine.state_slots``), float32; eager steps only; and, with
    ``num_state_checkpoints``, ``checkpoints``: that many more states, where prefix caching keeps
    copies of a request's state at checkpoint boundaries (restored on a hit).
    """

    def __init__(self, model: Transformer, num_blocks: int, block_size: int,
                 kv_dtype: str | None = None, decode_graphs: str | None = None,
                 max_num_seqs: int = 1, max_model_len: int | None = None,
                 kernels: DefaultKernels | None = None, num_state_checkpoints: int = 0) -> None:
        param = next(model.parameters())
        self.model = model.eval()
        self.device, self.dtype = param.device, param.dtype
        self.kernels = DefaultKernels() if kernels is None else kernels
        self.on_logits = None
        if self.kernels.batch_invariant:
            check_device(self.device)
            if decode_graphs == "auto":
                decode_graphs = None  # graphs pad the batch: the mode runs every step eagerly
            elif decode_graphs is not None:
                raise ValueError(f"decode_graphs={decode_graphs!r} no es compatible con el modo "
                                 "invariante al lote (batch_invariant=True), que ejecuta cada paso "
                                 "sin grafos; use decode_graphs='auto' o None")
        if block_size > model.config.max_position_embeddings:
            raise ValueError(f"block_size={block_size} supera las "
                             f"{model.config.max_position_embeddings} posiciones del modelo "
                             "(max_position_embeddings)")
        hybrid = model.config.is_hybrid
        if hybrid and decode_graphs not in (None, "auto"):
            raise ValueError(f"decode_graphs={decode_graphs!r} no está disponible para un modelo "
                             "híbrido (sus capas lineales actualizan un estado por petición en "
                             "cada paso); use decode_graphs=None")
        if hybrid and self.kernels.batch_invariant:
            raise ValueError("el modo invariante al lote (batch_invariant=True) no cubre aún las "
                             "capas de atención lineal de un modelo híbrido")
        if decode_graphs == "auto":
            decode_graphs = "cuda" if self.device.type == "cuda" and not hybrid else None
        if decode_graphs not in (None, *GRAPH_BACKENDS):
            raise ValueError(f"decode_graphs={decode_graphs!r} no es válido; aceptados: 'auto', "
                             f"{', '.join(repr(b) for b in GRAPH_BACKENDS)} o None")
        self.block_size = block_size
        # With decode graphs, one block more: the scratch block the padding entries write into.
        self.cache = BlockKVCache(model.config, num_blocks + (decode_graphs is not None), block_size,
                                  dtype=self.dtype, device=self.device, kv_dtype=kv_dtype)
        self.graphs = None if decode_graphs is None else DecodeGraphs(
            model, self.cache, max_num_seqs, max_model_len or block_size, backend=decode_graphs)
        self.state = (LinearAttentionState(model.config, max_num_seqs, device=self.device)
                      if hybrid else None)
        self.checkpoints = (LinearAttentionState(model.config, num_state_checkpoints,
                                                 device=self.device)
                            if hybrid and num_state_checkpoints else None)
        self.generators: dict[str, torch.Generator] = {}  # request id -> its sampling generator
        self._t0 = time.perf_counter()

    @classmethod
    def for_kv(cls, model: Transformer, kv, kv_dtype: str | None = None, *,
               decode_graphs: str | None = None, max_num_seqs: int = 1,
               max_model_len: int | None = None,
               kernels: DefaultKernels | None = None) -> "ModelRunner":
        """Sized from the scheduler's KV manager. ``decode_graphs``: ``"auto"`` (CUDA graphs for
        pure decode steps on a GPU, none on the CPU), ``"cuda"``, ``"eager"`` (the graphs' static
        padded step without capture: how the CPU checks it) or None (eager steps only)."""
        return cls(model, kv.num_blocks, kv.block_size, kv_dtype, decode_graphs, max_num_seqs,
                   max_model_len or getattr(kv, "max_model_len", None), kernels,
                   getattr(kv, "num_state_checkpoints", 0))

    def check_kv(self, kv, max_model_len: int) -> None:
        """Refuse (Spanish ``ValueError``) a scheduler whose KV manager places tokens in a
        cache other than this runner's: another number of blocks or block size (another layout),
        or requests longer than the model's positions or the decode graphs' block tables."""
        num_blocks = self.cache.num_blocks - (self.graphs is not None)  # (the scratch block)
        if (kv.num_blocks, kv.block_size) != (num_blocks, self.block_size):
            raise ValueError(f"el ejecutor tiene una caché de {num_blocks} bloques de "
                             f"{self.block_size} tokens y el gestor de KV del planificador reparte "
                             f"{kv.num_blocks} bloques de {kv.block_size}: deben coincidir (cree el "
                             "ejecutor con ModelRunner.for_kv(modelo, kv), o use build_engine)")
        slots = getattr(kv, "num_state_slots", None)
        if self.state is not None and slots != self.state.batch_size:
            raise ValueError(f"el modelo es híbrido: el ejecutor guarda {self.state.batch_size} "
                             f"estados (max_num_seqs) y el gestor de KV reparte {slots} ranuras de "
                             "estado: deben coincidir (use build_engine, que envuelve el gestor en "
                             "un HybridKVManager)")
        rows = 0 if self.checkpoints is None else self.checkpoints.batch_size
        if self.state is not None and getattr(kv, "num_state_checkpoints", 0) != rows:
            raise ValueError(f"el ejecutor guarda {rows} puntos de control del estado y el gestor "
                             f"de KV reparte {kv.num_state_checkpoints}: deben coincidir (cree el "
                             "ejecutor con ModelRunner.for_kv(modelo, kv), o use build_engine)")
        limit = self.model.config.max_position_embeddings
        if self.graphs is not None:
            limit = min(limit, self.graphs.max_blocks * self.block_size)
        if max_model_len > limit:
            raise ValueError(f"el planificador admite peticiones de hasta {max_model_len} tokens "
                             f"(max_model_len) y el ejecutor solo puede con {limit}: cree el "
                             "ejecutor con el mismo max_model_len")

    # --- clock (the engine reads every timestamp from its executor) ------------------------------
    def now(self) -> float:
        return time.perf_counter() - self._t0

    def idle_until(self, t: float) -> None:
        """Nothing to run before ``t``: wait for it (online arrivals)."""
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)

    # --- one step ------------------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> StepResult:
        """Run the step's tokens. The result holds the sampled token of every request whose
        pending tokens the step completed (all of them, until chapter 5 splits prompts into
        chunks), or the exception its sampling raised; a request that verifies k draft tokens
        (greedy) gets the target's argmax at each of its last k + 1 positions."""
        for request_id in out.finished_req_ids:
            self.generators.pop(request_id, None)
        with self.kernels.active():
            if self.graphs is not None and self.graphs.covers(out):
                hidden = self.graphs.hidden_states(out)[None]              # [1, n, hidden]
                last = list(range(len(out.scheduled)))
            else:
                hidden, last = self._eager_hidden_states(out)
            samples = [(s, i) for s, i in zip(out.scheduled, last) if s.samples]
            if not samples:
                synchronize(self.device)
                return StepResult()
            # each sampling request's last 1 + k positions among the step's tokens
            positions = [p for s, i in samples for p in range(i - len(s.draft_token_ids), i + 1)]
            logits = self.model.logits(hidden[0, positions])              # [n, V]
            if logits is None:  # a tensor-parallel worker: rank 0 gathers the logits and samples
                return StepResult()
            logits = logits.float()
        best = logits.argmax(dim=-1).tolist()
        sampled: dict[str, tuple[int, ...]] = {}
        errors: dict[str, BaseException] = {}
        target_probs = {}
        end = 0
        for s, _ in samples:
            begin, end = end, end + 1 + len(s.draft_token_ids)
            if self.on_logits is not None:
                self.on_logits(s.request_id, logits[begin:end])
            p = s.sampling_params
            if p.greedy:
                sampled[s.request_id] = tuple(best[begin:end])
                continue
            try:  # one request's sampling can fail without failing the others'
                if s.draft_token_ids:  # verified by rejection sampling in the scheduler
                    target_probs[s.request_id] = token_probs(
                        logits[begin:end], p.temperature, p.top_k, p.top_p).cpu()
                    sampled[s.request_id] = ()
                    continue
                sampled[s.request_id] = (int(pick_tokens(logits[end - 1:end], p.temperature, p.top_k,
                                                         p.top_p, self._generator(s))[0]),)
            except Exception as err:  # noqa: BLE001 - reported as that request's error
                errors[s.request_id] = err
        return StepResult(sampled, errors, target_probs)

    def _eager_hidden_states(self, out: SchedulerOutput) -> tuple[Tensor, list[int]]:
        """Hidden states ``[1, N, hidden]`` of the step's ``N`` tokens (every request's, one
        after the other), and the index of each request's last token among them."""
        ids, pos, blocks, offsets, last = [], [], [], [], []
        bs = self.block_size
        for s in out.scheduled:
            ids += s.token_ids
            positions = range(s.start, s.context_len)
            pos += positions
            blocks += [s.block_ids[p // bs] for p in positions]   # the slot mapping
            offsets += [p % bs for p in positions]
            last.append(len(ids) - 1)
        dev = self.device
        ids_t = torch.tensor(ids, device=dev)[None]                        # [1, N]
        pos_t = torch.tensor(pos, device=dev)[None]                        # [1, N]
        blocks_t, offsets_t = torch.tensor(blocks, device=dev), torch.tensor(offsets, device=dev)
        if self.kernels.batch_invariant:
            attn = InvariantAttention(self.kernels, out, blocks_t, offsets_t, bs)
        else:
            attn = _SelectiveAttention(out, blocks_t, offsets_t, bs)
        return self.model.hidden_states(ids_t, pos_t, kv_cache=self.cache, attn_fn=attn,
                                        state=self._slot_state(out)), last

    def _slot_state(self, out: SchedulerOutput) -> SlotState | None:
        """A hybrid's states for this step: each request's tokens and slot; a request that
        starts at position 0 (new, or preempted and recomputing) starts from zeros, one that
        starts after a prefix hit from the checkpoint it restores. Every restore is done here,
        before any layer runs (a row restored in a step is never written in that step). The
        checkpoints the step saves ride along (``SlotState``)."""
        if self.state is None:
            return None
        segments, saves, n = [], [], 0
        for s in out.scheduled:
            if s.state_slot is None:
                raise ValueError(f"la petición {s.request_id} no tiene ranura de estado y el "
                                 "modelo es híbrido (el gestor de KV debe ser un HybridKVManager)")
            if (s.state_restore is not None or s.state_saves) and self.checkpoints is None:
                raise ValueError(f"la petición {s.request_id} usa puntos de control del estado y "
                                 "el ejecutor no tiene ninguno (créelo con ModelRunner.for_kv)")
            if s.state_restore is not None:
                self.state.conv[:, s.state_slot] = self.checkpoints.conv[:, s.state_restore]
                self.state.recurrent[:, s.state_slot] = self.checkpoints.recurrent[:, s.state_restore]
            elif s.start == 0:
                self.state.conv[:, s.state_slot] = 0
                self.state.recurrent[:, s.state_slot] = 0
            saves += [(n, tokens - s.start, row) for tokens, row in s.state_saves]
            segments.append((n, n + s.num_tokens, s.state_slot))
            n += s.num_tokens
        return SlotState(self.state, tuple(segments), self.checkpoints, tuple(saves))

    def _generator(self, s: ScheduledRequest) -> torch.Generator:
        """The request's sampling generator, created (and seeded) at its first sample and kept
        until it finishes (``SchedulerOutput.finished_req_ids``)."""
        g = self.generators.get(s.request_id)
        if g is None:
            g = self.generators[s.request_id] = torch.Generator(device=self.device)
            if s.sampling_params.seed is None:
                g.seed()
            else:
                g.manual_seed(s.sampling_params.seed)
        return g


class _SelectiveAttention:
    """``attn_fn`` for the flat batch: gathers and masks built once per step, reused by every layer."""

    def __init__(self, out: SchedulerOutput, block_of_token: Tensor, offset_of_token: Tensor,
                 block_size: int) -> None:
        self.block_of_token, self.offset_of_token = block_of_token, offset_of_token
        dev = block_of_token.device
        offs = _offsets(out)
        # prefills: (first flat index, last + 1, blocks to read (an int when one), start position)
        self.prefills = []
        for s, a in zip(out.scheduled, offs):
            if s.num_tokens > 1:
                n_blocks = -(-s.context_len // block_size)
                blocks = s.block_ids[:n_blocks]
                self.prefills.append((a, a + s.num_tokens, blocks[0] if n_blocks == 1 else
                                      torch.tensor(blocks, device=dev), s.start))
        self.masks = {}
        for a, b, _, p0 in self.prefills:
            if p0:  # the new tokens also see the p0 tokens already cached
                n = b - a
                key = torch.arange(p0 + n, device=dev)
                self.masks[a] = (key[None] <= (p0 + torch.arange(n, device=dev))[:, None])[None, None]
        decode = [(s, a) for s, a in zip(out.scheduled, offs) if s.num_tokens == 1]
        self.decode, self.dense = None, False
        if decode:
            starts, firsts = [s.start for s, _ in decode], [s.first_block for s, _ in decode]
            idx = torch.tensor([a for _, a in decode], device=dev)
            pos = torch.tensor(starts, device=dev)
            length = max(starts) + 1
            n_blocks = -(-length // block_size)
            first = torch.tensor(firsts, device=dev)
            lo, hi = min(firsts), max(firsts)
            if n_blocks == 1 and hi - lo + 1 <= 2 * len(decode):
                # Everybody's tokens sit in the first block (always, with the contiguous layout)
                # and those blocks are close together: read their range through a view; blocks
                # in the range that are not decoding get a dummy query that sees key 0 only,
                # dropped afterwards.
                entries = first - lo  # each decode's entry in the block range
                mask = torch.zeros(hi - lo + 1, 1, 1, length, dtype=torch.bool, device=dev)
                mask[..., 0] = True
                mask[entries, 0, 0] = torch.arange(length, device=dev)[None] <= pos[:, None]
                self.decode = (idx, entries, slice(lo, hi + 1), length, mask)
                # Every token of the step is a decode token and the entries are the range itself,
                # in order (always at batch 1): queries and outputs are views, nothing to scatter.
                self.dense = not self.prefills and firsts == list(range(lo, hi + 1))
            else:
                # Gather each request's blocks (padded with its first block) into [B, ...].
                table = torch.tensor([list(s.block_ids[:n_blocks]) +
                                      [s.block_ids[0]] * (n_blocks - len(s.block_ids[:n_blocks]))
                                      for s, _ in decode], device=dev)
                mask = (torch.arange(length, device=dev)[None] <= pos[:, None])[:, None, None]
                self.decode = (idx, torch.arange(len(decode), device=dev), table, length, mask)
                self.dense = not self.prefills

    def __call__(self, q: Tensor, k_new: Tensor, v_new: Tensor, k_cache: Tensor, v_cache: Tensor,
                 positions: Tensor) -> Tensor:
        # q [1, H, N, D]; k_new, v_new [1, Hkv, N, D]; caches [num_blocks, Hkv, block_size, D]
        write_slots(k_cache, v_cache, self.block_of_token, self.offset_of_token, k_new, v_new)
        if self.decode is not None:
            idx, entries, where, length, mask = self.decode
            if isinstance(where, slice):   # one block each: a view of the block range
                kd, vd = k_cache[where, :, :length], v_cache[where, :, :length]
            else:                          # paged: gather each request's blocks
                kd, vd = gather_blocks(k_cache, where, length), gather_blocks(v_cache, where, length)
            if self.dense:
                return decode_attention(q, kd, vd, mask)
        out = torch.empty_like(q)
        if self.decode is not None:
            qd = q.new_zeros(kd.shape[0], q.shape[1], 1, q.shape[3])
            qd[entries] = q[0, :, idx].transpose(0, 1)[:, :, None]
            od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, enable_gqa=True)
            out[0, :, idx] = od[entries][:, :, 0].transpose(0, 1)
        for a, b, blocks, p0 in self.prefills:
            length = p0 + b - a
            if isinstance(blocks, int):  # one block: a view
                kc, vc = k_cache[blocks:blocks + 1, :, :length], v_cache[blocks:blocks + 1, :, :length]
            else:
                kc = gather_blocks(k_cache, blocks, length)[None]
                vc = gather_blocks(v_cache, blocks, length)[None]
            if p0:
                o = F.scaled_dot_product_attention(q[:, :, a:b], kc, vc, attn_mask=self.masks[a],
                                                   enable_gqa=True)
            else:
                o = F.scaled_dot_product_attention(q[:, :, a:b], kc, vc, is_causal=True, enable_gqa=True)
            out[:, :, a:b] = o
        return out


def _offsets(out: SchedulerOutput) -> list[int]:
    """Index of each scheduled request's first token in the flat batch."""
    offs, n = [], 0
    for s in out.scheduled:
        offs.append(n)
        n += s.num_tokens
    return offs
