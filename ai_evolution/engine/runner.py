"""The model runner: executes one ``SchedulerOutput`` on the real model.

Every scheduled request contributes its new tokens to a single flat row of ``N`` tokens, so the
linear layers (QKV, MLP, lm_head) run once over all of them: that is where batching pays, because
the weights are read once per step for everybody. Attention cannot be shared that way (each
request has its own past), so it is split per request, which is Orca's *selective batching*:

- decode tokens (one per request) attend in one batched call over the KV rows they occupy;
- each prefill attends causally over its own prompt.

The K/V of the new tokens are written into the request's row of a ``ContiguousKVCache`` whose
batch dimension is the engine's slots.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import Tensor

from ..generation import pick_tokens
from ..hardware import synchronize
from ..model.attention import ContiguousKVCache
from ..model.decoder import Transformer
from .scheduler import SchedulerOutput


class ModelRunner:
    """Runs scheduled batches on ``model`` with a contiguous slot cache; wall-clock timing."""

    def __init__(self, model: Transformer, num_slots: int, max_model_len: int) -> None:
        param = next(model.parameters())
        self.model = model.eval()
        self.device, self.dtype = param.device, param.dtype
        if max_model_len > model.config.max_position_embeddings:
            raise ValueError(f"max_model_len={max_model_len} exceeds the model's "
                             f"max_position_embeddings={model.config.max_position_embeddings}")
        self.cache = ContiguousKVCache(model.config, num_slots, max_model_len,
                                       dtype=self.dtype, device=self.device)
        self._layers = _SlotLayers(self.cache)
        self._t0 = time.perf_counter()

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
    def execute(self, out: SchedulerOutput) -> dict[str, int]:
        """Run the step's tokens; return the sampled token of every request that completed its
        pending tokens (all of them, until chapter 5 splits prompts into chunks)."""
        ids, pos, slots, last = [], [], [], []
        for s in out.scheduled:
            ids += s.token_ids
            pos += range(s.start, s.context_len)
            slots += [s.slot] * s.num_tokens
            last.append(len(ids) - 1)
        dev = self.device
        ids_t = torch.tensor(ids, device=dev)[None]                        # [1, N]
        pos_t = torch.tensor(pos, device=dev)[None]                        # [1, N]
        attn = _SelectiveAttention(out, torch.tensor(slots, device=dev), pos_t[0])
        hidden = self.model.hidden_states(ids_t, pos_t, kv_cache=self._layers, attn_fn=attn)
        samples = [s for s, i in zip(out.scheduled, last) if s.context_len == s.request.num_tokens]
        rows = [i for s, i in zip(out.scheduled, last) if s.context_len == s.request.num_tokens]
        if not samples:
            synchronize(self.device)
            return {}
        logits = self.model.logits(hidden[0, rows]).float()               # [n, V]
        tokens = logits.argmax(dim=-1)
        for j, s in enumerate(samples):
            p = s.request.sampling_params
            if p.temperature > 0:
                tokens[j] = pick_tokens(logits[j:j + 1], p.temperature, p.top_k, p.top_p,
                                        self._generator(s.request))[0]
        return {s.request_id: t for s, t in zip(samples, tokens.tolist())}

    def _generator(self, request) -> torch.Generator:
        if request.generator is None:
            g = torch.Generator(device=self.device)
            if request.sampling_params.seed is None:
                g.seed()
            else:
                g.manual_seed(request.sampling_params.seed)
            request.generator = g
        return request.generator


class _SlotLayers:
    """The slot cache as the decoder sees it: ``layer(i)`` gives every slot's K/V of layer i
    (the flat row has batch 1, so the decoder must not compare batch sizes)."""

    def __init__(self, cache: ContiguousKVCache) -> None:
        self.layer = cache.layer


class _SelectiveAttention:
    """``attn_fn`` for the flat row: masks built once per step, reused by every layer."""

    def __init__(self, out: SchedulerOutput, slot_of_token: Tensor, pos_of_token: Tensor) -> None:
        self.slot_of_token, self.pos_of_token = slot_of_token, pos_of_token
        dev = pos_of_token.device
        decode = [(s.slot, s.start, i) for s, i in zip(out.scheduled, _offsets(out)) if s.num_tokens == 1]
        self.prefills = [(s.slot, a, a + s.num_tokens, s.start)
                         for s, a in zip(out.scheduled, _offsets(out)) if s.num_tokens > 1]
        self.masks = {}
        for slot, a, b, p0 in self.prefills:
            if p0:  # the chunk also sees the p0 tokens already cached
                n = b - a
                key = torch.arange(p0 + n, device=dev)
                self.masks[a] = (key[None] <= (p0 + torch.arange(n, device=dev))[:, None])[None, None]
        self.decode = None
        if decode:
            slot_d = torch.tensor([d[0] for d in decode], device=dev)
            pos_d = torch.tensor([d[1] for d in decode], device=dev)
            lo, hi = int(slot_d.min()), int(slot_d.max())
            length = int(pos_d.max()) + 1
            # Rows lo..hi of the cache are read in one call; rows that are not decoding this step
            # get a dummy query that sees key 0 only, and their output is dropped.
            mask = torch.zeros(hi - lo + 1, 1, 1, length, dtype=torch.bool, device=dev)
            mask[..., 0] = True
            mask[slot_d - lo, 0, 0] = torch.arange(length, device=dev)[None] <= pos_d[:, None]
            self.decode = (torch.tensor([d[2] for d in decode], device=dev), slot_d - lo, lo, hi, length, mask)

    def __call__(self, q: Tensor, k_new: Tensor, v_new: Tensor, k_cache: Tensor, v_cache: Tensor,
                 positions: Tensor) -> Tensor:
        # q [1, H, N, D]; k_new, v_new [1, Hkv, N, D]; caches [slots, Hkv, S, D]
        k_cache[self.slot_of_token, :, self.pos_of_token] = k_new[0].transpose(0, 1).to(k_cache.dtype)
        v_cache[self.slot_of_token, :, self.pos_of_token] = v_new[0].transpose(0, 1).to(v_cache.dtype)
        out = torch.empty_like(q)
        if self.decode is not None:
            idx, rows, lo, hi, length, mask = self.decode
            qd = q.new_zeros(hi - lo + 1, q.shape[1], 1, q.shape[3])
            qd[rows] = q[0, :, idx].transpose(0, 1)[:, :, None]
            od = F.scaled_dot_product_attention(qd, k_cache[lo:hi + 1, :, :length],
                                                v_cache[lo:hi + 1, :, :length], attn_mask=mask,
                                                enable_gqa=True)          # [rows, H, 1, D]
            out[0, :, idx] = od[rows][:, :, 0].transpose(0, 1)
        for slot, a, b, p0 in self.prefills:
            length = p0 + b - a
            kc, vc = k_cache[slot:slot + 1, :, :length], v_cache[slot:slot + 1, :, :length]
            if p0:
                o = F.scaled_dot_product_attention(q[:, :, a:b], kc, vc, attn_mask=self.masks[a],
                                                   enable_gqa=True)
            else:
                o = F.scaled_dot_product_attention(q[:, :, a:b], kc, vc, is_causal=True, enable_gqa=True)
            out[:, :, a:b] = o
        return out


def _offsets(out: SchedulerOutput) -> list[int]:
    """Index of each scheduled request's first token in the flat row."""
    offs, n = [], 0
    for s in out.scheduled:
        offs.append(n)
        n += s.num_tokens
    return offs
