"""Model configurations, memory arithmetic, the decoder and its checkpoints."""

from .config import SUPPORTED_MODEL_TYPES, ModelConfig
from .memory import (MemoryBudget, WeightFormat, allreduce_bytes_per_step,
                     allreduce_bytes_per_token, dtype_bytes, kv_bytes, kv_bytes_per_token,
                     linear_shapes, memory_budget, param_count, parse_weight_format,
                     quantized_weight_bytes, sequences_that_fit, state_bytes_per_sequence,
                     state_page_block_size, weight_bytes)
from .presets import get_preset, preset_names
from .shipped_models import SHIPPED_MODELS, shipped_model_dir, shipped_names

__all__ = [
    "SUPPORTED_MODEL_TYPES", "ModelConfig", "MemoryBudget", "allreduce_bytes_per_step",
    "allreduce_bytes_per_token", "dtype_bytes", "kv_bytes",
    "kv_bytes_per_token", "memory_budget", "param_count", "weight_bytes", "get_preset",
    "preset_names", "SHIPPED_MODELS", "shipped_model_dir", "shipped_names", "WeightFormat",
    "linear_shapes", "parse_weight_format", "quantized_weight_bytes", "state_bytes_per_sequence",
    "sequences_that_fit", "state_page_block_size",
]

# The decoder and its checkpoints (imported last: checkpoint.py imports the modules above).
from .checkpoint import (CheckpointError, load_model, load_pretrained, random_model,  # noqa: E402
                         save_pretrained)
from .decoder import Transformer  # noqa: E402

__all__ += ["CheckpointError", "load_model", "load_pretrained", "random_model", "save_pretrained", "Transformer"]
from .tokenizer import Tokenizer, load_tokenizer  # noqa: E402

__all__ += ["Tokenizer", "load_tokenizer"]
from .quant import QuantizedLinear, quantize_model  # noqa: E402

__all__ += ["QuantizedLinear", "quantize_model"]
