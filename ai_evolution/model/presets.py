"""Named model configurations, each with the source its numbers were copied from."""

from __future__ import annotations

from .config import ModelConfig
from .shipped_models import SHIPPED_MODELS, shipped_model_dir

_HF = "https://huggingface.co/{}/blob/main/config.json"

_PRESETS: dict[str, ModelConfig] = {
    "llama-2-7b": ModelConfig(
        name="llama-2-7b", model_type="llama", num_layers=32, hidden_size=4096, num_heads=32,
        num_kv_heads=32, intermediate_size=11008, vocab_size=32000, rope_theta=10000.0,
        rms_norm_eps=1e-5, max_position_embeddings=4096,
        source=_HF.format("meta-llama/Llama-2-7b-hf"),
    ),
    "llama-3.1-8b": ModelConfig(
        name="llama-3.1-8b", model_type="llama", num_layers=32, hidden_size=4096, num_heads=32,
        num_kv_heads=8, intermediate_size=14336, vocab_size=128256, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        rms_norm_eps=1e-5, max_position_embeddings=131072,
        source=_HF.format("meta-llama/Llama-3.1-8B"),
    ),
    # Same tokenizer (vocabulary 128256) as Llama 3.1: the draft model of chapter 9's prediction.
    "llama-3.2-1b": ModelConfig(
        name="llama-3.2-1b", model_type="llama", num_layers=16, hidden_size=2048, num_heads=32,
        num_kv_heads=8, head_dim=64, intermediate_size=8192, vocab_size=128256, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=131072,
        source=_HF.format("meta-llama/Llama-3.2-1B"),
    ),
    "llama-3.1-70b": ModelConfig(
        name="llama-3.1-70b", model_type="llama", num_layers=80, hidden_size=8192, num_heads=64,
        num_kv_heads=8, intermediate_size=28672, vocab_size=128256, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        rms_norm_eps=1e-5, max_position_embeddings=131072,
        source=_HF.format("meta-llama/Llama-3.1-70B"),
    ),
    "mistral-7b-v0.3": ModelConfig(
        name="mistral-7b-v0.3", model_type="mistral", num_layers=32, hidden_size=4096,
        num_heads=32, num_kv_heads=8, intermediate_size=14336, vocab_size=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-5, max_position_embeddings=32768,
        source=_HF.format("mistralai/Mistral-7B-v0.3"),
    ),
    "qwen2.5-0.5b": ModelConfig(
        name="qwen2.5-0.5b", model_type="qwen2", num_layers=24, hidden_size=896, num_heads=14,
        num_kv_heads=2, intermediate_size=4864, vocab_size=151936, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=True,
        max_position_embeddings=32768, source=_HF.format("Qwen/Qwen2.5-0.5B"),
    ),
    "qwen3-0.6b": ModelConfig(
        name="qwen3-0.6b", model_type="qwen3", num_layers=28, hidden_size=1024, num_heads=16,
        num_kv_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, qk_norm=True,
        max_position_embeddings=40960, source=_HF.format("Qwen/Qwen3-0.6B"),
    ),
    "smollm2-135m": ModelConfig(
        name="smollm2-135m", model_type="llama", num_layers=30, hidden_size=576, num_heads=9,
        num_kv_heads=3, intermediate_size=1536, vocab_size=49152, rope_theta=100000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=8192,
        source=_HF.format("HuggingFaceTB/SmolLM2-135M"),
    ),
    # Random-weight config whose fp32 weights (~670 MB read per decode step) far exceed a CPU's
    # last-level cache, so that decode on a laptop is bandwidth-bound (see the roofline chapter).
    "cpu-200m": ModelConfig(
        name="cpu-200m", model_type="llama", num_layers=12, hidden_size=1024, num_heads=16,
        num_kv_heads=4, intermediate_size=2816, vocab_size=32000, rms_norm_eps=1e-5,
        max_position_embeddings=4096, source="this project (random weights, shaped like a small Llama)",
    ),
}

def preset_names() -> list[str]:
    return sorted(_PRESETS) + list(SHIPPED_MODELS)


def get_preset(name: str) -> ModelConfig:
    """Return a named configuration; the shipped model's is read from the package data."""
    key = name.lower()
    if key in _PRESETS:
        return _PRESETS[key]
    if key in SHIPPED_MODELS:
        return ModelConfig.from_hf_config(shipped_model_dir(key), name=key).replace(
            source=f"shipped with ai_evolution (ai_evolution/model/shipped/{key})"
        )
    raise KeyError(f"modelo {name!r} desconocido; aceptados: {', '.join(preset_names())}")
