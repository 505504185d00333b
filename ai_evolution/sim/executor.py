"""The simulator's executor: the engine's scheduler decides, the roofline cost model times.

``SimExecutor`` has the same three calls as ``engine.runner.ModelRunner`` (``now``,
``idle_until``, ``execute``), so an ``LLMEngine`` built with it runs the *same* scheduler and KV
placement, and fills the *same* timing records, but every step advances a simulated clock by

    t = max(bytes / bandwidth, flops / peak) + overhead

for exactly the tokens and contexts the scheduler chose. No model runs: the sampled token is a
placeholder (``SIM_TOKEN``), so simulated requests should set ``ignore_eos`` and end by
``max_tokens``.

Speculative steps (chapter 9): ``SimSpeculation`` gives the simulated engine a proposer
(``SimProposer``: ``num_speculative_tokens`` placeholder drafts for every decoding request, as
many as the real proposers would offer) and the executor an acceptance rate ``alpha``: each
verified draft is kept with probability ``alpha``, drawn per proposal from a seeded generator,
until the first rejection, as the formula ``(1 - alpha^(k+1)) / (1 - alpha)`` assumes. The
verification's cost is the step's own (its query lengths include the drafts); a draft model's
proposals add ``k`` decode steps of ``draft_config`` per speculating request, one request at a
time as ``DraftProposer`` runs them; n-gram proposals (``draft_config=None``) cost nothing.
"""

from __future__ import annotations

import torch

import random
from dataclasses import dataclass
from typing import Sequence

from ..engine.drafter import speculating
from ..engine.request import Request
from ..engine.step import SchedulerOutput, StepResult
from ..model import ModelConfig
from ..model.memory import parse_weight_format, quantized_weight_bytes
from .cost_model import RooflineCostModel, step_cost

SIM_TOKEN = 0


@dataclass(frozen=True)
class SimSpeculation:
    """Speculation in the simulator: ``num_speculative_tokens`` drafts per step, each kept with
    probability ``alpha`` (measured on a real run, or assumed); ``draft_config``: the draft
    model whose decode steps cost the proposals (None: n-gram proposals, free), timed by
    ``draft_cost_model`` (default: the executor's; a draft forward outside the engine's step
    has less overhead than a whole step, so a lab fits the draft's own); ``seed``: the
    acceptance draws."""

    alpha: float
    num_speculative_tokens: int
    draft_config: ModelConfig | None = None
    seed: int = 0
    draft_cost_model: RooflineCostModel | None = None

    def __post_init__(self) -> None:
        if isinstance(self.alpha, bool) or not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha (tasa de aceptación) debe estar entre 0 y 1; se recibió {self.alpha!r}")
        if (isinstance(self.num_speculative_tokens, bool) or not isinstance(self.num_speculative_tokens, int)
                or self.num_speculative_tokens < 1):
            raise ValueError(f"num_speculative_tokens debe ser un entero >= 1; se recibió "
                             f"{self.num_speculative_tokens!r}")


class SimProposer:
    """Placeholder drafts for the simulated engine: every decoding request gets as many as a real
    proposer would offer it (``drafter.speculating``)."""

    def __init__(self, num_speculative_tokens: int, max_model_len: int) -> None:
        self.num_speculative_tokens, self.max_model_len = num_speculative_tokens, max_model_len
        self.draft_probs: dict = {}

    def propose_drafts(self, running: Sequence[Request]) -> dict[str, list[int]]:
        drafts = {}
        for r in running:
            n = speculating(r, self.max_model_len, self.num_speculative_tokens)
            if n > 0:
                drafts[r.request_id] = [SIM_TOKEN] * n
        return drafts


class SimExecutor:
    """Simulated time for a ``config`` on a machine described by ``cost_model``."""

    def __init__(self, config: ModelConfig, cost_model: RooflineCostModel,
                 dtype: str | torch.dtype = "bf16", kv_dtype: str | torch.dtype | None = None,
                 weight_format: str | None = None, speculation: SimSpeculation | None = None) -> None:
        self.config = config
        self.speculation = speculation
        self._rng = random.Random(None if speculation is None else speculation.seed)
        self.num_drafts = self.num_accepted = self.num_examined = 0  # acceptance draws so far
        self.verifications: list[tuple[int, int]] = []  # (drafts verified, drafts kept) each
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

    def step_time_s(self, query_lens: list[int], context_lens: list[int],
                    num_state_copies: int = 0) -> float:
        return self.cost_model.step_time_s(step_cost(self.config, query_lens, context_lens,
                                                     self.dtype, self.kv_dtype,
                                                     weight_format=self.weight_format,
                                                     num_state_copies=num_state_copies))

    def draft_time_s(self, out: SchedulerOutput) -> float:
        """What proposing this step's drafts cost: ``k`` decode steps of the draft model per
        speculating request, one request at a time (nothing for n-gram proposals)."""
        spec = self.speculation
        if spec is None or spec.draft_config is None:
            return 0.0
        cost_model = spec.draft_cost_model or self.cost_model
        return sum(cost_model.step_time_s(step_cost(spec.draft_config, [1], [s.start + j + 1],
                                                         self.dtype))
                   for s in out.scheduled for j in range(len(s.draft_token_ids)))

    def execute(self, out: SchedulerOutput) -> StepResult:
        copies = sum(len(s.state_saves) + (s.state_restore is not None) for s in out.scheduled)
        dt = self.step_time_s([s.num_tokens for s in out.scheduled],
                              [s.context_len for s in out.scheduled], copies) + self.draft_time_s(out)
        self.clock += dt
        self.step_times.append(dt)
        return StepResult({s.request_id: self._verified(s.draft_token_ids)
                           for s in out.scheduled if s.samples})

    def _verified(self, drafts: tuple[int, ...]) -> tuple[int, ...]:
        """The target's tokens at the ``k + 1`` verified places: the drafts the acceptance draws
        keep (each with probability ``alpha``, up to the first rejection), then another token."""
        if not drafts:
            return (SIM_TOKEN,)
        alpha = self.speculation.alpha if self.speculation is not None else 1.0
        kept = 0
        while kept < len(drafts) and self._rng.random() < alpha:
            kept += 1
        self.num_drafts += len(drafts)
        self.num_accepted += kept
        self.num_examined += min(kept + 1, len(drafts))
        self.verifications.append((len(drafts), kept))
        rejected = () if kept == len(drafts) else ((drafts[kept] + 1) % self.config.vocab_size,)
        return (*drafts[:kept], *rejected) + (SIM_TOKEN,) * (len(drafts) + 1 - kept - len(rejected))


def sim_engine(config: ModelConfig, cost_model: RooflineCostModel, max_num_seqs: int,
               max_model_len: int, policy="continuous", dtype: str | torch.dtype = "bf16", kv=None,
               max_num_batched_tokens: int | None = None, enable_chunked_prefill: bool = False,
               weight_format: str | None = None, speculation: SimSpeculation | None = None,
               scheduling_policy="fcfs", state_checkpoint_interval: int | None = None):
    """An ``LLMEngine`` whose scheduler is the real one and whose executor is simulated: the
    builder's engine with a ``SimExecutor`` (``kv``: the scheduler's KV manager; default,
    contiguous rows; ``weight_format``: the weights are quantized, as in
    ``cost_model.step_cost``; ``speculation``: speculative steps, see ``SimSpeculation``;
    ``scheduling_policy``, ``state_checkpoint_interval`` (a hybrid with a paged ``kv`` that
    caches prefixes): see ``EngineConfig``)."""
    from ..engine.config import EngineConfig, build_engine
    engine_config = EngineConfig(max_num_seqs=max_num_seqs, max_model_len=max_model_len, policy=policy,
                                 max_num_batched_tokens=max_num_batched_tokens,
                                 enable_chunked_prefill=enable_chunked_prefill,
                                 scheduling_policy=scheduling_policy,
                                 block_size=16 if kv is None else kv.block_size,
                                 state_checkpoint_interval=state_checkpoint_interval)
    engine = build_engine(config, engine_config, kv=kv,
                          executor=SimExecutor(config, cost_model, dtype, weight_format=weight_format,
                                               speculation=speculation))
    if speculation is not None:
        engine.drafter = SimProposer(speculation.num_speculative_tokens, max_model_len)
    return engine
