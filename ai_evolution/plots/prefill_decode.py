"""Chapter 1, prefill and decode: its figures."""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
import numpy as np

from .style import COMMA


def batching_curve_figure(batch_sizes, measured_ms, predicted_ms, departure: int | None,
                          model_name: str):
    """Decode step time and throughput against batch size: measured vs the calibrated roofline."""
    b = np.asarray(batch_sizes)
    meas, pred = np.asarray(measured_ms), np.asarray(predicted_ms)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax1.plot(b, meas, "o-", label="medido", color="tab:blue")
    ax1.plot(b, pred, "s--", label="roofline calibrado", color="tab:gray")
    ax2.plot(b, b / meas * 1e3, "o-", label="medido", color="tab:blue")
    ax2.plot(b, b / pred * 1e3, "s--", label="roofline calibrado", color="tab:gray")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(b, [str(x) for x in b])
        if departure is not None:
            ax.axvline(departure, color="tab:red", lw=1, ls=":", label=f"se separan (lote {departure})")
        ax.set_xlabel("secuencias en el lote")
        ax.legend()
    ax1.yaxis.set_major_formatter(COMMA)
    ax2.yaxis.set_major_formatter(COMMA)
    ax1.set(ylabel="tiempo por paso (ms)", title="Paso de decodificación")
    ax2.set(ylabel="tokens/s", title="Rendimiento")
    fig.suptitle(f"Modelo {model_name}")
    fig.tight_layout()
    return fig


def memory_wall_figure(generations, dtype: str = "fp16"):
    """The memory wall from datasheets: ``generations`` is ``[(year, DeviceSpec), ...]``, oldest
    first. Left: peak ``dtype`` compute and memory bandwidth, each relative to the first
    generation (log scale); right: the ridge point (FLOP per byte) each generation needs."""
    years = [y for y, _ in generations]
    names = [(re.search(r"\b[A-Z]\d{3}\b", s.name) or re.search(r".*", s.name)).group(0)
             for _, s in generations]  # "V100", "A100"...: the chip, not the whole product name
    peak = np.array([s.peak_flops[dtype] for _, s in generations])
    bw = np.array([s.bandwidth_bytes_per_s for _, s in generations])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax1.plot(years, peak / peak[0], "o-", label=f"pico de cálculo ({dtype})", color="tab:red")
    ax1.plot(years, bw / bw[0], "s-", label="ancho de banda de la memoria", color="tab:blue")
    ax1.set_yscale("log")
    ax1.set(xlabel="año", ylabel=f"veces el {names[0]}", title="Cálculo frente a memoria")
    ax2.bar(range(len(years)), peak / bw, color="tab:gray")
    ax2.set_xticks(range(len(years)), [f"{n}\n{y}" for n, y in zip(names, years)])
    ax2.set(ylabel="FLOP por byte", title="Punto de cresta")
    for ax in (ax1, ax2):
        ax.yaxis.set_major_formatter(COMMA)
    ax1.set_xticks(years, [str(y) for y in years])
    ax1.legend()
    fig.tight_layout()
    return fig
