"""A Llama/Mistral/Qwen2/Qwen3 decoder in plain PyTorch, and the Qwen3.5 hybrid (its
``linear_attention`` layers are Gated DeltaNet, ``model.linear_attention``).

Module names mirror Hugging Face's state-dict keys (``model.layers.0.self_attn.q_proj.weight``
...) so that a checkpoint loads with a plain ``load_state_dict``, without renaming.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import AttentionFn, ContiguousKVCache, cached_attention, causal_attention
from .config import ModelConfig
from .linear_attention import GatedDeltaNet, LinearAttentionState
from .norm import RMSNorm

SUPPORTED_ROPE_TYPES = ("default", "llama3")


def rope_inv_freq(config: ModelConfig, device: torch.device | str = "cpu") -> Tensor:
    """Inverse frequencies ``theta^(-2i/D)`` for i in 0..D/2-1, float32 ``[D/2]``.

    With ``rope_scaling={"rope_type": "llama3", ...}`` (Llama 3.1) the frequencies whose wavelength
    exceeds the original context are divided by ``factor``, the high ones are kept, and the band in
    between is interpolated smoothly, so the model reaches ``factor`` x its training context.
    """
    dim = config.rotary_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
    inv_freq = 1.0 / (config.rope_theta ** exponents)
    scaling = config.rope_scaling
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type != "llama3":
        raise ValueError(f"rope_type {rope_type!r} no está soportado; rope_type soportados: "
                         f"{', '.join(SUPPORTED_ROPE_TYPES)}")
    factor = float(scaling["factor"])
    low = float(scaling["low_freq_factor"])
    high = float(scaling["high_freq_factor"])
    old_len = float(scaling.get("original_max_position_embeddings", config.max_position_embeddings))
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths (low frequencies) are stretched by factor; short ones stay as trained.
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """cos/sin of RoPE, tabulated lazily up to the largest position seen so far.

    Llama 3.1 advertises 131072 positions; a table that long would be 64 MB per head_dim of 128
    before the first token, so the table only grows (doubling) when a longer position arrives.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        rope_inv_freq(config, device="cpu")  # fail at construction on an unsupported rope_type
        # Plain attributes, not buffers: they must stay float32 when the model is cast to bf16,
        # and they are not part of the checkpoint.
        self._cos: Tensor | None = None  # [N, D] float32
        self._sin: Tensor | None = None

    def _grow(self, needed: int, device: torch.device) -> None:
        n = max(needed, 2 * (0 if self._cos is None else self._cos.shape[0]), 256)
        inv_freq = rope_inv_freq(self.config, device=device)                # [D/2]
        freqs = torch.arange(n, device=device).float()[:, None] * inv_freq  # [N, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)                              # [N, D]
        self._cos, self._sin = emb.cos(), emb.sin()

    def reserve(self, n: int, device: torch.device | str) -> None:
        """Tabulate positions ``0..n-1`` on ``device`` now. A CUDA graph cannot grow the table
        while it records (reading ``positions.max()`` waits for the GPU), so the engine reserves
        ``max_model_len`` positions before it captures."""
        device = torch.device(device)
        if self._cos is None or self._cos.shape[0] < n or self._cos.device != device:
            self._grow(n, device)

    def forward(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``positions`` ``[B, T]`` -> ``(cos, sin)`` each ``[B, 1, T, D]`` in ``dtype``."""
        if not (positions.is_cuda and torch.cuda.is_current_stream_capturing()):
            self.reserve(int(positions.max()) + 1, positions.device)
        cos = self._cos[positions].to(dtype)[:, None]
        sin = self._sin[positions].to(dtype)[:, None]
        return cos, sin


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x`` ``[B, H, T, D]`` rotated by its tokens' angles (Hugging Face's rotate-half layout).
    With partial rotation (``cos`` narrower than ``D``) only the first dimensions turn."""
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return torch.addcmul(x * cos, rotate_half(x), sin)
    turned, kept = x[..., :r], x[..., r:]
    return torch.cat((torch.addcmul(turned * cos, rotate_half(turned), sin), kept), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        h, q_dim, kv_dim = config.hidden_size, config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        # With an output gate (Qwen3.5), q_proj yields each head's query then its gate.
        self.gated = config.attn_output_gate
        self.q_proj = nn.Linear(h, q_dim * (2 if self.gated else 1), bias=config.attention_bias)
        self.k_proj = nn.Linear(h, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(h, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, h, bias=config.o_proj_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, config.zero_centered_norm)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, config.zero_centered_norm)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor,
                kv: tuple[Tensor, Tensor] | None, attn_fn: AttentionFn) -> Tensor:
        B, T, _ = x.shape
        gate = None
        if self.gated:
            q, gate = self.q_proj(x).view(B, T, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        else:
            q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim)  # [B, T, H, D]
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim)  # [B, T, Hkv, D]
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim)  # [B, T, Hkv, D]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        # One rotation for the queries and the keys together (the same ops per element, half
        # the kernels), then views of each: q [B, H, T, D], k [B, Hkv, T, D].
        qk = apply_rope(torch.cat((q, k), dim=2).transpose(1, 2), cos, sin)
        q, k = qk.split((self.num_heads, self.num_kv_heads), dim=1)
        v = v.transpose(1, 2)
        if kv is None:
            out = causal_attention(q, k, v)
        else:
            out = attn_fn(q, k, v, kv[0], kv[1], positions)               # [B, H, T, D]
        out = out.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim)
        if gate is not None:
            out = out * torch.sigmoid(gate.reshape(B, T, -1))
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Norm, token mixer, residual; norm, MLP, residual. The mixer is ``self_attn`` (softmax
    attention) or, for a ``linear_attention`` layer, ``linear_attn`` (Gated DeltaNet)."""

    def __init__(self, config: ModelConfig, index: int = 0) -> None:
        super().__init__()
        zc = config.zero_centered_norm
        self.is_linear = config.layer_kinds[index] == "linear_attention"
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, zc)
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(config)
        else:
            self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, zc)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor,
                kv: tuple[Tensor, Tensor] | None, attn_fn: AttentionFn) -> Tensor:
        """``kv``: this layer's cache, the KV pair of an attention layer or the
        ``(conv, recurrent)`` state of a linear one (None: no cache)."""
        h = self.input_layernorm(x)
        if self.is_linear:
            x = x + self.linear_attn(h, kv)
        else:
            x = x + self.self_attn(h, cos, sin, positions, kv, attn_fn)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    """The part Hugging Face calls ``model``: embeddings, layers and the final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.zero_centered_norm)
        self.rotary_emb = RotaryEmbedding(config)


class Transformer(nn.Module):
    """Decoder-only transformer built from a ``ModelConfig``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderStack(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Make ``lm_head`` share the embedding matrix when the config says so (call again after
        anything that replaces parameters, such as ``to_empty`` or ``load_state_dict(assign=True)``)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def hidden_states(self, input_ids: Tensor, positions: Tensor | None = None,
                      kv_cache: ContiguousKVCache | None = None,
                      attn_fn: AttentionFn | None = None,
                      state: LinearAttentionState | None = None) -> Tensor:
        """``input_ids`` ``[B, T]`` -> final-norm hidden states ``[B, T, hidden]``.

        ``positions`` ``[B, T]`` are the tokens' absolute positions (default ``0..T-1`` in every
        row). Without ``kv_cache`` the T tokens attend causally to each other only. With it, every
        attention layer calls ``(attn_fn or cached_attention)(q, k, v, k_cache_a, v_cache_a,
        positions)``, which stores the new K/V in the cache and attends to everything up to each
        position; ``a`` counts attention layers only (a hybrid's cache has no entry for its
        linear layers). Any object with ``layer(a) -> (k, v)`` can stand for the cache when
        ``attn_fn`` knows its layout (the engine passes its ``BlockKVCache`` with all tokens in
        one row, ``B = 1``).

        A hybrid's linear layers read and update ``state`` (``LinearAttentionState``, one row per
        batch row, holding what the sequences saw before these tokens); a hybrid takes both
        caches or neither.
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids debe tener forma [B, T]; tiene {tuple(input_ids.shape)}")
        B, T = input_ids.shape
        if positions is None:
            positions = torch.arange(T, device=input_ids.device).expand(B, T)
        elif positions.shape != (B, T):
            raise ValueError(f"positions tiene forma {tuple(positions.shape)}; se esperaba {(B, T)}")
        if kv_cache is None and attn_fn is not None:
            raise ValueError("attn_fn solo se usa con una caché KV: pase también kv_cache=")
        if isinstance(kv_cache, ContiguousKVCache) and kv_cache.batch_size != B:
            raise ValueError(f"kv_cache tiene batch_size={kv_cache.batch_size} pero input_ids tiene {B} filas")
        self._check_state(state, kv_cache, B)
        attn_fn = attn_fn or cached_attention
        x = self.model.embed_tokens(input_ids)                            # [B, T, hidden]
        cos, sin = self.model.rotary_emb(positions, x.dtype)               # [B, 1, T, D]
        n_attn = n_linear = 0
        for layer in self.model.layers:
            if layer.is_linear:
                cache = None if state is None else state.layer(n_linear)
                n_linear += 1
            else:
                cache = None if kv_cache is None else kv_cache.layer(n_attn)
                n_attn += 1
            x = layer(x, cos, sin, positions, cache, attn_fn)
        return self.model.norm(x)

    def _check_state(self, state: LinearAttentionState | None, kv_cache, batch: int) -> None:
        config = self.config
        if state is not None and not config.is_hybrid:
            raise ValueError(f"state= es el estado de las capas de atención lineal; {config.name} "
                             "no tiene ninguna (layer_types solo full_attention)")
        if config.is_hybrid and config.num_attention_layers and (state is None) != (kv_cache is None):
            raise ValueError(
                "un modelo híbrido guarda dos cosas por secuencia: la caché KV de sus capas de "
                "atención y el estado fijo de sus capas lineales; pase kv_cache= y state= juntos "
                "(o ninguno, para una pasada sin caché)")
        if state is not None and state.batch_size != batch:
            raise ValueError(f"state tiene batch_size={state.batch_size} pero input_ids tiene "
                             f"{batch} filas")

    def logits(self, hidden: Tensor) -> Tensor:
        """``[..., hidden]`` -> ``[..., vocab]``."""
        return self.lm_head(hidden)

    def forward(self, input_ids: Tensor, positions: Tensor | None = None,
                kv_cache: ContiguousKVCache | None = None,
                attn_fn: AttentionFn | None = None,
                state: LinearAttentionState | None = None) -> Tensor:
        """``input_ids`` ``[B, T]`` -> logits ``[B, T, vocab]`` (arguments: ``hidden_states``)."""
        return self.logits(self.hidden_states(input_ids, positions, kv_cache, attn_fn, state))

    def num_parameters(self) -> int:
        """Parameters, counting a tied lm_head once."""
        return sum(p.numel() for p in self.parameters())
