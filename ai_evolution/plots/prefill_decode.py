"""Chapter 1, prefill and decode: its figures."""

from __future__ import annotations

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
