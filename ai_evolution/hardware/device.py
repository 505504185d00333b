"""What the device says about itself: which device to use, the dtypes it runs, its name and
memory, and how to wait for it (``synchronize``)."""

from __future__ import annotations

import os
import platform
import sys

import torch


def pick_device(prefer: str | None = None) -> torch.device:
    """CUDA if present, else Apple MPS, else CPU; ``prefer`` forces one ("cuda", "mps", "cpu")."""
    accepted = ("cuda", "mps", "cpu")
    if prefer is not None:
        if prefer not in accepted:
            raise ValueError(f"dispositivo {prefer!r} desconocido; aceptados: {', '.join(accepted)}")
        if prefer == "cuda" and not torch.cuda.is_available():
            raise ValueError("se pidió el dispositivo 'cuda', pero torch.cuda.is_available() es "
                             "False; aceptados aquí: 'cpu' o None (elige solo)")
        if prefer == "mps" and not _mps_available():
            raise ValueError("se pidió el dispositivo 'mps', pero Apple MPS no está disponible; "
                             "aceptados aquí: 'cpu' o None (elige solo)")
        return torch.device(prefer)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if _mps_available():
        return torch.device("mps")
    return torch.device("cpu")


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend and backend.is_available())


def supported_dtypes(device: torch.device | str) -> list[str]:
    """Floating dtypes the device runs natively. A T4 (compute capability 7.5) has no bf16."""
    device = torch.device(device)
    if device.type == "cuda":
        dtypes = ["float32", "float16"]
        if torch.cuda.is_bf16_supported(including_emulation=False):
            dtypes.append("bfloat16")
        return dtypes
    if device.type == "mps":
        return ["float32", "float16", "bfloat16"]
    return ["float32", "bfloat16"]


def default_dtype(device: torch.device | str) -> torch.dtype:
    """The half-precision dtype to serve with: bf16 where supported, else fp16; fp32 on CPU.

    On CPU fp32 is the default because the labs compare against exact greedy decoding and a
    CPU's bf16 matrix-vector kernels are not faster at batch 1.
    """
    device = torch.device(device)
    if device.type == "cpu":
        return torch.float32
    return torch.bfloat16 if "bfloat16" in supported_dtypes(device) else torch.float16


def device_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return "Apple MPS"
    return platform.processor() or platform.machine() or "cpu"


def describe(device: torch.device | str | None = None) -> dict:
    """Facts about the machine for the contract's ``environment`` field."""
    import numpy

    device = pick_device() if device is None else torch.device(device)
    env = {
        "device": device.type,
        "device_name": device_name(device),
        "supported_dtypes": supported_dtypes(device),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": {"torch": torch.__version__, "numpy": numpy.__version__},
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["gpu_memory_bytes"] = int(props.total_memory)
        env["compute_capability"] = f"{props.major}.{props.minor}"
    return env

def synchronize(device: torch.device) -> None:
    """Wait for the device to finish queued work, so wall-clock timings are honest."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
