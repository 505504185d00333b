"""Memory arithmetic on a ModelConfig: weight bytes, KV-cache bytes and how many sequences fit.

All sizes are in bytes (GB = 1e9 bytes, GiB = 2**30 bytes; the names say which).

A hybrid decoder (``config.layer_types`` with ``linear_attention`` layers) pays two kinds of
per-sequence memory: KV bytes per token for its attention layers only, and a fixed state per
sequence for its linear layers (``state_bytes_per_sequence``), whatever the sequence's length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..fmt import es
from .config import ModelConfig

# Bytes per element. Quantized formats are listed by their nominal width (no scales/zeros).
_DTYPE_BYTES = {
    "float32": 4.0, "fp32": 4.0,
    "float16": 2.0, "fp16": 2.0, "half": 2.0,
    "bfloat16": 2.0, "bf16": 2.0,
    "float8": 1.0, "fp8": 1.0, "int8": 1.0,
    "int4": 0.5, "q4": 0.5,
}


def dtype_bytes(dtype: str | torch.dtype) -> float:
    """Bytes per element of ``dtype`` (a torch dtype or one of the names in ``_DTYPE_BYTES``)."""
    if isinstance(dtype, torch.dtype):
        return float(torch.empty((), dtype=dtype).element_size())
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _DTYPE_BYTES:
        hint = ""
        if key.startswith("int4-") or key.startswith("int8-"):
            hint = (" (un formato cuantizado con escalas, como int4-g128, se pasa como "
                    "weight_format=, junto al dtype de las escalas y activaciones)")
        raise ValueError(f"dtype {dtype!r} desconocido; aceptados: "
                         f"{', '.join(sorted(_DTYPE_BYTES))}{hint}")
    return _DTYPE_BYTES[key]


# --- weight-only quantization formats (chapter 7) ---------------------------------------------
# The bytes of a stored integer come from ``_DTYPE_BYTES`` ("int8", "int4"): one table for both.
WEIGHT_FORMATS = ("int8", "int4", "int4-asym")
GROUP_SIZES = (32, 64, 128)
DEFAULT_GROUP_SIZE = 128


@dataclass(frozen=True)
class WeightFormat:
    """How the weights of a linear layer are stored after weight-only quantization.

    ``int8``: symmetric, one scale per output channel (a "group" is a whole row, ``group_size``
    None). ``int4``: symmetric, one scale per ``group_size`` consecutive inputs of a row.
    ``int4-asym``: one scale and one zero (offset) per group. Scales and zeros are stored in the
    model's floating dtype (the ``dtype`` of the byte functions below).
    """

    kind: str
    group_size: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in WEIGHT_FORMATS:
            raise ValueError(f"formato de pesos {self.kind!r} desconocido; formatos aceptados: "
                             f"{', '.join(WEIGHT_FORMATS)}")
        if self.kind == "int8" and self.group_size is not None:
            raise ValueError(f"int8 usa una escala por canal de salida (fila entera): no admite "
                             f"group_size (se recibió {self.group_size!r}); use group_size=None")
        if self.kind != "int8" and (isinstance(self.group_size, bool)
                                    or self.group_size not in GROUP_SIZES):
            raise ValueError(f"group_size={self.group_size!r} no está soportado para {self.kind}; "
                             f"tamaños de grupo aceptados: {', '.join(map(str, GROUP_SIZES))}")

    @property
    def name(self) -> str:
        """Canonical name: ``int8``, ``int4-g128``, ``int4-asym-g32``..."""
        return self.kind if self.group_size is None else f"{self.kind}-g{self.group_size}"

    @property
    def bits(self) -> int:
        return 8 if self.kind == "int8" else 4

    @property
    def symmetric(self) -> bool:
        return self.kind != "int4-asym"

    @property
    def bytes_per_weight(self) -> float:
        """Bytes of one stored integer, without scales: 1 (int8) or 0,5 (int4, two per byte)."""
        return dtype_bytes("int8" if self.bits == 8 else "int4")

    def check_shape(self, out_features: int, in_features: int, what: str = "la capa") -> None:
        """Raise a Spanish ValueError if a ``[out_features, in_features]`` weight cannot be stored
        in this format (int4: ``in_features`` must be a multiple of ``group_size``)."""
        if self.group_size is not None and in_features % self.group_size:
            fits = [str(g) for g in GROUP_SIZES if in_features % g == 0]
            raise ValueError(
                f"{what} tiene in_features={in_features}, que no es múltiplo de group_size="
                f"{self.group_size}; tamaños de grupo aceptados: {', '.join(map(str, GROUP_SIZES))}"
                f" (de ellos dividen {in_features}: {', '.join(fits) or 'ninguno'})")

    def linear_bytes(self, out_features: int, in_features: int,
                     dtype: str | torch.dtype = "bf16") -> float:
        """Exact bytes of a ``[out_features, in_features]`` weight in this format: the integers
        plus a scale (and, asymmetric, a zero) at ``dtype`` per group. No bias."""
        self.check_shape(out_features, in_features)
        groups = 1 if self.group_size is None else in_features // self.group_size
        per_group = 1 if self.symmetric else 2
        return (out_features * in_features * self.bytes_per_weight
                + out_features * groups * per_group * dtype_bytes(dtype))


def parse_weight_format(name: str | WeightFormat, group_size: int | None = None) -> WeightFormat:
    """Parse ``"int8"``, ``"int4"``, ``"int4-asym"``, optionally suffixed ``-g32``/``-g64``/``-g128``
    (``"int4-g64"``), or pass ``group_size=`` apart. int4 without a group size: 128."""
    if isinstance(name, WeightFormat):
        if group_size is not None and group_size != name.group_size:
            raise ValueError(f"el formato {name.name} ya fija group_size={name.group_size}; se "
                             f"recibió además group_size={group_size}")
        return name
    accepted = ("formatos aceptados: int8, int4, int4-asym; int4 con tamaño de grupo -g"
                + ", -g".join(map(str, GROUP_SIZES)) + " (por ejemplo int4-g128)")
    if not isinstance(name, str):
        raise ValueError(f"formato de pesos {name!r} desconocido; {accepted}")
    key = name.strip().lower()
    kind, _, suffix = key.rpartition("-g")
    if kind and suffix.isdigit():
        if group_size is not None and group_size != int(suffix):
            raise ValueError(f"el formato {name!r} ya fija group_size={suffix}; se recibió además "
                             f"group_size={group_size}")
        key, group_size = kind, int(suffix)
    if key not in WEIGHT_FORMATS:
        raise ValueError(f"formato de pesos {name!r} desconocido; {accepted}")
    if key != "int8" and group_size is None:
        group_size = DEFAULT_GROUP_SIZE
    return WeightFormat(key, group_size)


def _attention_linears(config: ModelConfig) -> list[tuple[str, int, int]]:
    h, hd = config.hidden_size, config.head_dim
    q, kv = config.num_heads * hd, config.num_kv_heads * hd
    q_out = 2 * q if config.attn_output_gate else q  # queries and their output gate
    return [("self_attn.q_proj", q_out, h), ("self_attn.k_proj", kv, h),
            ("self_attn.v_proj", kv, h), ("self_attn.o_proj", h, q)]


def _linear_attention_linears(config: ModelConfig) -> list[tuple[str, int, int]]:
    h, hv = config.hidden_size, config.linear_num_value_heads
    value_dim = hv * config.linear_value_head_dim
    return [("linear_attn.in_proj_qkv", config.linear_conv_dim, h),
            ("linear_attn.in_proj_z", value_dim, h), ("linear_attn.in_proj_b", hv, h),
            ("linear_attn.in_proj_a", hv, h), ("linear_attn.out_proj", h, value_dim)]


def linear_shapes(config: ModelConfig) -> list[tuple[str, int, int]]:
    """``(name, out_features, in_features)`` of every ``nn.Linear`` of the decoder, in module
    order, lm_head last (listed even when it is tied to the embedding table)."""
    shapes = config.__dict__.get("_linear_shapes")  # computed once per (frozen) config
    if shapes is None:
        h, inter = config.hidden_size, config.intermediate_size
        mlp = [("mlp.gate_proj", inter, h), ("mlp.up_proj", inter, h), ("mlp.down_proj", h, inter)]
        shapes = []
        for i, kind in enumerate(config.layer_kinds):
            mixer = (_linear_attention_linears(config) if kind == "linear_attention"
                     else _attention_linears(config))
            shapes += [(f"model.layers.{i}.{n}", o, k) for n, o, k in mixer + mlp]
        shapes = (*shapes, ("lm_head", config.vocab_size, h))
        object.__setattr__(config, "_linear_shapes", shapes)
    return list(shapes)


def unquantized_params(config: ModelConfig) -> int:
    """Parameters that weight-only quantization leaves in floating point, minus the embedding
    table: norms and biases."""
    layer_linears = sum(o * k for _, o, k in linear_shapes(config)[:-1])
    table = config.vocab_size * config.hidden_size
    head = 0 if config.tie_word_embeddings else table
    return param_count(config) - layer_linears - table - head


def quantized_weight_bytes(config: ModelConfig, fmt: str | WeightFormat,
                           dtype: str | torch.dtype = "bf16") -> float:
    """Bytes of every linear weight of the decoder (lm_head included) stored in ``fmt``, with
    its scales (and zeros) at ``dtype``."""
    fmt = parse_weight_format(fmt)
    for name, o, k in linear_shapes(config):
        fmt.check_shape(o, k, f"la capa {name} de {config.name}")
    return sum(fmt.linear_bytes(o, k, dtype) for _, o, k in linear_shapes(config))


def param_count(config: ModelConfig) -> int:
    """Parameters of the decoder, counting a tied lm_head once."""
    h, hd = config.hidden_size, config.head_dim
    q, kv = config.num_heads * hd, config.num_kv_heads * hd
    attn = sum(o * k for _, o, k in _attention_linears(config))
    if config.attention_bias:
        attn += (2 * q if config.attn_output_gate else q) + 2 * kv
    if config.o_proj_bias:
        attn += h
    if config.qk_norm:
        attn += 2 * hd
    linear = 0
    if config.is_hybrid:
        linear = (sum(o * k for _, o, k in _linear_attention_linears(config))
                  + config.linear_conv_dim * config.linear_conv_kernel_dim       # conv1d
                  + 2 * config.linear_num_value_heads                            # dt_bias, A_log
                  + config.linear_value_head_dim)                                # gated norm
    mlp = 3 * h * config.intermediate_size
    norms = 2 * h  # two RMSNorm weights per layer
    embed = config.vocab_size * h
    head = 0 if config.tie_word_embeddings else config.vocab_size * h
    return (config.num_attention_layers * attn + config.num_linear_layers * linear
            + config.num_layers * (mlp + norms) + embed + head + h)  # + final norm


def weight_bytes(config: ModelConfig, dtype: str | torch.dtype = "bf16", *,
                 weight_format: str | WeightFormat | None = None) -> float:
    """Bytes of all weights stored at ``dtype``.

    With ``weight_format`` (``"int8"``, ``"int4-g128"``...; see ``parse_weight_format``), what
    ``quant.quantize_model`` holds: every linear weight (lm_head included) in that format with its
    scales at ``dtype``, and the rest (embedding table, norms, biases) at ``dtype``. A tied
    embedding table stays at ``dtype`` for the lookup while the lm_head gets its own quantized copy.
    """
    if weight_format is None:
        return param_count(config) * dtype_bytes(dtype)
    table = config.vocab_size * config.hidden_size
    return (quantized_weight_bytes(config, weight_format, dtype)
            + (unquantized_params(config) + table) * dtype_bytes(dtype))


def kv_bytes_per_token(config: ModelConfig, dtype: str | torch.dtype = "bf16",
                       scale_dtype: str | torch.dtype | None = None) -> float:
    """KV-cache bytes one token occupies: 2 (K and V) x attention layers x kv_heads x head_dim
    x bytes (a hybrid's linear layers keep no per-token cache: see
    ``state_bytes_per_sequence``); with ``scale_dtype`` (a quantized cache such as int8), plus
    one scale of that dtype per K and V head (``model.kv_quant``)."""
    per_head = config.head_dim * dtype_bytes(dtype)
    if scale_dtype is not None:
        per_head += dtype_bytes(scale_dtype)
    return 2 * config.num_attention_layers * config.num_kv_heads * per_head


# llama.cpp keeps a linear layer's whole state in float32 whatever the weights' dtype (vLLM its
# recurrent part; its convolution window in the model's dtype: see state_page_block_size).
DEFAULT_STATE_DTYPE = "float32"


def allreduce_bytes_per_token(config: ModelConfig, dtype: str | torch.dtype = "bf16") -> float:
    """Bytes all-reduced per token by a tensor-parallel forward pass (Megatron-LM's split): 2
    all-reduces per layer (after ``o_proj`` and after ``down_proj``), each of the token's
    ``hidden_size`` activations: ``2 x layers x hidden x dtype bytes``. It is the size of the
    tensors reduced (the payload), whatever the number of ranks; what each link carries depends
    on the algorithm (``engine.tensor_parallel.ring_allreduce_traffic``)."""
    return 2 * config.num_layers * config.hidden_size * dtype_bytes(dtype)


def allreduce_bytes_per_step(config: ModelConfig, num_tokens: int,
                             dtype: str | torch.dtype = "bf16") -> float:
    """Bytes all-reduced by a tensor-parallel step that computes ``num_tokens`` tokens (a decode
    step: one per request in the batch): ``2 x layers x hidden x num_tokens x dtype bytes``."""
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
        raise ValueError(f"num_tokens debe ser un entero >= 0; se recibió {num_tokens!r}")
    return allreduce_bytes_per_token(config, dtype) * num_tokens


def recurrent_state_bytes(config: ModelConfig, dtype: str | torch.dtype = DEFAULT_STATE_DTYPE) -> float:
    """Bytes of the delta-rule matrices of one sequence: linear layers x value heads x
    key_head_dim x value_head_dim x bytes (0 for a plain transformer)."""
    if not config.is_hybrid:
        return 0.0
    return (config.num_linear_layers * config.linear_num_value_heads * config.linear_key_head_dim
            * config.linear_value_head_dim * dtype_bytes(dtype))


def conv_state_bytes(config: ModelConfig, dtype: str | torch.dtype = DEFAULT_STATE_DTYPE) -> float:
    """Bytes of the convolution windows of one sequence: linear layers x channels (queries, keys
    and values) x (kernel - 1) past inputs x bytes (0 for a plain transformer)."""
    if not config.is_hybrid:
        return 0.0
    return (config.num_linear_layers * config.linear_conv_dim
            * (config.linear_conv_kernel_dim - 1) * dtype_bytes(dtype))


def state_bytes_per_sequence(config: ModelConfig,
                             dtype: str | torch.dtype = DEFAULT_STATE_DTYPE) -> float:
    """The fixed state of one sequence, paid the same at 10 tokens as at 10 000: recurrent
    state plus convolution state (what ``linear_attention.LinearAttentionState`` holds)."""
    return recurrent_state_bytes(config, dtype) + conv_state_bytes(config, dtype)


def kv_bytes(config: ModelConfig, num_tokens: int, batch_size: int = 1,
             dtype: str | torch.dtype = "bf16") -> float:
    """KV-cache bytes of ``batch_size`` sequences of ``num_tokens`` tokens each (a hybrid's
    state comes on top: ``state_bytes_per_sequence``)."""
    return kv_bytes_per_token(config, dtype) * num_tokens * batch_size


@dataclass(frozen=True)
class MemoryBudget:
    """How much KV cache fits on one accelerator after the weights.

    ``static_slots``: sequences that fit when each reserves ``max_len`` tokens up front
    (contiguous reservation). ``on_demand_sequences``: sequences that fit when each holds only the
    ``typical_len`` tokens it really has (paged, on-demand allocation). Both count, per sequence,
    a hybrid's fixed state (``state_bytes_per_sequence``, 0 for a plain transformer) besides its
    tokens' KV. ``max_tokens``: KV tokens the budget holds with no state at all.
    ``state_checkpoint_bytes``: a hybrid's prefix-cache checkpoint pool (that many states, kept
    beside the running ones), taken from the budget before anything else.
    """

    gpu_memory_bytes: float
    utilization: float
    weight_bytes: float
    kv_budget_bytes: float
    kv_bytes_per_token: float
    max_len: int
    typical_len: int
    static_slots: int
    on_demand_sequences: int
    max_tokens: int
    state_bytes_per_sequence: float = 0.0
    state_checkpoint_bytes: float = 0.0


def _check_budget_options(utilization: float, num_state_checkpoints: int) -> None:
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization debe estar en (0, 1]; se recibió {utilization}")
    if (isinstance(num_state_checkpoints, bool) or not isinstance(num_state_checkpoints, int)
            or num_state_checkpoints < 0):
        raise ValueError(f"num_state_checkpoints debe ser un entero >= 0; se recibió "
                         f"{num_state_checkpoints!r}")


def memory_budget(config: ModelConfig, gpu_memory_bytes: float, *, max_len: int,
                  typical_len: int | None = None, utilization: float = 1.0,
                  dtype: str | torch.dtype = "bf16", kv_dtype: str | torch.dtype | None = None,
                  weights_bytes: float | None = None,
                  weight_format: str | WeightFormat | None = None,
                  kv_scale_dtype: str | torch.dtype | None = None,
                  state_dtype: str | torch.dtype = DEFAULT_STATE_DTYPE,
                  num_state_checkpoints: int = 0) -> MemoryBudget:
    """Sequences that fit in ``utilization`` x ``gpu_memory_bytes`` once the weights are loaded.

    ``weights_bytes`` overrides the exact weight size computed from the config (for example the
    nominal "7B x 2 bytes = 14 GB" of a back-of-the-envelope estimate). ``weight_format``: the
    weights are quantized (see ``weight_bytes``); the KV cache stays at ``kv_dtype or dtype``
    (``kv_scale_dtype``: a quantized cache's per token-and-head scales, see
    ``kv_bytes_per_token``). A hybrid's state per sequence is counted at ``state_dtype``;
    ``num_state_checkpoints`` more states (its prefix-cache checkpoints, see
    ``engine.state_slots``) come out of the budget first.
    """
    if max_len < 1 or (typical_len is not None and typical_len < 1):
        raise ValueError(f"max_len y typical_len deben ser >= 1; se recibieron {max_len} y "
                         f"{typical_len}")
    typical_len = max_len if typical_len is None else typical_len
    w = (weight_bytes(config, dtype, weight_format=weight_format) if weights_bytes is None
         else float(weights_bytes))
    _check_budget_options(utilization, num_state_checkpoints)
    state = state_bytes_per_sequence(config, state_dtype)
    checkpoints = num_state_checkpoints * state
    budget = gpu_memory_bytes * utilization - w - checkpoints
    if budget <= 0 and checkpoints:
        raise ValueError(
            f"los pesos ({es(w / 1e9, 2)} GB) y {num_state_checkpoints} puntos de control del "
            f"estado ({es(checkpoints / 1e9, 2)} GB) no caben en {es(utilization, 2)} × "
            f"{es(gpu_memory_bytes / 1e9, 2)} GB: no queda sitio para la caché KV")
    if budget <= 0:
        raise ValueError(
            f"los pesos ({es(w / 1e9, 2)} GB) no caben en {es(utilization, 2)} × "
            f"{es(gpu_memory_bytes / 1e9, 2)} GB: no queda sitio para la caché KV"
        )
    per_token = kv_bytes_per_token(config, dtype if kv_dtype is None else kv_dtype, kv_scale_dtype)
    return MemoryBudget(
        gpu_memory_bytes=float(gpu_memory_bytes), utilization=utilization, weight_bytes=w,
        kv_budget_bytes=budget, kv_bytes_per_token=per_token, max_len=max_len,
        typical_len=typical_len,
        static_slots=math.floor(budget / (per_token * max_len + state)),
        on_demand_sequences=math.floor(budget / (per_token * typical_len + state)),
        max_tokens=math.floor(budget / per_token),
        state_bytes_per_sequence=state, state_checkpoint_bytes=checkpoints,
    )


def state_page_block_size(config: ModelConfig, *, kv_dtype: str | torch.dtype = "bf16",
                          recurrent_dtype: str | torch.dtype = DEFAULT_STATE_DTYPE,
                          conv_dtype: str | torch.dtype = "bf16", alignment: int = 16) -> int:
    """The block size vLLM gives a hybrid so that one block of an attention layer's KV takes at
    least the bytes of one linear layer's state (its "page"): the smallest multiple of
    ``alignment`` (the attention kernels' block granularity) with ``block x KV bytes per token
    of one attention layer >= state bytes of one linear layer``. vLLM logs it as "Setting
    attention block size to N tokens to ensure that attention page size is >= mamba page size";
    as prefix caching works in whole blocks, it is also the checkpoint interval, and prompts
    shorter than it never hit (vLLM issue #40696 reports 528 tokens for Qwen3.5). Defaults: the
    recurrent state in float32 and the convolution window and KV in bf16, as vLLM keeps them
    for Qwen3.5 (with them the ``qwen3.5-9b`` preset gives 528). 0 for a model without linear
    layers (nothing to align)."""
    if not config.is_hybrid:
        return 0
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1:
        raise ValueError(f"alignment debe ser un entero >= 1; se recibió {alignment!r}")
    per_layer_state = (recurrent_state_bytes(config, recurrent_dtype)
                       + conv_state_bytes(config, conv_dtype)) / config.num_linear_layers
    per_layer_token = kv_bytes_per_token(config, kv_dtype) / config.num_attention_layers
    return math.ceil(per_layer_state / per_layer_token / alignment) * alignment


@dataclass(frozen=True)
class SequencesThatFit:
    """How many sequences of ``context_len`` tokens fit on a GPU of ``gpu_memory_gb`` GB
    (``sequences_that_fit``): bytes of the weights, and per sequence of its KV (attention layers
    only) and of its fixed state (linear layers; 0 for a transformer)."""

    model: str
    gpu_memory_gb: float
    context_len: int
    weight_bytes: float
    kv_bytes_per_sequence: float
    state_bytes_per_sequence: float
    state_checkpoint_bytes: float
    sequences: int
    weights_fit: bool  # the weights (and checkpoints) leave room for any KV at all

    @property
    def bytes_per_sequence(self) -> float:
        return self.kv_bytes_per_sequence + self.state_bytes_per_sequence


def sequences_that_fit(config: ModelConfig | str, gpu_memory_gb: float, context_len: int, *,
                       dtype: str | torch.dtype = "bf16", kv_dtype: str | torch.dtype | None = None,
                       utilization: float = 1.0, num_state_checkpoints: int = 0,
                       state_dtype: str | torch.dtype = DEFAULT_STATE_DTYPE) -> SequencesThatFit:
    """Sequences of ``context_len`` tokens each that fit on a GPU of ``gpu_memory_gb`` GB (1e9
    bytes, as datasheets count; ``utilization``: the fraction the engine may take) once the
    weights (``dtype``) are loaded: each pays its KV (``kv_dtype or dtype``) and, for a hybrid,
    its fixed state (``state_dtype``); ``num_state_checkpoints`` prefix-cache checkpoints are
    taken first. ``config``: a ``ModelConfig`` or a preset name (``"qwen3.5-9b"``,
    ``"llama-3.1-8b"``...). 0 sequences when not even the weights fit (no error: that is the
    answer)."""
    if isinstance(config, str):
        from .presets import get_preset
        config = get_preset(config)
    if isinstance(context_len, bool) or not isinstance(context_len, int) or context_len < 1:
        raise ValueError(f"context_len debe ser un entero >= 1; se recibió {context_len!r}")
    if isinstance(gpu_memory_gb, bool) or not isinstance(gpu_memory_gb, (int, float)) \
            or not gpu_memory_gb > 0:
        raise ValueError(f"gpu_memory_gb debe ser un número > 0 (GB de 1e9 bytes); se recibió "
                         f"{gpu_memory_gb!r}")
    _check_budget_options(utilization, num_state_checkpoints)
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    w = weight_bytes(config, dtype)
    state = state_bytes_per_sequence(config, state_dtype)
    fits = gpu_memory_gb * 1e9 * utilization > w + num_state_checkpoints * state
    sequences = memory_budget(config, gpu_memory_gb * 1e9, max_len=context_len,
                              utilization=utilization, dtype=dtype, kv_dtype=kv_dtype,
                              state_dtype=state_dtype,
                              num_state_checkpoints=num_state_checkpoints).static_slots if fits else 0
    return SequencesThatFit(config.name, float(gpu_memory_gb), context_len, w,
                            kv_bytes(config, context_len, 1, kv_dtype), state,
                            num_state_checkpoints * state, sequences, fits)
