"""Chapter 5, the scheduler: its figures."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .style import COMMA, decimal_comma


def tradeoff_figure(panels: dict):
    """TTFT of the long prompt against the others' p99 inter-token latency, one point per token
    budget. ``panels`` maps a title to a list of rows with ``budget``, ``ttft_s``, ``itl_p99_s``."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.9), squeeze=False)
    for ax, (title, rows) in zip(axes[0], panels.items()):
        x = [1e3 * r["itl_p99_s"] for r in rows]
        y = [1e3 * r["ttft_s"] for r in rows]
        ax.plot(x, y, "o-", color="tab:purple")
        for r, xi, yi in zip(rows, x, y):
            ax.annotate(str(r["budget"]), (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set(xlabel="ITL p99 de las demás peticiones (ms)", ylabel="TTFT del prompt largo (ms)",
               title=title)
        decimal_comma(ax)
    fig.suptitle("Presupuesto de tokens por paso (etiquetas): TTFT frente a latencia entre tokens")
    fig.tight_layout()
    return fig


def preemption_figure(pool_blocks, preemptions, recomputed, e2e_preempted, e2e_spared):
    """Preemptions and recomputed tokens as the pool shrinks, and who pays in latency."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    x = np.arange(len(pool_blocks))
    ax1.bar(x - 0.2, preemptions, 0.4, label="expulsiones", color="tab:red")
    ax1b = ax1.twinx()
    ax1b.bar(x + 0.2, recomputed, 0.4, label="tokens recalculados", color="tab:gray")
    ax1.set_xticks(x, [str(b) for b in pool_blocks])
    ax1.set(xlabel="bloques del pool", ylabel="expulsiones", title="Lo que cuesta la falta de memoria")
    ax1b.set_ylabel("tokens recalculados")
    ax1.legend(loc="upper left", fontsize=8)
    ax1b.legend(loc="upper center", fontsize=8)
    pre = [np.nan if v is None else v for v in e2e_preempted]
    spa = [np.nan if v is None else v for v in e2e_spared]
    ax2.plot(x, spa, "o-", label="nunca expulsadas", color="tab:blue")
    ax2.plot(x, pre, "s-", label="expulsadas alguna vez", color="tab:red")
    ax2.set_xticks(x, [str(b) for b in pool_blocks])
    ax2.set(xlabel="bloques del pool", ylabel="latencia media de extremo a extremo (s)",
            title="Quién paga")
    ax2.yaxis.set_major_formatter(COMMA)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return fig


# States of a request's life, as the scheduler sees it: (label, x centre, colour).
LIFECYCLE_STATES = (("llegada", 0.7, "0.6"), ("cola\n(waiting)", 2.9, "tab:orange"),
                    ("prefill\n(uno o más trozos)", 5.1, "tab:purple"),
                    ("decodificación\n(un token\npor paso)", 7.3, "tab:blue"),
                    ("terminada", 9.5, "tab:green"))


def request_lifecycle_figure():
    """The life of a request in a vLLM-style scheduler: arrival, queue, prefill (possibly in
    chunks), decode, finish; preemption sends a running request back to the queue. A diagram,
    no data: boxes are states, arrows are the transitions the scheduler makes."""
    fig, ax = plt.subplots(figsize=(9.5, 3.2))
    y, h, w = 1.6, 0.9, 1.6
    for label, x, colour in LIFECYCLE_STATES:
        ax.add_patch(plt.Rectangle((x - w / 2, y - h / 2), w, h, facecolor=colour, alpha=0.25,
                                   edgecolor=colour, linewidth=1.5))
        ax.text(x, y, label, ha="center", va="center", fontsize=9)
    xs = [x for _, x, _ in LIFECYCLE_STATES]
    steps = ("", "admitida:\nhay bloques", "último trozo:\nprimer token", "max_tokens\no parada")
    for (a, b), what in zip(zip(xs, xs[1:]), steps):
        ax.annotate("", xy=(b - w / 2, y), xytext=(a + w / 2, y),
                    arrowprops=dict(arrowstyle="->", lw=1.5))
        if what:
            ax.text((a + b) / 2, y + h / 2 + 0.08, what, ha="center", va="bottom", fontsize=7.5)
    # Preemption: from the running states (prefill, decode) back to the front of the queue.
    for x_from in xs[2:4]:
        ax.annotate("", xy=(xs[1] + 0.25, y - h / 2), xytext=(x_from, y - h / 2),
                    arrowprops=dict(arrowstyle="->", lw=1.2, color="tab:red",
                                    connectionstyle="arc3,rad=-0.35"))
    ax.text((xs[1] + xs[3]) / 2, y - 1.35,
            "expulsión: sin bloque libre, vuelve la primera a la cola y recalcula después",
            ha="center", va="top", fontsize=8, color="tab:red")
    # What the user sees: TTFT spans queue + prefill, TPOT/ITL the decode steps.
    ax.annotate("", xy=(xs[2] + w / 2, y + 1.45), xytext=(xs[0], y + 1.45),
                arrowprops=dict(arrowstyle="<->", lw=1, color="0.3"))
    ax.text((xs[0] + xs[2] + w / 2) / 2, y + 1.5, "TTFT = espera en cola + prefill", ha="center",
            va="bottom", fontsize=8, color="0.3")
    ax.annotate("", xy=(xs[3] + w / 2, y + 1.45), xytext=(xs[3] - w / 2, y + 1.45),
                arrowprops=dict(arrowstyle="<->", lw=1, color="0.3"))
    ax.text(xs[3], y + 1.5, "TPOT, ITL", ha="center", va="bottom", fontsize=8, color="0.3")
    ax.set_xlim(-0.2, 10.4)
    ax.set_ylim(-0.1, 3.6)
    ax.axis("off")
    ax.set_title("La vida de una petición en el planificador")
    fig.tight_layout()
    return fig
