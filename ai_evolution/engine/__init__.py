"""A small real serving engine: requests, a scheduler with pluggable batching policies, a KV
cache layout and a model runner, in vLLM's vocabulary (``LLM``, ``SamplingParams``, ``Request``,
``Scheduler``, ``ModelRunner``)."""

from .kv_cache import ContiguousSlots
from .llm import LLM, Executor, LLMEngine, StepEntry, StepRecord
from .request import (FinishReason, Request, RequestOutput, RequestRejected, RequestStatus,
                      SamplingParams, request_metrics)
from .runner import ModelRunner
from .scheduler import (POLICIES, BatchPlan, Policy, PolicyError, ScheduledRequest, Scheduler,
                        SchedulerOutput, continuous_batching, static_batching)

__all__ = [
    "ContiguousSlots", "LLM", "Executor", "LLMEngine", "StepEntry", "StepRecord", "FinishReason", "Request",
    "RequestOutput", "RequestRejected", "RequestStatus", "SamplingParams", "request_metrics",
    "ModelRunner", "POLICIES", "BatchPlan", "Policy", "PolicyError", "ScheduledRequest",
    "Scheduler", "SchedulerOutput", "continuous_batching", "static_batching",
]
