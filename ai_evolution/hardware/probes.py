"""What this machine actually achieves: bandwidth and matmul probes, measured with a warm-up and
repetitions and reported as medians (with every sample)."""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .device import default_dtype, device_name, pick_device, supported_dtypes, synchronize

GiB = 2**30
_SHOW_PROGRESS_ABOVE_S = 2.0
_MIN_REP_S = 0.01  # below this a repetition loops the call, so timer overhead stays negligible
_MAX_CALLS_PER_REP = 10_000


@dataclass(frozen=True)
class ProbeResult:
    """One measurement: the median over repetitions, its range, and every sample.

    ``samples`` holds one value per repetition in ``unit``; ``params`` records what was measured
    (sizes, dtype, device, threads, derived rates) so that the number can be re-read later.
    """

    name: str
    unit: str
    median: float
    min: float
    max: float
    samples: tuple[float, ...]
    params: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """A JSON-serializable copy."""
        out = dataclasses.asdict(self)
        out["samples"] = list(self.samples)
        return out


def available_memory_bytes(device: torch.device | str) -> int | None:
    """Free memory the probes may draw on: the GPU's free memory on CUDA, else the host's.

    On Linux the host figure is ``MemAvailable`` from /proc/meminfo (no psutil dependency);
    elsewhere it falls back to ``os.sysconf``, and to half of physical memory where only that is
    known (macOS). ``None`` when nothing can be read.
    """
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the file says kB, meaning KiB
    except (OSError, ValueError, IndexError):
        pass
    for pages_name, fraction in (("SC_AVPHYS_PAGES", 1), ("SC_PHYS_PAGES", 2)):
        try:
            return int(os.sysconf(pages_name) * os.sysconf("SC_PAGE_SIZE") // fraction)
        except (ValueError, OSError, AttributeError):
            continue
    return None


def _resolve_device(device: torch.device | str | None) -> torch.device:
    return pick_device() if device is None else torch.device(device)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_dtype(device: torch.device, dtype: torch.dtype) -> str:
    name = _dtype_name(dtype)
    accepted = supported_dtypes(device)
    if name not in accepted:
        raise ValueError(f"el dtype {name!r} no está soportado en el dispositivo "
                         f"{device_name(device)!r} ({device.type}); dtypes aceptados: "
                         f"{', '.join(accepted)}")
    return name


def _check_positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "un entero positivo" if minimum == 1 else f"un entero >= {minimum}"
        raise ValueError(f"{name} debe ser {what}; se recibió {value!r}")
    return value



def _capped(default_bytes: int, device: torch.device, share: int) -> int:
    """``default_bytes`` or 1/``share`` of the available memory, whichever is smaller."""
    available = available_memory_bytes(device)
    return default_bytes if available is None else min(default_bytes, available // share)


class _Progress:
    """A tqdm bar over repetitions, created only when asked or when the run looks long."""

    def __init__(self, progress: bool | None, total: int, desc: str):
        self._wanted, self._total, self._desc = progress, total, desc
        self._bar = None
        if progress:
            self._open()

    def _open(self) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=self._total, desc=self._desc, unit="rep", leave=False)

    def decide(self, estimated_s: float) -> None:
        if self._wanted is None and self._bar is None and estimated_s > _SHOW_PROGRESS_ABOVE_S:
            self._open()
        self._wanted = self._bar is not None  # decide once

    def update(self) -> None:
        if self._bar is not None:
            self._bar.update()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _time_calls(call: Callable[[], object], device: torch.device, *, repeats: int, warmup: int,
                bar: _Progress, runs_left: float = 1.0) -> tuple[list[float], int]:
    """Seconds per ``call()``, one value per repetition, and the calls looped per repetition.

    After the warm-up, one more (uncounted) timed call sizes the loop inside a repetition (a
    repetition lasts at least ``_MIN_REP_S``, so the timer and synchronisation cost stay
    negligible on fast GPUs) and estimates whether a progress bar is worth showing
    (``runs_left`` such measurements are still to come). ``warmup=0`` skips both.
    """
    calls_per_rep = 1
    if warmup:
        for _ in range(warmup):
            call()
        synchronize(device)
        start = time.perf_counter()
        call()
        synchronize(device)
        last_s = max(time.perf_counter() - start, 1e-9)
        calls_per_rep = max(1, min(_MAX_CALLS_PER_REP, math.ceil(_MIN_REP_S / last_s)))
        bar.decide(last_s * calls_per_rep * repeats * runs_left)
    else:
        bar.decide(0.0)
    seconds = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(calls_per_rep):
            call()
        synchronize(device)
        seconds.append(max(time.perf_counter() - start, 1e-9) / calls_per_rep)
        bar.update()
    return seconds, calls_per_rep


def _result(name: str, unit: str, samples: Sequence[float], params: dict) -> ProbeResult:
    samples = tuple(float(s) for s in samples)
    return ProbeResult(name=name, unit=unit, median=float(statistics.median(samples)),
                       min=min(samples), max=max(samples), samples=samples, params=params)


def _common_params(device: torch.device, dtype_name: str, calls_per_rep: int,
                   repeats: int, warmup: int) -> dict:
    params = {"device": device.type, "device_name": device_name(device), "dtype": dtype_name,
              "repeats": repeats, "warmup": warmup, "calls_per_rep": calls_per_rep}
    if device.type == "cpu":
        params["torch_threads"] = torch.get_num_threads()
    if device.type == "cuda":
        params["allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
    return params


BANDWIDTH_KINDS = ("read", "copy")


def _probe_numel(size_bytes: int | None, dtype: torch.dtype, dtype_name: str,
                 device: torch.device, buffers: int) -> tuple[int, int]:
    """Elements and element size of a probe buffer of ``size_bytes`` (default: 1 GiB, 2 on CUDA,
    capped to the memory available for ``buffers`` such buffers)."""
    if size_bytes is None:
        size_bytes = _capped((2 if device.type == "cuda" else 1) * GiB, device, 8 * buffers)
    else:
        _check_positive_int("size_bytes", size_bytes)
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = size_bytes // itemsize
    if numel < 1:
        raise ValueError(f"size_bytes={size_bytes} es menor que un elemento de {dtype_name} "
                         f"({itemsize} bytes); use un tamaño de al menos {itemsize} bytes")
    return numel, itemsize


def measure_bandwidth(device: torch.device | str | None = None, size_bytes: int | None = None,
                      kind: str = "read", dtype: torch.dtype = torch.float32, repeats: int = 5,
                      warmup: int = 1, progress: bool | None = None) -> ProbeResult:
    """Memory bandwidth in GB/s (1e9 bytes/s), median over ``repeats``.

    ``kind="read"`` times ``torch.sum`` over one buffer of ``size_bytes`` (bytes moved = its
    size); ``kind="copy"`` times ``dst.copy_(src)`` (bytes moved = 2 x size: one read, one
    write). The default size is 1 GiB on CPU/MPS and 2 GiB on CUDA, never more than about 1/8
    of the available memory in all: buffers must be far larger than the last-level cache
    (about 64 MiB on the course's CI machine; 50-60 MB of L2 on an H100/H200), or the probe
    measures the cache. ``progress=None`` shows a bar only when the run looks longer than ~2 s.
    """
    device = _resolve_device(device)
    if kind not in BANDWIDTH_KINDS:
        raise ValueError(f"kind={kind!r} no es válido; valores aceptados: "
                         f"{', '.join(repr(k) for k in BANDWIDTH_KINDS)}")
    dtype_name = _check_dtype(device, dtype)
    repeats = _check_positive_int("repeats", repeats)
    warmup = _check_positive_int("warmup", warmup, minimum=0)
    buffers = 1 if kind == "read" else 2
    numel, itemsize = _probe_numel(size_bytes, dtype, dtype_name, device, buffers)
    nbytes = numel * itemsize

    with torch.inference_mode():
        src = torch.ones(numel, dtype=dtype, device=device)  # writing it touches every page
        if kind == "read":
            def call():
                return torch.sum(src)
        else:
            dst = torch.empty_like(src)

            def call():
                return dst.copy_(src)
        bytes_per_call = nbytes * buffers
        bar = _Progress(progress, repeats, f"bandwidth {kind}")
        try:
            seconds, calls_per_rep = _time_calls(call, device, repeats=repeats, warmup=warmup,
                                                 bar=bar)
        finally:
            bar.close()
    params = {"kind": kind, "size_bytes": nbytes, "bytes_per_call": bytes_per_call,
              **_common_params(device, dtype_name, calls_per_rep, repeats, warmup)}
    return _result(f"bandwidth_{kind}", "GB/s", [bytes_per_call / s / 1e9 for s in seconds],
                   params)


def measure_matmul(device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
                   n: int | None = None, repeats: int = 5, warmup: int = 1,
                   progress: bool | None = None) -> ProbeResult:
    """Square ``n x n @ n x n`` GEMM throughput in GFLOP/s (2 n^3 FLOP per call), median.

    The default ``n`` is 2048 on CPU/MPS and 8192 on CUDA, halved while the three matrices
    would take more than 1/8 of the available memory. On CUDA, fp32 runs as true fp32 unless
    ``torch.backends.cuda.matmul.allow_tf32`` is set (recorded in ``params``).
    """
    device = _resolve_device(device)
    dtype_name = _check_dtype(device, dtype)
    repeats = _check_positive_int("repeats", repeats)
    warmup = _check_positive_int("warmup", warmup, minimum=0)
    itemsize = torch.empty((), dtype=dtype).element_size()
    if n is None:
        n = 8192 if device.type == "cuda" else 2048
        available = available_memory_bytes(device)
        while available is not None and n > 256 and 3 * n * n * itemsize > available // 8:
            n //= 2
    else:
        _check_positive_int("n", n)

    with torch.inference_mode():
        gen = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(n, n, dtype=dtype, device=device, generator=gen)
        b = torch.randn(n, n, dtype=dtype, device=device, generator=gen)
        c = torch.empty(n, n, dtype=dtype, device=device)

        def call():
            return torch.mm(a, b, out=c)

        bar = _Progress(progress, repeats, f"matmul {dtype_name} n={n}")
        try:
            seconds, calls_per_rep = _time_calls(call, device, repeats=repeats, warmup=warmup,
                                                 bar=bar)
        finally:
            bar.close()
    flops = 2 * n**3
    params = {"n": n, "flops_per_call": flops,
              **_common_params(device, dtype_name, calls_per_rep, repeats, warmup)}
    return _result("matmul", "GFLOP/s", [flops / s / 1e9 for s in seconds], params)


def measure_decode_matmul(device: torch.device | str | None = None,
                          dtype: torch.dtype = torch.float32, k: int = 2048, n: int = 8192,
                          rows: Sequence[int] = (1, 2, 4, 8, 16, 32, 64), repeats: int = 5,
                          warmup: int = 1, working_set_bytes: int | None = None,
                          progress: bool | None = None) -> list[ProbeResult]:
    """Decode-shaped linears ``F.linear(x[M, k], W[n, k])`` with cold weights, one result per M.

    A decode step multiplies a few rows (the batch, M) by every weight matrix once, so each
    weight must come from memory, not from cache. The probe cycles through enough distinct
    ``W`` matrices that together they exceed the last-level cache: ``working_set_bytes``
    defaults to 1,2 GiB on CPU/MPS (the CI machine's LLC is about 64 MiB) and 512 MB on CUDA
    (about 10x an H100's L2), capped at 1/8 of the available memory.

    Each result's median is milliseconds per linear; ``params`` adds ``weight_gbps`` (weight
    bytes read per second, at the median) and ``gflops`` (2 M k n per call, at the median).
    """
    device = _resolve_device(device)
    dtype_name = _check_dtype(device, dtype)
    k = _check_positive_int("k", k)
    n = _check_positive_int("n", n)
    repeats = _check_positive_int("repeats", repeats)
    warmup = _check_positive_int("warmup", warmup, minimum=0)
    rows = tuple(rows)
    if not rows:
        raise ValueError("rows no puede estar vacío; dé al menos un número de filas, "
                         "p. ej. (1, 8)")
    for m in rows:
        _check_positive_int("cada valor de rows", m)
    if working_set_bytes is None:
        default = 512 * 10**6 if device.type == "cuda" else int(1.2 * GiB)
        working_set_bytes = _capped(default, device, 8)
    else:
        _check_positive_int("working_set_bytes", working_set_bytes)
    itemsize = torch.empty((), dtype=dtype).element_size()
    weight_bytes = n * k * itemsize
    num_matrices = max(1, math.ceil(working_set_bytes / weight_bytes))

    results = []
    bar = _Progress(progress, repeats * len(rows), f"decode linears {dtype_name}")
    try:
        with torch.inference_mode():
            gen = torch.Generator(device=device).manual_seed(0)
            weights = [torch.empty(n, k, dtype=dtype, device=device)
                       .uniform_(-1, 1, generator=gen) for _ in range(num_matrices)]
            for i, m in enumerate(rows):
                x = torch.randn(m, k, dtype=dtype, device=device, generator=gen)

                def one_pass(x=x):
                    for w in weights:
                        F.linear(x, w)

                # Larger M costs more per call; twice the first row's time is a rough guess.
                seconds, passes_per_rep = _time_calls(
                    one_pass, device, repeats=repeats, warmup=warmup, bar=bar,
                    runs_left=2.0 * (len(rows) - i))
                ms = [s / num_matrices * 1e3 for s in seconds]
                median_s = statistics.median(ms) / 1e3
                flops = 2 * m * k * n
                params = {"rows": m, "k": k, "n": n, "num_matrices": num_matrices,
                          "working_set_bytes": num_matrices * weight_bytes,
                          "weight_bytes_per_call": weight_bytes, "flops_per_call": flops,
                          "weight_gbps": weight_bytes / median_s / 1e9,
                          "gflops": flops / median_s / 1e9,
                          **_common_params(device, dtype_name, passes_per_rep, repeats, warmup)}
                results.append(_result("decode_matmul", "ms", ms, params))
    finally:
        bar.close()
    return results


def measure_stream_bandwidths(device: torch.device | str | None = None,
                              dtype: torch.dtype = torch.float32, repeats: int = 5,
                              warmup: int = 1, size_bytes: int | None = None,
                              working_set_bytes: int | None = None, k: int = 2048, n: int = 8192,
                              between: Callable[[int], None] | None = None,
                              progress: bool | None = None) -> dict[str, ProbeResult]:
    """Two floors of a decode step, interleaved rep by rep, in GB/s (1e9 bytes/s).

    - ``"read"``: what the memory can stream, ``torch.sum`` over one buffer of ``size_bytes``
      (as ``measure_bandwidth(kind="read")``, same default size);
    - ``"gemv"``: what a cold matrix-vector product streams, ``F.linear(x[1, k], W[n, k])``
      cycling through distinct ``W`` that together exceed the last-level cache
      (``working_set_bytes``, as ``measure_decode_matmul``: 1,2 GiB on CPU/MPS, 512 MB on CUDA),
      counted as weight bytes read per second. It is the kernel a batch-1 decode step runs, so
      it can stream less than the memory allows (an fp32 GEMV path that does not saturate it).

    Each repetition takes one sample of each, back to back, so drift on a shared machine hits
    both alike (their ratio can be compared pair by pair). ``between(rep)`` runs after each
    repetition's pair with the buffers still allocated: a caller interleaves its own timings
    there (a lab's decode steps) without paying the allocation again. The first repetition
    warms up and sizes the loop of calls (a sample lasts at least ~10 ms); later ones reuse it.
    Both buffers are alive together, each capped at 1/8 of the available memory.
    """
    device = _resolve_device(device)
    dtype_name = _check_dtype(device, dtype)
    repeats = _check_positive_int("repeats", repeats)
    warmup = _check_positive_int("warmup", warmup, minimum=0)
    k = _check_positive_int("k", k)
    n = _check_positive_int("n", n)
    numel, itemsize = _probe_numel(size_bytes, dtype, dtype_name, device, 1)
    if working_set_bytes is None:
        default = 512 * 10**6 if device.type == "cuda" else int(1.2 * GiB)
        working_set_bytes = _capped(default, device, 8)
    else:
        _check_positive_int("working_set_bytes", working_set_bytes)
    read_bytes = numel * itemsize
    weight_bytes = n * k * itemsize
    num_matrices = max(1, math.ceil(working_set_bytes / weight_bytes))

    def timed(call: Callable[[], object], calls: int) -> float:
        synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            call()
        synchronize(device)
        return max(time.perf_counter() - start, 1e-9) / calls

    read_s: list[float] = []
    gemv_s: list[float] = []
    calls = {"read": 1, "gemv": 1}
    bar = _Progress(progress, repeats, f"stream probes {dtype_name}")
    try:
        with torch.inference_mode():
            src = torch.ones(numel, dtype=dtype, device=device)  # writing it touches every page
            gen = torch.Generator(device=device).manual_seed(0)
            weights = [torch.empty(n, k, dtype=dtype, device=device)
                       .uniform_(-1, 1, generator=gen) for _ in range(num_matrices)]
            x = torch.randn(1, k, dtype=dtype, device=device, generator=gen)

            def read():
                return torch.sum(src)

            def gemv():
                for w in weights:
                    F.linear(x, w)

            for rep in range(repeats):
                start = time.perf_counter()
                for name, call, out in (("read", read, read_s), ("gemv", gemv, gemv_s)):
                    if rep == 0:
                        seconds, calls[name] = _time_calls(
                            call, device, repeats=1, warmup=warmup, bar=_Progress(False, 1, ""))
                        out.append(seconds[0])
                    else:
                        out.append(timed(call, calls[name]))
                if between is not None:
                    between(rep)
                if rep == 0:
                    bar.decide((time.perf_counter() - start) * (repeats - 1))
                bar.update()
    finally:
        bar.close()
    common = {"interleaved": "read, gemv" + (", between" if between is not None else "")}
    read_result = _result("bandwidth_read", "GB/s", [read_bytes / s / 1e9 for s in read_s], {
        "kind": "read", "size_bytes": read_bytes, "bytes_per_call": read_bytes, **common,
        **_common_params(device, dtype_name, calls["read"], repeats, warmup)})
    gemv_result = _result("bandwidth_gemv", "GB/s",
                          [num_matrices * weight_bytes / s / 1e9 for s in gemv_s], {
        "kind": "gemv", "rows": 1, "k": k, "n": n, "num_matrices": num_matrices,
        "working_set_bytes": num_matrices * weight_bytes, "weight_bytes_per_call": weight_bytes,
        **common, **_common_params(device, dtype_name, calls["gemv"], repeats, warmup)})
    return {"read": read_result, "gemv": gemv_result}


def probe_summary(device: torch.device | str | None = None, quick: bool = False) -> dict:
    """Read bandwidth and matmul throughput for the device's default dtype, JSON-ready.

    Meant for a lab contract's ``environment``. ``quick=True`` (tests, the ``ci`` profile) uses
    a 16 MiB buffer and n=256: it finishes in well under a second, but such a buffer sits in
    the cache of most machines, so its "bandwidth" is not DRAM bandwidth; the dict says so.
    """
    device = _resolve_device(device)
    dtype = default_dtype(device)
    if quick:
        bandwidth = measure_bandwidth(device, size_bytes=16 * 2**20, kind="read", dtype=dtype,
                                      repeats=2, warmup=1, progress=False)
        matmul = measure_matmul(device, dtype=dtype, n=256, repeats=2, warmup=1, progress=False)
    else:
        bandwidth = measure_bandwidth(device, kind="read", dtype=dtype)
        matmul = measure_matmul(device, dtype=dtype)
    summary = {
        "device": device.type,
        "device_name": device_name(device),
        "dtype": _dtype_name(dtype),
        "quick": bool(quick),
        "measured": True,  # timings: they change from run to run
        "bandwidth_read_gbps": bandwidth.median,
        "matmul_gflops": matmul.median,
        "probes": {"bandwidth_read": bandwidth.to_dict(), "matmul": matmul.to_dict()},
    }
    if quick:
        summary["note"] = ("modo rápido: el búfer de 16 MiB cabe en la caché, así que el ancho "
                           "de banda medido no es el de la memoria principal")
    return summary
