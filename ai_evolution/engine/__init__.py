"""A small real serving engine: requests, a scheduler with pluggable batching policies, a KV
cache layout and a model runner, in vLLM's vocabulary (``LLM``, ``SamplingParams``, ``Request``,
``Scheduler``, ``ModelRunner``, ``EngineConfig``)."""

from .batch_invariant import BatchInvariantKernels, DefaultKernels
from .block_pool import BlockPool, KVBlock
from .config import KV_LAYOUTS, EngineConfig, SpeculativeConfig, build_engine
from .kv_cache import (ContiguousKVManager, KVCacheManager, KVManager, block_hashes,
                       find_cached_prefix, hash_block)
from .llm import LLM
from .llm_engine import Executor, ExecutorFailed, LLMEngine, StepEntry, StepRecord
from .request import (FinishReason, Request, RequestOutput, RequestRejected, RequestStatus,
                      SamplingParams, request_metrics)
from .runner import BlockKVCache, ModelRunner
from .scheduler import (POLICIES, BatchPlan, Policy, PolicyError, Scheduler, continuous_batching,
                        newest_unfinished, static_batching, tokens_for)
from .state_slots import HybridKVManager, StateCheckpointPool
from .step import ScheduledRequest, SchedulerOutput, StepResult

__all__ = [
    "BatchInvariantKernels", "DefaultKernels", "BlockPool", "KVBlock", "KVCacheManager", "KVManager", "block_hashes", "find_cached_prefix",
    "hash_block", "KV_LAYOUTS", "EngineConfig", "SpeculativeConfig", "build_engine",
    "BlockKVCache", "ContiguousKVManager", "LLM", "Executor", "LLMEngine", "StepEntry",
    "StepRecord", "ExecutorFailed", "FinishReason", "Request", "RequestOutput", "RequestRejected", "RequestStatus",
    "SamplingParams", "request_metrics", "ModelRunner", "POLICIES", "BatchPlan", "Policy",
    "PolicyError", "ScheduledRequest", "Scheduler", "SchedulerOutput", "StepResult",
    "continuous_batching", "static_batching", "newest_unfinished", "tokens_for",
    "HybridKVManager", "StateCheckpointPool",
]
