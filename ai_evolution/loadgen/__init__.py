"""Workloads: how many requests, how long their prompts and outputs, and when they arrive."""

from .workload import WorkItem, capped_exponential_lengths, fixed_prompt_workload

__all__ = ["WorkItem", "capped_exponential_lengths", "fixed_prompt_workload"]
