"""The simulator's executor: the engine's scheduler decides, the roofline cost model times.

``SimExecutor`` has the same three calls as ``engine.runner.ModelRunner`` (``now``,
``idle_until``, ``execute``), so an ``LLMEngine`` built with it runs the *same* scheduler and KV
placement, and fills the *same* timing records, but every step advances a simulated clock by

    t = max(bytes / bandwidth, flops / peak) + overhead

for exactly the tokens and contexts the scheduler chose. No model runs: the sampled token is a
placeholder (``SIM_TOKEN``), so simulated requests should set ``ignore_eos`` and end by
``max_tokens``.
"""

from __future__ import annotations

import torch

from ..engine.step import SchedulerOutput, StepResult
from ..model import ModelConfig
from ..model.memory import parse_weight_format, quantized_weight_bytes
from .cost_model import RooflineCostModel, step_cost

SIM_TOKEN = 0


class SimExecutor:
    """Simulated time for a ``config`` on a machine described by ``cost_model``."""

    def __init__(self, config: ModelConfig, cost_model: RooflineCostModel,
                 dtype: str | torch.dtype = "bf16", kv_dtype: str | torch.dtype | None = None,
                 weight_format: str | None = None) -> None:
        self.config = config
        self.cost_model = cost_model
        self.dtype, self.kv_dtype = dtype, kv_dtype
        # quantized linear weights ("int8", "int4-g128"...), checked against the config now
        self.weight_format = (None if weight_format is None
                              else parse_weight_format(weight_format).name)
        if self.weight_format is not None:
            quantized_weight_bytes(config, self.weight_format, dtype)
        self.clock = 0.0
        self.step_times: list[float] = []

    def now(self) -> float:
        return self.clock

    def idle_until(self, t: float) -> None:
        self.clock = max(self.clock, t)

    def step_time_s(self, query_lens: list[int], context_lens: list[int]) -> float:
        return self.cost_model.step_time_s(step_cost(self.config, query_lens, context_lens,
                                                     self.dtype, self.kv_dtype,
                                                     weight_format=self.weight_format))

    def execute(self, out: SchedulerOutput) -> StepResult:
        dt = self.step_time_s([s.num_tokens for s in out.scheduled],
                              [s.context_len for s in out.scheduled])
        self.clock += dt
        self.step_times.append(dt)
        return StepResult({s.request_id: (SIM_TOKEN,) * (1 + len(s.draft_token_ids))
                           for s in out.scheduled if s.samples})


def sim_engine(config: ModelConfig, cost_model: RooflineCostModel, max_num_seqs: int,
               max_model_len: int, policy="continuous", dtype: str | torch.dtype = "bf16", kv=None,
               max_num_batched_tokens: int | None = None, enable_chunked_prefill: bool = False,
               weight_format: str | None = None, scheduling_policy="fcfs"):
    """An ``LLMEngine`` whose scheduler is the real one and whose executor is simulated: the
    builder's engine with a ``SimExecutor`` (``kv``: the scheduler's KV manager; default,
    contiguous rows; ``weight_format``: the weights are quantized, as in
    ``cost_model.step_cost``; ``scheduling_policy``: see ``EngineConfig``)."""
    from ..engine.config import EngineConfig, build_engine
    engine_config = EngineConfig(max_num_seqs=max_num_seqs, max_model_len=max_model_len, policy=policy,
                                 max_num_batched_tokens=max_num_batched_tokens,
                                 enable_chunked_prefill=enable_chunked_prefill,
                                 scheduling_policy=scheduling_policy)
    return build_engine(config, engine_config, kv=kv,
                        executor=SimExecutor(config, cost_model, dtype, weight_format=weight_format))
