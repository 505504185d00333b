"""Reference answer of the continuous-batching lab (chapter 3): the challenge's gains of
continuous over static batching, simulated."""

from __future__ import annotations

import functools

from ..hardware import get_device_spec
from ..loadgen import capped_exponential_lengths, fixed_prompt_workload
from ..metrics import summarize
from ..model import get_preset
from ..sim import RooflineCostModel, sim_engine


CHALLENGE_WIDTHS = (8, 32, 128)


@functools.lru_cache(maxsize=8)
def simulated_gains(dc_device: str, dc_model: str, dc_requests: int, dc_prompt_len: int,
                    dc_mean_output: float, cap: int, max_cap: int, seed: int) -> dict[int, float]:
    """The challenge's gains (continuous / static tokens per second) per width, simulated with
    the library's policies and metrics in the datacenter study of section 6: the same GPU,
    model, workload (``labs.continuous_batching.workload``) and seed. Cached: a grader checks
    many submissions in one process."""
    gpu, big = get_device_spec(dc_device), get_preset(dc_model)
    dtype = "bf16" if "bf16" in gpu.peak_flops else "fp16"
    cost = RooflineCostModel.from_device_spec(gpu, dtype)
    lengths = capped_exponential_lengths(dc_requests, dc_mean_output, cap, seed)
    items = fixed_prompt_workload(dc_requests, dc_prompt_len, lengths, big.vocab_size, seed)
    gains = {}
    for b in CHALLENGE_WIDTHS:
        tput = {}
        for policy in ("static", "continuous"):
            engine = sim_engine(big, cost, b, dc_prompt_len + max_cap, policy, dtype=dtype)
            tput[policy] = summarize(engine.run(items))["throughput_tok_s"]
        gains[b] = tput["continuous"] / tput["static"]
    return gains
