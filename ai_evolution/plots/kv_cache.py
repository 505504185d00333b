"""Chapter 2, the KV cache: its figures."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..fmt import es
from .style import COMMA, decimal_comma


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
    ax.xaxis.set_major_formatter(COMMA)
    ax.set_xlim(0, gb.max() * 1.25)
    fig.tight_layout()
    return fig
