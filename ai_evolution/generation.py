"""Autoregressive generation: greedy or sampled, with or without a KV cache.

``cache=None`` recomputes the whole sequence at every step (T steps cost O(T^2) tokens of work);
``cache="contiguous"`` runs the prompt once (prefill) and then one token per row per step
(decode), reading the past from a ``ContiguousKVCache``. Both give the same greedy tokens.
"""

from __future__ import annotations

import numbers
from typing import Callable, Iterable, Sequence

import torch
from torch import Tensor

from .model.attention import AttentionFn, ContiguousKVCache
from .model.linear_attention import LinearAttentionState
from .model.decoder import Transformer
from .model.kv_quant import check_kv_dtype
from .model.sampling import pick_tokens

CACHE_KINDS = (None, "contiguous")


def generate(model: Transformer, prompt_ids: Sequence[int] | Sequence[Sequence[int]],
             max_new_tokens: int, *, cache: str | None = "contiguous", temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
             eos_token_id: int | Iterable[int] | None = None, attn_fn: AttentionFn | None = None,
             on_token: Callable[[int, list[int | None]], None] | None = None,
             kv_dtype: str | None = None) -> list[list[int]]:
    """Generate up to ``max_new_tokens`` tokens after each prompt; return the new tokens only.

    ``prompt_ids`` is one prompt (``list[int]``) or a batch (``list[list[int]]``, lengths may
    differ); the result always has one list per prompt. ``temperature == 0`` is greedy; otherwise
    tokens are sampled from ``softmax(logits / temperature)`` restricted to the ``top_k`` most
    likely tokens and to the smallest set whose probability reaches ``top_p``, with a generator
    seeded by ``seed`` (same seed, same tokens). A row that produces ``eos_token_id`` keeps it
    and stops; the others go on. ``attn_fn`` replaces ``cached_attention`` inside the model
    (needs a cache). ``on_token(step, tokens)`` is called after every step with the token of
    each row (``None`` for rows that had already stopped). ``kv_dtype="int8"`` keeps the cache
    in int8 with a scale per token and head (chapter 7).
    """
    config = model.config
    prompts = _check_prompts(prompt_ids, config.vocab_size)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens debe ser un entero >= 1; se recibió {max_new_tokens!r}")
    if cache not in CACHE_KINDS:
        raise ValueError(f"cache={cache!r} no está soportado; aceptados: {', '.join(map(repr, CACHE_KINDS))}")
    check_kv_dtype(kv_dtype)
    if cache is None and kv_dtype is not None:
        raise ValueError("kv_dtype elige cómo se guarda la caché KV, así que necesita "
                         "cache='contiguous'; se recibió cache=None")
    if cache is None and attn_fn is not None:
        raise ValueError("attn_fn sustituye el paso de atención con caché, así que necesita "
                         "cache='contiguous'; se recibió cache=None")
    if not temperature >= 0 or temperature == float("inf"):
        raise ValueError(f"temperature debe ser un número finito >= 0 (0 = voraz); se recibió {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k debe ser un entero >= 1 o None; se recibió {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p debe estar en (0, 1] o ser None; se recibió {top_p!r}")
    eos = _check_eos(eos_token_id, config.vocab_size)

    param = next(model.parameters())
    generator = None
    if temperature > 0:
        generator = torch.Generator(device=param.device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)

    with torch.inference_mode():
        if cache is None:
            next_logits = _uncached_stepper(model, prompts)
        else:
            kv = ContiguousKVCache(config, len(prompts), max(map(len, prompts)) + max_new_tokens,
                                   dtype=param.dtype, device=param.device, kv_dtype=kv_dtype)
            if config.is_hybrid and kv_dtype is not None:
                raise ValueError("kv_dtype no está disponible aún con un modelo híbrido en "
                                 "generate; use kv_dtype=None")
            next_logits = _cached_stepper(model, prompts, kv, attn_fn)
        out: list[list[int]] = [[] for _ in prompts]
        done = [False] * len(prompts)
        tokens = None
        for step in range(max_new_tokens):
            logits = next_logits(tokens)                                   # [B, V]
            tokens = pick_tokens(logits.float(), temperature, top_k, top_p, generator).tolist()
            reported: list[int | None] = []
            for i, t in enumerate(tokens):
                if done[i]:
                    reported.append(None)
                    continue
                out[i].append(t)
                reported.append(t)
                done[i] = t in eos
            if on_token is not None:
                on_token(step, reported)
            if all(done):
                break
    return out


def _check_prompts(prompt_ids, vocab_size: int) -> list[list[int]]:
    if isinstance(prompt_ids, Tensor):
        prompt_ids = prompt_ids.tolist()
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids está vacío: hace falta al menos un token")
    batch = [prompt_ids] if not isinstance(prompt_ids[0], (list, tuple, Tensor)) else prompt_ids
    prompts = []
    for i, p in enumerate(batch):
        p = p.tolist() if isinstance(p, Tensor) else list(p)
        if not p:
            raise ValueError(f"prompt_ids[{i}] está vacío: cada prompt necesita al menos un token")
        for j, t in enumerate(p):
            if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < vocab_size:
                raise ValueError(f"prompt_ids[{i}][{j}]={t!r} no es un id de token del vocabulario "
                                 f"(aceptados: enteros 0..{vocab_size - 1})")
        prompts.append([int(t) for t in p])
    return prompts


def _check_eos(eos_token_id, vocab_size: int) -> set[int]:
    if eos_token_id is None:
        return set()
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    for t in ids:
        if not 0 <= t < vocab_size:
            raise ValueError(f"eos_token_id={t!r} está fuera del vocabulario (0..{vocab_size - 1})")
    return set(ids)


class _Row:
    """Row ``b`` of a cache or a state: ``layer(i)`` gives that row's views (``[1, ...]``)."""

    batch_size = 1

    def __init__(self, store, b: int) -> None:
        self.store, self.b = store, b

    def layer(self, i: int):
        return tuple(t[self.b:self.b + 1] for t in self.store.layer(i))


def _right_pad(seqs: list[list[int]], device) -> tuple[Tensor, Tensor]:
    """Rows padded on the right with token 0: ``ids`` ``[B, max_len]`` and ``lengths`` ``[B]``.

    Right padding keeps each row's real tokens at positions 0..len-1, and causal attention means a
    real token never looks at the padding after it.
    """
    lengths = torch.tensor([len(s) for s in seqs], device=device)
    ids = torch.zeros(len(seqs), int(lengths.max()), dtype=torch.long, device=device)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, device=device)
    return ids, lengths


def _last_logits(model: Transformer, hidden: Tensor, lengths: Tensor) -> Tensor:
    """Logits of each row's last real token: hidden ``[B, T, h]`` -> ``[B, V]``."""
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    return model.logits(hidden[rows, lengths - 1])


def _uncached_stepper(model: Transformer, prompts: list[list[int]]):
    device = next(model.parameters()).device
    seqs = [list(p) for p in prompts]

    def next_logits(new_tokens: list[int] | None) -> Tensor:
        if new_tokens is not None:
            for s, t in zip(seqs, new_tokens):
                s.append(t)
        ids, lengths = _right_pad(seqs, device)
        return _last_logits(model, model.hidden_states(ids), lengths)

    return next_logits


def _cached_stepper(model: Transformer, prompts: list[list[int]], kv: ContiguousKVCache,
                    attn_fn: AttentionFn | None):
    device = kv.device
    ids, lengths = _right_pad(prompts, device)
    # A hybrid's linear layers fold every token they see into their state, padding included:
    # its rows are prefilled one at a time, each with its own length (then decode is batched).
    state = (LinearAttentionState(model.config, len(prompts), device=device)
             if model.config.is_hybrid else None)

    def next_logits(new_tokens: list[int] | None) -> Tensor:
        nonlocal lengths
        if new_tokens is None and state is not None:
            last = [model.hidden_states(ids[b:b + 1, :n], kv_cache=_Row(kv, b), attn_fn=attn_fn,
                                        state=_Row(state, b))[:, -1]
                    for b, n in enumerate(lengths.tolist())]
            return model.logits(torch.cat(last))
        if new_tokens is None:  # prefill: every row at positions 0..T-1, padding included
            hidden = model.hidden_states(ids, kv_cache=kv, attn_fn=attn_fn)       # [B, T, h]
            return _last_logits(model, hidden, lengths)
        # decode: each row writes its new token right after its own last one
        step_ids = torch.tensor(new_tokens, device=device)[:, None]            # [B, 1]
        positions = lengths[:, None]                                            # [B, 1]
        hidden = model.hidden_states(step_ids, positions, kv_cache=kv, attn_fn=attn_fn,
                                     state=state)
        lengths = lengths + 1
        return model.logits(hidden[:, -1])

    return next_logits
