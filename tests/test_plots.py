"""Figures carry titles and axis labels with units, and mark what the caption points at."""

import matplotlib

matplotlib.use("Agg")

from ai_evolution.plots import batching_curve_figure, kv_bytes_figure, step_times_figure  # noqa: E402


def test_batching_curve_marks_the_departure_and_labels_units():
    fig = batching_curve_figure([1, 2, 4], [10.0, 11.0, 20.0], [10.0, 10.1, 10.2], 4, "m")
    ax1, ax2 = fig.axes
    assert "ms" in ax1.get_ylabel() and "tokens/s" in ax2.get_ylabel()
    assert any("lote 4" in t.get_text() for t in ax1.get_legend().get_texts())


def test_step_times_and_kv_figures_have_titles():
    fig = step_times_figure([1.0, 1.0, 1.1], [1.0, 2.0, 3.0], 16, "m")
    assert all(ax.get_title() for ax in fig.axes)
    fig = kv_bytes_figure({"a": 1024.0, "b": 2048.0}, 4096, "bf16")
    assert "GB" in fig.axes[0].get_xlabel()
