"""Shared matplotlib figures. Each has a title, axis labels with units, and returns the Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

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
    ax.yaxis.set_major_formatter(_COMMA)
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
    ax1.yaxis.set_major_formatter(_COMMA)
    ax2.yaxis.set_major_formatter(_COMMA)
    lines = ax1.get_lines() + ax2.get_lines()
    ax1.legend(lines, [ln.get_label() for ln in lines], loc="center left", fontsize=8)
    fig.tight_layout()
    return fig


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
    ax2.yaxis.set_major_formatter(_COMMA)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _log_y(ax) -> None:
    """Log y scale with ticks at 1, 2 and 5 of each decade, labelled with a decimal comma."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(_COMMA)
    ax.yaxis.set_minor_formatter(NullFormatter())


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
        _log_y(ax)
        ax.set(xlabel="tasa de llegada realizada (peticiones/s)", ylabel="TTFT (s, escala log.)",
               title=title)
        ax.xaxis.set_major_formatter(_COMMA)
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
        ax.yaxis.set_major_formatter(_COMMA)
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
        _log_y(ax)
        ax.set(xlabel="peticiones por bloque", ylabel="TTFT p99 del bloque (s, escala log.)",
               title=f"{es(s['fraction'], 2)} × la capacidad")
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("¿Cuántas peticiones necesita un p99? Bloques de una ejecución larga")
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
    for r in rows:
        low, high = (base * (1 + v) for v in r["increase_interval"])
        on = r["label"] in front
        ax.errorbar(r["bytes_per_weight"], r["perplexity"],
                    yerr=[[max(0.0, r["perplexity"] - low)], [max(0.0, high - r["perplexity"])]],
                    fmt="o", color="tab:blue" if on else "tab:gray", capsize=3)
        ax.annotate(r["label"], (r["bytes_per_weight"], r["perplexity"]),
                    textcoords="offset points", xytext=(6, 4), fontsize=9)
    ax.plot([by[k]["bytes_per_weight"] for k in front], [by[k]["perplexity"] for k in front],
            color="tab:blue", lw=1, label="frente de Pareto")
    ax.axhline(base, color="tab:gray", ls=":", lw=1, label="bf16")
    ax.set_xscale("log", base=2)
    ticks = sorted({round(r["bytes_per_weight"], 3) for r in rows})
    ax.set_xticks(ticks, [es(t, 2) for t in ticks], fontsize=8)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(_COMMA)
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
    _log_y(ax1)
    ax1.xaxis.set_major_formatter(_COMMA)
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
    _log_y(ax2)
    ax2.xaxis.set_major_formatter(_COMMA)
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
    _log_y(ax3)
    ax3.xaxis.set_major_formatter(_COMMA)
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
    _log_y(ax)
    ax.xaxis.set_major_formatter(_COMMA)
    ax.set(xlabel="N (tokens del prefill causal)", ylabel="ms por llamada (mediana, escala log.)",
           title=f"Tiempo de la atención ({timing['dtype']}, {timing['torch_threads']} hilo(s))")
    ax.legend(fontsize=8)
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
