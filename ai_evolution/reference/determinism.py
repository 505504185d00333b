"""Reference answers of the determinism lab (chapter 10): a batch-invariant matmul, the
comparison of one request's run alone and inside a batch, and the split-K sum of the challenge."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor


def reference_invariant_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)`` (``x`` ``[M, K]``) with every row through the kernel in the
    same shape, ``[1, K]``: row ``i``'s bits do not depend on ``M`` nor on the other rows."""
    if x.shape[0] == 0:
        return F.linear(x, weight, bias)
    return torch.cat([F.linear(x[i:i + 1], weight, bias) for i in range(x.shape[0])])


def reference_compare_runs(solo_tokens, solo_logits: Tensor, batch_tokens,
                           batch_logits: Tensor) -> dict:
    """One request's greedy run alone and inside a batch (token ids, and the ``[steps, V]`` logits
    each token was chosen from) -> ``{"first_token_step", "first_logit_step", "max_abs_diff"}``.

    ``first_token_step``: the first step whose token differs (a shorter run that is a prefix of the
    other differs at its end), None if the runs are equal. The logits are comparable only while
    both runs have the same prefix: at the steps up to ``first_token_step`` included (all of them if
    the tokens never differ). ``first_logit_step``: the first of those steps whose logit row is not
    equal bit for bit (None if none); ``max_abs_diff``: the largest absolute difference over them
    (0.0 if they are equal)."""
    a, b = [int(t) for t in solo_tokens], [int(t) for t in batch_tokens]
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                 None if len(a) == len(b) else min(len(a), len(b)))
    n = min(len(a), len(b), solo_logits.shape[0], batch_logits.shape[0])
    if first is not None:
        n = min(n, first + 1)
    sa, sb = solo_logits[:n].float(), batch_logits[:n].float()
    rows = [i for i in range(n) if not torch.equal(sa[i], sb[i])]
    return {"first_token_step": first, "first_logit_step": rows[0] if rows else None,
            "max_abs_diff": float((sa - sb).abs().max()) if n else 0.0}


def reference_split_sum(values, split: int) -> float:
    """The sum of ``values`` in float32 as a split-K kernel does it: chunks of ``split``
    consecutive values, each summed from left to right, then the chunks' partial sums added from
    left to right. Every addition is one IEEE float32 addition, so the result is the same on any
    machine."""
    v = np.asarray(values, dtype=np.float32)
    total = np.float32(0.0)
    for start in range(0, len(v), split):
        part = np.float32(0.0)
        for x in v[start:start + split]:
            part = np.float32(part + x)
        total = np.float32(total + part)
    return float(total)
