"""The simulator's pieces: the roofline cost model (shared with the roofline chapter)."""

from .cost_model import (RooflineCostModel, StepCost, arithmetic_intensity, decode_step_cost,
                         departure_batch,
                         efficiency, matmul_params, ridge_point, step_cost, time_floor_s,
                         weight_bytes_read)

__all__ = ["RooflineCostModel", "StepCost", "arithmetic_intensity", "decode_step_cost", "departure_batch",
           "efficiency", "matmul_params", "ridge_point", "step_cost", "time_floor_s",
           "weight_bytes_read"]
