"""Roofline cost of one model step: bytes moved, FLOPs done, and the time they set.

A step runs some sequences forward by a few tokens each: a decode adds 1 token, a prefill chunk
adds many. Its cost on a machine with bandwidth ``BW`` (bytes/s) and peak ``P`` (FLOP/s) is

    t = max(bytes / BW, flops / P) + overhead + overhead_per_seq x sequences

where *bytes* are the weights read once per step (shared by every sequence in the batch) plus each
sequence's KV cache, and *flops* are 2 per matmul weight per token plus attention. ``overhead``
is what a real engine adds on top (kernel launches, Python), fitted to a measured step; the
optional per-sequence term is the bookkeeping an engine does for each request in the batch.

    weights read per step (untied embeddings)        weights read per step (tied)
    +-------------------+--------------+             +-------------------------------+
    | layers + lm_head  | 1 embed row  |             | layers + whole table (lm_head)|
    +-------------------+--------------+             +-------------------------------+

NOTE: the embedding table is gathered, not multiplied: a step reads one row per token, not the
table, unless the table is tied to the lm_head, whose matmul reads all of it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import torch

from ..model import ModelConfig, dtype_bytes, kv_bytes_per_token, param_count
from ..model.memory import (WeightFormat, linear_shapes, quantized_weight_bytes,
                            state_bytes_per_sequence, unquantized_params)


def matmul_params(config: ModelConfig) -> int:
    """Weights that take part in a matmul for every token: every linear layer (attention or
    linear-attention projections, MLP) and lm_head."""
    total = config.__dict__.get("_matmul_params")  # computed once per (frozen) config
    if total is None:
        total = sum(o * k for _, o, k in linear_shapes(config))
        object.__setattr__(config, "_matmul_params", total)
    return total


def state_flops_per_token(config: ModelConfig) -> float:
    """FLOPs of a hybrid's linear layers beyond their projections, per token: the convolution
    (2 x kernel per channel) and the delta-rule update of each ``Dk x Dv`` state (decay, read,
    rank-one write, output read: about 7 per element). 0 for a plain transformer."""
    if not config.is_hybrid:
        return 0.0
    state = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim
    conv = 2 * config.linear_conv_kernel_dim * config.linear_conv_dim
    return config.num_linear_layers * (7 * state + conv)


def weight_bytes_read(config: ModelConfig, dtype: str | torch.dtype = "bf16",
                      num_tokens: int = 1, *,
                      weight_format: str | WeightFormat | None = None) -> float:
    """Weight bytes one step reads: every weight once, but only ``num_tokens`` embedding rows.

    ``weight_format`` (``"int8"``, ``"int4-g128"``, ``"int4-asym-g64"``...): the linear weights
    (lm_head included, even when tied) are read in that format with their scales (and zeros) at
    ``dtype``; the embedding rows, norms and biases stay at ``dtype``. See
    ``model.memory.parse_weight_format``.
    """
    b = dtype_bytes(dtype)
    if weight_format is not None:
        return (quantized_weight_bytes(config, weight_format, dtype)
                + (unquantized_params(config) + num_tokens * config.hidden_size) * b)
    table = config.vocab_size * config.hidden_size
    weights = param_count(config) - (0 if config.tie_word_embeddings else table)
    return (weights + num_tokens * config.hidden_size) * b


@dataclass(frozen=True)
class StepCost:
    flops: float
    weight_bytes: float
    kv_bytes: float
    num_seqs: int = 1
    state_bytes: float = 0.0  # a hybrid's per-sequence state, read and written back

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes + self.state_bytes

    @property
    def intensity(self) -> float:
        """FLOP per byte moved."""
        return self.flops / self.bytes


def step_cost(config: ModelConfig, query_lens: Sequence[int], context_lens: Sequence[int],
              dtype: str | torch.dtype = "bf16",
              kv_dtype: str | torch.dtype | None = None, *,
              weight_format: str | WeightFormat | None = None,
              num_state_copies: int = 0) -> StepCost:
    """Cost of one step that adds ``query_lens[i]`` tokens to sequence ``i``, which then holds
    ``context_lens[i]`` tokens (so ``context_lens[i] >= query_lens[i]``). ``weight_format``: the
    linear weights are quantized (``weight_bytes_read``); FLOPs are the same.

    Attention: each new token at position p scores against p+1 keys and mixes p+1 values, i.e.
    4 x heads x head_dim x (p+1) FLOPs per attention layer. KV bytes: each sequence's whole cache
    read once. A hybrid's linear layers add ``state_flops_per_token`` per token and read and write
    each sequence's state once per step (float32, ``state_bytes_per_sequence``), whatever its
    length; ``num_state_copies`` whole states more are read and written: prefix caching's
    checkpoints saved and restored in the step (``engine.state_slots``).
    """
    if len(query_lens) != len(context_lens) or not query_lens:
        raise ValueError("query_lens y context_lens no pueden estar vacías y deben tener la misma longitud")
    for q, c in zip(query_lens, context_lens):
        if q < 1 or c < q:
            raise ValueError(f"cada paso añade >= 1 token a un contexto que los contiene (1 <= q <= c); "
                             f"se recibió q={q}, c={c}")
    tokens = sum(query_lens)
    attended = sum(q * (c - q) + q * (q + 1) // 2 for q, c in zip(query_lens, context_lens))
    attn_flops = 4 * config.num_attention_layers * config.num_heads * config.head_dim * attended
    kv_b = kv_bytes_per_token(config, dtype if kv_dtype is None else kv_dtype) * sum(context_lens)
    return StepCost(flops=2 * matmul_params(config) * tokens + attn_flops
                    + state_flops_per_token(config) * tokens,
                    weight_bytes=weight_bytes_read(config, dtype, tokens,
                                                   weight_format=weight_format), kv_bytes=kv_b,
                    num_seqs=len(query_lens),
                    state_bytes=2 * state_bytes_per_sequence(config)
                    * (len(query_lens) + num_state_copies))


def decode_step_cost(config: ModelConfig, batch_size: int = 1, context_len: int = 0,
                     dtype: str | torch.dtype = "bf16",
                     kv_dtype: str | torch.dtype | None = None, *,
                     weight_format: str | WeightFormat | None = None) -> StepCost:
    """One decode step: ``batch_size`` sequences each add one token after ``context_len`` tokens
    (``weight_format``: quantized linear weights, as ``step_cost``)."""
    return step_cost(config, [1] * batch_size, [context_len + 1] * batch_size, dtype, kv_dtype,
                     weight_format=weight_format)


def arithmetic_intensity(flops: float, n_bytes: float) -> float:
    """FLOP per byte."""
    return flops / n_bytes


def ridge_point(peak_flops: float, bandwidth_bytes_per_s: float) -> float:
    """The intensity (FLOP/byte) above which a kernel is compute-bound on this machine."""
    return peak_flops / bandwidth_bytes_per_s


def time_floor_s(n_bytes: float, bandwidth_bytes_per_s: float) -> float:
    """The least time moving ``n_bytes`` can take: the bandwidth floor."""
    return n_bytes / bandwidth_bytes_per_s


def efficiency(floor_s: float, measured_s: float) -> float:
    """Fraction of the roofline achieved: floor / measured (1.0 = at the roofline)."""
    return floor_s / measured_s


@dataclass(frozen=True)
class RooflineCostModel:
    """``t = max(bytes / bandwidth, flops / peak) + overhead + overhead_per_seq x sequences``."""

    bandwidth_bytes_per_s: float
    peak_flops: float
    overhead_s: float = 0.0
    name: str = ""
    overhead_per_seq_s: float = 0.0

    def __post_init__(self) -> None:
        if (self.bandwidth_bytes_per_s <= 0 or self.peak_flops <= 0 or self.overhead_s < 0
                or self.overhead_per_seq_s < 0):
            raise ValueError(f"el ancho de banda y el pico deben ser > 0 y las sobrecargas "
                             f"(overhead_s, overhead_per_seq_s) >= 0; se recibió "
                             f"{self.bandwidth_bytes_per_s}, {self.peak_flops}, {self.overhead_s}, "
                             f"{self.overhead_per_seq_s}")

    @classmethod
    def from_device_spec(cls, spec, dtype: str = "bf16") -> "RooflineCostModel":
        """From a datasheet preset (``ai_evolution.hardware.DeviceSpec``)."""
        if dtype not in spec.peak_flops:
            raise ValueError(f"{spec.name} no tiene un pico publicado para {dtype!r}; "
                             f"disponibles: {', '.join(spec.peak_flops)}")
        return cls(spec.bandwidth_bytes_per_s, spec.peak_flops[dtype], name=spec.name)

    @property
    def ridge_point(self) -> float:
        return ridge_point(self.peak_flops, self.bandwidth_bytes_per_s)

    def roofline_s(self, cost: StepCost) -> float:
        return max(cost.bytes / self.bandwidth_bytes_per_s, cost.flops / self.peak_flops)

    def step_time_s(self, cost: StepCost) -> float:
        return self.roofline_s(cost) + self.overhead_s + self.overhead_per_seq_s * cost.num_seqs

    def calibrated(self, cost: StepCost, measured_s: float) -> "RooflineCostModel":
        """The same machine with ``overhead`` fitted so that ``cost`` takes ``measured_s``.

        A measurement faster than the roofline (a cache-resident model, or an optimistic
        bandwidth) gives zero overhead rather than a negative one.
        """
        extra = self.overhead_per_seq_s * cost.num_seqs
        return replace(self, overhead_s=max(0.0, measured_s - self.roofline_s(cost) - extra))


def departure_batch(batch_sizes: Sequence[int], measured_s: Sequence[float],
                    predicted_s: Sequence[float], tolerance: float) -> int | None:
    """The first batch size whose measured step exceeds the prediction by more than ``tolerance``,
    relative: ``measured > predicted x (1 + tolerance)`` (strictly); None if none does.

    Later points do not matter: a curve that departs and then dips back within the tolerance
    still departed at its first excess. ``batch_sizes`` must be sorted ascending and the three
    sequences of the same length; ``tolerance >= 0``. Raises ValueError otherwise.
    """
    batch_sizes = list(batch_sizes)
    if not len(batch_sizes) == len(measured_s) == len(predicted_s):
        raise ValueError(f"batch_sizes, measured_s y predicted_s deben tener la misma longitud; "
                         f"tienen {len(batch_sizes)}, {len(measured_s)} y {len(predicted_s)}.")
    if batch_sizes != sorted(batch_sizes):
        raise ValueError(f"batch_sizes debe estar ordenada de menor a mayor; se recibió "
                         f"{batch_sizes}.")
    if tolerance < 0:
        raise ValueError(f"la tolerancia debe ser >= 0; se recibió {tolerance}.")
    for b, m, p in zip(batch_sizes, measured_s, predicted_s):
        if m > p * (1 + tolerance):
            return int(b)
    return None


def _nonneg_two(design: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Least squares ``y ~ design @ (a, b)`` with ``a, b >= 0`` (two columns: try the free
    solution, then each column alone, then nothing; keep the best feasible one)."""
    best, best_res = (0.0, 0.0), float((y**2).sum())
    candidates = [((0, 1), torch.linalg.lstsq(design, y).solution)]
    for col in (0, 1):
        x = design[:, col]
        denom = float((x * x).sum())
        coef = float((x * y).sum()) / denom if denom > 0 else 0.0
        full = torch.zeros(2, dtype=design.dtype)
        full[col] = coef
        candidates.append(((col,), full))
    for _, coef in candidates:
        a, b = float(coef[0]), float(coef[1])
        if a < 0 or b < 0:
            continue
        res = float(((design @ torch.tensor([a, b], dtype=design.dtype) - y) ** 2).sum())
        if res < best_res:
            best, best_res = (a, b), res
    return best


def fit_cost_model(costs: Sequence[StepCost], measured_s: Sequence[float],
                   bandwidth_bytes_per_s: float, name: str = "calibrated",
                   errors: str = "relative") -> RooflineCostModel:
    """Fit an *effective* ``peak`` and the two overheads to measured steps, bandwidth fixed.

    For each candidate peak on a log grid (10^6..10^16 FLOP/s), ``overhead`` and
    ``overhead_per_seq`` come from a non-negative least-squares fit of ``measured - roofline``
    against the number of sequences; the candidate with the smallest root-mean-square error wins.
    ``errors="relative"`` (default) weighs every step's relative error alike (the shape of the
    curve); ``"absolute"`` weighs its error in seconds, so long steps count more and the fit
    matches the total time of the steps (what a workload's duration adds up). On a CPU, where
    decode-shaped matmuls of 8-32 rows cost far more per byte than one row, the fitted peak is
    what lets the model follow the batching curve: a property of this machine and these shapes,
    not a datasheet number.
    """
    if errors not in ("relative", "absolute"):
        raise ValueError(f"errors debe ser 'relative' o 'absolute'; se recibió {errors!r}")
    if len(costs) != len(measured_s) or not costs:
        raise ValueError("costs y measured_s no pueden estar vacías y deben tener la misma longitud")
    measured = torch.tensor(list(measured_s), dtype=torch.float64)
    bad = measured[~(torch.isfinite(measured) & (measured > 0))]
    if len(bad):
        raise ValueError(f"los tiempos de paso medidos deben ser finitos y > 0; se recibió "
                         f"{float(bad[0])!r} ({len(bad)} de {len(measured)} no lo son)")
    seqs = torch.tensor([float(c.num_seqs) for c in costs], dtype=torch.float64)
    w = 1 / measured if errors == "relative" else torch.full_like(measured, 1 / float(measured.mean()))
    design = torch.stack([torch.ones_like(seqs), seqs], dim=1) * w[:, None]
    one_size = len(set(seqs.tolist())) == 1
    best = None
    for peak in torch.logspace(6, 16, 401, dtype=torch.float64).tolist():
        roof = torch.tensor([max(c.bytes / bandwidth_bytes_per_s, c.flops / peak) for c in costs],
                            dtype=torch.float64)
        if one_size:  # one batch size: the two overheads are one number
            fixed, per_seq = max(0.0, float(((measured - roof) * w * w).sum() / (w * w).sum())), 0.0
        else:
            fixed, per_seq = _nonneg_two(design, (measured - roof) * w)
        err = float((((roof + fixed + per_seq * seqs - measured) * w) ** 2).mean().sqrt())
        if best is None or err < best[0]:
            best = (err, peak, fixed, per_seq)
    return RooflineCostModel(bandwidth_bytes_per_s, best[1], best[2], name=name,
                             overhead_per_seq_s=best[3])


# The speculation economics (chapter 9) live in ``sim/speculation.py``; their names stay importable
# from here (imported last: that module builds on the step cost above).
from .speculation import (SPECULATION_DEVICE, SPECULATION_DRAFT, SPECULATION_TARGET,  # noqa: E402
                          SpeculativeStep, best_k, break_even_batch,
                          expected_tokens_per_step, predict_speculation_h100, speculation_vs_batch,
                          speculative_speedup, speculative_step)
