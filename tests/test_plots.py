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


def test_request_lifecycle_shows_every_state_and_preemption_back_to_the_queue():
    from ai_evolution.plots import LIFECYCLE_STATES, request_lifecycle_figure

    fig = request_lifecycle_figure()
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    for state in ("llegada", "cola", "prefill", "decodificación", "terminada"):
        assert state in texts
    assert "expulsión" in texts and "TTFT" in texts
    xs = [x for _, x, _ in LIFECYCLE_STATES]
    assert xs == sorted(xs)  # left to right, in the order a request lives them
    # two preemption arrows (from prefill and from decode) point back at the queue box
    red = [a for a in fig.axes[0].texts if getattr(a, "arrow_patch", None) is not None
           and a.arrow_patch.get_edgecolor()[:3] == matplotlib.colors.to_rgb("tab:red")]
    assert sorted(a.xyann[0] for a in red) == xs[2:4]
    assert all(abs(a.xy[0] - xs[1]) < 1 for a in red)


def test_every_name_a_figure_module_reads_is_defined():
    """Each chapter's module imports what its figures use (a name left behind in another module
    fails only when that figure is drawn, in a notebook)."""
    import builtins
    import dis
    import importlib
    import pkgutil
    import types

    import ai_evolution.plots as plots

    def globals_read(code):
        for ins in dis.get_instructions(code):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                yield ins.argval
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                yield from globals_read(const)

    for info in pkgutil.iter_modules(plots.__path__):
        mod = importlib.import_module(f"{plots.__name__}.{info.name}")
        code = compile(open(mod.__file__).read(), mod.__file__, "exec")
        missing = {n for n in globals_read(code) if n not in vars(mod) and not hasattr(builtins, n)}
        assert not missing, (info.name, missing)


def test_quantization_figures_draw_with_decimal_commas():
    from ai_evolution.labs.quantization import weights_vs_kv
    from ai_evolution.plots import layer_error_figure, weights_kv_figure

    fig = layer_error_figure({"int8": {"a": 0.001, "b": 0.002}, "int4": {"a": 0.01, "b": 0.03}})
    assert fig.axes[0].get_title() and "%" in fig.axes[0].get_ylabel()
    fig = weights_kv_figure(weights_vs_kv())
    assert "GB" in fig.axes[0].get_ylabel()
    assert fig.axes[0].yaxis.get_major_formatter()(0.5, 0) == "0,5"
