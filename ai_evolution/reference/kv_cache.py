"""Reference answer of the KV-cache lab (chapter 2): how many sequences fit in one GPU."""

from __future__ import annotations

import math

from ..model import ModelConfig, kv_bytes_per_token, weight_bytes


def reference_sequences_that_fit(config: ModelConfig, gpu_memory_bytes: float, utilization: float,
                                 activation_bytes: float, weight_dtype: str, kv_dtype: str,
                                 block_size: int, context_len: int) -> dict:
    """How many sequences of ``context_len`` tokens fit in one GPU, the way a serving engine
    sizes its KV cache:

    - ``kv_budget_bytes``: ``utilization`` x the memory, minus the weights (in ``weight_dtype``)
      and the activation reserve; 0 when nothing is left;
    - ``num_blocks``: whole blocks of ``block_size`` tokens (KV in ``kv_dtype``) in that budget;
    - ``max_tokens``: the tokens those blocks hold;
    - ``sequences``: sequences that each reserve the blocks their ``context_len`` tokens need
      (a partly used block counts whole).
    """
    budget = gpu_memory_bytes * utilization - weight_bytes(config, weight_dtype) - activation_bytes
    if budget <= 0:
        return {"kv_budget_bytes": 0.0, "num_blocks": 0, "max_tokens": 0, "sequences": 0}
    blocks = math.floor(budget / (kv_bytes_per_token(config, kv_dtype) * block_size))
    return {"kv_budget_bytes": budget, "num_blocks": blocks, "max_tokens": blocks * block_size,
            "sequences": blocks // math.ceil(context_len / block_size)}

