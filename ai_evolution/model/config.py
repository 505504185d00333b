"""Model configuration: the numbers that decide a decoder's memory and compute.

Field names follow the serving vocabulary (``num_layers``, ``num_kv_heads``) rather than Hugging
Face's (``num_hidden_layers``, ``num_key_value_heads``); ``ModelConfig.from_hf_config`` maps one
onto the other for the Llama, Mistral, Qwen2 and Qwen3 families.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_5_text")
SUPPORTED_ACTIVATIONS = ("silu", "swish")  # SwiGLU: silu(gate) * up
# Token mixers a layer can have: softmax attention over a KV cache, or Gated DeltaNet linear
# attention over a fixed-size state (Hugging Face's ``layer_types`` values).
LAYER_TYPES = ("full_attention", "linear_attention")
_LINEAR_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                  "linear_value_head_dim", "linear_conv_kernel_dim")
# A hybrid's config.json (Qwen3.5) wraps the decoder's under text_config; these are its types.
_HYBRID_WRAPPERS = ("qwen3_5",)


@dataclass(frozen=True)
class ModelConfig:
    """A Llama/Qwen-family decoder-only transformer.

    ``head_dim`` is explicit because some families (Qwen3) do not use hidden_size / num_heads.
    ``attention_bias`` puts a bias on the q, k and v projections; ``o_proj_bias`` on the output
    projection (Llama's ``attention_bias`` sets both; Qwen2 has the first without the second).
    ``qk_norm`` is Qwen3's per-head RMSNorm on queries and keys before RoPE.

    Hybrid decoders (Qwen3.5, ``model_type="qwen3_5_text"``): ``layer_types`` names each
    layer's token mixer, ``"full_attention"`` or ``"linear_attention"`` (Gated DeltaNet, sized by
    the ``linear_*`` fields); None means every layer is full attention (a plain transformer).
    Their attention layers rotate only ``partial_rotary_factor`` of each head's dimensions,
    multiply their output by a sigmoid gate (``attn_output_gate``: ``q_proj`` then yields the
    queries and the gate), and their RMSNorms scale by ``1 + weight`` (``zero_centered_norm``).
    """

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    head_dim: int | None = None
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    o_proj_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 4096
    model_type: str = "llama"
    name: str = "custom"
    source: str = ""
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    layer_types: tuple[str, ...] | None = None
    partial_rotary_factor: float = 1.0
    attn_output_gate: bool = False
    zero_centered_norm: bool = False
    linear_num_key_heads: int | None = None
    linear_num_value_heads: int | None = None
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    linear_conv_kernel_dim: int | None = None

    def __post_init__(self) -> None:
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ValueError(
                    f"hidden_size={self.hidden_size} no es divisible entre num_heads={self.num_heads}; "
                    "indique head_dim explícitamente"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads",
                     "intermediate_size", "vocab_size", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} debe ser un entero positivo; se recibió {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} debe ser múltiplo de num_kv_heads={self.num_kv_heads} "
                "(la atención con consultas agrupadas comparte cada cabeza KV entre un grupo entero de "
                "cabezas de consulta)"
            )
        for name in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} debe ser un número finito > 0; se recibió {value!r}")
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type={self.model_type!r} no está soportado; soportados: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        self._check_layer_types()
        factor = self.partial_rotary_factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
            raise ValueError(f"partial_rotary_factor debe estar en (0, 1]; se recibió {factor!r}")
        rotary = int(self.head_dim * factor)
        if rotary < 2 or rotary % 2:
            raise ValueError(
                f"partial_rotary_factor={factor} deja {rotary} dimensiones rotadas de head_dim="
                f"{self.head_dim}; RoPE gira pares de dimensiones: hacen falta un número par >= 2")

    def _check_layer_types(self) -> None:
        if self.layer_types is None:
            return
        if isinstance(self.layer_types, str) or not isinstance(self.layer_types, (list, tuple)):
            raise ValueError(f"layer_types debe ser una lista con un tipo por capa ("
                             f"{', '.join(LAYER_TYPES)}); se recibió {self.layer_types!r}")
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if len(self.layer_types) != self.num_layers:
            raise ValueError(f"layer_types tiene {len(self.layer_types)} entradas pero num_layers="
                             f"{self.num_layers}: hace falta un tipo por capa")
        for i, kind in enumerate(self.layer_types):
            if kind not in LAYER_TYPES:
                raise ValueError(f"layer_types[{i}]={kind!r} no es un tipo de capa conocido; "
                                 f"aceptados: {', '.join(LAYER_TYPES)}")
        if "linear_attention" not in self.layer_types:
            return
        for name in _LINEAR_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} debe ser un entero positivo en un modelo con capas "
                                 f"linear_attention; se recibió {value!r}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(
                f"linear_num_value_heads={self.linear_num_value_heads} debe ser múltiplo de "
                f"linear_num_key_heads={self.linear_num_key_heads} (cada cabeza de clave y consulta "
                "sirve a un grupo entero de cabezas de valor)")

    @property
    def q_per_kv(self) -> int:
        """Query heads that share one KV head (1 = MHA, num_heads = MQA)."""
        return self.num_heads // self.num_kv_heads

    # --- layer types (hybrid decoders) -------------------------------------------------------
    # Cached per instance (the config is frozen): the simulator asks for them at every step.
    @functools.cached_property
    def layer_kinds(self) -> tuple[str, ...]:
        """The token mixer of every layer (``layer_types``, or all ``"full_attention"``)."""
        return self.layer_types or ("full_attention",) * self.num_layers

    @functools.cached_property
    def attention_layer_ids(self) -> tuple[int, ...]:
        """Indices of the full-attention layers: the only ones with a KV cache."""
        return tuple(i for i, kind in enumerate(self.layer_kinds) if kind == "full_attention")

    @property
    def num_attention_layers(self) -> int:
        return len(self.attention_layer_ids)

    @property
    def num_linear_layers(self) -> int:
        return self.num_layers - self.num_attention_layers

    @property
    def is_hybrid(self) -> bool:
        """Whether any layer is linear attention (a fixed state per sequence)."""
        return self.num_linear_layers > 0

    @property
    def rotary_dim(self) -> int:
        """Dimensions of each attention head that RoPE rotates (the rest pass through)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_conv_dim(self) -> int:
        """Channels of a linear layer's convolution: its queries, keys and values."""
        return (2 * self.linear_num_key_heads * self.linear_key_head_dim
                + self.linear_num_value_heads * self.linear_value_head_dim)

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # --- Hugging Face config.json -------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, hf: dict[str, Any] | str | Path, name: str | None = None) -> "ModelConfig":
        """Read a Hugging Face ``config.json`` (a dict, or a path to the file or its folder)."""
        if not isinstance(hf, dict):
            path = Path(hf)
            if path.is_dir():
                path = path / "config.json"
            if not path.exists():
                raise FileNotFoundError(f"no se encuentra config.json: {path}")
            hf = json.loads(path.read_text())
            name = name or path.parent.name
            if not isinstance(hf, dict):
                raise ValueError(f"{path} debe contener un objeto JSON (claves como model_type, "
                                 f"hidden_size...); contiene un {type(hf).__name__}")
        if hf.get("model_type") in _HYBRID_WRAPPERS and isinstance(hf.get("text_config"), dict):
            hf = {"model_type": f"{hf['model_type']}_text", **hf["text_config"]}
        model_type = hf.get("model_type")
        act = hf.get("hidden_act", hf.get("hidden_activation", "silu"))
        if act not in SUPPORTED_ACTIVATIONS:
            raise ValueError(f"hidden_act={act!r} no está soportada en config.json: este decodificador "
                             f"usa SwiGLU; aceptadas: {', '.join(SUPPORTED_ACTIVATIONS)}")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type {model_type!r} de config.json no está soportado; model_type soportados: "
                f"{', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        # transformers >= 5 writes RoPE settings under rope_parameters; older files at top level.
        rope = dict(hf.get("rope_parameters") or {})
        rope_theta = float(rope.pop("rope_theta", hf.get("rope_theta", 10000.0)))
        hybrid = model_type == "qwen3_5_text"
        # Qwen3.5 keeps its partial rotation (and its multimodal sections, which for text reduce
        # to plain RoPE) under rope_parameters.
        partial = float(rope.pop("partial_rotary_factor",
                                 hf.get("partial_rotary_factor", 0.25 if hybrid else 1.0)))
        for key in ("mrope_section", "mrope_interleaved"):
            rope.pop(key, None)
        rope_scaling = hf.get("rope_scaling") or (rope if rope else None)
        if rope_scaling is not None:
            rope_scaling = dict(rope_scaling)
            rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
            rope_scaling = None if rope_type == "default" else {**rope_scaling, "rope_type": rope_type}
        bias = bool(hf.get("attention_bias", False))
        if model_type == "qwen2":
            qkv_bias, o_bias = True, False
        else:
            qkv_bias, o_bias = bias, bias
        eos = hf.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        return cls(
            num_layers=int(hf["num_hidden_layers"]),
            hidden_size=int(hf["hidden_size"]),
            num_heads=int(hf["num_attention_heads"]),
            num_kv_heads=int(hf.get("num_key_value_heads") or hf["num_attention_heads"]),
            intermediate_size=int(hf["intermediate_size"]),
            vocab_size=int(hf["vocab_size"]),
            head_dim=hf.get("head_dim"),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=qkv_bias,
            o_proj_bias=o_bias,
            qk_norm=model_type in ("qwen3", "qwen3_5_text"),
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            model_type=model_type,
            name=name or hf.get("_name_or_path") or model_type,
            source="config.json",
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=eos,
            partial_rotary_factor=partial,
            **(cls._hybrid_fields(hf) if hybrid else {}),
        )

    @staticmethod
    def _hybrid_fields(hf: dict[str, Any]) -> dict[str, Any]:
        """The Qwen3.5 fields of a ``config.json``: layer types (Hugging Face's default, every
        ``full_attention_interval``-th layer full attention, when the list is absent) and the
        linear layers' sizes."""
        layer_types = hf.get("layer_types")
        if layer_types is None:
            interval = int(hf.get("full_attention_interval", 4))
            layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                           for i in range(int(hf["num_hidden_layers"]))]
        return {"layer_types": tuple(layer_types), "attn_output_gate": True,
                "zero_centered_norm": True,
                **{name: hf.get(name) for name in _LINEAR_FIELDS}}

    def to_hf_config(self) -> dict[str, Any]:
        """The inverse of ``from_hf_config``: a ``config.json`` dict that transformers can load."""
        arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                "qwen3_5_text": "Qwen3_5ForCausalLM"}[self.model_type]
        hf: dict[str, Any] = {
            "architectures": [arch],
            "model_type": self.model_type,
            "num_hidden_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "torch_dtype": "float32",
        }
        if self.rope_scaling:
            hf["rope_scaling"] = dict(self.rope_scaling)
        if self.model_type == "qwen3_5_text":
            del hf["rope_theta"]
            hf["rope_parameters"] = {"rope_type": "default", "rope_theta": self.rope_theta,
                                     "partial_rotary_factor": self.partial_rotary_factor,
                                     **(self.rope_scaling or {})}
            hf["layer_types"] = list(self.layer_kinds)
            hf.update({name: getattr(self, name) for name in _LINEAR_FIELDS})
        if self.bos_token_id is not None:
            hf["bos_token_id"] = self.bos_token_id
        if self.eos_token_id is not None:
            hf["eos_token_id"] = self.eos_token_id
        return hf
