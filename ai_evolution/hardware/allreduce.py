"""All-reduce time vs message size on THIS machine: ``world_size`` processes, ``torch.distributed``
with the gloo backend (the CPU's; NCCL's twin on GPUs), each timing ``all_reduce`` of float32
tensors of each size.

``measure_allreduce(sizes_bytes)`` starts the ranks (``spawn``: fresh interpreters, one torch
thread each), rendezvous over TCP on 127.0.0.1, warms up, then for each size runs ``repeats``
timed all-reduces, each after a barrier, and reports rank 0's times (a measured timing: volatile).
``fit_allreduce(rows)`` fits the ring model of ``sim.interconnect`` to them,
``t = latency + 2 (p - 1) / p x bytes / bandwidth`` (non-negative least squares), and returns the
``Interconnect`` this machine behaves as, so a lab can put its own link into the same formula it
uses for NVLink and PCIe.

On a 2-core machine the two ranks share the cores with everything else: the numbers describe
this machine's loopback and memory copies, not a network.
"""

from __future__ import annotations

import socket
import statistics
import time
from typing import Sequence

import torch

DEFAULT_SIZES_BYTES = (4 * 2**10, 64 * 2**10, 2**20, 4 * 2**20)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, sizes: list[int], repeats: int,
               warmup: int, out) -> None:
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    try:
        rows = []
        for size in sizes:
            x = torch.ones(max(1, size // 4), dtype=torch.float32)
            for _ in range(warmup):
                dist.all_reduce(x)
            times = []
            for _ in range(repeats):
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(x)
                times.append(time.perf_counter() - t0)
            rows.append((size, times))
        if rank == 0:
            out.put(rows)
    finally:
        dist.destroy_process_group()


def measure_allreduce(sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES, world_size: int = 2,
                      repeats: int = 7, warmup: int = 2, timeout_s: float = 120.0) -> list[dict]:
    """One row per size: ``bytes``, ``times_s`` (rank 0's), ``median_s``, ``min_s``, and the
    bandwidths NCCL's tests print, ``algbw`` = bytes / median and ``busbw`` = algbw x
    2 (p - 1) / p (what each rank's link carried per second)."""
    import torch.multiprocessing as mp
    sizes = [int(s) for s in sizes_bytes]
    if not sizes or any(s < 4 for s in sizes):
        raise ValueError(f"sizes_bytes: al menos un tamaño, cada uno >= 4 bytes (un float32); "
                         f"se recibió {list(sizes_bytes)!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise ValueError(f"world_size debe ser un entero >= 2; se recibió {world_size!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats debe ser un entero >= 1; se recibió {repeats!r}")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world_size, port, sizes, repeats, warmup, out),
                         daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    try:
        rows = out.get(timeout=timeout_s)
    except Exception:
        raise RuntimeError(f"la medida del all-reduce no terminó en {timeout_s} s (¿algún rango "
                           "falló al arrancar?)") from None
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    factor = 2 * (world_size - 1) / world_size
    result = []
    for size, times in rows:
        median = statistics.median(times)
        result.append({"bytes": size, "world_size": world_size, "times_s": times,
                       "median_s": median, "min_s": min(times),
                       "algbw_bytes_per_s": size / median,
                       "busbw_bytes_per_s": size / median * factor})
    return result


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
