"""Chapter 7, quantization: its figures."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter, NullFormatter

from ..fmt import es
from .style import COMMA, decimal_comma


def quant_speed_figure(rows: list[dict], bandwidth_gbps: float, model_name: str,
                       predicted_ms: list[float] | None = None):
    """Decode step against the bytes it reads, one point per weight format (median, with the
    range of the rounds), with the bandwidth floor (bytes / the measured read rate) and, if
    given, a prediction per format. ``rows``: ``label``, ``bytes_per_step``, ``step_s``,
    ``step_range_s`` (``labs.quantization.analyse_speed``)."""
    mb = np.array([r["bytes_per_step"] / 1e6 for r in rows])
    ms = np.array([1e3 * r["step_s"] for r in rows])
    lo = ms - np.array([1e3 * r["step_range_s"][0] for r in rows])
    hi = np.array([1e3 * r["step_range_s"][1] for r in rows]) - ms
    fig, ax = plt.subplots(figsize=(7, 4.2))
    x = np.linspace(0, mb.max() * 1.08, 50)
    ax.plot(x, x * 1e6 / (bandwidth_gbps * 1e9) * 1e3, color="tab:gray", ls="--",
            label=f"suelo: bytes / {es(bandwidth_gbps, 1)} GB/s")
    if predicted_ms is not None:
        ax.plot(mb, predicted_ms, "s", color="tab:orange", mfc="none",
                label="predicción (suelo + sobrecarga)")
    ax.errorbar(mb, ms, yerr=[lo, hi], fmt="o", color="tab:blue", capsize=3, label="medido")
    for r, x_, y_ in zip(rows, mb, ms):
        ax.annotate(r["label"], (x_, y_), textcoords="offset points", xytext=(6, 4), fontsize=9)
    ax.set(xlabel="bytes leídos por paso (MB)", ylabel="tiempo por paso (ms)",
           title=f"Decodificación con lote 1 de {model_name}, mismo modelo en cada formato")
    ax.set_xlim(0, mb.max() * 1.12)
    ax.set_ylim(0, max(ms.max() + hi.max(), *(predicted_ms or [0])) * 1.12)
    decimal_comma(ax)
    ax.legend(loc="upper left")
    fig.tight_layout()
    return fig


def pareto_figure(rows: list[dict], front: list[str], model_name: str, tokens: int):
    """Perplexity on held-out text against bytes per weight, one point per format, the Pareto
    front joined. ``rows``: ``label``, ``bytes_per_weight``, ``perplexity``,
    ``increase_interval`` (relative to bf16, for the error bars)."""
    by = {r["label"]: r for r in rows}
    base = by["bf16"]["perplexity"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ordered = sorted(rows, key=lambda r: r["bytes_per_weight"])
    for r in ordered:
        low, high = (base * (1 + v) for v in r["increase_interval"])
        on = r["label"] in front
        ax.errorbar(r["bytes_per_weight"], r["perplexity"],
                    yerr=[[max(0.0, r["perplexity"] - low)], [max(0.0, high - r["perplexity"])]],
                    fmt="o", color="tab:blue" if on else "tab:gray", capsize=3)
    # Formats a few percent apart in bytes (int4 with groups of 32 and 64, symmetric or not)
    # would print their labels over each other: each cluster of near points gets a column of
    # labels to its right, in the order of their perplexity, each with a line to its point.
    clusters: list[list[dict]] = []
    for r in ordered:
        if clusters and r["bytes_per_weight"] / clusters[-1][-1]["bytes_per_weight"] < 1.15:
            clusters[-1].append(r)
        else:
            clusters.append([r])
    spans = [base * (1 + v) for r in rows for v in r["increase_interval"]]
    spans += [r["perplexity"] for r in rows]
    step = 0.055 * (max(spans) - min(spans) or 1.0)     # one label's height, in perplexity
    for cluster in clusters:
        last = cluster is clusters[-1]
        if len(cluster) == 1:
            r = cluster[0]
            ax.annotate(r["label"], (r["bytes_per_weight"], r["perplexity"]), fontsize=9,
                        textcoords="offset points", xytext=(-6, 6) if last else (6, 4),
                        ha="right" if last else "left")
            continue
        right = max(c["bytes_per_weight"] for c in cluster)
        top = max(c["perplexity"] for c in cluster)
        for i, r in enumerate(sorted(cluster, key=lambda r: -r["perplexity"])):
            ax.annotate(r["label"], (r["bytes_per_weight"], r["perplexity"]), fontsize=9,
                        xytext=(right * 1.1, top - i * step), va="center",
                        arrowprops={"arrowstyle": "-", "color": "0.6", "lw": 0.6})
    ax.plot([by[k]["bytes_per_weight"] for k in front], [by[k]["perplexity"] for k in front],
            color="tab:blue", lw=1, label="frente de Pareto")
    ax.axhline(base, color="tab:gray", ls=":", lw=1, label="bf16")
    ax.set_xscale("log", base=2)
    ticks = []
    for t in sorted({round(r["bytes_per_weight"], 3) for r in rows}):
        if not ticks or t / ticks[-1] > 1.12:   # closer ticks would print over each other
            ticks.append(t)
    ax.set_xticks(ticks, [es(t, 2) for t in ticks], fontsize=8)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(COMMA)
    ax.set(xlabel="bytes por peso de las capas lineales (con escalas; escala logarítmica)",
           ylabel="perplejidad",
           title=f"{model_name}: perplejidad en {tokens} tokens que no vio al entrenar")
    ax.legend(loc="upper right")
    fig.tight_layout()
    return fig


def layer_error_figure(errors: dict[str, dict[str, float]]):
    """Relative error of every linear layer's weight (module order), one line per format."""
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for label, per_layer in errors.items():
        ax.plot(range(1, len(per_layer) + 1), [100 * v for v in per_layer.values()], "o-",
                ms=3, lw=1, label=label)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _p: f"{y:g}".replace(".", ",")))
    ax.set(xlabel="capa lineal (en el orden del modelo; la última es lm_head)",
           ylabel="error relativo del peso (%)", title="Error de cada matriz cuantizada")
    ax.legend(ncol=3, fontsize=8)
    fig.tight_layout()
    return fig


def weights_kv_figure(roof: dict):
    """Bytes one decode step reads against the batch size: weights (once per step) plus the KV
    cache (once per sequence), one line per weight/cache format (``labs.quantization.
    weights_vs_kv``), with the batch at which the cache outweighs the weights marked."""
    b = np.asarray(roof["batches"])
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (label, series), color in zip(roof["step_bytes"].items(),
                                      ("tab:gray", "tab:blue", "tab:orange", "tab:green")):
        ax.plot(b, np.asarray(series) / 1e9, "o-", ms=3, color=color, label=label)
        cross = roof["crossing_batch"][label]
        if b.min() <= cross <= b.max():
            ax.axvline(cross, color=color, lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(b, [str(x) for x in b])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _p: f"{y:g}".replace(".", ",")))
    ax.set(xlabel="secuencias en el lote", ylabel="bytes leídos por paso (GB)",
           title=f"{roof['model']}, {roof['context_len']} tokens de contexto por secuencia")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
