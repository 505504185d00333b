"""Chapter 3, continuous batching: its figures."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..fmt import es
from .style import COMMA, decimal_comma


def row_timeline_figure(histories: dict, num_rows: int, max_steps: int | None = None):
    """Which request holds each KV row at every step, one panel per policy.

    Colored cell: the row's request ran this step (a dot marks its prefill); gray: the row is
    held by a request that has already finished (static batching's idle row); white: free.
    ``histories`` maps a panel title to an engine ``history`` (list of ``StepRecord``).
    """
    from matplotlib.colors import ListedColormap

    palette = plt.get_cmap("tab20").colors
    fig, axes = plt.subplots(len(histories), 1, figsize=(10, 1.2 + 0.32 * num_rows * len(histories)),
                             squeeze=False)
    longest = max(len(h) for h in histories.values())
    steps = min(longest, max_steps) if max_steps else longest
    for ax, (title, history) in zip(axes[:, 0], histories.items()):
        grid = np.full((num_rows, steps), -1)           # -1 free, -2 held idle, k >= 0 request
        prefill_x, prefill_y = [], []
        for x, rec in enumerate(history[:steps]):
            for rid, row in rec.holders.items():
                grid[row, x] = -2
            for e in rec.scheduled:
                grid[e.first_block, x] = int(e.request_id) % len(palette) if e.request_id.isdigit() \
                    else hash(e.request_id) % len(palette)
                if e.is_prefill:
                    prefill_x.append(x)
                    prefill_y.append(e.first_block)
        colors = ListedColormap(["white", "0.75", *palette])
        ax.imshow(grid + 2, cmap=colors, vmin=0, vmax=len(palette) + 1, aspect="auto",
                  interpolation="nearest")
        ax.scatter(prefill_x, prefill_y, s=6, color="black", label="prefill")
        idle = (grid == -2).sum() / max(1, (grid != -1).sum())
        ax.set(ylabel="fila de la caché", title=f"{title}: {len(history)} pasos, "
               f"{es(100 * idle, 0)} % de filas reservadas ociosas")
        ax.set_yticks(range(num_rows))
    axes[-1, 0].set_xlabel("paso" + (f" (primeros {steps})" if steps < longest else ""))
    fig.tight_layout()
    return fig


def batching_gain_figure(caps, measured_ratio, simulated_ratio, measured_label: str,
                         simulated_label: str, simulated_caps=None):
    """Throughput of continuous over static batching against the output-length cap."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.plot(caps, measured_ratio, "o-", color="tab:blue", label=measured_label)
    ax.plot(simulated_caps if simulated_caps is not None else caps, simulated_ratio, "s--",
            color="tab:orange", label=simulated_label)
    ax.axhline(1, color="0.5", lw=1, ls=":")
    ax.set_xscale("log", base=2)
    all_caps = sorted(set(caps) | set(simulated_caps or []))
    ax.set_xticks(all_caps, [str(c) for c in all_caps])
    ax.yaxis.set_major_formatter(COMMA)
    ax.set(xlabel="tope de la longitud de salida (tokens; más tope, más dispersión)",
           ylabel="rendimiento continuo / estático", title="Ganancia del batching continuo")
    ax.legend()
    fig.tight_layout()
    return fig


def latency_cdf_figure(latencies: dict, xlabel: str = "latencia de extremo a extremo (s)"):
    """Empirical CDF of per-request latencies, one line per label."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for label, values in latencies.items():
        v = np.sort(np.asarray(values, dtype=float))
        ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=label)
    ax.set(xlabel=xlabel, ylabel="fracción de peticiones", title="Distribución de la latencia")
    decimal_comma(ax)
    ax.legend()
    fig.tight_layout()
    return fig
