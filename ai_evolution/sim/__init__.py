"""The simulator: the roofline cost model of a step (shared with the roofline chapter), the
speculation economics built on it (``speculation``), and an executor that replays the engine's
own scheduler on simulated time."""

from .cost_model import (RooflineCostModel, StepCost, arithmetic_intensity, decode_step_cost,
                         departure_batch, efficiency, fit_cost_model, matmul_params, ridge_point,
                         step_cost, time_floor_s, weight_bytes_read)
from .executor import SIM_TOKEN, SimExecutor, SimProposer, SimSpeculation, sim_engine

__all__ = ["RooflineCostModel", "StepCost", "arithmetic_intensity", "decode_step_cost",
           "departure_batch", "efficiency", "fit_cost_model", "matmul_params", "ridge_point",
           "step_cost", "time_floor_s", "weight_bytes_read", "SIM_TOKEN", "SimExecutor",
           "SimProposer", "SimSpeculation", "sim_engine"]
