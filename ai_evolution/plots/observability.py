"""Chapter 6, observability: its figures."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..fmt import es
from .style import COMMA, log_y


def load_curve_figure(panels: dict):
    """TTFT p50 and p99 against the realized arrival rate, log scale: the hockey stick.

    ``panels`` maps a title to ``{"rows": sweep rows, "repeats": rows of repeated runs,
    "capacity": req/s, "knee": find_knee(...) or None}``; a row has ``realized_rate``,
    ``ttft_p50_s``, ``ttft_p99_s`` and ``ttft_p99_ci_s`` (a bootstrap interval, drawn as a bar).
    """
    fig, axes = plt.subplots(1, len(panels), figsize=(5.4 * len(panels), 4.0), squeeze=False)
    for ax, (title, p) in zip(axes[0], panels.items()):
        rows = sorted(p["rows"], key=lambda r: r["realized_rate"])
        x = [r["realized_rate"] for r in rows]
        p99 = np.array([r["ttft_p99_s"] for r in rows])
        ci = np.array([r["ttft_p99_ci_s"] for r in rows]).T
        ax.plot(x, [r["ttft_p50_s"] for r in rows], "o-", color="tab:blue", label="TTFT p50")
        ax.errorbar(x, p99, yerr=[p99 - ci[0], ci[1] - p99], fmt="s-", color="tab:red",
                    capsize=3, label="TTFT p99 (IC bootstrap 95 %)")
        if p.get("repeats"):
            rx = [r["realized_rate"] for r in p["repeats"]]
            rp = np.array([r["ttft_p99_s"] for r in p["repeats"]])
            rci = np.array([r["ttft_p99_ci_s"] for r in p["repeats"]]).T
            ax.errorbar(rx, rp, yerr=[rp - rci[0], rci[1] - rp], fmt="^", mfc="none",
                        color="tab:purple", capsize=2, label="p99, ejecuciones repetidas")
        ax.axvline(p["capacity"], color="0.4", ls=":", lw=1.2, label="capacidad (bucle cerrado)")
        if p.get("knee"):
            k = p["knee"]
            ax.annotate("codo", (k["realized_rate"], k["ttft_p99_s"]), textcoords="offset points",
                        xytext=(12, -22), arrowprops={"arrowstyle": "->", "color": "0.3"}, fontsize=9,
                        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "0.6"})
        log_y(ax)
        ax.set(xlabel="tasa de llegada realizada (peticiones/s)", ylabel="TTFT (s, escala log.)",
               title=title)
        ax.xaxis.set_major_formatter(COMMA)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("Latencia hasta el primer token frente a la carga ofrecida")
    fig.tight_layout()
    return fig


def repeat_spread_figure(panels: dict):
    """TTFT p99 of each repeated run at one configured rate, with its own bootstrap interval.

    ``panels`` maps a title to the runs' rows (``ttft_p99_s``, ``ttft_p99_ci_s``,
    ``realized_rate``). Intervals that do not overlap are runs that disagree beyond what each
    one believes about itself.
    """
    fig, axes = plt.subplots(1, len(panels), figsize=(5.4 * len(panels), 3.8), squeeze=False)
    for ax, (title, rows) in zip(axes[0], panels.items()):
        idx = np.arange(1, len(rows) + 1)
        p99 = np.array([1e3 * r["ttft_p99_s"] for r in rows])
        ci = 1e3 * np.array([r["ttft_p99_ci_s"] for r in rows]).T
        ax.errorbar(idx, p99, yerr=[p99 - ci[0], ci[1] - p99], fmt="o", color="tab:red", capsize=4)
        if len(rows) <= 10:
            for i, r, y in zip(idx, rows, p99):
                ax.annotate(es(r["realized_rate"], 1), (i, y), textcoords="offset points",
                            xytext=(6, -3), fontsize=7, color="0.35")
        ax.set_xticks(idx if len(rows) <= 10 else idx[::max(1, len(rows) // 10)])
        ax.set(xlabel="ejecución (etiqueta: tasa realizada, peticiones/s)",
               ylabel="TTFT p99 (ms) e IC 95 %", title=title)
        ax.yaxis.set_major_formatter(COMMA)
    fig.suptitle("La misma tasa configurada, distintas ejecuciones")
    fig.tight_layout()
    return fig


def settle_figure(settles: list[dict]):
    """TTFT p99 of every block of consecutive requests of a long run, against the block size,
    with the whole run's p99 and the tolerance band; one panel per long run (``settle`` output,
    with each block size's ``p99_s`` list)."""
    fig, axes = plt.subplots(1, len(settles), figsize=(5.2 * len(settles), 3.8), squeeze=False)
    rng = np.random.default_rng(0)  # horizontal jitter only
    for ax, s in zip(axes[0], settles):
        sizes = [b["block"] for b in s["blocks"]]
        for b in s["blocks"]:
            x = b["block"] * np.exp(rng.uniform(-0.12, 0.12, len(b["p99_s"])))
            ax.plot(x, b["p99_s"], ".", color="tab:red", alpha=0.6, ms=5)
        whole, tol = s["ttft_p99_s"], s["tolerance"]
        ax.axhline(whole, color="k", lw=1, label=f"p99 de las {s['requests']} peticiones")
        ax.axhspan(whole * (1 - tol), whole * (1 + tol), color="0.85",
                   label=f"±{es(100 * tol, 0)} %")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(n) for n in sizes])
        log_y(ax)
        ax.set(xlabel="peticiones por bloque", ylabel="TTFT p99 del bloque (s, escala log.)",
               title=f"{es(s['fraction'], 2)} × la capacidad")
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("¿Cuántas peticiones necesita un p99? Bloques de una ejecución larga")
    fig.tight_layout()
    return fig
