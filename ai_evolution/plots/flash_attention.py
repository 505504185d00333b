"""Chapter 8, FlashAttention: its figures."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..fmt import es
from .style import COMMA, log_y


def flash_io_memory_figure(io: dict, memory: dict):
    """Chapter 8 in one figure: the IO model's bytes against N (naive vs tiled), the tiled
    bytes against the query tile at one N (hollow: tiles that do not fit the fast memory), and
    the peak memory measured on this machine against N (naive, tiled, SDPA)."""
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(14, 4.2))
    n = np.asarray(io["sizes"])
    ax1.plot(n, np.asarray(io["naive_bytes"]) / 1e6, "o-", color="tab:red", label="ingenua")
    ax1.plot(n, np.asarray(io["tiled_bytes"]) / 1e6, "s-", color="tab:blue",
             label=f"por bloques ({es(io['fast_memory_bytes'] / 1024, 0)} KiB de memoria rápida)")
    ax1.set_xscale("log", base=2)
    log_y(ax1)
    ax1.xaxis.set_major_formatter(COMMA)
    ax1.set(xlabel="N (tokens del prefill causal)", ylabel="MB movidos (escala log.)",
            title=f"Modelo de E/S: una cabeza, d = {io['head_dim']}")
    ax1.legend(fontsize=8)
    sweep = io["sweep"]
    bq = np.array([r["block_q"] for r in sweep])
    mb = np.array([r["bytes"] for r in sweep]) / 1e6
    fits = np.array([r["fits"] for r in sweep])
    ax2.plot(bq, mb, "-", color="tab:blue", lw=1)
    ax2.plot(bq[fits], mb[fits], "o", color="tab:blue", label="cabe en la memoria rápida")
    ax2.plot(bq[~fits], mb[~fits], "o", mfc="none", color="tab:blue", label="no cabe")
    naive_sweep = io["naive_bytes"][io["sizes"].index(io["sweep_n"])] / 1e6 \
        if io["sweep_n"] in io["sizes"] else None
    if naive_sweep is not None:
        ax2.axhline(naive_sweep, color="tab:red", ls="--", lw=1, label="ingenua")
    ax2.set_xscale("log", base=2)
    log_y(ax2)
    ax2.xaxis.set_major_formatter(COMMA)
    ax2.set(xlabel=f"bloque de consultas (bloque de claves: {sweep[0]['block_k']})",
            ylabel="MB movidos (escala log.)", title=f"Modelo de E/S en N = {io['sweep_n']}")
    ax2.legend(fontsize=8)
    m = np.asarray(memory["sizes"])
    for name, label, style, color in (("naive", "ingenua", "o-", "tab:red"),
                                      ("tiled", "por bloques", "s-", "tab:blue"),
                                      ("sdpa", "SDPA", "^-", "tab:green")):
        ax3.plot(m, np.asarray(memory["peak_bytes"][name]) / 1e6, style, color=color, label=label)
    ax3.plot(m, np.asarray(memory["score_matrix_bytes"]) / 1e6, ":", color="0.4",
             label="una matriz N × N por cabeza")
    ax3.set_xscale("log", base=2)
    log_y(ax3)
    ax3.xaxis.set_major_formatter(COMMA)
    ax3.set(xlabel="N (tokens del prefill causal)", ylabel="MB (escala log.)",
            title=f"Memoria pico medida ({memory['device']}, {memory['dtype']})")
    ax3.legend(fontsize=8)
    fig.tight_layout()
    return fig


def attention_time_figure(timing: dict):
    """Median milliseconds per call of naive, tiled (a Python loop) and SDPA attention against N."""
    fig, ax = plt.subplots(figsize=(6.5, 4.0))
    n = np.asarray(timing["sizes"])
    for name, label, style, color in (("naive", "ingenua", "o-", "tab:red"),
                                      ("tiled", "por bloques (bucle en Python)", "s-", "tab:blue"),
                                      ("sdpa", "SDPA (núcleo fusionado)", "^-", "tab:green")):
        ax.plot(n, [float(np.median(r)) for r in timing["ms"][name]], style, color=color,
                label=label)
    ax.set_xscale("log", base=2)
    log_y(ax)
    ax.xaxis.set_major_formatter(COMMA)
    threads = timing["torch_threads"]
    ax.set(xlabel="N (tokens del prefill causal)", ylabel="ms por llamada (mediana, escala log.)",
           title=f"Tiempo de la atención ({timing['dtype']}, {threads} hilo{'' if threads == 1 else 's'})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
