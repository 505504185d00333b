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
    # Qwen3.5-9B, the seed article's hybrid: 32 layers, every 4th full attention (8 of 32), the
    # other 24 Gated DeltaNet. The sizes are transformers' Qwen3_5TextConfig defaults, which its
    # docstring calls "the Qwen3.5-9B style configuration" (transformers 5.x,
    # models/qwen3_5/configuration_qwen3_5.py), and reproduce the seed's measured 32 KiB/token
    # and 48 MiB/sequence: hidden 4096, intermediate 12288, 16 query and 4 KV heads of
    # head_dim 256, partial_rotary_factor 0.25, linear layers of 16 key and 32 value heads of
    # dim 128, conv kernel 4, vocabulary 248320, untied head. rope_theta 1e7 and 262144
    # positions are the Qwen3.5 family's published values (they do not enter the memory
    # arithmetic). Source: the text_config of the Hub config.json below (not reachable from the
    # machine this was written on: re-read it before quoting any other field).
    # KV: 2 x 8 x 4 x 256 x 2 B (bf16) = 32 KiB/token; state: 24 x 32 x 128 x 128 x 4 B (f32)
    # = 48 MiB/sequence plus 24 x 8192 x 3 x 4 B = 2,25 MiB of convolution windows.
    "qwen3.5-9b": ModelConfig(
        name="qwen3.5-9b", model_type="qwen3_5_text", num_layers=32, hidden_size=4096,
        num_heads=16, num_kv_heads=4, head_dim=256, intermediate_size=12288, vocab_size=248320,
        rope_theta=10000000.0, partial_rotary_factor=0.25, rms_norm_eps=1e-6,
        tie_word_embeddings=False, qk_norm=True, attn_output_gate=True, zero_centered_norm=True,
        max_position_embeddings=262144,
        layer_types=tuple(
            "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(32)),
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4,
        source=_HF.format("Qwen/Qwen3.5-9B"),
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
