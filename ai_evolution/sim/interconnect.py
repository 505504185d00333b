"""The interconnect in the cost model: what tensor parallelism (TP) saves and what it pays.

With Megatron-LM's split over ``tp`` GPUs each GPU holds and reads ``1/tp`` of every linear
layer's weights (Q/K/V and gate/up by columns, O and down by rows, the vocabulary projection by
rows of the vocabulary) and of the KV cache (KV heads split; with fewer KV heads than GPUs each
GPU keeps one head, replicated), and does ``1/tp`` of the FLOPs. It pays two all-reduces per
layer (after O and after down), each of ``tokens x hidden x dtype`` bytes. A decode step on
``tp`` GPUs then costs

    t = max(bytes / tp / BW, flops / tp / peak) + 2 x layers x allreduce(tokens x hidden x b) + overhead

    ring all-reduce of m bytes over p GPUs:  allreduce(m) = 2 (p - 1) / p x m / link_BW + latency

(a ring sends and receives ``2 (p - 1) / p x m`` bytes per GPU over links of ``link_BW`` bytes/s
per direction; ``latency`` is the fixed cost of one collective). The all-reduces are not
overlapped with the matmuls (vLLM does not overlap them in decode either), so their time adds.
Bandwidths come from the datasheets (``DeviceSpec.nvlink_bytes_per_s``, ``pcie_bytes_per_s``);
the latency is an ASSUMPTION (``ASSUMED_LATENCY_S``), not a datasheet figure: a lab can replace
it with one fitted on its own machine (``hardware.allreduce.fit_allreduce``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..model import (ModelConfig, allreduce_bytes_per_step, dtype_bytes, kv_bytes_per_token,
                     param_count)
from .cost_model import RooflineCostModel, step_cost

LINKS = ("nvlink", "pcie")
# Fixed cost of one small all-reduce: an assumption of this model (order of magnitude of a
# collective's launch and synchronisation), NOT from a datasheet. Pass latency_s= to change it.
ASSUMED_LATENCY_S = {"nvlink": 5e-6, "pcie": 15e-6}
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of a GPU's memory for weights + KV


@dataclass(frozen=True)
class Interconnect:
    """A link between GPUs: ``bandwidth_bytes_per_s`` per direction, ``latency_s`` per
    collective."""

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float

    def __post_init__(self) -> None:
        if not self.bandwidth_bytes_per_s > 0 or self.latency_s < 0:
            raise ValueError(f"el enlace necesita ancho de banda > 0 y latencia >= 0; se recibió "
                             f"{self.bandwidth_bytes_per_s!r} y {self.latency_s!r}")


def interconnect_of(spec, link: str = "nvlink", latency_s: float | None = None) -> Interconnect:
    """The ``link`` ("nvlink" or "pcie") of a datasheet preset (``hardware.DeviceSpec``)."""
    key = str(link).strip().lower()
    if key not in LINKS:
        raise ValueError(f"enlace desconocido {link!r}; los aceptados son: {', '.join(LINKS)}")
    bw = spec.nvlink_bytes_per_s if key == "nvlink" else spec.pcie_bytes_per_s
    if bw is None:
        have = [k for k in LINKS if getattr(spec, f"{k}_bytes_per_s") is not None]
        raise ValueError(f"{spec.name} no publica ancho de banda {key}; tiene: "
                         f"{', '.join(have) or 'ninguno'}")
    return Interconnect(f"{spec.name} {key}", bw,
                        ASSUMED_LATENCY_S[key] if latency_s is None else latency_s)


def ring_allreduce_s(message_bytes: float, world_size: int, link: Interconnect) -> float:
    """Time of one ring all-reduce of ``message_bytes`` over ``world_size`` GPUs (0 for one)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size debe ser un entero >= 1; se recibió {world_size!r}")
    if message_bytes < 0:
        raise ValueError(f"message_bytes debe ser >= 0; se recibió {message_bytes!r}")
    if world_size == 1:
        return 0.0
    p = world_size
    return 2 * (p - 1) / p * message_bytes / link.bandwidth_bytes_per_s + link.latency_s


def kv_share(config: ModelConfig, tp: int) -> float:
    """Share of the KV cache one GPU holds: ``1/tp``, or ``1/num_kv_heads`` when there are fewer
    KV heads than GPUs (each GPU keeps a whole head, replicated)."""
    return max(1 / tp, 1 / config.num_kv_heads)


def check_tp(config: ModelConfig, tp: int) -> int:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp debe ser un entero >= 1; se recibió {tp!r}")
    if config.num_heads % tp:
        divisors = [d for d in range(1, config.num_heads + 1) if config.num_heads % d == 0]
        raise ValueError(f"tp={tp} no divide las {config.num_heads} cabezas de atención de "
                         f"{config.name}; valores aceptados: {divisors}")
    return tp


@dataclass(frozen=True)
class TPStep:
    """One step on ``tp`` GPUs: per-GPU bytes, FLOPs and memory; compute and communication
    times; whether weights + KV fit in ``GPU_MEMORY_UTILIZATION`` of each GPU's memory."""

    tp: int
    link: str
    num_tokens: int
    weight_bytes_per_gpu: float        # read this step
    kv_bytes_per_gpu: float            # read this step
    flops_per_gpu: float
    memory_per_gpu_bytes: float        # held: all weights / tp + this batch's KV share
    fits: bool
    compute_s: float                   # roofline of one GPU's share (+ overhead)
    allreduce_s: float                 # 2 x layers all-reduces
    allreduce_bytes_per_step: float

    @property
    def step_s(self) -> float:
        return self.compute_s + self.allreduce_s

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.step_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.tp

    @property
    def comm_fraction(self) -> float:
        return self.allreduce_s / self.step_s

    def as_dict(self) -> dict:
        out = dict(self.__dict__)
        out.update(step_s=self.step_s, tokens_per_s=self.tokens_per_s,
                   tokens_per_s_per_gpu=self.tokens_per_s_per_gpu,
                   comm_fraction=self.comm_fraction)
        return out


def tp_step(config: ModelConfig, spec, tp: int, query_lens: Sequence[int],
            context_lens: Sequence[int], link: str = "nvlink", dtype: str = "bf16",
            kv_dtype: str | None = None, latency_s: float | None = None,
            overhead_s: float = 0.0) -> TPStep:
    """A step (``cost_model.step_cost``'s tokens and contexts) on ``tp`` GPUs of the datasheet
    preset ``spec`` linked by ``link``: see the module's docstring. ``tp=1`` is
    ``RooflineCostModel.from_device_spec(spec).roofline_s(step_cost(...)) + overhead_s`` and no
    communication."""
    check_tp(config, tp)
    cost = step_cost(config, query_lens, context_lens, dtype, kv_dtype)
    roof = RooflineCostModel.from_device_spec(spec, dtype)
    share = kv_share(config, tp)
    weight_b, kv_b = cost.weight_bytes / tp, cost.kv_bytes * share
    flops = cost.flops / tp
    compute = max((weight_b + kv_b + cost.state_bytes) / roof.bandwidth_bytes_per_s,
                  flops / roof.peak_flops) + overhead_s
    tokens = sum(query_lens)
    moved = allreduce_bytes_per_step(config, tokens, dtype)
    num_allreduces = 2 * config.num_layers  # after o_proj and after down_proj
    comm = 0.0
    if tp > 1:
        comm = num_allreduces * ring_allreduce_s(
            moved / num_allreduces, tp, interconnect_of(spec, link, latency_s))
    held = (param_count(config) * dtype_bytes(dtype) / tp
            + kv_bytes_per_token(config, dtype if kv_dtype is None else kv_dtype)
            * sum(context_lens) * share)
    return TPStep(tp, link, tokens, weight_b, kv_b, flops, held,
                  held <= GPU_MEMORY_UTILIZATION * spec.memory_bytes, compute, comm,
                  moved)


def tp_decode_step(config: ModelConfig, spec, tp: int, batch_size: int, context_len: int,
                   link: str = "nvlink", **kw) -> TPStep:
    """A decode step: ``batch_size`` sequences each add one token after ``context_len``."""
    return tp_step(config, spec, tp, [1] * batch_size, [context_len + 1] * batch_size, link, **kw)


def tp_sweep(config: ModelConfig, spec, tps: Sequence[int] = (1, 2, 4, 8),
             batch_sizes: Sequence[int] = (1, 8, 32, 128), context_len: int = 2048,
             links: Sequence[str] = LINKS, **kw) -> list[dict]:
    """``tp_decode_step`` for every link, TP and batch size: one dict per combination (the
    ``TPStep`` fields, its times and rates, plus ``batch_size`` and ``context_len``)."""
    rows = []
    for link in links:
        for tp in tps:
            for b in batch_sizes:
                row = tp_decode_step(config, spec, tp, b, context_len, link, **kw).as_dict()
                row.update(batch_size=b, context_len=context_len)
                rows.append(row)
    return rows


def tp_scaling(rows: Sequence[dict]) -> list[dict]:
    """For each (link, batch size) of ``tp_sweep`` rows: the smallest TP whose weights and KV fit
    (``min_tp``), and for every TP that fits its ``speedup`` (step time of ``min_tp`` / its own)
    and ``per_gpu_efficiency`` (its tokens/s per GPU / ``min_tp``'s): TP pays in latency when the
    speedup is above 1, and pays for its GPUs when the efficiency stays near 1. Groups where no
    TP fits are left out."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["link"], r["batch_size"]), []).append(r)
    out = []
    for (link, b), group in groups.items():
        fitting = sorted((r for r in group if r["fits"]), key=lambda r: r["tp"])
        if not fitting:
            continue
        base = fitting[0]
        for r in fitting:
            out.append({"link": link, "batch_size": b, "tp": r["tp"], "min_tp": base["tp"],
                        "step_s": r["step_s"], "comm_fraction": r["comm_fraction"],
                        "speedup": base["step_s"] / r["step_s"],
                        "per_gpu_efficiency": r["tokens_per_s_per_gpu"] / base["tokens_per_s_per_gpu"]})
    return out


__all__ = ["ASSUMED_LATENCY_S", "GPU_MEMORY_UTILIZATION", "Interconnect", "LINKS", "TPStep",
           "allreduce_bytes_per_step", "check_tp", "interconnect_of", "kv_share",
           "ring_allreduce_s", "tp_decode_step", "tp_scaling", "tp_step", "tp_sweep"]
