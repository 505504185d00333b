"""Model configuration: the numbers that decide a decoder's memory and compute.

Field names follow the serving vocabulary (``num_layers``, ``num_kv_heads``) rather than Hugging
Face's (``num_hidden_layers``, ``num_key_value_heads``); ``ModelConfig.from_hf_config`` maps one
onto the other for the Llama, Mistral, Qwen2 and Qwen3 families.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_ACTIVATIONS = ("silu", "swish")  # SwiGLU: silu(gate) * up


@dataclass(frozen=True)
class ModelConfig:
    """A Llama/Qwen-family decoder-only transformer.

    ``head_dim`` is explicit because some families (Qwen3) do not use hidden_size / num_heads.
    ``attention_bias`` puts a bias on the q, k and v projections; ``o_proj_bias`` on the output
    projection (Llama's ``attention_bias`` sets both; Qwen2 has the first without the second).
    ``qk_norm`` is Qwen3's per-head RMSNorm on queries and keys before RoPE.
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

    @property
    def q_per_kv(self) -> int:
        """Query heads that share one KV head (1 = MHA, num_heads = MQA)."""
        return self.num_heads // self.num_kv_heads

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
            qk_norm=model_type == "qwen3",
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            model_type=model_type,
            name=name or hf.get("_name_or_path") or model_type,
            source="config.json",
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=eos,
        )

    def to_hf_config(self) -> dict[str, Any]:
        """The inverse of ``from_hf_config``: a ``config.json`` dict that transformers can load."""
        arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[self.model_type]
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
        if self.bos_token_id is not None:
            hf["bos_token_id"] = self.bos_token_id
        if self.eos_token_id is not None:
            hf["eos_token_id"] = self.eos_token_id
        return hf
