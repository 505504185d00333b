"""A small real serving engine: requests, a scheduler with pluggable batching policies, a KV
cache layout and a model runner, in vLLM's vocabulary (``LLM``, ``SamplingParams``, ``Request``,
``Scheduler``, ``ModelRunner``)."""

from .block_pool import BlockPool, KVBlock
from .kv_cache import (ContiguousKVManager, KVCacheManager, KVManager, block_hashes,
                       find_cached_prefix, hash_block)
from .llm import KV_LAYOUTS, LLM, Executor, LLMEngine, StepEntry, StepRecord, build_engine
from .request import (FinishReason, Request, RequestOutput, RequestRejected, RequestStatus,
                      SamplingParams, request_metrics)
from .runner import BlockKVCache, ModelRunner
from .scheduler import (POLICIES, BatchPlan, Policy, PolicyError, ScheduledRequest, Scheduler,
                        SchedulerOutput, continuous_batching, newest_unfinished, static_batching,
                        tokens_for)

__all__ = [
    "BlockPool", "KVBlock", "KVCacheManager", "KVManager", "block_hashes", "find_cached_prefix",
    "hash_block", "KV_LAYOUTS", "build_engine", "BlockKVCache", "ContiguousKVManager", "LLM", "Executor", "LLMEngine", "StepEntry", "StepRecord", "FinishReason", "Request",
    "RequestOutput", "RequestRejected", "RequestStatus", "SamplingParams", "request_metrics",
    "ModelRunner", "POLICIES", "BatchPlan", "Policy", "PolicyError", "ScheduledRequest",
    "Scheduler", "SchedulerOutput", "continuous_batching", "static_batching", "newest_unfinished",
    "tokens_for",
]
