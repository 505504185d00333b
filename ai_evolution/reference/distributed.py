"""Reference answers of the distributed lab (chapter 13): Megatron's split of one linear layer,
the bytes a tensor-parallel step all-reduces, and the prefix-affinity routing rule."""

from __future__ import annotations

from typing import Mapping, Sequence

from torch import Tensor

from ..model.memory import allreduce_bytes_per_step
from ..router.policies import affinity_choice

MODES = ("column", "row")


def reference_shard_linear(weight: Tensor, rank: int, n: int, mode: str) -> Tensor:
    """Rank ``rank``'s piece of a linear layer's ``weight`` (``[out_features, in_features]``, as
    ``nn.Linear`` stores it) split over ``n`` ranks: ``"column"`` (column-parallel) keeps the
    rank's contiguous ``out_features / n`` rows (its output features), ``"row"``
    (row-parallel) its contiguous ``in_features / n`` columns (its input features). A copy, in
    rank order."""
    if mode not in MODES:
        raise ValueError(f"mode debe ser uno de {', '.join(MODES)}; se recibió {mode!r}")
    dim = 0 if mode == "column" else 1
    size = weight.shape[dim] // n
    return weight.narrow(dim, rank * size, size).clone()


def reference_allreduce_bytes(config, num_tokens: int, dtype_bytes: float) -> float:
    """Bytes a tensor-parallel step of ``num_tokens`` tokens all-reduces: two all-reduces per
    layer (after the attention output and after the MLP's down projection), each of
    ``num_tokens x hidden_size`` values of ``dtype_bytes`` bytes."""
    return allreduce_bytes_per_step(config, num_tokens, "fp32") / 4 * dtype_bytes


def reference_affinity_choice(prefix: Sequence, owners: Mapping, loads: Sequence[int],
                              candidates: Sequence[int], max_imbalance: int) -> int:
    """The prefix-affinity rule (``router.policies.PrefixAffinity``): the candidate that last
    served the longest leading run of ``prefix`` (``owners``: block hash -> replica); no such
    candidate -> the least-loaded candidate (lowest index on a tie); and if the owner has more
    than ``max_imbalance`` outstanding requests above the least-loaded candidate, the
    least-loaded one."""
    return affinity_choice(list(prefix), dict(owners), list(loads), list(candidates),
                           max_imbalance).index
