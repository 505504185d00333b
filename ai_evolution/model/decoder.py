"""A Llama/Mistral/Qwen2/Qwen3 decoder in plain PyTorch.

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

SUPPORTED_ROPE_TYPES = ("default", "llama3")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == torch.float32 == self.weight.dtype:  # one kernel, scale included
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        # Normalize in float32 and round back before scaling, as Hugging Face does, so that
        # bf16/fp16 outputs round the same way as theirs.
        y = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)
        return self.weight * y


def rope_inv_freq(config: ModelConfig, device: torch.device | str = "cpu") -> Tensor:
    """Inverse frequencies ``theta^(-2i/D)`` for i in 0..D/2-1, float32 ``[D/2]``.

    With ``rope_scaling={"rope_type": "llama3", ...}`` (Llama 3.1) the frequencies whose wavelength
    exceeds the original context are divided by ``factor``, the high ones are kept, and the band in
    between is interpolated smoothly, so the model reaches ``factor`` x its training context.
    """
    dim = config.head_dim
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
    """``x`` ``[B, H, T, D]`` rotated by its tokens' angles (Hugging Face's rotate-half layout)."""
    return torch.addcmul(x * cos, rotate_half(x), sin)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        h, q_dim, kv_dim = config.hidden_size, config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        self.q_proj = nn.Linear(h, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(h, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(h, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, h, bias=config.o_proj_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor,
                kv: tuple[Tensor, Tensor] | None, attn_fn: AttentionFn) -> Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim)     # [B, T, H, D]
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
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor,
                kv: tuple[Tensor, Tensor] | None, attn_fn: AttentionFn) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, positions, kv, attn_fn)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    """The part Hugging Face calls ``model``: embeddings, layers and the final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
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
                      attn_fn: AttentionFn | None = None) -> Tensor:
        """``input_ids`` ``[B, T]`` -> final-norm hidden states ``[B, T, hidden]``.

        ``positions`` ``[B, T]`` are the tokens' absolute positions (default ``0..T-1`` in every
        row). Without ``kv_cache`` the T tokens attend causally to each other only. With it, every
        layer calls ``(attn_fn or cached_attention)(q, k, v, k_cache_i, v_cache_i, positions)``,
        which stores the new K/V in the cache and attends to everything up to each position.
        Any object with ``layer(i) -> (k, v)`` can stand for the cache when ``attn_fn`` knows
        its layout (the engine passes its ``BlockKVCache`` with all tokens in one row, ``B = 1``).
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
        attn_fn = attn_fn or cached_attention
        x = self.model.embed_tokens(input_ids)                            # [B, T, hidden]
        cos, sin = self.model.rotary_emb(positions, x.dtype)               # [B, 1, T, D]
        for i, layer in enumerate(self.model.layers):
            kv = None if kv_cache is None else kv_cache.layer(i)
            x = layer(x, cos, sin, positions, kv, attn_fn)
        return self.model.norm(x)

    def logits(self, hidden: Tensor) -> Tensor:
        """``[..., hidden]`` -> ``[..., vocab]``."""
        return self.lm_head(hidden)

    def forward(self, input_ids: Tensor, positions: Tensor | None = None,
                kv_cache: ContiguousKVCache | None = None,
                attn_fn: AttentionFn | None = None) -> Tensor:
        """``input_ids`` ``[B, T]`` -> logits ``[B, T, vocab]``."""
        return self.logits(self.hidden_states(input_ids, positions, kv_cache, attn_fn))

    def num_parameters(self) -> int:
        """Parameters, counting a tied lm_head once."""
        return sum(p.numel() for p in self.parameters())
