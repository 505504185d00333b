"""Reference answers of the memory-roofline lab (chapter 1): the bytes, FLOPs and floor of a
decode step, the time of a step on the roofline, and where a measured batching curve leaves its
calibrated prediction."""

from __future__ import annotations

from ..model import ModelConfig
from ..sim import RooflineCostModel, StepCost, decode_step_cost, ridge_point, time_floor_s
from ..sim import departure_batch as departure_from_prediction


def reference_decode_roofline(config: ModelConfig, dtype: str, batch_size: int, context_len: int,
                              bandwidth_bytes_per_s: float) -> dict:
    """The roofline of one decode step: ``batch_size`` sequences each add one token after
    ``context_len`` tokens, weights and KV cache stored at ``dtype``.

    - ``bytes``: every weight read once per step (shared by the whole batch), but only one
      embedding row per token (the table is gathered, not multiplied; a tied table is read whole
      as the lm_head, plus the gathered rows), plus the KV cache of every sequence: its
      ``context_len + 1`` positions (the new token attends to itself too);
    - ``flops``: 2 per matmul weight per token, plus attention (4 x layers x heads x head_dim
      per attended position);
    - ``intensity``: flops / bytes (FLOP per byte);
    - ``floor_s``: bytes / bandwidth, the least time the step can take.
    """
    cost = decode_step_cost(config, batch_size, context_len, dtype)
    return {"bytes": cost.bytes, "flops": cost.flops, "intensity": cost.intensity,
            "floor_s": time_floor_s(cost.bytes, bandwidth_bytes_per_s)}


def reference_predict_step(step_bytes: float, step_flops: float, bandwidth_bytes_per_s: float,
                           peak_flops: float, overhead_s: float) -> dict:
    """One step on the roofline, plus a fixed overhead:

    - ``time_s``: ``max(bytes / BW, flops / peak) + overhead``, the slower of the two limits;
    - ``bound``: ``"compute"`` when doing the FLOPs takes longer than reading the bytes, else
      ``"memory"`` (at a tie the step is not yet compute-bound);
    - ``ridge_intensity``: the arithmetic intensity (FLOP/byte) at which both limits take the
      same time on this machine, ``peak / BW`` (the ridge point).
    """
    model = RooflineCostModel(bandwidth_bytes_per_s, peak_flops, overhead_s)
    t_mem, t_comp = step_bytes / bandwidth_bytes_per_s, step_flops / peak_flops
    return {"time_s": model.step_time_s(StepCost(flops=step_flops, weight_bytes=step_bytes,
                                                 kv_bytes=0.0)),
            "bound": "compute" if t_comp > t_mem else "memory",
            "ridge_intensity": ridge_point(peak_flops, bandwidth_bytes_per_s)}


def reference_departure_batch(batch_sizes, measured_s, step_costs, bandwidth_bytes_per_s: float,
                              peak_flops: float, tolerance: float) -> int | None:
    """The first batch size whose measured step exceeds the calibrated roofline prediction by
    more than ``tolerance``, relative; None if none does.

    The prediction is calibrated on the first (smallest) batch: its overhead is what that
    measured step takes beyond its roofline time, never negative (a step measured below its
    roofline leaves no room for a fixed cost). Every batch is then predicted with that overhead
    (``reference_predict_step``), and the comparison is ``measured > predicted x (1 +
    tolerance)``, strictly: a curve that departs and dips back departed at its first excess.
    ``step_costs[i]`` holds the ``bytes`` and ``flops`` of one step of ``batch_sizes[i]``.
    """
    return departure_from_prediction(
        batch_sizes, measured_s,
        calibrated_prediction(measured_s, step_costs, bandwidth_bytes_per_s, peak_flops),
        tolerance)


def calibrated_prediction(measured_s, step_costs, bw: float, peak: float,
                          overhead_mode: str = "calibrated", memory_only: bool = False
                          ) -> list[float]:
    """The roofline prediction per batch size, its overhead calibrated on the first one.
    ``overhead_mode`` and ``memory_only`` give the plausible mistakes the hints recognise."""
    def roof(c):
        return c["bytes"] / bw if memory_only else \
            reference_predict_step(c["bytes"], c["flops"], bw, peak, 0.0)["time_s"]

    extra = measured_s[0] - roof(step_costs[0])
    overhead = {"calibrated": max(0.0, extra), "none": 0.0, "signed": extra}[overhead_mode]
    return [roof(c) + overhead for c in step_costs]

