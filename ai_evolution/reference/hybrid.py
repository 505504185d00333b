"""Reference answers of the hybrid-models lab (chapter 11): the fixed state one sequence keeps,
one step of the gated delta rule, and how many sequences fit with state and KV cache."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..model import ModelConfig
from ..model.memory import DEFAULT_STATE_DTYPE, memory_budget, state_bytes_per_sequence


def reference_state_bytes(config: ModelConfig, dtype_bytes: float = 4.0) -> float:
    """Bytes of the fixed state of one sequence, ``dtype_bytes`` per element: in every linear
    layer, one ``key_head_dim x value_head_dim`` matrix per **value** head (the delta rule's
    memory) plus the convolution's window, ``kernel - 1`` past inputs of each of its channels
    (queries, keys and values: ``2 x key_heads x key_head_dim + value_heads x value_head_dim``).
    0 for a model without linear layers: its whole memory per sequence is the KV cache."""
    if not config.is_hybrid:
        return 0.0
    recurrent = (config.linear_num_value_heads * config.linear_key_head_dim
                 * config.linear_value_head_dim)
    conv = config.linear_conv_dim * (config.linear_conv_kernel_dim - 1)
    return float(config.num_linear_layers * (recurrent + conv) * dtype_bytes)


def reference_delta_step(state: Tensor, q: Tensor, k: Tensor, v: Tensor, g: Tensor,
                         beta: Tensor) -> tuple[Tensor, Tensor]:
    """One token of the gated delta rule, for every sequence and head at once.

    ``state`` ``[B, H, Dk, Dv]``; ``q``, ``k`` ``[B, H, Dk]`` (normalized; ``q`` scaled); ``v``
    ``[B, H, Dv]``; ``g`` (log-decay, ``<= 0``) and ``beta`` (write strength) ``[B, H]``. The
    state first decays by ``exp(g)``; then it predicts the value of key ``k`` (``S^T k``), and
    writes ``beta x (v - prediction)`` along ``k`` (a rank-one update); the output reads the new
    state with the query, ``S^T q``. Returns ``(output [B, H, Dv], new state)``, float32; the
    input state is not modified."""
    S = state.float() * g.float().exp()[..., None, None]
    k, q, v, beta = k.float(), q.float(), v.float(), beta.float()
    predicted = torch.einsum("bhkv,bhk->bhv", S, k)
    delta = (v - predicted) * beta[..., None]
    S = S + k[..., :, None] * delta[..., None, :]
    return torch.einsum("bhkv,bhk->bhv", S, q), S


def reference_sequences_that_fit(config: ModelConfig, gpu_bytes: float, context_len: int,
                                 utilization: float = 0.9, dtype: str = "bf16",
                                 state_dtype: str = DEFAULT_STATE_DTYPE) -> int:
    """Sequences of ``context_len`` tokens that fit in ``utilization x gpu_bytes`` once the
    weights (at ``dtype``) are loaded: each one takes its tokens' KV (``dtype``, attention layers
    only) plus, in a hybrid, its fixed state (``state_dtype``). Rounded down: a sequence that does
    not fit whole does not run. 0 when the weights leave no room."""
    try:
        budget = memory_budget(config, gpu_bytes, max_len=context_len, utilization=utilization,
                               dtype=dtype, state_dtype=state_dtype)
    except ValueError:
        if context_len >= 1 and 0 < utilization <= 1:
            return 0
        raise
    return budget.on_demand_sequences


def reference_state_crossover(config: ModelConfig, kv_bytes_per_token: float,
                              state_dtype: str = DEFAULT_STATE_DTYPE) -> int | None:
    """The shortest context whose KV cache weighs at least as much as the fixed state: below it
    the state dominates one sequence's memory. None for a model without state."""
    state = state_bytes_per_sequence(config, state_dtype)
    if state == 0:
        return None
    return max(1, math.ceil(state / kv_bytes_per_token))


def reference_reusable_tokens(shared_len: int, prompt_len: int, interval: int) -> int:
    """Prompt tokens a request can take from the prefix cache when ``shared_len`` of its
    ``prompt_len`` tokens repeat an earlier request and the engine can resume only every
    ``interval`` tokens (a transformer: its block size, every full block; a hybrid: the distance
    between checkpoints of its state). The shared part is cut down to a multiple of
    ``interval``, and one prompt token is always left to compute, because the first new token's
    logits come from it: ``min(shared_len, prompt_len - 1) // interval * interval``."""
    return min(shared_len, prompt_len - 1) // interval * interval
