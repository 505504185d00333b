"""Linear attention as a recurrence: the Gated DeltaNet layer of Qwen3.5 / Qwen3-Next.

Where softmax attention keeps every past key and value (the KV cache grows with the context), a
linear-attention layer folds the past into a fixed-size **state** per head, a ``[Dk, Dv]``
matrix ``S``. For each token ``t``, with key ``k_t`` and query ``q_t`` (L2-normalized), value
``v_t``, a decay ``a_t = exp(g_t)`` in (0, 1] and a write strength ``beta_t`` in (0, 1):

    S  <- a_t * S                                  (forget a little of the past)
    S  <- S + k_t (beta_t * (v_t - S^T k_t))^T     (delta rule: write only what S mispredicts)
    o_t = S^T q_t

``gated_delta_recurrent`` runs exactly that, one token at a time (decode). ``gated_delta_chunked``
computes the same outputs and final state for a whole prompt in chunks of ``chunk_size`` tokens:
inside a chunk the writes are solved together as a triangular system (the "UT transform"),
between chunks the state carries over (prefill). Before the recurrence, a short causal
convolution (``linear_conv_kernel_dim`` taps per channel) mixes each channel with its last few
inputs: its window of past inputs is the layer's second piece of state.

Module and parameter names mirror Hugging Face's ``Qwen3_5GatedDeltaNet`` (``in_proj_qkv``,
``in_proj_z``, ``in_proj_b``, ``in_proj_a``, ``conv1d``, ``dt_bias``, ``A_log``, ``norm``,
``out_proj``) so that its checkpoints load without renaming.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from .norm import RMSNorm

DEFAULT_CHUNK_SIZE = 64


def l2_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dimension (the convention of the
    flash-linear-attention kernels that Qwen3.5 was trained with)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_recurrent(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                          initial_state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The gated delta rule, one token after another.

    ``q``, ``k``: ``[B, T, H, Dk]`` (normalized; ``q`` already scaled); ``v``: ``[B, T, H, Dv]``;
    ``g``: log-decay ``[B, T, H]`` (``<= 0``); ``beta``: ``[B, T, H]``; ``initial_state``:
    ``[B, H, Dk, Dv]`` or None (zeros). Returns the outputs ``[B, T, H, Dv]`` and the state after
    the last token, both float32 (it computes in float32 whatever the inputs' dtype).
    """
    B, T, H, Dk = k.shape
    Dv = v.shape[-1]
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    S = (torch.zeros(B, H, Dk, Dv, device=v.device) if initial_state is None
         else initial_state.float().clone())
    out = torch.empty(B, T, H, Dv, device=v.device)
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        predicted = torch.einsum("bhkv,bhk->bhv", S, k[:, t])            # what S says v_t is
        delta = (v[:, t] - predicted) * beta[:, t, :, None]
        S = S + k[:, t, :, :, None] * delta[:, :, None, :]                # rank-one write
        out[:, t] = torch.einsum("bhkv,bhk->bhv", S, q[:, t])
    return out, S


def gated_delta_chunked(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                        initial_state: Tensor | None = None,
                        chunk_size: int = DEFAULT_CHUNK_SIZE) -> tuple[Tensor, Tensor]:
    """The gated delta rule over whole chunks: the same result as ``gated_delta_recurrent``
    (same arguments and returns) in ``ceil(T / chunk_size)`` sequential steps of matrix products.

    Inside a chunk, with ``G_t`` the product of the decays from the chunk's start to ``t`` and
    ``S0`` the state before the chunk, the value each token really writes is
    ``u_s = beta_s (v_s - G_s S0^T k_s - sum_{r<s} (G_s/G_r) (k_s . k_r) u_r)``: a unit lower
    triangular system ``(I + A) U = beta V - beta G K S0`` solved for all ``s`` at once. Then
    ``o_t = G_t S0^T q_t + sum_{s<=t} (G_t/G_s) (q_t . k_s) u_s`` and the state after the chunk is
    ``G_C S0 + sum_s (G_C/G_s) k_s u_s^T``.
    """
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size debe ser un entero >= 1; se recibió {chunk_size!r}")
    B, T, H, Dk = k.shape
    Dv = v.shape[-1]
    C = chunk_size
    pad = (-T) % C
    # [B, H, T, ...] in float32; padded tokens have g = 0 and beta = 0: they write nothing.
    q, k, v = (F.pad(x.float().transpose(1, 2), (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x.float().transpose(1, 2), (0, pad)) for x in (g, beta))
    N = (T + pad) // C
    q, k, v = (x.reshape(B, H, N, C, x.shape[-1]) for x in (q, k, v))
    g, beta = g.reshape(B, H, N, C), beta.reshape(B, H, N, C)

    log_G = g.cumsum(dim=-1)                                             # [B, H, N, C]
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    decay = (log_G[..., :, None] - log_G[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    k_beta = k * beta[..., None]
    eye = torch.eye(C, device=q.device)
    system = eye + (k_beta @ k.transpose(-1, -2) * decay).tril(-1)      # I + A, [.., C, C]
    u_free = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False,
                                           unitriangular=True)          # U when S0 = 0
    u_from_state = torch.linalg.solve_triangular(system, k_beta * log_G.exp()[..., None],
                                                 upper=False, unitriangular=True)
    scores = q @ k.transpose(-1, -2) * decay                            # [.., C, C], s <= t
    q_decayed = q * log_G.exp()[..., None]
    k_to_end = k * (log_G[..., -1:] - log_G).exp()[..., None]
    chunk_decay = log_G[..., -1].exp()[..., None, None]                 # [B, H, N, 1, 1]

    S = (torch.zeros(B, H, Dk, Dv, device=v.device) if initial_state is None
         else initial_state.float().clone())
    out = torch.empty(B, H, N, C, Dv, device=v.device)
    for n in range(N):
        u = u_free[:, :, n] - u_from_state[:, :, n] @ S
        out[:, :, n] = q_decayed[:, :, n] @ S + scores[:, :, n] @ u
        S = S * chunk_decay[:, :, n] + k_to_end[:, :, n].transpose(-1, -2) @ u
    out = out.reshape(B, H, N * C, Dv)[:, :, :T].transpose(1, 2)
    return out, S


def causal_conv(x: Tensor, weight: Tensor, conv_state: Tensor | None = None) -> Tensor:
    """Depthwise causal convolution: ``x`` ``[B, C, T]``, ``weight`` ``[C, 1, K]`` -> ``[B, C, T]``;
    output ``t`` mixes inputs ``t-K+1..t`` of its channel. The ``K - 1`` inputs before the first
    come from ``conv_state`` ``[B, C, K-1]`` (zeros when None); with a state, it is overwritten
    with the last ``K - 1`` inputs seen (the window the next call needs)."""
    B, C, T = x.shape
    window = weight.shape[-1] - 1
    past = (x.new_zeros(B, C, window) if conv_state is None else conv_state.to(x.dtype))
    full = torch.cat((past, x), dim=-1)                                  # [B, C, K-1+T]
    if conv_state is not None:
        conv_state.copy_(full[:, :, T:])
    return F.conv1d(full.to(weight.dtype), weight, groups=C).to(x.dtype)


class LinearAttentionState:
    """The fixed-size state of every linear-attention layer, for ``batch_size`` sequences.

    Per linear layer ``j``: ``conv[j]`` ``[B, conv_dim, K-1]`` (the convolution's window of past
    inputs) and ``recurrent[j]`` ``[B, Hv, Dk, Dv]`` (the delta-rule matrices). Its size does not
    depend on how many tokens a sequence has seen. ``dtype`` float32 by default, as llama.cpp
    and vLLM keep it (``memory.state_bytes_per_sequence`` counts the same bytes).
    """

    def __init__(self, config: ModelConfig, batch_size: int, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu") -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size debe ser >= 1; se recibió {batch_size}")
        if not config.num_linear_layers:
            raise ValueError(f"{config.name} no tiene capas de atención lineal "
                             f"(layer_types={config.layer_kinds}): no tiene estado que guardar")
        L = config.num_linear_layers
        self.config, self.batch_size = config, batch_size
        self.conv = torch.zeros(L, batch_size, config.linear_conv_dim,
                                config.linear_conv_kernel_dim - 1, dtype=dtype, device=device)
        self.recurrent = torch.zeros(L, batch_size, config.linear_num_value_heads,
                                     config.linear_key_head_dim, config.linear_value_head_dim,
                                     dtype=dtype, device=device)

    def layer(self, j: int) -> tuple[Tensor, Tensor]:
        """Views ``(conv, recurrent)`` of linear layer ``j`` (0-based among linear layers)."""
        if not 0 <= j < self.conv.shape[0]:
            raise IndexError(f"la capa lineal {j} está fuera de rango; el estado tiene las capas "
                             f"lineales 0..{self.conv.shape[0] - 1}")
        return self.conv[j], self.recurrent[j]

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.recurrent.nbytes


class GatedDeltaNet(nn.Module):
    """One linear-attention token mixer (takes the place of ``self_attn`` in a layer)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.num_k_heads, self.num_v_heads = config.linear_num_key_heads, config.linear_num_value_heads
        self.head_k_dim, self.head_v_dim = config.linear_key_head_dim, config.linear_value_head_dim
        self.key_dim = self.num_k_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        conv_dim = config.linear_conv_dim
        self.chunk_size = DEFAULT_CHUNK_SIZE
        self.in_proj_qkv = nn.Linear(h, conv_dim, bias=False)
        self.in_proj_z = nn.Linear(h, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(h, self.num_v_heads, bias=False)
        self.in_proj_a = nn.Linear(h, self.num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, config.linear_conv_kernel_dim, groups=conv_dim,
                                bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = RMSNorm(self.head_v_dim, config.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, h, bias=False)

    def forward(self, x: Tensor, state: "tuple[Tensor, Tensor] | StateSegments | None" = None) -> Tensor:
        """``x`` ``[B, T, hidden]`` -> ``[B, T, hidden]``. ``state``: the sequences' state before
        these tokens, **updated in place**: a ``(conv, recurrent)`` pair with one row per batch
        row, or ``StateSegments`` when the row holds several sequences one after another (the
        engine's flat step); None starts from zeros and keeps nothing. A sequence with one new
        token runs the recurrent form; with more, the chunked form. The projections run once
        over all the tokens; only the convolution and the recurrence are per sequence."""
        B, T, _ = x.shape
        mixed = self.in_proj_qkv(x)                                          # [B, T, conv_dim]
        beta = self.in_proj_b(x).sigmoid()
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)
        if isinstance(state, StateSegments):
            out = state.apply(self.mix, mixed, g, beta)
        else:
            conv_state, recurrent = (None, None) if state is None else state
            out = self.mix(mixed, g, beta, conv_state, recurrent)
        z = self.in_proj_z(x).reshape(B, T, self.num_v_heads, self.head_v_dim)
        out = (self.norm(out.to(x.dtype)) * F.silu(z.float())).to(x.dtype)  # gated RMSNorm
        return self.out_proj(out.reshape(B, T, self.value_dim))

    def mix(self, mixed: Tensor, g: Tensor, beta: Tensor, conv_state: Tensor | None,
            recurrent: Tensor | None) -> Tensor:
        """The per-sequence part: convolution, then the delta rule. ``mixed`` ``[B, T, conv_dim]``
        (``in_proj_qkv``'s output), ``g``, ``beta`` ``[B, T, Hv]``; the states (``[B, ...]`` or
        None) are updated in place. Returns ``[B, T, Hv, Dv]`` float32."""
        B, T, _ = mixed.shape
        mixed = F.silu(causal_conv(mixed.transpose(1, 2), self.conv1d.weight, conv_state))
        q, k, v = mixed.transpose(1, 2).split((self.key_dim, self.key_dim, self.value_dim), dim=-1)
        group = self.num_v_heads // self.num_k_heads  # each q/k head serves `group` value heads
        q = q.reshape(B, T, self.num_k_heads, self.head_k_dim).repeat_interleave(group, dim=2)
        k = k.reshape(B, T, self.num_k_heads, self.head_k_dim).repeat_interleave(group, dim=2)
        v = v.reshape(B, T, self.num_v_heads, self.head_v_dim)
        q = l2_normalize(q.float()) * self.head_k_dim ** -0.5
        k = l2_normalize(k.float())
        if T == 1:
            out, final = gated_delta_recurrent(q, k, v, g, beta, recurrent)
        else:
            out, final = gated_delta_chunked(q, k, v, g, beta, recurrent, self.chunk_size)
        if recurrent is not None:
            recurrent.copy_(final)
        return out


class StateSegments:
    """One linear layer's state store seen by a flat row of several sequences' tokens.

    ``conv`` ``[slots, C, K-1]`` and ``recurrent`` ``[slots, Hv, Dk, Dv]`` hold one state per
    slot; ``segments`` lists ``(begin, end, slot)``: tokens ``begin..end-1`` of the row (in order,
    covering it) belong to the sequence whose state is in ``slot``. Sequences with one token
    (decode) are gathered into one batch; each longer one (a prompt chunk) runs on its own.

    State checkpoints (prefix caching for hybrids): ``saves`` lists ``(begin, offset, checkpoint)``:
    copy the state of the sequence whose segment starts at ``begin`` into row ``checkpoint`` of
    ``checkpoints`` (a ``(conv, recurrent)`` pair shaped like the slots') once its first
    ``offset`` tokens of the segment are done (``1 <= offset <= end - begin``). A segment with a
    save inside it is computed in pieces that end at each save (the state after a token that is
    not the last of a chunk exists nowhere else); a piece of one token takes the recurrent form.
    """

    def __init__(self, conv: Tensor, recurrent: Tensor,
                 segments: tuple[tuple[int, int, int], ...],
                 checkpoints: tuple[Tensor, Tensor] | None = None,
                 saves: tuple[tuple[int, int, int], ...] = ()) -> None:
        if saves and checkpoints is None:
            raise ValueError("saves= necesita checkpoints= (dónde copiar el estado)")
        self.conv, self.recurrent, self.segments = conv, recurrent, segments
        self.checkpoints, self.saves = checkpoints, saves

    def _save(self, slot: int, checkpoint: int) -> None:
        conv, recurrent = self.checkpoints
        conv[checkpoint].copy_(self.conv[slot])
        recurrent[checkpoint].copy_(self.recurrent[slot])

    def apply(self, mix, mixed: Tensor, g: Tensor, beta: Tensor) -> Tensor:
        """``mix(mixed, g, beta, conv, recurrent)`` per sequence of the row ``[1, N, ...]``."""
        pieces: dict[int, Tensor] = {}
        saves: dict[int, list[tuple[int, int]]] = {}
        for b, offset, checkpoint in self.saves:
            saves.setdefault(b, []).append((offset, checkpoint))
        single = [(b, slot) for b, e, slot in self.segments if e - b == 1]
        if single:
            idx = torch.tensor([b for b, _ in single], device=mixed.device)
            slots = torch.tensor([slot for _, slot in single], device=mixed.device)
            conv, rec = self.conv[slots], self.recurrent[slots]               # gathered copies
            out = mix(mixed[0, idx, None], g[0, idx, None], beta[0, idx, None], conv, rec)
            self.conv[slots], self.recurrent[slots] = conv, rec               # written back
            pieces.update((b, out[i:i + 1]) for i, (b, _) in enumerate(single))
            for b, slot in single:
                for _, checkpoint in saves.get(b, ()):
                    self._save(slot, checkpoint)
        for b, e, slot in self.segments:
            if e - b == 1:
                continue
            cuts = sorted(saves.get(b, ()))
            bounds = sorted({b + o for o, _ in cuts} | {e})
            outs, lo = [], b
            for hi in bounds:
                outs.append(mix(mixed[:, lo:hi], g[:, lo:hi], beta[:, lo:hi],
                                self.conv[slot:slot + 1], self.recurrent[slot:slot + 1]))
                for o, checkpoint in cuts:
                    if b + o == hi:
                        self._save(slot, checkpoint)
                lo = hi
            pieces[b] = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        return torch.cat([pieces[b] for b, _, _ in self.segments], dim=1)


class SlotState:
    """``LinearAttentionState`` rows used as per-request slots, for one flat engine step:
    ``layer(j)`` gives linear layer ``j``'s ``StateSegments``. ``checkpoints`` (another
    ``LinearAttentionState``, one row per checkpoint) and ``saves`` (see ``StateSegments``): the
    states this step copies out for prefix caching."""

    batch_size = 1  # the engine's step is one flat row

    def __init__(self, store: LinearAttentionState,
                 segments: tuple[tuple[int, int, int], ...],
                 checkpoints: LinearAttentionState | None = None,
                 saves: tuple[tuple[int, int, int], ...] = ()) -> None:
        self.store, self.segments = store, segments
        self.checkpoints, self.saves = checkpoints, saves

    def layer(self, j: int) -> StateSegments:
        conv, recurrent = self.store.layer(j)
        checkpoints = None if self.checkpoints is None else self.checkpoints.layer(j)
        return StateSegments(conv, recurrent, self.segments, checkpoints, self.saves)
