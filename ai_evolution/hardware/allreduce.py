"""All-reduce time vs message size on THIS machine: ``world_size`` processes, ``torch.distributed``
with the gloo backend (the CPU's; NCCL's twin on GPUs), each timing ``all_reduce`` of tensors of
each size. The one measurement of the project: the chapter 13 lab, the tensor-parallel benchmark
and the tests all call it.

``measure_allreduce(sizes_bytes)`` spawns the ranks (fresh interpreters, none of them this
process, so an open tensor-parallel engine is not disturbed; ``threads`` torch threads each),
which rendezvous over a TCP store on 127.0.0.1 (port chosen by the OS: no race), warm up, then
for each size run ``repeats`` timed all-reduces, each after a barrier, and report rank 0's times
(a measured timing: volatile). A rank whose parent dies exits (no orphans).
``fit_allreduce(rows)`` fits the ring model of ``sim.interconnect`` to them,
``t = latency + 2 (p - 1) / p x bytes / bandwidth`` (non-negative least squares), and returns the
``Interconnect`` this machine behaves as, so a lab can put its own link into the same formula it
uses for NVLink and PCIe.

On a 2-core machine the two ranks share the cores with everything else: the numbers describe
this machine's loopback and memory copies, not a network.
"""

from __future__ import annotations

import os
import statistics
import time
import traceback
from datetime import timedelta
from typing import Sequence

import torch

DEFAULT_SIZES_BYTES = (4 * 2**10, 64 * 2**10, 2**20, 4 * 2**20)
START_TIMEOUT_S = 300.0  # spawning a rank imports torch: seconds on a busy CPU


def _check_int(value, name: str, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} debe ser un entero >= {low}; se recibió {value!r}")


def measure_allreduce(sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES, world_size: int = 2,
                      repeats: int = 7, warmup: int = 2, timeout_s: float = 120.0, *,
                      dtype: torch.dtype = torch.float32, threads: int = 1) -> list[dict]:
    """One row per size: ``bytes`` (the payload, rounded down to whole elements of ``dtype``),
    ``world_size``, ``times_s`` (rank 0's), ``median_s``, ``min_s``, ``max_s``, and the
    bandwidths NCCL's tests print, ``algbw_bytes_per_s`` = bytes / median and
    ``busbw_bytes_per_s`` = algbw x 2 (p - 1) / p (what each rank's link carried per second).
    More ranks than this CPU's cores are refused."""
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from multiprocessing.connection import wait as wait_for

    _check_int(world_size, "world_size", 2)
    _check_int(repeats, "repeats", 1)
    _check_int(warmup, "warmup", 0)
    _check_int(threads, "threads", 1)
    cores = os.cpu_count() or 1
    if world_size > cores:
        raise ValueError(f"world_size={world_size} pide más procesos que los {cores} núcleos de "
                         f"esta CPU; use world_size <= {cores}")
    element = torch.empty((), dtype=dtype).element_size()
    sizes = list(sizes_bytes)
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < element for b in sizes):
        raise ValueError(f"sizes_bytes debe ser una lista de enteros >= {element} (los bytes de un "
                         f"elemento {dtype}); se recibió {sizes!r}")
    store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=START_TIMEOUT_S))
    ctx = mp.get_context("spawn")
    pipes = [ctx.Pipe() for _ in range(world_size)]
    procs = [ctx.Process(target=_rank_main, daemon=True, name=f"allreduce-{rank}",
                         args=(child, rank, world_size, store.port, sizes, repeats, warmup,
                               dtype, threads))
             for rank, (_, child) in enumerate(pipes)]
    try:
        for proc in procs:
            proc.start()
        for _, child in pipes:
            child.close()
        conn, proc = pipes[0][0], procs[0]
        ready = wait_for([conn, proc.sentinel], timeout=timeout_s)
        try:
            kind, rows = conn.recv() if conn in ready else (
                "error", f"sin respuesta en {timeout_s} s")
        except EOFError:
            kind, rows = "error", f"el proceso {proc.name} terminó sin resultado"
        if kind == "error":
            raise RuntimeError(f"la medida del all-reduce falló:\n{rows}")
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
    factor = 2 * (world_size - 1) / world_size
    result = []
    for size, times in rows:
        median = statistics.median(times)
        result.append({"bytes": size, "world_size": world_size, "times_s": times,
                       "median_s": median, "min_s": min(times), "max_s": max(times),
                       "algbw_bytes_per_s": size / median,
                       "busbw_bytes_per_s": size / median * factor})
    return result


def _rank_main(conn, rank: int, n: int, port: int, sizes: list[int], repeats: int, warmup: int,
               dtype: torch.dtype, threads: int) -> None:
    import torch.distributed as dist
    from ..engine.tensor_parallel import STEP_TIMEOUT, _watch_parent
    _watch_parent()
    torch.set_num_threads(threads)
    try:
        store = dist.TCPStore("127.0.0.1", port, n, is_master=False,
                              timeout=timedelta(seconds=START_TIMEOUT_S))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=n, timeout=STEP_TIMEOUT)
        element = torch.empty((), dtype=dtype).element_size()
        rows = []
        for size in sizes:
            x = torch.ones(size // element, dtype=dtype)
            for _ in range(warmup):
                dist.all_reduce(x)
            times = []
            for _ in range(repeats):
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(x)
                times.append(time.perf_counter() - start)
            rows.append((x.numel() * element, times))
        dist.destroy_process_group()
        if rank == 0:
            conn.send(("rows", rows))
    except BaseException:  # noqa: BLE001 - reported to the caller
        if rank == 0:
            conn.send(("error", traceback.format_exc()))
        os._exit(1)


def fit_allreduce(rows: Sequence[dict], name: str = "gloo (esta máquina)"):
    """The ``sim.interconnect.Interconnect`` whose ring formula best fits the medians of
    ``rows`` (``measure_allreduce``'s): ``median = latency + 2 (p - 1) / p x bytes / bandwidth``,
    both terms >= 0 (least squares on the relative error, so small messages count as much as
    large ones). Needs two sizes at least."""
    from ..sim.cost_model import _nonneg_two
    from ..sim.interconnect import Interconnect
    if len({r["bytes"] for r in rows}) < 2:
        raise ValueError("hacen falta al menos dos tamaños de mensaje distintos para ajustar "
                         "latencia y ancho de banda")
    p = rows[0]["world_size"]
    y = torch.tensor([r["median_s"] for r in rows], dtype=torch.float64)
    x = torch.tensor([2 * (p - 1) / p * r["bytes"] for r in rows], dtype=torch.float64)
    w = 1 / y
    latency, inv_bw = _nonneg_two(torch.stack([torch.ones_like(x), x], dim=1) * w[:, None], y * w)
    bandwidth = 1 / inv_bw if inv_bw > 0 else float("inf")
    return Interconnect(name, bandwidth, latency)


__all__ = ["DEFAULT_SIZES_BYTES", "fit_allreduce", "measure_allreduce"]
