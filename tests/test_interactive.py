"""Interactive figures (``ai_evolution.plots.interactive``): the states they hold, and the HTML
they write driven in headless Chromium as a reader would use it.

Each explorer is written into a page in a temporary folder beside the ``plotly.min.js`` of the
installed package (what ``_ext/interactive.py`` ships with the book) and opened from ``file://``:
every option of every control is chosen the way a person does (the value set, an ``input`` event),
and the readouts and the plotted traces must become the ones the executed data hold for that
point; the page must make no request outside its folder; at 1400 and at 390 px nothing sticks out.
This needs no book build.
"""

from __future__ import annotations

import json
import shutil

import plotly.graph_objects as go
import pytest

from ai_evolution.plots.interactive import (PLOTLY_JS, Control, Explorer, State, base_layout,
                                            plotly_js_path)
from browser import INSTALL_HINT, Chromium, find_chromium

WIDTHS = {"escritorio": (1400, 900, False), "móvil": (390, 844, True)}


def toy_explorer() -> Explorer:
    fig = go.Figure([go.Scatter(name="medido", x=[1, 2], y=[0, 0]),
                     go.Bar(name="reserva", x=["a"], y=[0])],
                    layout=base_layout("Prueba", "secuencias", "ms"))
    controls = [Control("model", "Modelo", ("pequeño", "grande")),
                Control("n", "Secuencias", ("1", "2", "4"), kind="slider", default=1)]

    def state_of(model, n):
        y = [(model + 1) * (n + 1) * 1.5, (model + 1) * (n + 2) * 2.25]
        return State(traces=({"y": y}, {"y": [n + 0.5]}),
                     readouts=(f"{y[0]:.2f}".replace(".", ","), f"modelo {model}, punto {n}"))
    return Explorer.from_function("toy", fig, controls, ("paso", "qué"), state_of)


def test_every_combination_has_a_state_and_defaults_are_read():
    ex = toy_explorer()
    assert set(ex.states) == {(m, n) for m in range(2) for n in range(3)}
    assert ex.default_key == (0, 1)
    assert ex.readouts() == {"paso": "3,00", "qué": "modelo 0, punto 1"}
    assert ex.readouts(model=1, n=2)["qué"] == "modelo 1, punto 2"
    with pytest.raises(ValueError, match="controles desconocidos"):
        ex.readouts(modelo=1)


def test_bad_input_is_refused_in_spanish():
    with pytest.raises(ValueError, match="tipos aceptados: select, slider"):
        Control("x", "X", ("a",), kind="dial")
    with pytest.raises(ValueError, match="fuera de rango"):
        Control("x", "X", ("a", "b"), default=2)
    ex = toy_explorer()
    states = dict(ex.states)
    states.pop((1, 2))
    with pytest.raises(ValueError, match=r"faltan \[\(1, 2\)\]"):
        Explorer("toy", ex.figure, ex.controls, ex.readout_labels, states)
    bad = {k: State(s.traces, s.readouts[:1]) for k, s in ex.states.items()}
    with pytest.raises(ValueError, match="1 lecturas para 2 etiquetas"):
        Explorer("toy", ex.figure, ex.controls, ex.readout_labels, bad)
    with pytest.raises(ValueError, match="no válido"):
        Explorer("a b", ex.figure, ex.controls, ex.readout_labels, ex.states)


def test_html_is_self_contained_and_escapes_the_data():
    ex = toy_explorer()
    page = ex.to_html()
    assert "<script src" not in page and "cdn" not in page.lower() and "http" not in page
    assert 'class="ae-explorer"' in page
    assert page.count("</script>") == 2  # the data block cannot close its script early
    start = page.index('class="ae-data">') + len('class="ae-data">')
    spec = json.loads(page[start:page.index("</script>", start)])
    assert spec["figure"]["layout"]["separators"] == ",."
    assert spec["config"]["displaylogo"] is False
    assert spec["states"]["1,2"]["readouts"] == list(ex.states[(1, 2)].readouts)


def test_plotly_js_ships_in_the_package():
    path = plotly_js_path()
    assert path.name == PLOTLY_JS and path.stat().st_size > 1_000_000


# -- in Chromium -------------------------------------------------------------------------------

DRIVE = r"""
((id, key) => {
  const root = document.getElementById(id);
  const controls = [...root.querySelectorAll("[data-ae-control]")];
  key.forEach((v, i) => {
    controls[i].value = String(v);
    controls[i].dispatchEvent(new Event("input", {bubbles: true}));
  });
  const plot = root.querySelector(".ae-plot");
  return {
    state: root.getAttribute("data-state"),
    readouts: [...root.querySelectorAll("table.ae-readouts td")].map(td => td.textContent),
    traces: plot.data.map(t => ({x: t.x, y: t.y})),
    outputs: [...root.querySelectorAll("output")].map(o => o.textContent),
  };
})
"""

OVERFLOW = r"""
((id) => {
  const root = document.getElementById(id), doc = document.documentElement;
  const problems = [];
  if (doc.scrollWidth > doc.clientWidth + 1) problems.push(`page scrolls sideways: ${doc.scrollWidth}`);
  const edge = root.getBoundingClientRect();
  for (const el of root.querySelectorAll("*")) {
    const r = el.getBoundingClientRect();
    if (r.width && (r.left < edge.left - 1 || r.right > edge.right + 1))
      problems.push(`${el.tagName} ${el.className && el.className.baseVal === undefined ? el.className : ""} ` +
                    `sticks out: ${Math.round(r.left)}..${Math.round(r.right)} in ${Math.round(edge.right)}`);
  }
  const svg = root.querySelector(".ae-plot svg.main-svg");
  if (!svg) problems.push("no plot drawn");
  return problems;
})
"""


def write_page(explorers: list[Explorer], folder) -> str:
    shutil.copy(plotly_js_path(), folder / PLOTLY_JS)
    body = "\n".join(ex.to_html() for ex in explorers)
    page = folder / "index.html"
    page.write_text(f'<!doctype html><html lang="es"><head><meta charset="utf-8">'
                    f'<meta name="viewport" content="width=device-width, initial-scale=1">'
                    f'<script src="{PLOTLY_JS}"></script></head>'
                    f'<body style="margin:0 8px">{body}</body></html>', encoding="utf-8")
    return page.as_uri()


def explorer_problems(explorers: list[Explorer], folder, max_keys: int = 40) -> list[str]:
    """Drive every explorer at both widths; the list of what went wrong (empty when all works)."""
    executable = find_chromium()
    if executable is None:
        pytest.fail(f"Chromium is not installed: this test drives the figures in it. Install it "
                    f"with `{INSTALL_HINT}`.")
    url = write_page(explorers, folder)
    problems = []
    with Chromium(executable) as browser:
        browser.watch_network()
        for label, (width, height, mobile) in WIDTHS.items():
            browser.set_viewport(width, height, mobile)
            browser.open(url)
            for ex in explorers:
                keys = sorted(ex.states)
                step = max(1, len(keys) // max_keys)
                for key in keys[::step] + [keys[-1], ex.default_key]:
                    seen = browser.evaluate(f"({DRIVE})({json.dumps(ex.name)}, {json.dumps(key)})")
                    state = ex.states[key]
                    where = f"{ex.name} {key} @ {label}"
                    if seen["state"] != ",".join(map(str, key)):
                        problems.append(f"{where}: the page shows state {seen['state']}")
                    if seen["readouts"] != list(state.readouts):
                        problems.append(f"{where}: readouts {seen['readouts']} != {list(state.readouts)}")
                    for i, change in enumerate(state.traces):
                        for axis in ("x", "y"):
                            if axis in change and list(seen["traces"][i][axis]) != list(change[axis]):
                                problems.append(f"{where}: trace {i} {axis} {seen['traces'][i][axis]} "
                                                f"!= {list(change[axis])}")
                    sliders = [c for c in ex.controls if c.kind == "slider"]
                    expected_out = [c.options[key[ex.controls.index(c)]] for c in sliders]
                    if seen["outputs"] != expected_out:
                        problems.append(f"{where}: slider labels {seen['outputs']} != {expected_out}")
                problems += [f"{ex.name} @ {label}: {p}"
                             for p in browser.evaluate(f"({OVERFLOW})({json.dumps(ex.name)})")]
            folder_uri = url.rsplit("/", 1)[0] + "/"
            problems += [f"request outside the page's folder: {u}" for u in browser.requested_urls()
                         if not u.startswith(folder_uri)]
    return problems


@pytest.mark.slow  # Chromium: `make test` only
def test_the_toy_explorer_works_offline_in_chromium(tmp_path):
    assert explorer_problems([toy_explorer()], tmp_path) == []


@pytest.mark.slow  # Chromium: `make test` only
def test_the_driver_sees_a_wrong_readout_and_a_network_request(tmp_path):
    ex = toy_explorer()
    lying = Explorer("toy", ex.figure, ex.controls, ex.readout_labels,
                     {k: State(s.traces, ("0", s.readouts[1])) if k == (1, 0) else s
                      for k, s in ex.states.items()})
    page_html = lying.to_html() + '<img src="https://example.invalid/x.png">'
    ex.to_html = lambda: page_html  # the page lies at (1, 0) and asks the network for an image
    problems = explorer_problems([ex], tmp_path)
    assert any("(1, 0)" in p and "readouts ['0'" in p for p in problems), problems
    assert any("https://example.invalid/x.png" in p for p in problems), problems


# -- the chapters' explorers -------------------------------------------------------------------

def memory_explorer_and_examples():
    from ai_evolution.labs.common import worked_examples
    from ai_evolution.plots.explorers import memory_explorer
    examples = worked_examples()
    return memory_explorer(examples["gpu24_7b"]), examples


def test_the_memory_explorer_opens_on_the_worked_example_and_reuses_the_library():
    ex, examples = memory_explorer_and_examples()
    seed, gqa = examples["gpu24_7b"], examples["gpu24_7b_8kv"]
    first = ex.readouts()
    assert first["Secuencias con reserva contigua"] == str(seed.static_slots)
    assert first["Secuencias con bloques bajo demanda"] == str(seed.on_demand_sequences)
    assert ex.readouts(kv_heads=1)["Secuencias con bloques bajo demanda"] == str(gqa.on_demand_sequences)
    assert ex.readouts(kv_heads=1)["Secuencias con reserva contigua"] == str(gqa.static_slots)
    # The memory picture adds up to the GPU's memory in every state where the weights fit.
    for key, state in ex.states.items():
        totals = [sum(t["x"][row] for t in state.traces) for row in (0, 1)]
        if state.readouts[1] != "los pesos no caben":
            gpu_gb = float(ex.controls[0].options[key[0]].split()[0])
            assert totals == pytest.approx([gpu_gb, gpu_gb]), key
    # Llama-3.1-8B in fp16 (16,06 GB) does not fit in 16 GB: said, not a negative cache.
    assert ex.readouts(gpu=0, model=2)["Memoria para la caché KV"] == "los pesos no caben"


@pytest.mark.slow  # Chromium: `make test` only
def test_the_memory_explorer_in_chromium(tmp_path):
    ex, _ = memory_explorer_and_examples()
    assert explorer_problems([ex], tmp_path) == []


def fake_roofline_results():
    """Lab 1's contract results, shaped as report() writes them (numbers made up)."""
    def curve(meas, pred, depart, **extra):
        return {**extra, "batch_sizes": [1, 2, 4, 8], "measured_ms": meas, "predicted_ms": pred,
                "tokens_per_s": [b / m * 1e3 for b, m in zip([1, 2, 4, 8], meas)],
                "departure_batch": depart}
    return {"model": {"name": "cpu-200m"},
            "batching": curve([30.0, 31.0, 33.5, 40.0], [30.0, 30.2, 30.6, 31.4], 8),
            "batching_contrast": curve([4.0, 9.5, 20.0, 41.0], [4.0, 4.1, 4.2, 4.5], 2,
                                       model="tiny-es")}


def test_the_batching_explorer_reads_the_contract():
    from ai_evolution.fmt import es
    from ai_evolution.plots.explorers import batching_explorer
    results = fake_roofline_results()
    ex = batching_explorer(results)
    r = ex.readouts(model=1, batch=2)
    assert r["Paso medido"] == "20,00 ms" and r["Paso predicho"] == "4,20 ms"
    assert r["Tokens/s"] == es(results["batching_contrast"]["tokens_per_s"][2], 0)
    assert r["Rendimiento frente a una secuencia"] == es(0.8, 2) + " ×"
    assert r["Coste medido por secuencia extra"] == "5,33 ms"
    assert ex.readouts(batch=0)["Coste medido por secuencia extra"] == "—"
    assert ex.states[(1, 0)].layout["shapes"][0]["x0"] == 2
    bad = fake_roofline_results()
    bad["batching_contrast"]["batch_sizes"] = [1, 2, 4, 16]
    with pytest.raises(ValueError, match="mismos tamaños de lote"):
        batching_explorer(bad)


@pytest.mark.slow  # Chromium: `make test` only
def test_the_batching_explorer_in_chromium(tmp_path):
    from ai_evolution.plots.explorers import batching_explorer
    assert explorer_problems([batching_explorer(fake_roofline_results())], tmp_path) == []


def fake_observability_study():
    """Lab 6's results["measured"], shaped as report() writes it (numbers made up)."""
    def row(rate, p50, p99, tpot):
        return {"realized_rate": rate, "ttft_p50_s": p50, "ttft_p99_s": p99, "tpot_p50_s": tpot}
    return {"capacity": {"capacity_req_s": 4.0, "capacity_tok_s": 64.0},
            "sweep": [row(1.2, 0.05, 0.08, 0.02), row(4.4, 0.4, 2.5, 0.03), row(2.9, 0.07, 0.3, 0.025)],
            "repeats": [row(3.5, 0.09, 0.6, 0.027), row(3.7, 0.1, 0.9, 0.028)]}


def test_the_poisson_explorer_sorts_runs_by_realised_rate_and_reads_the_contract():
    from ai_evolution.plots.explorers import poisson_explorer
    ex = poisson_explorer(fake_observability_study())
    assert ex.controls[0].options == ("1,20 pet/s", "2,90 pet/s", "3,50 pet/s", "3,70 pet/s",
                                      "4,40 pet/s")
    r = ex.readouts(run=4)
    assert r["Carga"] == "110 % de la capacidad" and r["Tokens/s ofrecidos"] == "70"
    assert r["TTFT p99"] == "2,50 s" and r["TTFT p50"] == "400,0 ms"
    assert r["Capacidad (bucle cerrado)"] == "64 tokens/s"


@pytest.mark.slow  # Chromium: `make test` only
def test_the_poisson_explorer_in_chromium(tmp_path):
    from ai_evolution.plots.explorers import poisson_explorer
    assert explorer_problems([poisson_explorer(fake_observability_study())], tmp_path) == []
