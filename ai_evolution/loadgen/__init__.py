"""Workloads: how many requests, how long their prompts and outputs, and when they arrive."""

from .arrivals import (LENGTH_KINDS, ClosedLoopRun, burst_arrivals, closed_loop, length_sampler,
                       open_loop_workload, poisson_arrivals, realized_rate)
from .http import HTTPRecord, arun_http, run_http
from .inprocess import run_closed_loop, run_open_loop
from .realistic import TRACES, flood_mix, realistic_workload, tenant_mix, trace_lengths, uniform_workload
from .workload import WorkItem, capped_exponential_lengths, fixed_prompt_workload, varied_workload

__all__ = ["WorkItem", "capped_exponential_lengths", "fixed_prompt_workload", "varied_workload",
           "LENGTH_KINDS",
           "ClosedLoopRun", "burst_arrivals", "closed_loop", "length_sampler",
           "open_loop_workload", "poisson_arrivals", "realized_rate",
           "HTTPRecord", "arun_http", "run_http", "run_closed_loop", "run_open_loop",
           "TRACES", "flood_mix", "realistic_workload", "tenant_mix", "trace_lengths",
           "uniform_workload"]
