"""Shared matplotlib figures. Each has a title, axis labels with units, and returns the Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter

from .fmt import es

# Tick labels with a decimal comma, as the book's prose writes numbers.
_COMMA = FuncFormatter(lambda x, _pos: f"{x:g}".replace(".", ","))


def decimal_comma(ax) -> None:
    ax.xaxis.set_major_formatter(_COMMA)
    ax.yaxis.set_major_formatter(_COMMA)


def step_times_figure(step_ms_cached, step_ms_uncached, prompt_len: int, model_name: str):
    """Per-token time against the sequence length, with and without KV cache (two panels)."""
    cached = np.asarray(step_ms_cached)
    uncached = np.asarray(step_ms_uncached)
    n = np.arange(1, len(cached) + 1)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    seq_len = prompt_len + n
    ax1.plot(seq_len[1:], uncached[1:], label="sin caché", color="tab:red")
    ax1.plot(seq_len[1:], cached[1:], label="con caché KV", color="tab:blue")
    ax1.set(xlabel="longitud de la secuencia (tokens)", ylabel="tiempo por token (ms)",
            title="Coste de cada token nuevo")
    ax1.legend()
    ax2.plot(n, np.cumsum(uncached) / 1e3, label="sin caché", color="tab:red")
    ax2.plot(n, np.cumsum(cached) / 1e3, label="con caché KV", color="tab:blue")
    ax2.set(xlabel="tokens generados", ylabel="tiempo total (s)",
            title="Tiempo acumulado de generación")
    ax2.legend()
    decimal_comma(ax1)
    decimal_comma(ax2)
    fig.suptitle(f"Modelo {model_name}, prompt de {prompt_len} tokens")
    fig.tight_layout()
    return fig


def kv_bytes_figure(bytes_per_token: dict[str, float], context_len: int, dtype: str):
    """Horizontal bars: KV-cache size of one sequence of ``context_len`` tokens per model."""
    names = list(bytes_per_token)
    gb = np.array([bytes_per_token[n] * context_len / 1e9 for n in names])
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(names) + 1.2))
    ax.barh(names, gb, color="tab:purple")
    for y, v in enumerate(gb):
        ax.text(v, y, " " + es(v, 2), va="center")
    ax.set(xlabel=f"caché KV de una secuencia de {context_len} tokens (GB, {dtype})",
           title="Bytes de caché KV por secuencia")
    ax.invert_yaxis()
    ax.xaxis.set_major_formatter(_COMMA)
    ax.set_xlim(0, gb.max() * 1.25)
    fig.tight_layout()
    return fig


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
    ax1.yaxis.set_major_formatter(_COMMA)
    ax2.yaxis.set_major_formatter(_COMMA)
    ax1.set(ylabel="tiempo por paso (ms)", title="Paso de decodificación")
    ax2.set(ylabel="tokens/s", title="Rendimiento")
    fig.suptitle(f"Modelo {model_name}")
    fig.tight_layout()
    return fig
