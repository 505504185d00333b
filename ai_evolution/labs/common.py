"""What several labs share, side by side rather than importing each other: the models the
serving labs offer, the chapter 2 worked memory budgets (chapter 4 returns to them), and the
short dtype names of the contracts."""

from __future__ import annotations

import torch

from ..model import MemoryBudget, dtype_bytes, get_preset, memory_budget

# Served by the engine labs (2-6): the shipped trained model, and two presets with random weights.
SERVED_MODELS = ("tiny-es", "smollm2-135m", "cpu-200m")


def dtype_name(model) -> str:
    """The short name (fp32, fp16, bf16) of a model's weights' dtype."""
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[
        next(model.parameters()).dtype]


def worked_examples() -> dict[str, MemoryBudget]:
    """The chapter's worked memory budgets; the chapter and the lab both read them from here."""
    llama2, llama31 = get_preset("llama-2-7b"), get_preset("llama-3.1-8b")
    gpu24 = 24e9                      # a 24 GB consumer GPU
    nominal_7b = 7e9 * dtype_bytes("fp16")  # the back-of-the-envelope "7B x 2 bytes"
    h100, h100_utilization = 85.5e9, 0.92   # memory the runtime sees; fraction the engine takes
    return {
        "gpu24_7b": memory_budget(llama2, gpu24, max_len=4096, typical_len=512, dtype="fp16",
                                  weights_bytes=nominal_7b),
        "gpu24_7b_8kv": memory_budget(llama2.replace(num_kv_heads=8), gpu24, max_len=4096,
                                      typical_len=512, dtype="fp16", weights_bytes=nominal_7b),
        "gpu24_7b_exact": memory_budget(llama2, gpu24, max_len=4096, typical_len=512,
                                        dtype="fp16"),
        "h100_llama31_8b": memory_budget(llama31, h100, max_len=4096,
                                         utilization=h100_utilization, dtype="bf16"),
    }
