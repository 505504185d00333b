"""Chapter 4, paged attention and prefix caching: its figures."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .style import COMMA, decimal_comma


def block_table_figure(tables: dict, ref_counts: dict, block_size: int, title: str):
    """Each request's block table: one row per request, one cell per logical block, labelled
    with the physical block; blocks held by more than one request (prefix sharing) in orange."""
    names = list(tables)
    width = max(len(t) for t in tables.values())
    fig, ax = plt.subplots(figsize=(min(14, 1.2 + 0.55 * width), 0.9 + 0.38 * len(names)))
    for y, name in enumerate(names):
        for x, block in enumerate(tables[name]):
            shared = ref_counts.get(block, 1) > 1
            ax.add_patch(plt.Rectangle((x, y), 0.95, 0.9, color="tab:orange" if shared else "tab:blue",
                                       alpha=0.85))
            ax.text(x + 0.47, y + 0.45, str(block), ha="center", va="center", color="white", fontsize=8)
    ax.set_xlim(0, width)
    ax.set_ylim(len(names), 0)
    ax.set_yticks(np.arange(len(names)) + 0.45, names)
    ax.set_xticks(np.arange(width) + 0.47, [str(i) for i in range(width)])
    ax.set(xlabel=f"bloque lógico (de {block_size} tokens)", ylabel="petición", title=title)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color="tab:orange"),
                       plt.Rectangle((0, 0), 1, 1, color="tab:blue")],
              labels=["compartido (ref_cnt > 1)", "propio"], loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def utilization_figure(series: dict, title: str):
    """Share of the reserved KV memory holding real tokens, step by step, one line per layout."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for label, values in series.items():
        ax.plot(np.arange(len(values)), 100 * np.asarray(values), label=label)
    ax.set(xlabel="paso", ylabel="memoria reservada con tokens (%)", title=title, ylim=(0, 105))
    decimal_comma(ax)
    ax.legend()
    fig.tight_layout()
    return fig


def block_size_figure(sweep: list[dict]):
    """Internal waste (last block's empty slots) and block-table size against the block size."""
    bs = [r["block_size"] for r in sweep]
    fig, ax1 = plt.subplots(figsize=(7, 3.6))
    ax1.plot(bs, [100 * r["internal_waste"] for r in sweep], "o-", color="tab:red",
             label="desperdicio interno (%)")
    ax1.set_xscale("log", base=2)
    ax1.set_xticks(bs, [str(b) for b in bs])
    ax1.set(xlabel="tokens por bloque", ylabel="desperdicio interno (%)",
            title="Tamaño de bloque: desperdicio frente a tamaño de la tabla")
    ax2 = ax1.twinx()
    ax2.plot(bs, [r["mean_table_entries"] for r in sweep], "s--", color="tab:blue",
             label="entradas de la tabla por petición")
    ax2.set_yscale("log")
    ax2.set_ylabel("entradas de la tabla por petición")
    ax1.yaxis.set_major_formatter(COMMA)
    ax2.yaxis.set_major_formatter(COMMA)
    lines = ax1.get_lines() + ax2.get_lines()
    ax1.legend(lines, [ln.get_label() for ln in lines], loc="center left", fontsize=8)
    fig.tight_layout()
    return fig
